"""bitexact.paddle's layers (python/bitexact/paddle/_layers.py): each op
against Paddle's native autograd of the same formula in fp64 (fp32 error
bounds of the kernels' fixed orders, as test_torch_layers.py) and
bit-equal to bitexact.torch's op; fp32 central differences of the input
gradients (paddle.grad); THE cross-framework test: the tiny model of
torch_layers_model.py built in Paddle trains byte-identically to the torch
one; the negative control with both frameworks' native ops; 2 ranks over
paddle.distributed (gloo, CPU); bad input and protocol misuse."""
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

try:
    import paddle
except ImportError as e:  # the only reason to skip: Paddle absent
    pytest.skip(f"paddle is not importable ({e}); scripts/py_setup.sh installs the pinned "
                "paddlepaddle", allow_module_level=True)

import paddle.nn.functional as PF
import torch

import bitexact
import bitexact.paddle as bp
import bitexact.torch as bt
import paddle_layers_model as PM
import torch_layers_model as TM

U = 2.0 ** -24  # the fp32 unit roundoff
HERE = os.path.dirname(os.path.abspath(__file__))


def rnd(*shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def pt(a, grad=False, dtype=None):
    t = paddle.to_tensor(a if dtype is None else a.astype(dtype))
    t.stop_gradient = not grad
    return t


def bits(a):
    a = np.asarray(a.numpy() if hasattr(a, "numpy") else a)
    return a.view({4: np.int32, 8: np.int64}[a.dtype.itemsize])


def same(a, b):
    a, b = np.asarray(a.numpy() if hasattr(a, "numpy") else a), np.asarray(
        b.detach().numpy() if isinstance(b, torch.Tensor) else (b.numpy() if hasattr(b, "numpy") else b))
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(bits(a), bits(b))


def within(got, ref, bound, what):
    """|got - ref| <= bound elementwise (fp64), and the bound is not
    vacuous: far below the values' own size."""
    got, ref = np.asarray(got.numpy(), np.float64), ref.numpy().astype(np.float64)
    bound = np.broadcast_to(np.asarray(bound, np.float64), ref.shape)
    err = np.abs(got - ref)
    assert (err <= bound).all(), f"{what}: worst excess {float((err - bound).max())}"
    assert float(bound.max()) <= 1e-4 * max(float(np.abs(ref).max()), 1e-30), what


def two_pass(params, fn, T, seq_len, leaves=()):
    """fn() -> scalar, backward through a GradReduction over params (1
    micro-batch); plain leaves get Paddle's gradient per pass (cleared)."""
    red = bp.GradReduction(params, seq_len, T)

    def step(i):
        for t in leaves:
            t.clear_gradient()
        fn().backward()
    red.run_two_pass(step, [(0, T)])


# ---- (a) each op: fp64 Paddle autograd of the same formula; = bitexact.torch -

def test_linear_rmsnorm_match():
    # bounds as test_torch_layers.py: fmaf chains of K / N / C terms
    T, Kd, N, C = 24, 40, 12, 8
    x, w, dy = rnd(T, Kd, seed=1), rnd(N, Kd, seed=2), rnd(T, N, seed=3)
    lin = bp.Linear(Kd, N)
    lin.weight.set_value(w)
    xi, out = pt(x, True), {}

    def fn():
        out["y"] = lin(xi)
        return (out["y"] * pt(dy)).sum()  # y's upstream gradient: 1 * dy, exact
    two_pass([lin.weight], fn, T, C, [xi])
    x64, w64 = pt(x, True, "float64"), pt(w, True, "float64")
    y64 = paddle.matmul(x64, w64, transpose_y=True)
    gx, gw = paddle.grad([y64], [x64, w64], [pt(dy, dtype="float64")])
    ax, aw, ad = (np.abs(a.astype(np.float64)) for a in (x, w, dy))
    within(out["y"], y64, (Kd + 1) * U * ax @ aw.T, "y")
    within(xi.grad, gx, (N + 1) * U * ad @ aw, "dx")
    within(lin.weight.grad, gw, (C + 2) * U * ad.T @ ax, "dW")
    # the same bits as bitexact.torch's op on the same data
    tl = torch.nn.Parameter(torch.from_numpy(w.copy()))
    tx = torch.from_numpy(x.copy()).requires_grad_(True)
    tr = bt.GradReduction([tl], C, T)

    def tstep(i):
        tx.grad = None
        ty = bt.linear(tx, tl)
        ty.backward(torch.from_numpy(dy))
        out["ty"] = ty.detach()
    tr.run_two_pass(tstep, [(0, T)])
    assert same(out["y"], out["ty"]) and same(xi.grad, tx.grad) and same(lin.weight.grad, tl.grad)
    # RMSNorm: (H/2 + 6) u relative forward, (H + 8) u rstd (|g| + |xhat m|) dx
    Hd, eps = 24, 1e-6
    x, w, dy = rnd(16, Hd, seed=4), 1 + rnd(Hd, seed=5, scale=0.3), rnd(16, Hd, seed=6)
    norm = bp.RMSNorm(Hd, eps)
    norm.weight.set_value(w)
    xi = pt(x, True)

    def fn2():
        out["y"] = norm(xi)
        return (out["y"] * pt(dy)).sum()
    two_pass([norm.weight], fn2, 16, 4, [xi])
    x64, w64 = pt(x, True, "float64"), pt(w, True, "float64")
    rstd = paddle.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)
    y64 = x64 * rstd * w64
    gx, gw = paddle.grad([y64], [x64, w64], [pt(dy, dtype="float64")])
    within(out["y"], y64, (Hd / 2 + 6) * U * np.abs(y64.numpy()) + 1e-30, "norm y")
    xhat = (x64 * rstd).numpy()
    g = dy.astype(np.float64) * w
    mag = rstd.numpy() * (np.abs(g) + np.abs(xhat) * np.abs(g * xhat).mean(-1, keepdims=True))
    within(xi.grad, gx, (Hd + 8) * U * mag, "norm dx")
    within(norm.weight.grad, gw, (4 + 4) * U * (np.abs(dy) * np.abs(xhat)).sum(0), "norm dw")
    ty = bt.rms_norm(torch.from_numpy(x.copy()), torch.from_numpy(w.copy()), eps)
    assert same(out["y"], ty)


def test_swiglu_mlp_embedding_xent_match():
    T, F_ = 16, 20
    g, u, dh = rnd(T, F_, seed=7, scale=3), rnd(T, F_, seed=8), rnd(T, F_, seed=9)
    gi, ui = pt(g, True), pt(u, True)
    h = bp.swiglu(gi, ui)
    dg, du = paddle.grad([h], [gi, ui], [pt(dh)])
    g64, u64 = pt(g, True, "float64"), pt(u, True, "float64")
    h64 = PF.silu(g64) * u64
    rg, ru = paddle.grad([h64], [g64, u64], [pt(dh, dtype="float64")])
    within(h, h64, 2 * U * np.abs(h64.numpy()) + 1e-300, "h")
    s = 1 / (1 + np.exp(-g.astype(np.float64)))
    mag = np.abs(dh.astype(np.float64) * u) * s * (1 + np.abs(g) * (1 - s))
    within(dg, rg, 8 * U * mag + 1e-300, "dgate")
    within(du, ru, 3 * U * np.abs(ru.numpy()) + 1e-300, "dup")
    tg_, tu = torch.from_numpy(g).requires_grad_(True), torch.from_numpy(u).requires_grad_(True)
    th = bt.swiglu(tg_, tu)
    th.backward(torch.from_numpy(dh))
    assert same(h, th) and same(dg, tg_.grad) and same(du, tu.grad)
    # the MLP (one node), bounds of chains of H, I, C terms with 8x margin
    Hd, Id, C = 12, 20, 4
    x, dy = rnd(T, Hd, seed=10), rnd(T, Hd, seed=11)
    mlp = bp.SwiGLUMLP(Hd, Id)
    xi, out = pt(x, True), {}

    def fn():
        out["y"] = mlp(xi)
        return (out["y"] * pt(dy)).sum()
    two_pass(list(mlp.parameters()), fn, T, C, [xi])
    ws = [pt(p.numpy(), True, "float64") for p in mlp.parameters()]
    x64 = pt(x, True, "float64")
    y64 = PM._lin(PF.silu(PM._lin(x64, ws[0])) * PM._lin(x64, ws[1]), ws[2])
    refs = paddle.grad([y64], [x64] + ws, [pt(dy, dtype="float64")])
    scale = 8 * (Hd + Id + C) * U
    for got, ref, what in zip([out["y"], xi.grad] + [p.grad for p in mlp.parameters()],
                              [y64] + list(refs), ["y", "dx", "dgate", "dup", "ddown"]):
        within(got, ref, scale * np.abs(ref.numpy()).max(), f"mlp {what}")
    # embedding: a copy; the gradient per-chunk fp32 row sums
    Vv, He = 10, 6
    ids = np.random.default_rng(1).integers(0, Vv, T)
    emb = bp.Embedding(Vv, He)
    dy = rnd(T, He, seed=12)

    def fe():
        out["e"] = emb(pt(ids))
        return (out["e"] * pt(dy)).sum()
    two_pass([emb.weight], fe, T, C)
    assert same(out["e"], PF.embedding(pt(ids), emb.weight.detach()))
    ref, mag = np.zeros((Vv, He)), np.zeros((Vv, He))
    np.add.at(ref, ids, dy.astype(np.float64))
    np.add.at(mag, ids, np.abs(dy.astype(np.float64)))
    within(emb.weight.grad, paddle.to_tensor(ref), (C + 2) * U * mag, "embedding dweight")
    # cross-entropy: the mean over valid targets (one ignored)
    z, tg = rnd(T, Vv, seed=13, scale=2), np.random.default_rng(2).integers(0, Vv, T)
    tg[3] = -100
    zi = pt(z, True)
    loss = bp.cross_entropy(zi, pt(tg))
    (dz,) = paddle.grad([loss], [zi])
    z64 = pt(z, True, "float64")
    # the mean over the T - 1 valid targets (Paddle 3.3.1's reduction="mean"
    # with ignore_index divides by all T targets: measured 15/16 of this)
    l64 = PF.cross_entropy(z64, pt(tg), ignore_index=-100, reduction="sum") / (T - 1)
    (rz,) = paddle.grad([l64], [z64])
    lt = np.abs(PF.cross_entropy(pt(z, dtype="float64"), pt(tg), reduction="none").numpy())
    within(loss, l64, (T + 8) * U * lt.sum() / (T - 1), "loss")
    p = PF.softmax(pt(z, dtype="float64"), -1).numpy()
    within(dz, rz, 4 * U * (p + 1) / (T - 1), "dlogits")
    tz = torch.from_numpy(z).requires_grad_(True)
    tl = bt.cross_entropy(tz, torch.from_numpy(tg))
    tl.backward()
    assert same(loss, tl) and same(dz, tz.grad)


def test_rope_attention_match():
    T, Lq, hq, hkv, d = 16, 8, 4, 2, 6
    pos = np.tile(np.arange(Lq, dtype=np.int64), T // Lq)
    q, k, v, do = rnd(T, hq * d, seed=14), rnd(T, hkv * d, seed=15), rnd(T, hkv * d, seed=16), \
        rnd(T, hq * d, seed=17)
    qi = pt(q, True)
    y = bp.rope(qi, pt(pos), d)
    (dq,) = paddle.grad([y], [qi], [pt(do)])
    q64 = pt(q, True, "float64")
    y64 = PM.native_rope(q64, pt(pos), d)
    (rq,) = paddle.grad([y64], [q64], [pt(do, dtype="float64")])
    within(y, y64, 8 * U * (1 + Lq) * 2 * np.abs(q).max(), "rope y")
    within(dq, rq, 8 * U * (1 + Lq) * 2 * np.abs(do).max(), "rope dx")
    ins = [pt(t, True) for t in (q, k, v)]
    o = bp.causal_attention(*ins, Lq, hq, hkv, d)
    gs = paddle.grad([o], ins, [pt(do)])
    i64 = [pt(t, True, "float64") for t in (q, k, v)]
    o64 = PM.native_causal(*i64, Lq, hq, hkv, d)
    rs = paddle.grad([o64], i64, [pt(do, dtype="float64")])
    b = 16 * (Lq + d) * U
    within(o, o64, b * np.abs(o64.numpy()).max(), "attention o")
    for g, r, n in zip(gs, rs, "qkv"):
        within(g, r, 4 * b * np.abs(r.numpy()).max(), f"attention d{n}")
    tins = [torch.from_numpy(t).requires_grad_(True) for t in (q, k, v)]
    to = bt.causal_attention(*tins, Lq, hq, hkv, d)
    to.backward(torch.from_numpy(do))
    assert same(o, to) and all(same(g, t.grad) for g, t in zip(gs, tins))


# ---- input gradients: central differences in fp32 (paddle.grad) ----------

# fp32 central difference, eps = 2^-7: rounding ~ u |f| / eps ~ 1e-5,
# truncation ~ eps^2 |f'''| / 6 ~ 1e-5 (values O(1)); atol = rtol = 2e-3
# leaves a 100x margin, while a 5% error of the gradient fails (below).
EPS, TOL = 2.0 ** -7, 2e-3


def central_ok(fn, *arrays, wrong=1.0):
    """fn(*tensors) -> output; f = sum(output * r) with a fixed random r;
    analytic paddle.grad (times `wrong` for the control) vs central
    differences of every input element."""
    ts = [pt(a, True) for a in arrays]
    out = fn(*ts)
    r = pt(rnd(*out.shape, seed=99))
    grads = paddle.grad([(out * r).sum()], ts)
    for a, g in zip(arrays, grads):
        g = g.numpy().astype(np.float64) * wrong
        num = np.zeros(a.size)
        for i in range(a.size):
            vals = []
            for sgn in (1, -1):
                b = [c.copy() for c in arrays]
                b[[id(c) for c in arrays].index(id(a))].reshape(-1)[i] += sgn * EPS
                with paddle.no_grad():
                    vals.append(float((fn(*[pt(c) for c in b]) * r).sum().astype("float64")))
            num[i] = (vals[0] - vals[1]) / (2 * EPS)
        if not np.allclose(g.reshape(-1), num, rtol=TOL, atol=TOL):
            return False
    return True


def test_central_differences():
    T, Kd, N = 4, 5, 3
    w, nw = pt(rnd(N, Kd, seed=20)), pt(1 + rnd(Kd, seed=22, scale=0.2))
    x = rnd(T, Kd, seed=21)
    assert central_ok(lambda a: bp.linear(a, w), x)
    assert central_ok(lambda a: bp.rms_norm(a, nw), x)
    assert central_ok(bp.swiglu, rnd(T, N, seed=23), rnd(T, N, seed=24))
    wg, wu, wd = pt(rnd(6, Kd, seed=25)), pt(rnd(6, Kd, seed=26)), pt(rnd(Kd, 6, seed=27))
    assert central_ok(lambda a: bp.swiglu_mlp(a, wg, wu, wd), x)
    tg = pt(np.array([1, 6, -100, 0]))
    assert central_ok(lambda a: bp.cross_entropy(a, tg).reshape([1]), rnd(T, 7, seed=28))
    pos = pt(np.arange(T, dtype=np.int64))
    assert central_ok(lambda a: bp.rope(a, pos, 4), rnd(T, 8, seed=29))
    assert central_ok(lambda a, b, c: bp.causal_attention(a, b, c, 2, 2, 2, 3),
                      *(rnd(T, 6, seed=s) for s in (30, 31, 32)))
    wq, wk, wv = (pt(rnd(n, Kd, seed=s)) for n, s in ((4, 33), (2, 34), (2, 35)))
    assert central_ok(lambda a: paddle.concat(bp.qkv_projection(a, wq, wk, wv), -1), x)
    # the check fails a 5% wrong gradient
    assert not central_ok(bp.swiglu, rnd(T, N, seed=23), rnd(T, N, seed=24), wrong=1.05)


# ---- (b) THE cross-framework test ------------------------------------------

@pytest.fixture(scope="module")
def torch_reference():
    return TM.train_bitexact(1, 1)


def _same_run(a, b):
    return all(len(ra) == len(rb) and all(same(x, y) for x, y in zip(ra, rb))
               for ra, rb in zip(a, b))


@pytest.mark.parametrize("micro_batches,threads", [(1, 1), (2, 1), (2, 2), (4, 2)])
def test_paddle_model_bit_identical_to_torch(torch_reference, micro_batches, threads):
    """The tiny model in Paddle (bitexact.paddle layers, AdamW through
    bitexact.kernels.adamw_step), the torch model's initial weights and
    data: per-step losses, last gradients and parameters after M.STEPS
    steps are byte-identical to the torch model's (1 micro-batch, 1 thread)."""
    run = PM.train_bitexact(micro_batches, threads)
    assert len(run[0]) == TM.STEPS and len(run[1]) == 12
    assert all(np.abs(g).max() > 0 for g in run[1])
    init = [p.detach().numpy() for p in TM.Tiny().parameters()]
    assert not any(same(p, q) for p, q in zip(run[2], init))  # every parameter trained
    assert _same_run(run, torch_reference)


def test_native_frameworks_differ(torch_reference):
    """The negative control: the same model, weights and data with each
    framework's native ops and AdamW: torch and Paddle differ in bits after
    the steps (and Paddle differs between micro-batchings), while agreeing
    with each other and with bitexact to fp32 accuracy."""
    tn, pn = TM.train_native(1, 1), PM.train_native(1)
    diff_g = sum(not same(p, t) for p, t in zip(pn[1], tn[1]))
    diff_p = sum(not same(p, t) for p, t in zip(pn[2], tn[2]))
    assert diff_g > 0 and diff_p > 0, (diff_g, diff_p)
    pn2 = PM.train_native(2)
    assert not _same_run(pn2, pn)
    for a, b, r in zip(pn[1], tn[1], torch_reference[1]):
        scale = float(np.abs(r.numpy()).max())
        assert np.abs(a - b.numpy()).max() <= 1e-4 * scale
        assert np.abs(a - r.numpy()).max() <= 1e-4 * scale


# ---- (d) two ranks over paddle.distributed (gloo, CPU) -----------------------

def test_two_ranks_paddle_distributed(torch_reference):
    """paddle.distributed.launch, 2 CPU processes (gloo): each rank half
    the sequences (2 micro-batches), the int64 words all-reduced through
    bitexact.paddle.comm(); every rank = the 1-process torch run."""
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, PADDLE_DISTRI_BACKEND="gloo",
                   PYTHONPATH=os.pathsep.join(p for p in [HERE, os.environ.get("PYTHONPATH")] if p))
        cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2",
               "--log_dir", os.path.join(d, "log"), os.path.join(HERE, "paddle_layers_model.py"),
               d, "2"]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        logs = "".join(open(os.path.join(d, "log", f)).read()[-3000:]
                       for f in sorted(os.listdir(os.path.join(d, "log")))) if os.path.isdir(
            os.path.join(d, "log")) else ""
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:] + logs
        res = [np.load(os.path.join(d, f"rank{r}.npy"), allow_pickle=True).item() for r in range(2)]
    for r, o in enumerate(res):
        assert "exception" not in o, f"rank {r}:\n{o['exception']}"
        assert _same_run(o["run"], torch_reference), f"rank {r}"


# ---- (e) bad input and protocol misuse -------------------------------------

def _tiny():
    lin = bp.Linear(4, 3)
    return lin, bp.GradReduction(lin.named_parameters(), 2, 4)


@pytest.mark.parametrize("make,exc,arg", [
    (lambda: paddle.ones([4, 4], dtype="float64"), bitexact.DTypeError, "input"),
    (lambda: paddle.ones([4, 5]), bitexact.InvalidArgumentError, "input"),
    (lambda: paddle.ones([4, 4], dtype="int32"), bitexact.DTypeError, "input"),
    (lambda: torch.ones(4, 4), bitexact.InvalidArgumentError, "input"),
    (lambda: [[1.0] * 4] * 4, bitexact.InvalidArgumentError, "input"),
])
def test_bad_input_named(make, exc, arg):
    lin, red = _tiny()
    w0 = lin.weight.numpy().copy()
    red.begin()
    with red.micro_batch(0, 4):
        with pytest.raises(exc) as ei:
            lin(make())
    assert ei.value.argument == arg and f"'{arg}'" in str(ei.value)
    assert same(lin.weight, w0) and lin.weight.grad is None


def test_bad_input_other_ops():
    with pytest.raises(bitexact.DTypeError, match="'weight'"):
        bp.rms_norm(paddle.ones([2, 3]), paddle.ones([3], dtype="float16"))
    with pytest.raises(bitexact.DTypeError, match="'input'"):
        bp.embedding(paddle.ones([3]), paddle.ones([5, 2]))
    with pytest.raises(bitexact.InvalidArgumentError, match="'target'"):
        bp.cross_entropy(paddle.ones([4, 3]), paddle.zeros([5], dtype="int64"))
    with pytest.raises(bitexact.InvalidArgumentError, match="'down_weight'"):
        bp.swiglu_mlp(paddle.ones([2, 3]), paddle.ones([4, 3]), paddle.ones([4, 3]),
                      paddle.ones([4, 3]))
    with pytest.raises(bitexact.DTypeError, match="'positions'"):
        bp.rope(paddle.ones([2, 4]), paddle.zeros([2], dtype="int32"), 4)
    with pytest.raises(bitexact.InvalidArgumentError, match="'key'"):
        bp.causal_attention(paddle.ones([2, 4]), paddle.ones([4]), paddle.ones([2, 4]), 2, 2, 2, 2)
    with pytest.raises(bitexact.InvalidArgumentError, match="ids"):  # the kernel's own check
        bp.embedding(paddle.to_tensor([0, 9]), paddle.ones([5, 4]))
    p = paddle.create_parameter([3], "float32")
    p.stop_gradient = True
    with pytest.raises(bitexact.InvalidArgumentError, match="stop_gradient"):
        bp.GradReduction([p], 2, 4)
    with pytest.raises(bitexact.DTypeError, match="parameters"):
        bp.GradReduction([paddle.create_parameter([3], "float64")], 2, 4)


def test_protocol_misuse():
    lin, red = _tiny()
    x = paddle.ones([4, 4])
    with pytest.raises(bitexact.InvalidArgumentError, match="begin"):
        with red.micro_batch(0, 4):
            pass
    with pytest.raises(bitexact.InvalidArgumentError, match="no GradReduction"):
        lin(x)  # a trainable weight outside a micro-batch
    with paddle.no_grad():
        lin(x)  # fine without grad
    with pytest.raises(bitexact.InvalidArgumentError, match="phase 'idle'"):
        red.finish()
    red.begin()
    with pytest.raises(bitexact.InvalidArgumentError, match="phase 'bound'"):
        red.finish()
    with pytest.raises(bitexact.LayoutError, match="whole chunks"):
        with red.micro_batch(1, 2):
            pass
    with red.micro_batch(0, 4):
        y = lin(x)
        with pytest.raises(bitexact.InvalidArgumentError, match="used twice"):
            lin(x)
        with pytest.raises(bitexact.InvalidArgumentError, match="3 token rows"):
            bp.linear(paddle.ones([3, 4]), lin.weight)
    y.sum().backward()
    red.agree()
    with pytest.raises(bitexact.InvalidArgumentError, match="phase 'add'"):
        red.agree()
    with pytest.raises(bitexact.InvalidArgumentError, match="repeat pass 0"):
        with red.micro_batch(0, 2):
            pass
    with red.micro_batch(0, 4):
        y1 = lin(x)
    y1.sum().backward()
    red.finish()
    assert same(lin.weight.grad, np.full((3, 4), 4.0, np.float32))  # 4 tokens of 1 * 1
    with pytest.raises(bitexact.InvalidArgumentError, match="phase 'done'"):
        red.finish()


def test_stale_backward():
    """A backward of pass 0's graph run in pass 1 is refused before any
    work. Paddle turns an exception raised in a PyLayer's backward into
    its own OSError ("(External) ... InvalidArgumentError: ..."), so the
    type is Paddle's, the message bitexact's. (Paddle 3.3.1 segfaults on
    a second backward of a PyLayer graph kept by retain_graph, with or
    without bitexact, so the stale graph here is one never run.)"""
    a, b = bp.Linear(4, 3), bp.Linear(4, 3)
    red = bp.GradReduction(list(a.named_parameters()) + [("b", b.weight)], 2, 4)
    x = paddle.ones([4, 4])
    red.begin()
    with red.micro_batch(0, 4):
        ya, stale = a(x), b(x)
    ya.sum().backward()  # b's bound left out: pass 0 of b never runs
    red.agree()
    with red.micro_batch(0, 4):
        a(x).sum().backward()
    with pytest.raises(OSError, match="InvalidArgumentError.*finished pass"):
        stale.sum().backward()
    assert a.weight.grad is None and b.weight.grad is None and red.phase == "add"


def test_incomplete_step_writes_nothing():
    lin = bp.Linear(4, 3)
    red = bp.GradReduction(lin.named_parameters(), 2, 8)
    lin.weight.grad = paddle.full([3, 4], 7.0)

    def step(i):
        lin(paddle.ones([4, 4])).sum().backward()
    with pytest.raises(bitexact.LayoutError, match=r"tensor 0 \(weight\).*added 0 times"):
        red.run_two_pass(step, [(0, 4)])  # tokens [4, 8) never run
    assert same(lin.weight.grad, np.full((3, 4), 7.0, np.float32))
    assert red.count_targets(paddle.to_tensor([1, -100, 3])) == 2


def test_to_static_refused_by_name():
    """paddle.jit.to_static(full_graph=True): the layers see the program's
    static Values and refuse them, named (not a failure inside Paddle's
    translator)."""
    f = paddle.jit.to_static(bp.Linear(4, 3), full_graph=True)
    with pytest.raises(bitexact.InvalidArgumentError, match="static-graph .* dynamic graph only"):
        f(paddle.ones([2, 4]))
