"""bitexact.torch.trace (any nn.Module) and `bitexact diff --trace`
(issue 28, items 3-5, docs/trace.md): the same run twice is identical; a
planted one-ULP change in one module's output at one step is found at
exactly that step, module, sequence and element; a change beyond the kept
values is located to its part; traces of different models and corrupt or
truncated files are refused with one line and exit 2."""
import json
import os
import subprocess
import warnings

import pytest

torch = pytest.importorskip("torch")
import bitexact.torch as bt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
CLI = os.environ.get("BITEXACT_CLI", os.path.join(HERE, "..", "..", "build", "bitexact"))
pytestmark = pytest.mark.skipif(not os.access(CLI, os.X_OK), reason=f"{CLI} is not built")


def make(width=16):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.GELU(), torch.nn.Linear(width, 4))


def run(path, plant=None, steps=3, width=16):
    """Trains make() for `steps` steps on a fixed batch of 6, tracing into
    path; plant = (step, module index, sequence, element): that output
    element is moved one ULP up at that step."""
    m = make(width)
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(1))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    state = {"step": 0}
    if plant is not None:
        st, mi, seq, el = plant

        def bump(mod, args, out):
            if state["step"] != st:
                return None
            with torch.no_grad():  # out + d: exactly one element one ULP up
                d = torch.zeros_like(out)
                v = out[seq].reshape(-1)[el]
                d[seq].view(-1)[el] = torch.nextafter(v, torch.tensor(float("inf"))) - v
            return out + d
        m[mi].register_forward_hook(bump)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with bt.trace(m, path) as t:
            for s in range(steps):
                state["step"] = s
                m(x).pow(2).sum().backward()
                opt.step()
                t.step()
                opt.zero_grad()


def diff(a, b, *extra):
    p = subprocess.run([CLI, "diff", "--trace", *extra, a, b], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def test_same_run_identical_and_layout_free_order(tmp_path):
    a, b = str(tmp_path / "a.trace"), str(tmp_path / "b.trace")
    run(a)
    run(b)
    assert open(a, "rb").read() == open(b, "rb").read()
    rc, out, err = diff(a, b)
    assert rc == 0 and out.startswith("identical:"), (rc, out, err)
    head = json.loads(open(a).readline())
    assert head["bitexact_trace"] == 1 and head["model"].startswith("Sequential:")
    lines = [json.loads(l) for l in open(a).readlines()[1:]]
    phases = [e["phase"] for e in lines if e["step"] == 0]
    assert phases == sorted(phases, key=["forward", "backward", "optimizer"].index)
    assert {e["what"] for e in lines} >= {"output", "grad_input.0", "grad", "param"}
    assert sorted({e["slice"] for e in lines if e["what"] == "output"}) == list(range(6))


@pytest.mark.parametrize("step,module,seq,elem", [(1, 1, 4, 5), (0, 0, 2, 0)])
def test_planted_ulp_found_exactly(tmp_path, step, module, seq, elem):
    a, b = str(tmp_path / "a.trace"), str(tmp_path / "b.trace")
    run(a)
    run(b, plant=(step, module, seq, elem))
    rc, out, err = diff(a, b)
    assert rc == 1, (rc, out, err)
    first = out.splitlines()[0]
    assert first.startswith(f"first difference: step {step}, forward, {module}, output, "
                            f"sequence {seq} "), out
    assert f"element {elem}: " in out and "(1 ULP)" in out, out
    rc, out, err = diff(a, b, "--json")
    j = json.loads(out)
    f = j["first"]
    assert rc == 1 and not j["identical"] and (f["step"], f["module"], f["slice"], f["element"],
                                                f["ulp"]) == (step, str(module), seq, elem, 1), j
    assert j["differ"] >= 1 and j["modules"][0]["module"] == str(module)


def test_difference_beyond_the_head_located_to_its_part(tmp_path):
    a, b = str(tmp_path / "a.trace"), str(tmp_path / "b.trace")
    run(a, width=64)
    run(b, plant=(0, 0, 1, 40), width=64)  # element 40 of 64: part [40, 44)
    rc, out, err = diff(a, b, "--json")
    f = json.loads(out)["first"]
    assert rc == 1 and f["elements"] == [40, 44] and f["element"] is None, out


def test_bad_traces_refused(tmp_path):
    a = str(tmp_path / "a.trace")
    run(a, steps=1)
    text = open(a).read()
    other = str(tmp_path / "other.trace")
    run(other, steps=1, width=12)
    cases = {
        "truncated": text[:-40],
        "corrupt": text.replace('"phase": "forward"', '"phase": "sideways"', 1),
        "badjson": text.replace("}\n", "\n", 2),
        "version": text.replace('"bitexact_trace": 1', '"bitexact_trace": 2', 1),
        "empty": "",
    }
    for name, body in cases.items():
        p = str(tmp_path / f"{name}.trace")
        with open(p, "w") as f:
            f.write(body)
        rc, out, err = diff(a, p, "--trace")
        assert rc == 2 and out == "" and err.count("\n") == 1, (name, rc, out, err)
    rc, out, err = diff(a, other)
    assert rc == 2 and "different models" in err, err


@pytest.mark.parametrize("dtype", ["BF16", "F16"])
def test_ulp_in_the_entry_dtype(tmp_path, dtype):
    """The ULP distance is counted in the entry's dtype (as `bitexact diff`
    counts it for safetensors): values two bf16 / fp16 steps apart, 2 ULP."""
    import numpy as np
    from bitexact import _trace
    if dtype == "BF16":
        bits = np.array([0x3F80, 0x4000, 0x0001, 0x8002], dtype=np.uint16)  # 1, 2, subnormals
        vals = (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        moved = bits.copy()
        moved[2] += 2
        mvals = (moved.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        arrs = [(bits, "BF16", vals), (moved, "BF16", mvals)]
    else:
        h = np.array([1.0, 2.0, 6e-8, -3.0], dtype=np.float16)
        m = h.copy()
        m[2] = np.nextafter(np.nextafter(m[2], np.float16(1)), np.float16(1))
        arrs = [(h, None, None), (m, None, None)]
    paths = []
    for i, (a, dt, v) in enumerate(arrs):
        w = _trace.TraceWriter(str(tmp_path / f"{i}.trace"), "test:model", "test")
        w.add("forward", "m", "output", 0, a, dt, v)
        w.end_step()
        w.close()
        paths.append(str(tmp_path / f"{i}.trace"))
    rc, out, err = diff(*paths, "--json")
    f = json.loads(out)["first"]
    assert rc == 1 and f["dtype"] == dtype and f["element"] == 2 and f["ulp"] == 2, out
