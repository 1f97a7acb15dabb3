"""bitexact.paddle's GLM-4.5 MoE block (python/bitexact/paddle/_moe.py,
numerics in nn/_moe.py): (1) the Paddle block and bitexact.torch's block
from the same weights and inputs inside a GradReduction step: output,
input gradient and every weight gradient bitwise equal (1 and 2
micro-batches of two chunks each), and equal to bitexact.kernels called
directly in train_moe_block.c's sequence; (2) gradients against Paddle's
native autograd of the same formula (fp32 and fp64) on data whose routing
is stable; (3) bad input named, nothing modified."""
import types

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
import bitexact.kernels as K
import bitexact.paddle as bp
import bitexact.torch as bt
import torch_moe_model as M  # the torch block's config and make_moe (transformers not needed)

U = 2.0 ** -24
T, C = 32, 8  # tokens, chunk (= sequence) length
OPTS = dict(n_group=M.NG, topk_group=M.KG, norm_topk_prob=True, routed_scaling_factor=M.RSF)


def rnd(*shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def pt(a, grad=False, dtype=None):
    t = paddle.to_tensor(a if dtype is None else a.astype(dtype))
    t.stop_gradient = not grad
    return t


def npy(t):
    if isinstance(t, torch.Tensor):
        return t.detach().numpy()
    return np.asarray(t.numpy() if hasattr(t, "numpy") else t)


def same(a, b):
    a, b = npy(a), npy(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.kind == "f":
        iv = {4: np.int32, 8: np.int64}[a.itemsize]
        a, b = a.view(iv), b.view(iv)
    return np.array_equal(a, b)


def paddle_moe_from(tm):
    """A bitexact.paddle MoE holding torch MoE tm's weights and bias (by
    name: the two bindings' names must agree)."""
    pm = bp.MoE(M.H, M.MI, M.E, M.TOPK, 1, M.NG, M.KG, True, M.RSF)
    src = dict(tm.named_parameters())
    assert [n for n, _ in pm.named_parameters()] == list(src)
    for n, p in pm.named_parameters():
        p.set_value(src[n].detach().numpy().copy())
    pm.gate.e_score_correction_bias.set_value(tm.gate.e_score_correction_bias.numpy().copy())
    return pm


@pytest.fixture(scope="module")
def blocks():
    tm = M.make_moe(0)
    return tm, paddle_moe_from(tm), rnd(T, M.H, seed=11), rnd(T, M.H, seed=12)


def paddle_step(pm, x, dy, micro, threads=None):
    """out, dx, {name: grad} of sum(out * dy) through a bitexact.paddle
    GradReduction (chunks of C); one input leaf per micro-batch."""
    n_tok = sum(n for _, n in micro)
    red = bp.GradReduction(pm.named_parameters(), C, n_tok)
    pm.num_threads = threads
    outs, gx = {}, {}

    def step(i):
        b, n = micro[i]
        xs = pt(x[b:b + n], True)
        out = pm(xs)
        (out * pt(dy[b:b + n])).sum().backward()  # upstream gradient 1 * dy: exact
        outs[i], gx[i] = out.numpy(), xs.grad.numpy()
    try:
        red.run_two_pass(step, list(micro))
    finally:
        pm.num_threads = None
    return (np.concatenate([outs[i] for i in range(len(micro))]),
            np.concatenate([gx[i] for i in range(len(micro))]),
            {n: p.grad.numpy() for n, p in pm.named_parameters()})


def torch_step(tm, x, dy, micro, threads=None):
    n_tok = sum(n for _, n in micro)
    red = bt.GradReduction(tm.named_parameters(), C, n_tok)
    tm.num_threads = threads
    outs, gx = {}, {}

    def step(i):
        b, n = micro[i]
        xs = torch.from_numpy(x[b:b + n].copy()).requires_grad_(True)
        out = tm(xs)
        out.backward(torch.from_numpy(dy[b:b + n].copy()))
        outs[i], gx[i] = out.detach().numpy(), xs.grad.numpy()
    try:
        red.run_two_pass(step, list(micro))
    finally:
        tm.num_threads = None
    return (np.concatenate([outs[i] for i in range(len(micro))]),
            np.concatenate([gx[i] for i in range(len(micro))]),
            {n: p.grad.numpy() for n, p in tm.named_parameters()})


def _same_step(a, b):
    return same(a[0], b[0]) and same(a[1], b[1]) and list(a[2]) == list(b[2]) and \
        all(same(a[2][n], b[2][n]) for n in a[2])


# ---- (1) Paddle = torch = the kernels called directly, bit for bit ------------

MICRO = {"1 micro-batch": (16, ((0, 16),)), "2 micro-batches": (32, ((0, 16), (16, 16)))}


@pytest.mark.parametrize("layout", list(MICRO))
@pytest.mark.parametrize("threads", [1, 2])
def test_paddle_block_bit_identical_to_torch(blocks, layout, threads):
    """Two chunks of C tokens per micro-batch: the Paddle MoE's output,
    input gradient and all 3 + 3E + 3 weight gradients are the torch MoE's
    bits; so are its routing (ids, weights, per-chunk counts)."""
    tm, pm, x, dy = blocks
    n_tok, micro = MICRO[layout]
    got = paddle_step(pm, x[:n_tok], dy[:n_tok], micro, threads)
    ref = torch_step(tm, x[:n_tok], dy[:n_tok], micro)
    assert len(got[2]) == 3 * M.E + 4
    assert all(np.abs(g).max() > 0 for g in got[2].values()), "a weight got no gradient"
    assert _same_step(got, ref)
    pr, tr = pm.route(pt(x[:n_tok])), tm.route(torch.from_numpy(x[:n_tok]))
    assert all(same(a, b) for a, b in zip(pr, tr))
    assert int((npy(pr[2]).sum(0) > 0).sum()) == M.E  # every expert has tokens


def test_paddle_layouts_same_bits(blocks):
    """1 micro-batch of 32 tokens (4 chunks) = 2 of 16 = 4 of 8 in Paddle."""
    _, pm, x, dy = blocks
    base = paddle_step(pm, x, dy, ((0, T),))
    for micro in (((0, 16), (16, 16)), tuple((i, 8) for i in range(0, T, 8))):
        assert _same_step(paddle_step(pm, x, dy, micro, 2), base), micro


def kernels_direct(tm, x, dy):
    """The block on numpy arrays by bitexact.kernels called in
    train_moe_block.c's order (one micro-batch of all tokens, chunks of
    C): out, dx and the weight gradients through a TokRed (router and
    shared experts by linear_wgrad; each expert per chunk a TN gemm over
    its rows of that chunk, a zero partial where it has none, bounded by
    wgrad_bound_exp)."""
    p = {n: q.detach().numpy().copy() for n, q in tm.named_parameters()}
    bias = tm.gate.e_score_correction_bias.numpy().copy()
    n, H = x.shape
    E, KK = M.E, M.TOPK
    ex = [[p[f"experts.{e}.{k}_proj.weight"] for k in ("gate", "up", "down")] for e in range(E)]
    sgw, suw, sdw = (p[f"shared_experts.{k}_proj.weight"] for k in ("gate", "up", "down"))
    z = lambda *s, dt=np.float32: np.zeros(s, dt)  # noqa: E731
    logits, ids, w = z(n, E), z(n, KK, dt=np.int64), z(n, KK)
    K.gemm(x, p["gate.weight"], "nt", logits)
    K.moe_router_forward(logits, bias, ids, w, C, None, **OPTS)
    off, row_map, pos = z(E + 1, dt=np.int64), z(n * KK, 2, dt=np.int64), z(n, KK, dt=np.int64)
    K.moe_dispatch_plan(ids, None, off, row_map, pos)
    R, MI = n * KK, M.MI
    xp, gp, up, hp, yp = z(R, H), z(R, MI), z(R, MI), z(R, MI), z(R, H)
    K.moe_permute(x, row_map, xp)
    for e, (wg, wu, wd) in enumerate(ex):
        a, b = int(off[e]), int(off[e + 1])
        if a < b:
            K.gemm(xp[a:b], wg, "nt", gp[a:b])
            K.gemm(xp[a:b], wu, "nt", up[a:b])
            K.swiglu_forward(gp[a:b], up[a:b], hp[a:b])
            K.gemm(hp[a:b], wd, "nt", yp[a:b])
    sg, su, sa, so, out = z(n, MI), z(n, MI), z(n, MI), z(n, H), z(n, H)
    K.gemm(x, sgw, "nt", sg)
    K.gemm(x, suw, "nt", su)
    K.swiglu_forward(sg, su, sa)
    K.gemm(sa, sdw, "nt", so)
    K.moe_unpermute(yp, w, row_map, pos, so, out)
    # backward
    dyp, dw, dhp, dgp, dup, dxp, dx = z(R, H), z(n, KK), z(R, MI), z(R, MI), z(R, MI), z(R, H), \
        z(n, H)
    K.moe_unpermute_backward(dy, yp, w, row_map, pos, dyp, dw)
    for e, (wg, wu, wd) in enumerate(ex):
        a, b = int(off[e]), int(off[e + 1])
        if a < b:
            K.gemm(dyp[a:b], wd, "nn", dhp[a:b])
            K.swiglu_backward(gp[a:b], up[a:b], dhp[a:b], dgp[a:b], dup[a:b])
            K.gemm(dgp[a:b], wg, "nn", dxp[a:b])
            K.gemm(dup[a:b], wu, "nn", dxp[a:b], accumulate=True)
    K.moe_permute_backward(dxp, row_map, pos, dx)
    dlogits = z(n, E)
    K.moe_router_backward(logits, ids, dw, dlogits, **OPTS)
    K.gemm(dlogits, p["gate.weight"], "nn", dx, accumulate=True)
    dsa, dsg, dsu = z(n, MI), z(n, MI), z(n, MI)
    K.gemm(dy, sdw, "nn", dsa)
    K.swiglu_backward(sg, su, dsa, dsg, dsu)
    K.gemm(dsg, sgw, "nn", dx, accumulate=True)
    K.gemm(dsu, suw, "nn", dx, accumulate=True)
    # weight gradients: two passes over one TokRed
    names = list(p)
    s = K.TokRed([z(*p[k].shape) for k in names], C, n)
    lin = [("gate.weight", dlogits, x), ("shared_experts.gate_proj.weight", dsg, x),
           ("shared_experts.up_proj.weight", dsu, x), ("shared_experts.down_proj.weight", dy, sa)]
    tok = row_map[:, 0]
    for add in (False, True):
        for k, d, xx in lin:
            (K.linear_wgrad if add else K.linear_wgrad_bound)(
                s, w_tensor=names.index(k), b_tensor=None, dy=d, x=xx, token_begin=0)
        for e in range(E):
            a, b = int(off[e]), int(off[e + 1])
            for kind, d, xx in (("gate", dgp, xp), ("up", dup, xp), ("down", dyp, hp)):
                i = names.index(f"experts.{e}.{kind}_proj.weight")
                for ch in range(n // C):
                    rows = a + np.nonzero(tok[a:b] // C == ch)[0]  # contiguous: tokens ascending
                    r0, r1 = (int(rows[0]), int(rows[-1]) + 1) if rows.size else (0, 0)
                    if not add:
                        if r1 > r0:
                            s.bound_exp(i, K.wgrad_bound_exp(r1 - r0, float(np.abs(d[r0:r1]).max()),
                                                             float(np.abs(xx[r0:r1]).max())))
                        continue
                    part = z(d.shape[1], xx.shape[1])
                    if r1 > r0:
                        K.gemm(d[r0:r1], xx[r0:r1], "tn", part)
                    s.add(i, ch, part)
        if not add:
            s.agree()
    grads = [z(*p[k].shape) for k in names]
    s.finish(grads, 1)
    return out, dx, dict(zip(names, grads))


def test_paddle_block_equals_kernels_direct(blocks):
    tm, pm, x, dy = blocks
    got = paddle_step(pm, x, dy, ((0, T),))
    assert _same_step(got, kernels_direct(tm, x, dy))


# ---- (2) gradients against Paddle's native autograd of the same formula -------

def _select64(x, rw, bias):
    """GLM-4.5's group-limited top-k in fp64 numpy; returns the ascending
    ids and the smallest margins (k-th vs (k+1)-th kept score, KG-th vs
    (KG+1)-th group score)."""
    c = 1 / (1 + np.exp(-(x.astype(np.float64) @ rw.astype(np.float64).T))) + bias
    g = np.sort(c.reshape(len(x), M.NG, -1), -1)[..., -2:].sum(-1)
    gs = np.sort(g, -1)[:, ::-1]
    keep = np.argsort(-g, -1, kind="stable")[:, :M.KG]
    mask = np.zeros_like(g, bool)
    np.put_along_axis(mask, keep, True, 1)
    cm = np.where(np.repeat(mask, M.E // M.NG, 1), c, -np.inf)
    cs = np.sort(cm, -1)[:, ::-1]
    ids = np.sort(np.argsort(-cm, -1, kind="stable")[:, :M.TOPK], -1)
    return ids, float((gs[:, M.KG - 1] - gs[:, M.KG]).min()), \
        float((cs[:, M.TOPK - 1] - cs[:, M.TOPK]).min())


def native(pm, x, ids, dtype):
    """Glm4MoeMoE's formula in Paddle ops and autograd (dtype) on the
    experts ids: sigmoid scores gathered, / (sum + 1e-20), * scaling; per
    expert SiLU(x Wg^T)(x Wu^T) Wd^T, weighted, index_add; + the shared
    MLP. Returns out and the leaves (x, then the MoE's parameters)."""
    leaves = [pt(x, True, dtype)] + [pt(q.numpy(), True, dtype) for _, q in pm.named_parameters()]
    xx, rw = leaves[0], leaves[1]
    lin = lambda a, wt: paddle.matmul(a, wt, transpose_y=True)  # noqa: E731
    mlp = lambda a, wg, wu, wd: lin(PF.silu(lin(a, wg)) * lin(a, wu), wd)  # noqa: E731
    s = PF.sigmoid(lin(xx, rw))
    w = paddle.take_along_axis(s, paddle.to_tensor(ids), axis=1)
    w = w / (w.sum(-1, keepdim=True) + 1e-20) * M.RSF
    out = paddle.zeros_like(xx)
    for e in range(M.E):
        t, j = np.nonzero(ids == e)
        y = mlp(paddle.gather(xx, paddle.to_tensor(t)), *leaves[2 + 3 * e:5 + 3 * e])
        wj = paddle.gather_nd(w, paddle.to_tensor(np.stack([t, j], 1)))
        out = paddle.index_add(out, paddle.to_tensor(t), 0, y * wj.unsqueeze(-1))
    return out + mlp(xx, *leaves[-3:]), leaves


def test_gradients_match_paddle_native(blocks):
    """On these data the routing is stable (fp64 margins >= 1e-4, far above
    either fp32 evaluation's few-ulp error), so Paddle's formula on the
    same expert sets is the same function. Tolerance as
    test_torch_moe.py's: bitexact's error vs the fp64 autograd <= 1e-5 of
    each tensor's max |gradient| (~170 u: chains of 32 tokens of a weight
    gradient through three GEMM levels and the router's normalisation,
    first-order ~(32 + 16 + 8) u times sums of magnitudes within a few times
    the maximum) and no worse than 4x Paddle's own fp32 error (+ 8 u max);
    bitexact vs Paddle fp32 directly within the sum of both bounds."""
    _, pm, x, dy = blocks
    ids64, gmargin, kmargin = _select64(x, pm.gate.weight.numpy(),
                                        pm.gate.e_score_correction_bias.numpy())
    assert gmargin > 1e-4 and kmargin > 1e-4, (gmargin, kmargin)
    ids = npy(pm.route(pt(x))[0])
    assert np.array_equal(ids, ids64), "expert selection differs from the fp64 formula"
    got = paddle_step(pm, x, dy, ((0, T),))
    names = ["x"] + [n for n, _ in pm.named_parameters()]
    mine = dict(zip(names, [got[1]] + [got[2][n] for n in names[1:]]))
    res = {}
    for dt in ("float32", "float64"):
        out, leaves = native(pm, x, ids, dt)
        res[dt] = out.numpy(), [g.numpy() for g in paddle.grad([out], leaves, [pt(dy, dtype=dt)])]
    o32, o64 = res["float32"][0], res["float64"][0]
    assert np.abs(got[0] - o64).max() <= 1e-5 * np.abs(o64).max()
    assert np.abs(got[0] - o64).max() <= max(4 * np.abs(o32 - o64).max(), 8 * U * np.abs(o64).max())
    worst = 0.0
    for name, n32, n64 in zip(names, res["float32"][1], res["float64"][1]):
        mx = float(np.abs(n64).max())
        assert mx > 0, name
        eb, en = float(np.abs(mine[name] - n64).max()), float(np.abs(n32 - n64).max())
        assert eb <= 1e-5 * mx, f"{name}: bitexact error {eb / mx:.2e} of max"
        assert eb <= max(4 * en, 8 * U * mx), f"{name}: bitexact {eb:.2e} vs Paddle fp32 {en:.2e}"
        assert float(np.abs(mine[name] - n32).max()) <= 2e-5 * mx, name
        worst = max(worst, eb / mx)
    print("worst gradient error / max vs fp64 (bitexact.paddle):", worst)


def test_experts_alone_match_native_and_torch(blocks):
    """moe_experts with the router's ids/weights: x's and topk_weights'
    gradients by Paddle (stop_gradient=False), the experts' by the
    reduction; bit-equal to bitexact.torch.moe_experts, within the fp32
    tolerance above of Paddle's native fp64 index_add formula."""
    tm, pm, x, dy = blocks
    ids, w, _ = pm.route(pt(x))
    ex = pm.experts
    ws = [[getattr(e, f"{k}_proj").weight for e in ex] for k in ("gate", "up", "down")]
    red = bp.GradReduction([(f"e{i}", q) for i, q in enumerate(q for trio in zip(*ws)
                                                              for q in trio)], C, T)
    keep = {}

    def step(i):
        xi, wi = pt(x, True), pt(w.numpy(), True)
        out = bp.moe_experts(xi, ids, wi, *ws)
        (out * pt(dy)).sum().backward()
        keep.update(out=out.numpy(), gx=xi.grad.numpy(), gw=wi.grad.numpy())
    red.run_two_pass(step, [(0, T)])
    tex = tm.experts
    tws = [[getattr(e, f"{k}_proj").weight for e in tex] for k in ("gate", "up", "down")]
    tred = bt.GradReduction([(f"e{i}", q) for i, q in enumerate(q for trio in zip(*tws)
                                                                for q in trio)], C, T)
    xi, wi = torch.from_numpy(x.copy()).requires_grad_(True), torch.from_numpy(
        w.numpy().copy()).requires_grad_(True)

    def tstep(i):
        xi.grad = wi.grad = None
        out = bt.moe_experts(xi, torch.from_numpy(ids.numpy()), wi, *tws)
        out.backward(torch.from_numpy(dy))
        keep["tout"] = out.detach()
    tred.run_two_pass(tstep, [(0, T)])
    assert same(keep["out"], keep["tout"]) and same(keep["gx"], xi.grad) and \
        same(keep["gw"], wi.grad)
    assert all(same(a.grad, b.grad) for a, b in zip(red.params, tred.params))
    # native fp64: out[t] = sum_j w[t, j] expert_{ids[t, j]}(x[t])
    idn = ids.numpy()
    leaves = [pt(x, True, "float64"), pt(w.numpy(), True, "float64")] + \
        [pt(q.numpy(), True, "float64") for q in red.params]
    xx, ww = leaves[:2]
    lin = lambda a, wt: paddle.matmul(a, wt, transpose_y=True)  # noqa: E731
    out = paddle.zeros_like(xx)
    for e in range(M.E):
        t, j = np.nonzero(idn == e)
        xt = paddle.gather(xx, paddle.to_tensor(t))
        wg, wu, wd = leaves[2 + 3 * e:5 + 3 * e]
        y = lin(PF.silu(lin(xt, wg)) * lin(xt, wu), wd)
        wj = paddle.gather_nd(ww, paddle.to_tensor(np.stack([t, j], 1)))
        out = paddle.index_add(out, paddle.to_tensor(t), 0, y * wj.unsqueeze(-1))
    refs = paddle.grad([out], leaves, [pt(dy, dtype="float64")])
    for g, r in zip([keep["gx"], keep["gw"]] + [q.grad.numpy() for q in red.params], refs):
        r = r.numpy()
        assert np.abs(g - r).max() <= 1e-5 * np.abs(r).max()


def test_experts_alone_bf16_equal_torch(blocks):
    """moe_experts in bf16 compute (GradReduction(compute_dtype="bf16")):
    the output and the expert weights' gradients bit-equal to
    bitexact.torch's in bf16, and different from the fp32 ones."""
    tm, pm, x, dy = blocks
    ids, w, _ = pm.route(pt(x))
    ws = [[getattr(e, f"{k}_proj").weight for e in pm.experts] for k in ("gate", "up", "down")]
    tws = [[getattr(e, f"{k}_proj").weight for e in tm.experts] for k in ("gate", "up", "down")]
    tids, tw = torch.from_numpy(ids.numpy()), torch.from_numpy(w.numpy().copy())
    outs = {}
    for dtype in ("fp32", "bf16"):
        red = bp.GradReduction([(f"e{i}", q) for i, q in enumerate(
            q for trio in zip(*ws) for q in trio)], C, T, compute_dtype=dtype)
        tred = bt.GradReduction([(f"e{i}", q) for i, q in enumerate(
            q for trio in zip(*tws) for q in trio)], C, T, compute_dtype=dtype)

        def step(i):
            out = bp.moe_experts(pt(x), ids, w, *ws)
            (out * pt(dy)).sum().backward()
            outs[dtype] = out.numpy()

        def tstep(i):
            out = bt.moe_experts(torch.from_numpy(x.copy()), tids, tw, *tws)
            out.backward(torch.from_numpy(dy))
            outs["t" + dtype] = out.detach()
        red.run_two_pass(step, [(0, T)])
        tred.run_two_pass(tstep, [(0, T)])
        assert same(outs[dtype], outs["t" + dtype]), dtype
        assert all(same(a.grad, b.grad) for a, b in zip(red.params, tred.params)), dtype
    assert not same(outs["fp32"], outs["bf16"])


# ---- (3) bad input: named bitexact errors, nothing modified ---------------------

def _args(pm, x):
    ex, sh = pm.experts, pm.shared_experts
    return dict(x=x, router_weight=pm.gate.weight,
                e_score_correction_bias=pm.gate.e_score_correction_bias,
                gate_weights=[e.gate_proj.weight for e in ex],
                up_weights=[e.up_proj.weight for e in ex],
                down_weights=[e.down_proj.weight for e in ex],
                shared_gate_weight=sh.gate_proj.weight, shared_up_weight=sh.up_proj.weight,
                shared_down_weight=sh.down_proj.weight, num_experts_per_tok=M.TOPK, **OPTS)


def _set(key, make):
    def f(a):
        a[key] = make(a)
    return f


def _nan_bias(a):
    b = a["e_score_correction_bias"].numpy().copy()
    b[3] = np.nan
    a["e_score_correction_bias"] = pt(b)


def _bad_expert(a):
    a["down_weights"] = list(a["down_weights"])
    a["down_weights"][3] = pt(np.zeros((M.H, M.MI + 1), np.float32), True)


def _foreign_weight(a):  # requires grad, not a parameter of the reduction
    a["shared_up_weight"] = pt(a["shared_up_weight"].numpy(), True)


BAD = [
    (_set("router_weight", lambda a: a["router_weight"].astype("float64")), bitexact.DTypeError,
     "router_weight"),
    (_set("x", lambda a: a["x"].astype("float16")), bitexact.DTypeError, "input"),
    (_set("router_weight", lambda a: pt(np.zeros((M.E, M.H + 1), np.float32))),
     bitexact.InvalidArgumentError, "router_weight"),
    (_set("e_score_correction_bias", lambda a: pt(np.zeros(M.E - 1, np.float32))),
     bitexact.InvalidArgumentError, "e_score_correction_bias"),
    (_nan_bias, bitexact.NonFiniteError, "bias"),
    (_bad_expert, bitexact.InvalidArgumentError, "experts.3.down_proj.weight"),
    (_set("gate_weights", lambda a: a["gate_weights"][:-1]), bitexact.InvalidArgumentError,
     "gate_weights"),  # E - 1 gate weights, E up/down
    (lambda a: a.update(gate_weights=a["gate_weights"][:-1], up_weights=a["up_weights"][:-1],
                        down_weights=a["down_weights"][:-1]),
     bitexact.InvalidArgumentError, "gate_weights"),  # E - 1 experts, the router has E
    (_set("num_experts_per_tok", lambda a: M.E + 1), bitexact.InvalidArgumentError,
     "num_experts_per_tok"),
    (_set("x", lambda a: torch.from_numpy(a["x"].numpy())), bitexact.InvalidArgumentError,
     "input"),
    (_foreign_weight, bitexact.InvalidArgumentError, "shared_experts.up_proj.weight"),
]


@pytest.mark.parametrize("mutate,exc,name", BAD, ids=lambda v: getattr(v, "__name__", None))
def test_bad_input_named_nothing_modified(blocks, mutate, exc, name):
    """In pass 0 and pass 1 of a step: the failing call raises the named
    bitexact error, no weight, bias or .grad changes, and it registered
    nothing (the good call in the same micro-batch still works); the step's
    gradients equal a clean step's."""
    _, pm, x, dy = blocks
    clean = paddle_step(pm, x, dy, ((0, T),))
    before = {n: q.numpy().copy() for n, q in pm.named_parameters()}
    bias0 = pm.gate.e_score_correction_bias.numpy().copy()
    red = bp.GradReduction(pm.named_parameters(), C, T)
    red.begin()
    for _ in range(2):
        with red.micro_batch(0, T):
            a = _args(pm, pt(x, True))
            mutate(a)
            with pytest.raises(exc) as ei:
                bp.moe(**a)
            assert name in str(ei.value), str(ei.value)
            arg = getattr(ei.value, "argument", None)
            if arg is not None and exc is not bitexact.NonFiniteError:  # the kernel's own name
                assert arg == name
            assert all(same(q.grad, clean[2][n]) for n, q in pm.named_parameters())
            (pm(pt(x)) * pt(dy)).sum().backward()
        if red.phase == "bound":
            red.agree()
    red.finish()
    assert all(same(q, before[n]) for n, q in pm.named_parameters())
    assert same(pm.gate.e_score_correction_bias, bias0)
    assert all(same(q.grad, clean[2][n]) for n, q in pm.named_parameters())


@pytest.mark.parametrize("bad,exc", [
    (lambda ids: np.where((np.arange(T)[:, None] == 5) & (np.arange(M.TOPK) == 1), M.E, ids),
     bitexact.InvalidArgumentError),   # id == E: out of range
    (lambda ids: np.where((np.arange(T)[:, None] == 7) & (np.arange(M.TOPK) == 0), -1, ids),
     bitexact.InvalidArgumentError),   # negative
    (lambda ids: np.concatenate([ids[:, :1], ids[:, :1], ids[:, 2:]], 1),
     bitexact.InvalidArgumentError),   # repeated expert in a token
    (lambda ids: ids[:T - 1], bitexact.InvalidArgumentError),  # rows != tokens
    (lambda ids: ids.astype(np.float32), bitexact.DTypeError),  # dtype
])
def test_experts_bad_ids(blocks, bad, exc):
    _, pm, x, _ = blocks
    ids, w, _ = pm.route(pt(x))
    ex = pm.experts
    ws = [[getattr(e, f"{k}_proj").weight for e in ex] for k in ("gate", "up", "down")]
    before = [q.numpy().copy() for q in pm.parameters()]
    with paddle.no_grad(), pytest.raises(exc) as ei:
        bp.moe_experts(pt(x), pt(bad(ids.numpy())), w, *ws)
    assert "topk_ids" in str(ei.value), str(ei.value)
    assert all(same(q, b) for q, b in zip(pm.parameters(), before))


def test_requires_grad_misuse(blocks):
    """A trainable MoE outside a micro-batch, or twice in one micro-batch,
    is refused at forward (named, nothing registered); under
    paddle.no_grad() no reduction is needed; a backward of pass 0's graph
    run in pass 1 is refused before any work (as Paddle's OSError: Paddle
    wraps exceptions raised in a PyLayer's backward)."""
    _, pm, x, dy = blocks
    with pytest.raises(bitexact.InvalidArgumentError, match="no GradReduction") as ei:
        pm(pt(x))
    assert ei.value.argument == "router_weight"
    with paddle.no_grad():
        assert list(pm(pt(x)).shape) == [T, M.H]
    grads0 = {n: None if q.grad is None else q.grad.numpy().copy()
              for n, q in pm.named_parameters()}
    red = bp.GradReduction(pm.named_parameters(), C, T)
    red.begin()
    with red.micro_batch(0, T):
        stale = pm(pt(x))
        with pytest.raises(bitexact.InvalidArgumentError, match="used twice"):
            pm(pt(x))
    red.agree()  # pass 0 is over: stale's backward belongs to it
    with pytest.raises(OSError, match="InvalidArgumentError.*finished pass"):
        stale.sum().backward()
    assert red.phase == "add"
    assert all((q.grad is None) if grads0[n] is None else same(q.grad, grads0[n])
               for n, q in pm.named_parameters())


def test_from_config_names_and_state():
    cfg = types.SimpleNamespace(hidden_size=M.H, moe_intermediate_size=M.MI,
                                n_routed_experts=M.E, num_experts_per_tok=M.TOPK,
                                n_shared_experts=2, n_group=M.NG, topk_group=M.KG,
                                norm_topk_prob=True, routed_scaling_factor=M.RSF)
    pm, tm = bp.MoE.from_config(cfg), bt.MoE.from_config(cfg)
    shapes = lambda m: [(n, list(q.shape)) for n, q in m.named_parameters()]  # noqa: E731
    assert shapes(pm) == shapes(tm)
    assert dict(shapes(pm))["shared_experts.gate_proj.weight"] == [2 * M.MI, M.H]
    sd = pm.state_dict()
    assert "gate.e_score_correction_bias" in sd and not any(
        n == "gate.e_score_correction_bias" for n, _ in pm.named_parameters())
    assert set(sd) == set(tm.state_dict())
    assert pm.gate.e_score_correction_bias.stop_gradient
    bound = M.H ** -0.5
    assert np.abs(pm.gate.weight.numpy()).max() <= bound
    with pytest.raises(bitexact.InvalidArgumentError, match="num_experts_per_tok"):
        bp.MoE(M.H, M.MI, M.E, M.E + 1)
