"""bitexact.torch's layers (python/bitexact/torch/_layers.py): each op
against torch autograd of the same formula in fp64 (fp32 error bounds of
the kernels' fixed orders), gradcheck of the input gradients in fp32,
byte-identical training over micro-batchings / threads / 2 gloo ranks
with a measured negative control, bad input and protocol misuse."""
import os
import tempfile
import warnings

import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F

import bitexact
import bitexact.torch as bt
import torch_layers_model as M
from helpers import same_bits

U = 2.0 ** -24  # the fp32 unit roundoff
D64 = torch.float64


def rnd(*shape, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).float()


def within(got, ref, bound, what):
    """|got - ref| <= bound elementwise (ref, bound fp64); and the bound is
    not vacuous: far below the values' own size."""
    ref, bound = ref.detach(), bound.detach()
    err = (got.double() - ref).abs()
    assert bool((err <= bound).all()), f"{what}: worst excess {float((err - bound).max())}"
    assert float(bound.max()) <= 1e-4 * max(float(ref.abs().max()), 1e-30), what


def one_step(params, fn, T, seq_len, leaves=()):
    """fn() -> a scalar to backward, through a GradReduction over params
    holding T tokens, 1 micro-batch. The plain leaves (inputs) get torch's
    gradient in each pass: reset before each."""
    red = bt.GradReduction(params, seq_len, T)

    def step(i):
        for t in leaves:
            t.grad = None
        fn().backward()
    red.run_two_pass(step, [(0, T)])
    return [p.grad for p in params]


# ---- (a) each op against fp64 torch autograd of the same formula ----------

def test_linear_matches_fp64():
    # y = x W^T: one fmaf chain of K terms per element, error <= (K+1) u
    # sum|x||w| (a standard fp32 chain bound; fmaf rounds once per step);
    # dx the same over N, dW over the chunk's C tokens (partials on the grid
    # are exact here: the 2^-40 grid error is far below the bound).
    T, K, N, C = 24, 40, 12, 8
    x, w, dy = rnd(T, K, seed=1), rnd(N, K, seed=2), rnd(T, N, seed=3)
    xi = x.clone().requires_grad_(True)
    wp = torch.nn.Parameter(w.clone())
    red = bt.GradReduction([wp], C, T)
    out = {}

    def step(i):
        xi.grad = None  # a plain leaf gets torch's gradient in each pass
        y = bt.linear(xi, wp)
        y.backward(dy)
        out["y"] = y.detach()
    red.run_two_pass(step, [(0, T)])
    x64, w64, d64 = x.double().requires_grad_(True), w.double().requires_grad_(True), dy.double()
    y64 = x64 @ w64.T
    y64.backward(d64)
    within(out["y"], y64.detach(), (K + 1) * U * (x.double().abs() @ w.double().abs().T), "y")
    within(xi.grad, x64.grad, (N + 1) * U * (dy.double().abs() @ w.double().abs()), "dx")
    within(wp.grad, w64.grad, (C + 2) * U * (dy.double().abs().T @ x.double().abs()), "dW")


def test_rmsnorm_matches_fp64():
    # forward: H-term sum of squares (H u), rsqrt and two products (a few u):
    # relative (H/2 + 6) u per element; backward: dx has one H-term dot and a
    # cancellation g - xhat m, bounded by (H + 8) u rstd (|g| + |xhat m|) in
    # magnitude; dweight: C-term chains per chunk.
    T, Hd, C, eps = 16, 24, 4, 1e-6
    x, w, dy = rnd(T, Hd, seed=4), 1 + rnd(Hd, seed=5, scale=0.3), rnd(T, Hd, seed=6)
    xi, wp = x.clone().requires_grad_(True), torch.nn.Parameter(w.clone())
    out = {}

    def fn():
        out["y"] = bt.rms_norm(xi, wp, eps)
        return _Dot.apply(out["y"], dy)
    one_step([wp], fn, T, C, [xi])
    x64, w64 = x.double().requires_grad_(True), w.double().requires_grad_(True)
    rstd = torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)
    y64 = x64 * rstd * w64
    y64.backward(dy.double())
    within(out["y"].detach(), y64.detach(), (Hd / 2 + 6) * U * y64.detach().abs() + 1e-30, "y")
    xhat = (x64 * rstd).detach()
    g = dy.double() * w.double()
    mag = rstd.detach() * (g.abs() + xhat.abs() * (g * xhat).abs().mean(-1, keepdim=True))
    within(xi.grad, x64.grad, (Hd + 8) * U * mag, "dx")
    within(wp.grad, w64.grad, (C + 4) * U * (dy.double().abs() * xhat.abs()).sum(0), "dweight")


class _Dot(torch.autograd.Function):
    """backward(dy) of y without torch arithmetic: the scalar's grad is dy."""

    @staticmethod
    def forward(ctx, y, dy):
        ctx.save_for_backward(dy)
        return y.new_zeros(())

    @staticmethod
    def backward(ctx, _):
        return ctx.saved_tensors[0], None


def test_swiglu_and_mlp_match_fp64():
    # swiglu: SiLU correctly rounded, one product: 2u relative; backward:
    # five roundings on magnitudes |dh u| s (1 + |g|(1-s)): 8u of that.
    T, F_ = 16, 20
    g, u, dh = rnd(T, F_, seed=7, scale=3), rnd(T, F_, seed=8), rnd(T, F_, seed=9)
    gi, ui = g.clone().requires_grad_(True), u.clone().requires_grad_(True)
    h = bt.swiglu(gi, ui)
    h.backward(dh)
    g64, u64 = g.double().requires_grad_(True), u.double().requires_grad_(True)
    h64 = F.silu(g64) * u64
    h64.backward(dh.double())
    within(h.detach(), h64.detach(), 2 * U * h64.detach().abs() + 1e-300, "h")
    s = torch.sigmoid(g.double())
    mag = (dh.double() * u.double()).abs() * s * (1 + g.double().abs() * (1 - s))
    within(gi.grad, g64.grad, 8 * U * mag + 1e-300, "dgate")
    within(ui.grad, u64.grad, 3 * U * u64.grad.abs() + 1e-300, "dup")
    # the MLP: compare with fp64 autograd; bounds from chains of H, I, T terms
    Hd, Id, C = 12, 20, 4
    x, dy = rnd(T, Hd, seed=10), rnd(T, Hd, seed=11)
    mlp = bt.SwiGLUMLP(Hd, Id)
    xi = x.clone().requires_grad_(True)
    out = {}

    def fn():
        out["y"] = mlp(xi)
        return _Dot.apply(out["y"], dy)
    one_step(list(mlp.parameters()), fn, T, C, [xi])
    ws = [p.detach().double().requires_grad_(True) for p in mlp.parameters()]
    x64 = x.double().requires_grad_(True)
    y64 = F.linear(F.silu(F.linear(x64, ws[0])) * F.linear(x64, ws[1]), ws[2])
    y64.backward(dy.double())
    scale = 8 * (Hd + Id + C) * U  # composed chains of H, I and C terms, 8x margin
    within(out["y"].detach(), y64.detach(), scale * y64.detach().abs().max() + 0 * y64, "mlp y")
    within(xi.grad, x64.grad, scale * x64.grad.abs().max() + 0 * x64.grad, "mlp dx")
    for p, w in zip(mlp.parameters(), ws):
        within(p.grad, w.grad, scale * w.grad.abs().max() + 0 * w.grad, "mlp dW")


def test_embedding_and_xent_match():
    T, V, Hd, C = 16, 10, 6, 4
    ids = torch.randint(0, V, (T,), generator=torch.Generator().manual_seed(1))
    emb = bt.Embedding(V, Hd)
    dy = rnd(T, Hd, seed=12)
    out = {}

    def fn():
        out["y"] = emb(ids)
        return _Dot.apply(out["y"], dy)
    one_step([emb.weight], fn, T, C)
    assert same_bits(out["y"].detach(), F.embedding(ids, emb.weight.detach()))  # a copy
    ref = torch.zeros(V, Hd, dtype=D64).index_add_(0, ids, dy.double())
    mag = torch.zeros(V, Hd, dtype=D64).index_add_(0, ids, dy.double().abs())
    within(emb.weight.grad, ref, (C + 2) * U * mag, "dweight")  # per-chunk fp32 row sums
    # cross-entropy: the mean over valid targets (one ignored), vs fp64
    z, tg = rnd(T, V, seed=13, scale=2), torch.randint(0, V, (T,))
    tg[3] = -100
    zi = z.clone().requires_grad_(True)
    loss = bt.cross_entropy(zi, tg)
    loss.backward()
    z64 = z.double().requires_grad_(True)
    l64 = F.cross_entropy(z64, tg)
    l64.backward()
    lt = F.cross_entropy(z.double(), tg, reduction="none").abs()
    # per-token loss 4u relative (+ ln S's 2^-52), the fp32 chunk sum T u of
    # the sum, one rounding of the mean; dlogits two roundings of p - [v=y]
    within(loss.detach(), l64.detach(), (T + 8) * U * lt.sum() / (T - 1), "loss")
    p = torch.softmax(z.double(), -1)
    within(zi.grad, z64.grad, 4 * U * (p + 1) / (T - 1), "dlogits")
    zs = z.clone().requires_grad_(True)  # an upstream gradient (grad_scale)
    (bt.cross_entropy(zs, tg) * 3).backward()
    within(zs.grad, 3 * z64.grad, 12 * U * (p + 1) / (T - 1), "dlogits x3")


def test_rope_and_attention_match_fp64():
    T, Lq, hq, hkv, d = 16, 8, 4, 2, 6
    pos = torch.arange(Lq, dtype=torch.int64).repeat(T // Lq)
    q, k, v, do = rnd(T, hq * d, seed=14), rnd(T, hkv * d, seed=15), rnd(T, hkv * d, seed=16), \
        rnd(T, hq * d, seed=17)
    qi = q.clone().requires_grad_(True)
    y = bt.rope(qi, pos, d)
    y.backward(do)
    q64 = q.double().requires_grad_(True)
    y64 = M.native_rope(q64, pos, d)
    y64.backward(do.double())
    # cos/sin correctly rounded of an angle carrying ~3u relative error
    # (inverse frequency, product): error <= 8u (1 + max angle) (|a| + |b|)
    a = 8 * U * (1 + Lq) * 2 * q.double().abs().max()
    within(y.detach(), y64.detach(), a + 0 * y64, "rope y")
    within(qi.grad, q64.grad, 8 * U * (1 + Lq) * 2 * do.double().abs().max() + 0 * q64.grad, "rope dx")
    ins = [t.clone().requires_grad_(True) for t in (q, k, v)]
    o = bt.causal_attention(*ins, Lq, hq, hkv, d)
    o.backward(do)
    i64 = [t.double().requires_grad_(True) for t in (q, k, v)]
    o64 = M.native_causal(*i64, Lq, hq, hkv, d)
    o64.backward(do.double())
    b = 16 * (Lq + d) * U  # dot chains of d, softmax sums of Lq, p v chains of Lq
    within(o.detach(), o64.detach(), b * o64.detach().abs().max() + 0 * o64, "attention o")
    for g, r, n in zip(ins, i64, "qkv"):
        within(g.grad, r.grad, 4 * b * r.grad.abs().max() + 0 * r.grad, f"attention d{n}")


# ---- (b) input gradients: central differences in fp32 ---------------------

# gradcheck's central difference in fp32: rounding error ~ u |f| / eps,
# truncation ~ eps^2 |f'''| / 6; with eps = 2^-7 and |f|, |f'''| = O(1):
# ~1e-5 and ~1e-5; atol = rtol = 2e-3 leaves a 100x margin while a 5% error
# of the analytical gradient fails (checked below with a wrong backward).
GC = dict(eps=2.0 ** -7, atol=2e-3, rtol=2e-3, nondet_tol=0.0)


def _gradcheck(fn, *inputs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "not double precision": fp32 kernels on purpose
        return torch.autograd.gradcheck(fn, inputs, raise_exception=False, **GC)


def test_gradcheck_inputs():
    T, Kd, N = 4, 5, 3
    w = rnd(N, Kd, seed=20)
    x = rnd(T, Kd, seed=21).requires_grad_(True)
    assert _gradcheck(lambda a: bt.linear(a, w), x)
    nw = 1 + rnd(Kd, seed=22, scale=0.2)
    assert _gradcheck(lambda a: bt.rms_norm(a, nw), x)
    g, u = rnd(T, N, seed=23).requires_grad_(True), rnd(T, N, seed=24).requires_grad_(True)
    assert _gradcheck(bt.swiglu, g, u)
    wg, wu, wd = rnd(6, Kd, seed=25), rnd(6, Kd, seed=26), rnd(Kd, 6, seed=27)
    assert _gradcheck(lambda a: bt.swiglu_mlp(a, wg, wu, wd), x)
    z, tg = rnd(T, 7, seed=28).requires_grad_(True), torch.tensor([1, 6, -100, 0])
    assert _gradcheck(lambda a: bt.cross_entropy(a, tg), z)
    pos = torch.arange(T, dtype=torch.int64)
    qx = rnd(T, 8, seed=29).requires_grad_(True)
    assert _gradcheck(lambda a: bt.rope(a, pos, 4), qx)
    q, k, v = (rnd(T, 2 * 3, seed=s).requires_grad_(True) for s in (30, 31, 32))
    assert _gradcheck(lambda a, b, c: bt.causal_attention(a, b, c, 2, 2, 2, 3), q, k, v)


def test_gradcheck_catches_a_wrong_gradient():
    class Wrong(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b):
            ctx.save_for_backward(a, b)
            return bt.swiglu(a, b)

        @staticmethod
        def backward(ctx, dh):
            a, b = ctx.saved_tensors
            with torch.enable_grad():
                a2, b2 = a.detach().requires_grad_(True), b.detach().requires_grad_(True)
                ga, gb = torch.autograd.grad(bt.swiglu(a2, b2), (a2, b2), dh)
            return ga * 1.05, gb
    g, u = rnd(4, 3, seed=23).requires_grad_(True), rnd(4, 3, seed=24).requires_grad_(True)
    assert not _gradcheck(Wrong.apply, g, u)


# ---- (c) layout invariance, with the negative control measured ------------

@pytest.fixture(scope="module")
def reference():
    return M.train_bitexact(1, 1)


def _same_run(a, b):
    return all(all(same_bits(x, y) for x, y in zip(ra, rb)) for ra, rb in zip(a, b))


@pytest.mark.parametrize("micro_batches,threads", [(1, 2), (2, 1), (2, 2), (4, 1), (4, 2), (8, 1)])
def test_layout_invariance(reference, micro_batches, threads):
    """Losses of every step, the last gradients and the parameters after
    M.STEPS AdamW steps (bitexact.kernels.adamw_step): byte-identical."""
    run = M.train_bitexact(micro_batches, threads)
    assert len(run[1]) == 12 and all(g.abs().max() > 0 for g in run[1])
    assert _same_run(run, reference)


def test_layout_native_torch_differs(reference):
    """The negative control: the same model, data and step with plain
    torch modules (gradient accumulation, torch.optim.AdamW) changes bits
    with the micro-batching; it agrees with bitexact to fp32 accuracy."""
    base = M.train_native(1, 1)
    runs = {(mb, th): M.train_native(mb, th) for mb, th in [(2, 1), (4, 2), (8, 1)]}
    differing = {k: sum(not same_bits(a, b) for a, b in zip(r[1], base[1])) for k, r in runs.items()}
    assert all(n > 0 for n in differing.values()), differing  # measured: all 12 grads differ
    assert not any(_same_run(r, base) for r in runs.values())
    for a, b in zip(reference[1], base[1]):  # same formulas: close, not equal
        assert float((a - b).abs().max()) <= 1e-5 * float(b.abs().max())


# ---- (d) two gloo processes (data parallel) -------------------------------

@pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                    reason="torch.distributed with gloo is not available")
def test_two_ranks_data_parallel(reference):
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(M.worker, args=(2, d, 2), nprocs=2, join=True)
        res = [torch.load(os.path.join(d, f"rank{r}.pt"), weights_only=False) for r in range(2)]
    for r, o in enumerate(res):
        assert "exception" not in o, f"rank {r}:\n{o['exception']}"
        assert _same_run(o["run"], reference), f"rank {r}, 2 micro-batches"
        assert _same_run(o["group"], reference), f"rank {r}, process group, 2 threads"


# ---- (e) bad input and protocol misuse -------------------------------------

def _tiny():
    lin = bt.Linear(4, 3)
    return lin, bt.GradReduction([lin.weight], 2, 4)


@pytest.mark.parametrize("make,exc,arg", [
    (lambda: torch.ones(4, 4, dtype=D64), bitexact.DTypeError, "input"),
    (lambda: torch.ones(4, 5), bitexact.InvalidArgumentError, "input"),
    (lambda: torch.ones(4, 4, device="meta"), bitexact.DeviceError, "input"),
    (lambda: [[1.0] * 4] * 4, bitexact.InvalidArgumentError, "input"),
])
def test_bad_input_named(make, exc, arg):
    lin, red = _tiny()
    w0 = lin.weight.detach().clone()
    red.begin()
    with red.micro_batch(0, 4):
        with pytest.raises(exc) as ei:
            lin(make())
    assert ei.value.argument == arg and f"'{arg}'" in str(ei.value)
    assert same_bits(lin.weight.detach(), w0) and lin.weight.grad is None


def test_bad_input_other_ops():
    with pytest.raises(bitexact.DTypeError, match="'weight'"):
        bt.rms_norm(torch.ones(2, 3), torch.ones(3, dtype=torch.float16))
    with pytest.raises(bitexact.DTypeError, match="'input'"):
        bt.embedding(torch.ones(3), torch.ones(5, 2))
    with pytest.raises(bitexact.InvalidArgumentError, match="'target'"):
        bt.cross_entropy(torch.ones(4, 3), torch.zeros(5, dtype=torch.int64))
    with pytest.raises(bitexact.InvalidArgumentError, match="'down_weight'"):
        bt.swiglu_mlp(torch.ones(2, 3), torch.ones(4, 3), torch.ones(4, 3), torch.ones(4, 3))
    with pytest.raises(bitexact.DeviceError, match="'key'"):
        q = torch.ones(2, 4)
        bt.causal_attention(q, torch.ones(2, 4, device="meta"), q, 2, 2, 2, 2)
    x = torch.ones(3, 4)  # a kernel's own check (id out of range): bitexact's error, named
    with pytest.raises(bitexact.InvalidArgumentError, match="ids"):
        bt.embedding(torch.tensor([0, 9]), torch.ones(5, 4))
    assert same_bits(x, torch.ones(3, 4))


def test_protocol_misuse():
    lin, red = _tiny()
    x = torch.ones(4, 4)
    with pytest.raises(bitexact.InvalidArgumentError, match="begin"):
        with red.micro_batch(0, 4):
            pass
    with pytest.raises(bitexact.InvalidArgumentError, match="no GradReduction"):
        lin(x)  # a trainable weight outside a micro-batch
    with torch.no_grad():
        lin(x)  # fine without grad
    with pytest.raises(bitexact.InvalidArgumentError, match="phase 'idle'"):
        red.finish()
    red.begin()
    with pytest.raises(bitexact.InvalidArgumentError, match="phase 'bound'"):
        red.finish()  # before agree
    with pytest.raises(bitexact.LayoutError, match="whole chunks"):
        with red.micro_batch(1, 2):
            pass
    with red.micro_batch(0, 4):
        y = lin(x)
        with pytest.raises(bitexact.InvalidArgumentError, match="used twice"):
            lin(x)
        with pytest.raises(bitexact.InvalidArgumentError, match="3 token rows"):
            bt.linear(torch.ones(3, 4), lin.weight)
    y.sum().backward(retain_graph=True)
    red.agree()
    with pytest.raises(bitexact.InvalidArgumentError, match="phase 'add'"):
        red.agree()
    with pytest.raises(bitexact.InvalidArgumentError, match="repeat pass 0"):
        with red.micro_batch(0, 2):
            pass
    with red.micro_batch(0, 4):
        y1 = lin(x)
    with pytest.raises(bitexact.InvalidArgumentError, match="finished pass"):
        y.sum().backward()  # pass 0's graph, run in pass 1
    y1.sum().backward()
    red.finish()
    g = lin.weight.grad.clone()
    assert same_bits(g, torch.full((3, 4), 4.0))  # sum over 4 tokens of 1 * 1
    with pytest.raises(bitexact.InvalidArgumentError, match="phase 'done'"):
        red.finish()  # twice


def test_incomplete_step_writes_nothing():
    """A step that misses a micro-batch (coverage) fails in finish naming the
    parameter; every .grad is unchanged."""
    lin = bt.Linear(4, 3)
    red = bt.GradReduction(lin.named_parameters(), 2, 8)
    lin.weight.grad = torch.full((3, 4), 7.0)
    before = lin.weight.grad.clone()

    def step(i):
        lin(torch.ones(4, 4)).sum().backward()
    with pytest.raises(bitexact.LayoutError, match=r"tensor 0 \(weight\).*added 0 times"):
        red.run_two_pass(step, [(0, 4)])  # tokens [4, 8) never run
    assert same_bits(lin.weight.grad, before)
    with pytest.raises(bitexact.InvalidArgumentError, match="phase 'failed'"):
        red.finish()
    red.begin()  # a new step works
    with red.micro_batch(0, 8):
        lin(torch.ones(8, 4)).sum().backward()
    red.agree()
    with red.micro_batch(0, 8):
        lin(torch.ones(8, 4)).sum().backward()
    red.finish()
    assert same_bits(lin.weight.grad, torch.full((3, 4), 8.0))


def test_reduction_arguments():
    w = torch.nn.Parameter(torch.ones(3))
    with pytest.raises(bitexact.DTypeError, match="parameters"):
        bt.GradReduction([torch.nn.Parameter(torch.ones(3, dtype=D64))], 2, 4)
    with pytest.raises(bitexact.InvalidArgumentError, match="again"):
        bt.GradReduction([w, w], 2, 4)
    with pytest.raises(bitexact.InvalidArgumentError, match="seq_len"):
        bt.GradReduction([w], 0, 4)
    other = bt.Linear(4, 3)
    lin, red = _tiny()
    red.begin()
    with red.micro_batch(0, 4):
        with pytest.raises(bitexact.InvalidArgumentError, match="not a parameter"):
            other(torch.ones(4, 4))
