"""bitexact.torch.trace (any nn.Module) and `bitexact diff --trace`
(issue 28, items 3-5, docs/trace.md): the same run twice is identical; a
planted one-ULP change in one module's output at one step is found at
exactly that step, module, sequence and element; a change beyond the kept
values is located to its part; traces of different models and corrupt or
truncated files are refused with one line and exit 2; the keyword
arguments (seq_len, include_root, model, producer, dump), grads(),
discard(), the writer's merge hook, and the diff of entries on one side
only."""
import json
import os
import subprocess
import warnings

import numpy as np
import pytest
import xxhash

torch = pytest.importorskip("torch")
import bitexact.torch as bt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
CLI = os.environ.get("BITEXACT_CLI", os.path.join(HERE, "..", "..", "build", "bitexact"))
pytestmark = pytest.mark.skipif(not os.access(CLI, os.X_OK), reason=f"{CLI} is not built")


def make(width=16):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.GELU(), torch.nn.Linear(width, 4))


def run(path, plant=None, steps=3, width=16, **kw):
    """Trains make() for `steps` steps on a fixed batch of 6, tracing into
    path (kw: bt.trace's keyword arguments); plant = (step, module index,
    sequence, element): that output element is moved one ULP up at that
    step."""
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
        with bt.trace(m, path, **kw) as t:
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
    # the default model id: CLASS and the XXH3-64 of "name:d0,d1;" over the parameters
    names = "0.weight:16,8;0.bias:16;2.weight:4,16;2.bias:4;"
    assert head["bitexact_trace"] == 1 and head["model"] == "Sequential:" + xxhash.xxh3_64_hexdigest(names.encode())
    assert head["producer"] == f"bitexact.torch {torch.__version__}"
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


# ---- the tracer's keyword arguments and calls (seq_len, include_root, model,
# producer, grads, discard, dump) and the diff of entries on one side only


def entries(path):
    return [json.loads(l) for l in open(path).readlines()[1:]]


def h(arr):
    return xxhash.xxh3_64_hexdigest(np.ascontiguousarray(arr).tobytes())


class Flat(torch.nn.Module):
    """[B, L, 8] -> token-major [B*L, 8] -> Linear -> [B*L, 5], as a
    Megatron-style model flattens its activations."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.proj = torch.nn.Linear(8, 5)

    def forward(self, x):
        return self.proj(x.reshape(-1, x.shape[-1]))


def test_seq_len_cuts_token_major_rows_per_sequence(tmp_path):
    B, L = 3, 4
    m = Flat()
    x = torch.randn(B, L, 8, generator=torch.Generator().manual_seed(2)).requires_grad_()
    want = m(x).detach().numpy()  # [B*L, 5]
    p = str(tmp_path / "a.trace")
    with bt.trace(m, p, seq_len=L) as t:
        t.seq_offset = 10
        m(x).sum().backward()
        t.step()
    out = {e["slice"]: e for e in entries(p) if e["module"] == "proj" and e["what"] == "output"}
    assert sorted(out) == [10, 11, 12], out.keys()
    for i in range(B):  # sequence i: rows [i L, (i+1) L), shape [L, 5]
        assert out[10 + i]["shape"] == [L, 5] and out[10 + i]["hash"] == h(want[i * L:(i + 1) * L])
    gin = [e for e in entries(p) if e["module"] == "proj" and e["what"] == "grad_input.0"]
    assert sorted(e["slice"] for e in gin) == [10, 11, 12] and gin[0]["shape"] == [L, 8]
    # without seq_len the [B*L, ...] tensors are whole
    q = str(tmp_path / "b.trace")
    with bt.trace(m, q) as t:
        m(x).sum().backward()
        t.step()
    out = [e for e in entries(q) if e["module"] == "proj" and e["what"] == "output"]
    assert len(out) == 1 and out[0]["slice"] is None and out[0]["shape"] == [B * L, 5]
    with pytest.raises(ValueError):
        bt.Tracer(m, str(tmp_path / "c.trace"), seq_len=0)


def test_include_root_model_producer(tmp_path):
    a, b = str(tmp_path / "a.trace"), str(tmp_path / "b.trace")
    run(a, steps=1)
    run(b, steps=1, include_root=False)
    ea, eb = entries(a), entries(b)
    assert any(e["module"] == "Sequential" for e in ea)
    assert not any(e["module"] == "Sequential" for e in eb)
    assert [e for e in ea if e["module"] != "Sequential"] == eb  # nothing else changes
    c = str(tmp_path / "c.trace")
    run(c, steps=1, model="glm-tiny:v1", producer="my trainer 0.1")
    head = json.loads(open(c).readline())
    assert head["model"] == "glm-tiny:v1" and head["producer"] == "my trainer 0.1"
    assert open(c).readlines()[1:] == open(a).readlines()[1:]


def test_diff_names_entries_only_on_one_side(tmp_path):
    """a.trace has the root's entries, b.trace not: no common entry differs,
    the first line says so, the first entry only in a.trace is named, exit
    1; with a planted difference too, the first *common* difference is
    reported, not the missing entry before it."""
    a, b, c = (str(tmp_path / f"{n}.trace") for n in "abc")
    run(a, steps=1)
    run(b, steps=1, include_root=False)
    rc, out, err = diff(a, b)
    lines = out.splitlines()
    assert rc == 1 and lines[0].startswith("first difference: none among the "), out
    nroot = sum(e["module"] == "Sequential" for e in entries(a))
    assert f"{nroot} entries only in {a} (first: step 0, forward, Sequential, output, sequence 0)" in out, out
    rc, out, err = diff(b, a, "--json")
    j = json.loads(out)
    assert rc == 1 and j["differ"] == 0 and j["only_in_b"] == nroot and j["only_in_a"] == 0
    assert j["first"] is None and j["first_only_in_a"] is None
    assert j["first_only_in_b"] == {"step": 0, "phase": "forward", "module": "Sequential",
                                    "what": "output", "slice": 0}, j
    d = str(tmp_path / "d.trace")
    run(c, steps=2, plant=(1, 0, 3, 1))  # with the root, step 1's first Linear planted
    run(d, steps=2, include_root=False)
    rc, out, err = diff(c, d)  # step 0's root entries, only in c, come first in c's order
    lines = out.splitlines()
    assert rc == 1 and lines[0] == "first difference: step 1, forward, 0, output, sequence 3 (F32, 1-d)", out
    assert lines[1].startswith("  element 1: ") and lines[1].endswith("(1 ULP)"), out
    assert f"entries only in {c} (first: step 0, forward, Sequential, output, sequence 0)" in out, out


def test_grads_before_clipping_and_step(tmp_path):
    """grads() records the gradients where it is called (before clipping);
    step() then records only the parameters; without grads(), step()
    records the gradients as they are then (clipped)."""
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(1))
    res = {}
    for mode in ("grads", "step"):
        m = make()
        p = str(tmp_path / f"{mode}.trace")
        with bt.trace(m, p) as t:
            m(x).pow(2).sum().backward()
            raw = {n: q.grad.clone().numpy() for n, q in m.named_parameters()}
            if mode == "grads":
                t.grads()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1e-3)
            clipped = {n: q.grad.clone().numpy() for n, q in m.named_parameters()}
            t.step()
        g = {e["module"]: e["hash"] for e in entries(p) if e["what"] == "grad"}
        res[mode] = (g, raw, clipped)
        assert len([e for e in entries(p) if e["what"] == "grad"]) == 4  # once each, not twice
    g, raw, clipped = res["grads"]
    assert all(g[n] == h(raw[n]) and g[n] != h(clipped[n]) for n in raw), g
    g, raw, clipped = res["step"]
    assert all(g[n] == h(clipped[n]) for n in raw), g


def test_discard_keeps_only_the_last_pass(tmp_path):
    """A step run twice (the first pass discarded) writes the trace of the
    second pass alone."""
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(1))
    a, b = str(tmp_path / "a.trace"), str(tmp_path / "b.trace")
    m = make()
    with bt.trace(m, a) as t:
        m(x).pow(2).sum().backward()
        t.step()
    m = make()
    with bt.trace(m, b) as t:
        (m(2 * x[:4]) + 1).pow(3).sum().backward()  # another pass: other values, fewer sequences
        t.discard()
        m.zero_grad()
        m(x).pow(2).sum().backward()
        t.step()
    assert open(a, "rb").read() == open(b, "rb").read()
    # without discard, the first pass's entries are there
    c = str(tmp_path / "c.trace")
    m = make()
    with bt.trace(m, c) as t:
        (m(2 * x[:4]) + 1).pow(3).sum().backward()
        m.zero_grad()
        m(x).pow(2).sum().backward()
        t.step()
    assert open(a, "rb").read() != open(c, "rb").read()


def test_repeated_call_gets_its_own_key(tmp_path):
    """A module called twice in a step (same sequences) writes output and
    output@1, so the trace stays readable by diff."""
    lin = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)
    p = str(tmp_path / "a.trace")
    with bt.trace(lin, p) as t:
        lin(lin(x)).sum().backward()
        t.step()
    whats = sorted({e["what"] for e in entries(p) if e["phase"] == "forward"})
    assert whats == ["output", "output@1"], whats
    rc, out, err = diff(p, p)
    assert rc == 0, (out, err)


def test_dump_names_the_element_beyond_the_head(tmp_path):
    """A difference at element 40 of 64 (beyond the 8 kept values): the
    diff gives its part and the --dump key; rerun with dump=KEY, the two
    .dump.safetensors files hold that value whole and `bitexact diff`
    names element 40."""
    from safetensors.numpy import load_file
    a, b = str(tmp_path / "a.trace"), str(tmp_path / "b.trace")
    run(a, width=64)
    run(b, plant=(1, 0, 1, 40), width=64)
    rc, out, err = diff(a, b)
    key = "1/forward/0/output/1"
    assert rc == 1 and "first differing element in [40, 44) (beyond the first values kept)" in out, out
    assert f"rerun both with --dump '{key}' and bitexact diff the two .dump.safetensors files" in out
    rc, out, err = diff(a, b, "--json")
    assert json.loads(out)["first"]["dump_key"] == key
    run(a, width=64, dump=key)
    run(b, plant=(1, 0, 1, 40), width=64, dump=key)
    da, db = load_file(a + ".dump.safetensors"), load_file(b + ".dump.safetensors")
    assert list(da) == [key] and da[key].dtype == np.float32 and da[key].shape == (64,)
    e = next(e for e in entries(a) if (e["step"], e["phase"], e["module"], e["what"], e["slice"])
             == (1, "forward", "0", "output", 1))
    assert h(da[key]) == e["hash"]
    assert np.flatnonzero(da[key].view(np.uint32) != db[key].view(np.uint32)).tolist() == [40]
    p = subprocess.run([CLI, "diff", "--json", a + ".dump.safetensors", b + ".dump.safetensors"],
                       capture_output=True, text=True)
    t = json.loads(p.stdout)["tensors"][key]
    assert p.returncode == 1 and t["first_flat_index"] == 40 and t["max_ulp"] == 1, p.stdout
    # a key that matches nothing warns and writes nothing
    c = str(tmp_path / "c.trace")
    t = bt.Tracer(make(), c, dump="9/forward/0/output/1")
    t.step()
    with pytest.warns(UserWarning, match="matched no entry"):
        t.close()
    assert not os.path.exists(c + ".dump.safetensors")


def test_dump_bf16(tmp_path):
    """A BF16 entry is dumped as BF16 (its bits)."""
    from safetensors.torch import load_file
    m = make().to(torch.bfloat16)
    x = torch.randn(6, 8).to(torch.bfloat16)
    p = str(tmp_path / "a.trace")
    with bt.trace(m, p, dump="0/forward/2/output/5") as t:
        y = m(x)
        y.float().sum().backward()
        t.step()
    d = load_file(p + ".dump.safetensors")["0/forward/2/output/5"]
    assert d.dtype == torch.bfloat16 and torch.equal(d.view(torch.int16), y[5].detach().view(torch.int16))


def test_merge_hook_writes_one_trace_from_ranks(tmp_path):
    """end_step(merge=...): two ranks' halves of a step, gathered by rank
    0, write the bytes one process writes for the whole step; the other
    rank writes nothing but its header."""
    from bitexact import _trace
    rng = np.random.default_rng(0)
    acts = {s: rng.standard_normal(5).astype(np.float32) for s in range(4)}
    g = rng.standard_normal(3).astype(np.float32)

    def fill(w, seqs):
        for mod in ("emb", "mlp"):
            for s in seqs:
                w.add("forward", mod, "output", s, acts[s] + len(mod))
        w.add("backward", "mlp.weight", "grad", None, g)

    whole = str(tmp_path / "whole.trace")
    w = _trace.TraceWriter(whole, "m:1", "t")
    fill(w, [0, 1, 2, 3])
    w.end_step()
    w.close()
    gathered = []
    r0, r1 = _trace.TraceWriter(str(tmp_path / "r0.trace"), "m:1", "t"), \
        _trace.TraceWriter(str(tmp_path / "r1.trace"), "m:1", "t")
    fill(r1, [2, 3])
    r1.end_step(merge=lambda lines: gathered.extend(lines) or None)  # rank 1: sends, writes nothing
    fill(r0, [0, 1])

    def merge0(lines):
        seen, out = set(), []
        for k, line in lines + gathered:  # the gradient is on both ranks: keep one
            if line not in seen:
                seen.add(line)
                out.append((k, line))
        return out
    r0.end_step(merge=merge0)
    r0.close()
    r1.close()
    assert open(tmp_path / "r0.trace", "rb").read() == open(whole, "rb").read()
    assert len(open(tmp_path / "r1.trace").readlines()) == 1
