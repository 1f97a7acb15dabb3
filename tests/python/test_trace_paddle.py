"""bitexact.paddle.trace (any paddle.nn.Layer) and `bitexact diff --trace`
(issue 28, item 3; docs/trace.md): the same run twice is identical; a
planted one-ULP change in one layer's output is found at exactly that
step, layer, sequence and element; a torch MLP and a Paddle MLP with the
same weights have the same model id and identical parameter entries
(paddle.nn.Linear weights recorded in torch layout); grad_input is the
gradient from the layer's own use of its input (a residual's share not
included), checked against exact hand-computed values and against torch's
full backward hook; seq_len slicing, dump and discard() as in torch."""
import json
import os
import subprocess
import warnings

import numpy as np
import pytest
import xxhash

paddle = pytest.importorskip("paddle")
paddle.set_device("cpu")
import bitexact.paddle as bp  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
CLI = os.environ.get("BITEXACT_CLI", os.path.join(HERE, "..", "..", "build", "bitexact"))
pytestmark = pytest.mark.skipif(not os.access(CLI, os.X_OK), reason=f"{CLI} is not built")


def diff(a, b, *extra):
    p = subprocess.run([CLI, "diff", "--trace", *extra, a, b], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def entries(path):
    return [json.loads(l) for l in open(path).readlines()[1:]]


def h(arr):
    return xxhash.xxh3_64_hexdigest(np.ascontiguousarray(arr).tobytes())


def torch_weights(width=16):
    """The MLP's weights in torch layout (Linear weight [out, in]), fixed."""
    rng = np.random.default_rng(0)
    return [("0.weight", rng.standard_normal((width, 8)).astype(np.float32) * 0.3),
            ("0.bias", rng.standard_normal(width).astype(np.float32) * 0.1),
            ("2.weight", rng.standard_normal((4, width)).astype(np.float32) * 0.3),
            ("2.bias", rng.standard_normal(4).astype(np.float32) * 0.1)]


def make(width=16):
    """paddle.nn.Linear / GELU / Linear with torch_weights (transposed into
    Paddle's [in, out])."""
    m = paddle.nn.Sequential(paddle.nn.Linear(8, width), paddle.nn.GELU(), paddle.nn.Linear(width, 4))
    for (n, w), (pn, p) in zip(torch_weights(width), m.named_parameters()):
        assert n == pn
        p.set_value(w.T.copy() if w.ndim == 2 else w)
    return m


def batch():
    return np.random.default_rng(1).standard_normal((6, 8)).astype(np.float32)


def run(path, plant=None, steps=3, width=16, **kw):
    """Trains make() for `steps` SGD steps on a fixed batch of 6, tracing
    into path; plant = (step, layer index, sequence, element): that output
    element is moved one ULP up at that step."""
    m = make(width)
    x = paddle.to_tensor(batch())
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=m.parameters())
    state = {"step": 0}
    if plant is not None:
        st, li, seq, el = plant

        def bump(layer, inputs, out):
            if state["step"] != st:
                return None
            o = out.numpy()
            d = np.zeros_like(o)
            v = o[seq].reshape(-1)[el]
            d[seq].reshape(-1)[el] = np.nextafter(v, np.float32(np.inf)) - v
            return out + paddle.to_tensor(d)  # exactly one element one ULP up
        m[li].register_forward_post_hook(bump)
    with bp.trace(m, path, **kw) as t:
        for s in range(steps):
            state["step"] = s
            m(x).pow(2).sum().backward()
            opt.step()
            t.step()
            opt.clear_grad()
    return m


def test_same_run_identical(tmp_path):
    a, b = str(tmp_path / "a.trace"), str(tmp_path / "b.trace")
    run(a)
    run(b)
    assert open(a, "rb").read() == open(b, "rb").read()
    rc, out, err = diff(a, b)
    assert rc == 0 and out.startswith("identical:"), (rc, out, err)
    head = json.loads(open(a).readline())
    names = "0.weight:16,8;0.bias:16;2.weight:4,16;2.bias:4;"  # torch layout
    assert head["model"] == "Sequential:" + xxhash.xxh3_64_hexdigest(names.encode()), head
    assert head["producer"] == f"bitexact.paddle {paddle.__version__}"
    es = entries(a)
    assert {e["what"] for e in es} >= {"output", "grad_input.0", "grad", "param"}
    assert sorted({e["slice"] for e in es if e["what"] == "output"}) == list(range(6))
    w = [e for e in es if e["module"] == "0.weight"]
    assert w and all(e["shape"] == [16, 8] for e in w)  # [out, in], values and gradients


@pytest.mark.parametrize("step,layer,seq,elem", [(1, 1, 4, 5), (0, 0, 2, 0)])
def test_planted_ulp_found_exactly(tmp_path, step, layer, seq, elem):
    a, b = str(tmp_path / "a.trace"), str(tmp_path / "b.trace")
    run(a)
    run(b, plant=(step, layer, seq, elem))
    rc, out, err = diff(a, b)
    assert rc == 1, (rc, out, err)
    assert out.splitlines()[0] == f"first difference: step {step}, forward, {layer}, output, sequence {seq} (F32, 1-d)", out
    assert f"element {elem}: " in out and "(1 ULP)" in out, out
    f = json.loads(diff(a, b, "--json")[1])["first"]
    assert (f["step"], f["module"], f["slice"], f["element"], f["ulp"]) == (step, str(layer), seq, elem, 1), f


def test_torch_and_paddle_same_weights(tmp_path):
    """The same MLP in torch (nn.Linear) and Paddle (paddle.nn.Linear,
    weights transposed): the same model id, and the parameter entries of
    step 0 (traced before any update) identical bit for bit."""
    torch = pytest.importorskip("torch")
    import bitexact.torch as bt
    tm = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    with torch.no_grad():
        for (n, w), (tn, p) in zip(torch_weights(), tm.named_parameters()):
            p.copy_(torch.from_numpy(w))
    pm = make()
    a, b = str(tmp_path / "torch.trace"), str(tmp_path / "paddle.trace")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with bt.trace(tm, a) as t:
            tm(torch.from_numpy(batch())).pow(2).sum().backward()
            t.step()
    with bp.trace(pm, b) as t:
        pm(paddle.to_tensor(batch())).pow(2).sum().backward()
        t.step()
    ha, hb = json.loads(open(a).readline()), json.loads(open(b).readline())
    assert ha["model"] == hb["model"], (ha, hb)
    pa = {e["module"]: e for e in entries(a) if e["what"] == "param"}
    pb = {e["module"]: e for e in entries(b) if e["what"] == "param"}
    assert list(pa) == list(pb) == [n for n, _ in torch_weights()]
    for n, w in torch_weights():
        assert pa[n] == pb[n] and pa[n]["hash"] == h(w), n
    keys = lambda es: [(e["step"], e["phase"], e["module"], e["what"], e["slice"]) for e in es]
    assert keys(entries(a)) == keys(entries(b))  # the same entries, in the same order
    rc, out, err = diff(a, b)
    assert rc in (0, 1) and err == "", err  # comparable; whether GEMM bits agree is the frameworks'


class Block(paddle.nn.Layer):
    """y = x + lin(x): x feeds lin and the residual."""

    def __init__(self, w):
        super().__init__()
        self.lin = paddle.nn.Linear(w.shape[1], w.shape[0], bias_attr=False)
        self.lin.weight.set_value(w.T.copy())

    def forward(self, x):
        return x + self.lin(x)


def test_grad_input_is_the_layers_own_use(tmp_path):
    """grad_input.0 of lin is c @ W (the gradient through lin alone), not
    c + c @ W (x's total gradient, the residual's share included): small
    integers, so every value is exact and the hashes are compared with the
    hand-computed values; torch's full backward hook records the same."""
    rng = np.random.default_rng(5)
    W = rng.integers(-3, 4, (4, 4)).astype(np.float32)  # torch layout [out, in]
    x0 = rng.integers(-4, 5, (2, 4)).astype(np.float32)
    c = rng.integers(-2, 3, (2, 4)).astype(np.float32)  # loss = sum(c * y): dL/dy = c
    m = Block(W)
    x = paddle.to_tensor(x0, stop_gradient=False)
    p = str(tmp_path / "p.trace")
    with bp.trace(m, p) as t:
        (m(x) * paddle.to_tensor(c)).sum().backward()
        t.step()
    own, total = c @ W, c + c @ W
    assert np.array_equal(x.grad.numpy(), total)  # the residual does feed x
    g = {e["slice"]: e["hash"] for e in entries(p) if e["module"] == "lin" and e["what"] == "grad_input.0"}
    assert g == {i: h(own[i]) for i in range(2)}, g
    assert all(h(own[i]) != h(total[i]) for i in range(2))
    gb = {e["slice"]: e["hash"] for e in entries(p) if e["module"] == "Block" and e["what"] == "grad_input.0"}
    assert gb == {i: h(total[i]) for i in range(2)}  # the root's input: the whole gradient
    torch = pytest.importorskip("torch")
    import bitexact.torch as bt

    class TBlock(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4, bias=False)
            with torch.no_grad():
                self.lin.weight.copy_(torch.from_numpy(W))

        def forward(self, x):
            return x + self.lin(x)
    q = str(tmp_path / "t.trace")
    tb = TBlock()
    with bt.trace(tb, q, model=json.loads(open(p).readline())["model"]) as t:
        (tb(torch.from_numpy(x0).requires_grad_()) * torch.from_numpy(c)).sum().backward()
        t.step()
    gt = {e["slice"]: e["hash"] for e in entries(q) if e["module"] == "lin" and e["what"] == "grad_input.0"}
    assert gt == g
    rc, out, err = diff(q, p)
    assert rc == 1 and "first difference: none among" in out and "TBlock" in out, out  # root names differ


class Flat(paddle.nn.Layer):
    """[B, L, 8] -> token-major [B*L, 8] -> Linear -> [B*L, 5]."""

    def __init__(self):
        super().__init__()
        self.proj = paddle.nn.Linear(8, 5)

    def forward(self, x):
        return self.proj(x.reshape([-1, x.shape[-1]]))


def test_seq_len(tmp_path):
    B, L = 3, 4
    paddle.seed(3)
    m = Flat()
    x = paddle.to_tensor(np.random.default_rng(2).standard_normal((B, L, 8)).astype(np.float32),
                         stop_gradient=False)
    want = m(x).numpy()
    p = str(tmp_path / "a.trace")
    with bp.trace(m, p, seq_len=L) as t:
        t.seq_offset = 6
        m(x).sum().backward()
        t.step()
    out = {e["slice"]: e for e in entries(p) if e["module"] == "proj" and e["what"] == "output"}
    assert sorted(out) == [6, 7, 8]
    for i in range(B):
        assert out[6 + i]["shape"] == [L, 5] and out[6 + i]["hash"] == h(want[i * L:(i + 1) * L])
    gin = [e for e in entries(p) if e["module"] == "proj" and e["what"] == "grad_input.0"]
    assert sorted(e["slice"] for e in gin) == [6, 7, 8] and gin[0]["shape"] == [L, 8]


def test_dump_writes_the_entry(tmp_path):
    """dump= of a Linear weight writes it in torch layout; of an output,
    the sequence's row; both hash to their entries."""
    from safetensors.numpy import load_file
    p = str(tmp_path / "a.trace")
    run(p, steps=1, dump="0/optimizer/2.weight/param/-")
    m = make()
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=m.parameters())
    m(paddle.to_tensor(batch())).pow(2).sum().backward()
    opt.step()
    d = load_file(p + ".dump.safetensors")
    want = m[2].weight.numpy().T
    assert list(d) == ["0/optimizer/2.weight/param/-"] and d["0/optimizer/2.weight/param/-"].shape == (4, 16)
    assert np.array_equal(d["0/optimizer/2.weight/param/-"].view(np.uint32), want.view(np.uint32))
    e = next(e for e in entries(p) if e["module"] == "2.weight" and e["what"] == "param")
    assert e["hash"] == h(want)
    q = str(tmp_path / "b.trace")
    run(q, steps=2, dump="1/forward/1/output/3")
    v = load_file(q + ".dump.safetensors")["1/forward/1/output/3"]
    e = next(e for e in entries(q) if (e["step"], e["module"], e["what"], e["slice"]) == (1, "1", "output", 3))
    assert v.shape == (16,) and h(v) == e["hash"]


def test_discard_keeps_only_the_last_pass(tmp_path):
    x = paddle.to_tensor(batch())
    a, b = str(tmp_path / "a.trace"), str(tmp_path / "b.trace")
    m = make()
    with bp.trace(m, a) as t:
        m(x).pow(2).sum().backward()
        t.step()
    m = make()
    with bp.trace(m, b) as t:
        (m(2 * x[:4]) + 1).pow(3).sum().backward()
        t.discard()
        m.clear_gradients()
        m(x).pow(2).sum().backward()
        t.step()
    assert open(a, "rb").read() == open(b, "rb").read()


def test_include_root_model_producer_grads(tmp_path):
    m = make()
    x = paddle.to_tensor(batch())
    p = str(tmp_path / "a.trace")
    with bp.trace(m, p, include_root=False, model="mlp:v1", producer="test") as t:
        m(x).pow(2).sum().backward()
        raw = {n: q.grad.numpy().copy() for n, q in m.named_parameters()}
        t.grads()
        for q in m.parameters():
            q.grad.set_value(q.grad * 0.5)
        t.step()
    head = json.loads(open(p).readline())
    assert head["model"] == "mlp:v1" and head["producer"] == "test"
    es = entries(p)
    assert not any(e["module"] == "Sequential" for e in es)
    g = {e["module"]: e["hash"] for e in es if e["what"] == "grad"}
    assert g == {n: h(r.T if n.endswith("weight") else r) for n, r in raw.items()}  # before the halving
