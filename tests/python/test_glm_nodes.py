"""The model module's autograd nodes as the bindings call them
(bitexact._core.glm_*: src/glm/glm_node.h): each node's bits against the
same kernels composed by hand (bitexact.kernels, the reference of what the
node must order), its weight gradients through a TokRed against the
kernels' own partials, and its refusals: a bad argument is named, and a
failed call changes neither its outputs nor the gradient state."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import bitexact as bx  # noqa: E402
from bitexact import _core  # noqa: E402
from bitexact import kernels as k  # noqa: E402

G = torch.Generator().manual_seed(7)


def rnd(*shape):
    return torch.randn(*shape, generator=G, dtype=torch.float32)


def bits(t):
    return t.contiguous().view(torch.int32).clone()


def same(a, b):
    assert torch.equal(bits(a), bits(b))


def state(shapes, L=4, total=8):
    return k.TokRed([torch.empty(s) for s in shapes], L, total)


def run_two_pass(shapes, body, L=4, total=8):
    """A state over shapes; body(grads) once per pass (grads = the node's
    argument for the micro-batch of tokens [0, total)); the finished
    gradients."""
    s = state(shapes, L, total)
    body((s, 0, 0, 0))
    s.agree()
    body((s, 1, 0, 0))
    outs = [torch.empty(sh) for sh in shapes]
    s.finish(outs, 1)
    return outs


def bf16(t):
    return t.to(torch.bfloat16)


@pytest.mark.parametrize("use_bf16", [False, True])
def test_linear_forward_is_gemm_then_bias(use_bf16):
    x, w, b = rnd(8, 16), rnd(12, 16), rnd(12)
    wbf = bf16(w) if use_bf16 else None
    y = torch.empty(8, 12)
    _core.glm_linear_forward(x, w, wbf, b, y)
    ref = torch.empty(8, 12)
    k.gemm(bf16(x) if use_bf16 else x, wbf if use_bf16 else w, "nt", ref)
    ref.add_(b)
    same(y, ref)


@pytest.mark.parametrize("use_bf16", [False, True])
def test_linear_backward_dx_and_grads(use_bf16):
    x, w, dy = rnd(8, 16), rnd(12, 16), rnd(8, 12)
    wbf = bf16(w) if use_bf16 else None
    dx = torch.empty(8, 16)

    def node(grads):
        _core.glm_linear_backward(dy, x, w, wbf, dx, grads, 0, 1)
    gw, gb = run_two_pass([(12, 16), (12,)], node)
    ref_dx = torch.empty(8, 16)
    k.gemm(bf16(dy) if use_bf16 else dy, wbf if use_bf16 else w, "nn", ref_dx)
    same(dx, ref_dx)

    def kernels(grads):  # the weight's TN from rounded operands, the bias from fp32 dy
        s, p = grads[0], grads[1]
        f = k.linear_wgrad_bound if p == 0 else k.linear_wgrad
        if use_bf16:
            f(s, w_tensor=0, b_tensor=None, dy=bf16(dy), x=bf16(x), token_begin=0)
            f(s, w_tensor=None, b_tensor=1, dy=dy, x=None, token_begin=0)
        else:
            f(s, w_tensor=0, b_tensor=1, dy=dy, x=x, token_begin=0)
    rw, rb = run_two_pass([(12, 16), (12,)], kernels)
    same(gw, rw)
    same(gb, rb)


def test_qkv_backward_is_one_chain():
    x = rnd(8, 16)
    ws = [rnd(16, 16), rnd(8, 16), rnd(8, 16)]
    ds = [rnd(8, 16), rnd(8, 8), rnd(8, 8)]
    dx = torch.empty(8, 16)
    _core.glm_qkv_backward(*ds, x, *ws, None, None, None, dx, None, (-1,) * 6)
    ref = torch.empty(8, 16)
    for j, (d, w) in enumerate(zip(ds, ws)):
        k.gemm(d, w, "nn", ref, accumulate=j > 0)
    same(dx, ref)
    ys = [torch.empty(8, w.shape[0]) for w in ws]
    _core.glm_qkv_forward(x, *ws, None, None, None, None, None, None, *ys)
    for y, w in zip(ys, ws):
        r = torch.empty_like(y)
        k.gemm(x, w, "nt", r)
        same(y, r)


def test_mlp_nodes_match_kernels():
    T, H, I = 8, 16, 24
    x, wg, wu, wd, dy = rnd(T, H), rnd(I, H), rnd(I, H), rnd(H, I), rnd(T, H)
    g, u, a, y = torch.empty(T, I), torch.empty(T, I), torch.empty(T, I), torch.empty(T, H)
    _core.glm_mlp_forward(x, wg, wu, wd, None, None, None, g, u, a, y)
    rg, ru, ra, ry = (torch.empty_like(t) for t in (g, u, a, y))
    k.gemm(x, wg, "nt", rg)
    k.gemm(x, wu, "nt", ru)
    k.swiglu_forward(rg, ru, ra)
    k.gemm(ra, wd, "nt", ry)
    for p, q in ((g, rg), (u, ru), (a, ra), (y, ry)):
        same(p, q)
    da, dg, du, dx = torch.empty(T, I), torch.empty(T, I), torch.empty(T, I), torch.empty(T, H)
    _core.glm_mlp_backward(dy, x, g, u, a, wg, wu, wd, None, None, None, da, dg, du, dx, None,
                           (-1, -1, -1))
    rda, rdg, rdu, rdx = (torch.empty_like(t) for t in (da, dg, du, dx))
    k.gemm(dy, wd, "nn", rda)
    k.swiglu_backward(g, u, rda, rdg, rdu)
    k.gemm(rdg, wg, "nn", rdx)
    k.gemm(rdu, wu, "nn", rdx, accumulate=True)
    same(dx, rdx)
    same(dg, rdg)


def test_rmsnorm_backward_partials():
    x, w, dy = rnd(8, 16), rnd(16), rnd(8, 16)
    yy, rstd = torch.empty(8, 16), torch.empty(8)
    k.rmsnorm_forward(x, w, 1e-6, yy, rstd)
    dx, parts = torch.empty(8, 16), torch.empty(2, 16)

    def node(grads):
        _core.glm_rmsnorm_backward(x, w, dy, rstd, 4, dx, parts, grads, 0)
    (gw,) = run_two_pass([(16,)], node)
    rdx, rparts = torch.empty(8, 16), torch.empty(2, 16)
    k.rmsnorm_backward(x, w, dy, rstd, 4, rdx, rparts)
    same(dx, rdx)

    def kernels(grads):
        s, p = grads[0], grads[1]
        for j in range(2):
            (s.bound if p == 0 else s.add)(0, j, rparts[j])
    (rw,) = run_two_pass([(16,)], kernels)
    same(gw, rw)


def test_xent_mean_and_loss_state():
    T, V = 8, 10
    z, t = rnd(T, V), torch.randint(0, V, (T,), generator=G)
    losses, parts, dz, mean = torch.empty(T), torch.empty(2), torch.empty(T, V), torch.empty([])
    sl = k.TokRed([()], 4, T)
    _core.glm_xent_forward(z, t, T, 4, -100, losses, parts, dz, (sl, 0, 0, 0), mean)
    rl, rp, rdz = torch.empty(T), torch.empty(2), torch.empty(T, V)
    k.xent_forward_backward(z, t, T, 4, rl, rp, None, rdz)
    same(losses, rl)
    same(dz, rdz)
    ref = k.TokRed([()], 4, T)  # the exact mean: one rounding of the exact sum
    for j in range(2):
        ref.bound(0, j, rp[j])
    ref.agree()
    for j in range(2):
        ref.add(0, j, rp[j])
    out = torch.empty([])
    ref.finish([out], T)
    same(mean, out)
    sl.agree()  # pass 0 raised the loss state's bound: pass 1 adds the same partials
    _core.glm_xent_forward(z, t, T, 4, -100, losses, parts, dz, (sl, 1, 0, 0), None)
    total = torch.empty([])
    sl.finish([total], T)
    same(total, out)


def test_embedding_backward_into_state():
    V, H, T = 11, 6, 8
    ids, dy = torch.randint(0, V, (T,), generator=G), rnd(T, H)
    rid, rows, off = torch.empty(T, dtype=torch.int64), torch.empty(T, H), \
        torch.empty(3, dtype=torch.int64)

    def node(grads):
        _core.glm_embedding_backward(ids, dy, V, 4, rid, rows, off, grads, 0)
    (g,) = run_two_pass([(V, H)], node)

    def kernels(grads):
        s, p = grads[0], grads[1]
        rr, rw, ro = torch.empty_like(rid), torch.empty_like(rows), torch.empty_like(off)
        k.embedding_backward(ids, dy, V, 4, rr, rw, ro)
        if p == 0:
            k.embedding_grad_bound(s, 0, rw, ro)
        else:
            k.embedding_grad_add(s, 0, 0, rr, rw, ro)
    (r,) = run_two_pass([(V, H)], kernels)
    same(g, r)
    assert bool((g != 0).any())


# ---- refusals: named, and nothing changed ---------------------------------------------------

def test_bad_dtype_named():
    x, w = rnd(4, 8).double(), rnd(6, 8)
    y = torch.full((4, 6), 7.0)
    with pytest.raises(bx.DTypeError, match="'x'"):
        _core.glm_linear_forward(x, w, None, None, y)
    assert bool((y == 7.0).all())


def test_bad_shape_named_output_untouched():
    x, w = rnd(4, 8), rnd(6, 8)
    y = torch.full((4, 5), 7.0)
    with pytest.raises(bx.InvalidArgumentError, match="'y'"):
        _core.glm_linear_forward(x, w, None, None, y)
    assert bool((y == 7.0).all())


def test_strided_refused():
    x, w = rnd(4, 8), rnd(8, 6).t()
    with pytest.raises(bx.Error, match="weight"):
        _core.glm_linear_forward(x, w, None, None, torch.empty(4, 6))


def test_grads_checked_state_untouched():
    x, w, dy = rnd(8, 16), rnd(12, 16), rnd(8, 12)
    s = state([(12, 16)])
    _core.glm_linear_backward(dy, x, w, None, None, (s, 0, 0, 0), 0, -1)
    s.agree()
    before = np.array(k.words(s), copy=True)
    with pytest.raises(bx.InvalidArgumentError, match="pass"):
        _core.glm_linear_backward(dy, x, w, None, None, (s, 2, 0, 0), 0, -1)
    with pytest.raises(TypeError):
        _core.glm_linear_backward(dy, x, w, None, None, [s, 1, 0, 0], 0, -1)
    with pytest.raises(bx.InvalidArgumentError, match="TokRed"):
        _core.glm_linear_backward(dy, x, w, None, None, (object(), 0, 0, 0), 0, -1)
    with pytest.raises(bx.InvalidArgumentError, match="'dx'"):
        _core.glm_linear_backward(dy, x, w, None, torch.empty(8, 15), (s, 1, 0, 0), 0, -1)
    with pytest.raises(bx.Error, match="tensor 3"):  # a state index the state does not have
        _core.glm_linear_backward(dy, x, w, None, None, (s, 1, 0, 0), 3, -1)
    assert np.array_equal(np.array(k.words(s)), before)
    _core.glm_linear_backward(dy, x, w, None, None, (s, 1, 0, 0), 0, -1)  # still usable
    assert not np.array_equal(np.array(k.words(s)), before)


# ---- GradRed's local and absent tensors (expert parallelism's reduction) ---------------------

class _LocalExperts:
    """What a GradReduction asks its expert_parallel: which parameters are
    local (reduced over the replicas) and the replicas' comm (none here:
    one process)."""

    def __init__(self, params):
        self.ids = {id(p) for p in params}

    def is_local(self, p):
        return id(p) in self.ids

    def replica_comm(self):
        return None, 0


def _moe_step(local):
    from bitexact import torch as bt
    torch.manual_seed(3)
    m = bt.MoE(16, 8, 4, 2)
    x = torch.randn(2, 4, 16, generator=torch.Generator().manual_seed(5))
    params = list(m.named_parameters())
    ep = _LocalExperts([p for n, p in params if n.startswith("experts.")]) if local else None
    red = bt.GradReduction(params, 4, 8, expert_parallel=ep)
    red.run_two_pass(lambda i: m(x).square().sum().backward(), [(0, 8)])
    return {n: p.grad.clone() for n, p in params}, red


def test_gradred_local_experts_give_the_same_bits():
    """The routed experts in GradRed's local state (their own grid and
    words) give the bits of one state: the grid of a tensor is its own."""
    a, _ = _moe_step(False)
    b, red = _moe_step(True)
    assert red._xnames and all(n.startswith("experts.") for n in red._xnames)
    assert a.keys() == b.keys()
    for n in a:
        same(a[n], b[n])


def test_gradred_dense_node_refuses_local_and_absent_tensors():
    x, w, dy = rnd(8, 16), rnd(12, 16), rnd(8, 12)
    for where, msg in (([1, 0], "is local"), ([2, 0], "not held by this rank")):
        g = _core.GradRed([(12, 16), (12,)], 4, 8, where)
        g.begin()
        g.micro_batch(0, 8)
        with pytest.raises(bx.InvalidArgumentError, match=msg):
            _core.glm_linear_backward(dy, x, w, None, None, (g, 0, 0, 0), 0, 1)
    with pytest.raises(bx.InvalidArgumentError, match="where"):
        _core.GradRed([(12, 16), (12,)], 4, 8, [0, 3])
    with pytest.raises(bx.InvalidArgumentError, match="where"):
        _core.GradRed([(12, 16), (12,)], 4, 8, [0])


def test_gradred_absent_output_untouched_and_failed_finish_writes_nothing():
    x, w, dy = rnd(8, 16), rnd(12, 16), rnd(8, 12)

    def step(where, add_bias):
        g = _core.GradRed([(12, 16), (12,)], 4, 8, where)
        g.begin()
        for p in (0, 1):
            g.micro_batch(0, 8)
            _core.glm_linear_backward(dy, x, w, None, None, (g, p, 0, 0), 0, 1 if add_bias else -1)
            if p == 0:
                g.agree()
        g.allreduce()
        return g
    ref = [torch.empty(12, 16), torch.empty(12)]
    step(None, True).finish(ref)
    g = step([0, 2], False)  # the bias absent: no state, its output left alone
    keep = torch.full((12,), 7.0)
    outs = [torch.empty(12, 16), keep]
    g.finish(outs)
    same(outs[0], ref[0])
    assert torch.equal(keep, torch.full((12,), 7.0))
    g = step([0, 1], False)  # the local bias never added: its finish fails, nothing written
    outs = [torch.full((12, 16), 5.0), torch.full((12,), 5.0)]
    with pytest.raises(bx.Error, match="local tensors"):
        g.finish(outs)
    assert torch.equal(outs[0], torch.full((12, 16), 5.0))
    assert torch.equal(outs[1], torch.full((12,), 5.0))


def test_bf16_copy_against_torch_rounding():
    """The model's bf16 rounding (glm_bf16_convert, a vectorised loop) on
    special values, rounding ties, overflow to Inf, subnormals and random
    bit patterns, every length 0..70 at offsets 0..3 (the vector tails):
    torch's round-to-nearest-even conversion for every non-NaN value; every
    NaN the canonical 0x7FC0 (docs/design.md "NaN")."""
    g = np.random.default_rng(11)
    special = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x00000001, 0x807FFFFF,
                        0x7F7FFFFF, 0x7F7F8000, 0x7F7F7FFF, 0x3F808000, 0x3F818000,
                        0x3F808001, 0x3F807FFF, 0x7FC00000, 0xFF812345, 0x7F800001],
                       dtype=np.uint32)
    bits = np.concatenate([special, g.integers(0, 2**32, 20000, dtype=np.uint32)])
    x = torch.from_numpy(bits.view(np.float32).copy())

    def check(xs):
        y = torch.empty(xs.shape, dtype=torch.bfloat16)
        _core.glm_bf16_copy(xs, y)
        got = y.view(torch.int16).numpy().view(np.uint16)
        ref = xs.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
        nan = np.isnan(xs.numpy())
        assert np.array_equal(got[~nan], ref[~nan])
        assert (got[nan] == 0x7FC0).all()
    check(x)
    for n in range(71):
        for off in range(4):
            check(x[off:off + n])  # a view: unaligned starts
