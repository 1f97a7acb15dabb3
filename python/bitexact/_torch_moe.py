"""bitexact.torch's GLM-4.5 mixture-of-experts block (transformers'
``Glm4MoeMoE``) as torch autograd Functions and an nn.Module
(docs/torch_layers.md, "The MoE block").

The kernel sequence and orders are those of `bitexact train`
(src/cli/train_moe_block.c), so the bits are the same:

forward  logits = x W_r^T (bx_gemm NT); bx_moe_router_forward (sigmoid,
         e_score_correction_bias for the choice only, group-limited top-k,
         norm_topk_prob, routed_scaling_factor; ids ascending); the dispatch
         plan (rows sorted by (expert, token)); bx_moe_permute; per expert
         with rows: g = X_e W_g^T, u = X_e W_u^T, h = SiLU(g) u, y = h W_d^T;
         the shared experts' MLP on x; out = bx_moe_unpermute(y, weights,
         initial = shared output) = fl(sum_j fl(w_j y_j) + shared).
backward bx_moe_unpermute_backward (dy per row, dweights per slot); per
         expert dH = dY W_d, bx_swiglu_backward, dX_e = dG W_g + dU W_u (one
         fmaf chain); bx_moe_permute_backward (dx = the gather of dX_e);
         bx_moe_router_backward; dx += dlogits W_r, then the shared MLP's
         dG W_g and dU W_u accumulate onto the same chains. The whole block
         is ONE autograd node: as separate nodes torch would add three
         rounded branch gradients instead.
weights  the router and the shared experts as linear layers
         (linear_wgrad_bound / linear_wgrad over the token rows); each
         routed expert per global chunk over its rows of that chunk
         (moe_expert_chunks; a TN GEMM, a zero partial where a chunk sent it
         nothing; bound a priori with wgrad_bound_exp), exactly
         train_wgrad.c's tr_wg_expert. All go to the active GradReduction.

Differences from transformers (docs/train_moe.md): ties break toward the
lower group / expert id (torch.topk(sorted=False) leaves them open); the
sigmoid is correctly rounded; the top-k denominator is summed in fp64; the
experts are 2-D per expert (the hub checkpoints' experts.E.{gate,up,down}_
proj.weight, as `bitexact train`), not transformers 5's 3-D gate_up_proj.
The e_score_correction_bias is a buffer that is not trained (as in
transformers and `bitexact train`); :func:`moe_route` returns the
per-chunk expert counts for a caller's ``bitexact.kernels.moe_bias_update``.

Every check runs and the whole forward is computed before the module
registers its weights with the GradReduction: a failing call changes
nothing (no partial, no registration). Threading as _torch_layers.py.
Not here: expert parallelism (the all-to-all of train_moe_ep.c), bf16
compute, capacity / token dropping, CUDA tensors.
"""
import torch

from . import Error, InvalidArgumentError
from . import kernels as _k
from ._torch_gradred import _F32, _active, _capture, _check, _err, _renamed, _threads, _wgrad
from ._torch_layers import Linear, SwiGLUMLP

__all__ = ["MoE", "MoERouter", "moe", "moe_route", "moe_experts"]

_I64 = torch.int64


def _empty(*shape, dtype=_F32):
    return torch.empty(*shape, dtype=dtype)


def _chunk(C_default):
    red = _active()
    return red.seq_len if red is not None and red._mb is not None else C_default


# ---- pieces shared by the Functions ----------------------------------------

def _plan(ids, E, nt):
    """The dispatch plan of topk_ids [T, k]: offsets [E+1], row_map [R, 2],
    pos [T, k] (bx_moe_dispatch_plan; checks ids in range and distinct)."""
    T, K = ids.shape
    offsets, row_map, pos = _empty(E + 1, dtype=_I64), _empty(T * K, 2, dtype=_I64), \
        _empty(T, K, dtype=_I64)
    _k.moe_dispatch_plan(ids, None, offsets, row_map, pos, num_threads=nt)
    return offsets, row_map, pos


def _experts_fwd(x2, w, plan, ews, initial, nt):
    """Permute, each expert's SwiGLU MLP on its rows, unpermute (+ initial).
    ews: [(W_g, W_u, W_d)] per expert. Returns out and the saved state."""
    offsets, row_map, pos = plan
    R, H = row_map.shape[0], x2.shape[1]
    I = ews[0][0].shape[0]
    xp = _empty(R, H)
    _k.moe_permute(x2, row_map, xp, num_threads=nt)
    gp, up, hp, yp = _empty(R, I), _empty(R, I), _empty(R, I), _empty(R, H)
    off = offsets.tolist()
    for e, (wg, wu, wd) in enumerate(ews):
        a, b = off[e], off[e + 1]
        if a == b:
            continue
        _k.gemm(xp[a:b], wg, "nt", gp[a:b], num_threads=nt)
        _k.gemm(xp[a:b], wu, "nt", up[a:b], num_threads=nt)
        _k.swiglu_forward(gp[a:b], up[a:b], hp[a:b], num_threads=nt)
        _k.gemm(hp[a:b], wd, "nt", yp[a:b], num_threads=nt)
    out = _empty(x2.shape[0], H)
    _k.moe_unpermute(yp, w, row_map, pos, initial, out, num_threads=nt)
    return out, (xp, gp, up, hp, yp, off)


def _experts_bwd(dout, w, plan, ews, act, nt, want_dw=True):
    """unpermute backward, each expert's MLP backward, permute backward:
    dx [T, H] (the gather of the rows' dX, j ascending) and dweights [T, k]
    (None unless want_dw), plus what the weight gradients need."""
    offsets, row_map, pos = plan
    xp, gp, up, hp, yp, off = act
    R, H = yp.shape
    I = gp.shape[1]
    dyp = _empty(R, H)
    dw = _empty(w.shape) if want_dw else None
    _k.moe_unpermute_backward(dout, yp, w, row_map, pos, dyp, dw, num_threads=nt)
    dhp, dgp, dup, dxp = _empty(R, I), _empty(R, I), _empty(R, I), _empty(R, H)
    for e, (wg, wu, wd) in enumerate(ews):
        a, b = off[e], off[e + 1]
        if a == b:
            continue
        _k.gemm(dyp[a:b], wd, "nn", dhp[a:b], num_threads=nt)
        _k.swiglu_backward(gp[a:b], up[a:b], dhp[a:b], dgp[a:b], dup[a:b], num_threads=nt)
        _k.gemm(dgp[a:b], wg, "nn", dxp[a:b], num_threads=nt)
        _k.gemm(dup[a:b], wu, "nn", dxp[a:b], accumulate=True, num_threads=nt)
    dx = _empty(dout.shape)
    _k.moe_permute_backward(dxp, row_map, pos, dx, num_threads=nt)
    return dx, dw, (dyp, dgp, dup)


def _max_abs(t):
    """max |t| over the finite elements, 0 if none (exact; train_wgrad.c's
    max_abs, the input of bx_wgrad_bound_exp)."""
    a = t.abs()
    a = a[torch.isfinite(a)]
    return float(a.max()) if a.numel() else 0.0


def _expert_wgrads(mb, eidx, plan, act, grads, what):
    """tr_wg_expert for every expert weight that needs a gradient: per
    global chunk of the micro-batch the TN GEMM over the expert's rows of
    that chunk (pass 1; a zero partial for a chunk without rows) or the
    a-priori bound of that GEMM (pass 0; nothing for a chunk without rows)."""
    if all(i is None for t in eidx for i in t):
        return
    bound = mb.check(what)
    red = mb.red
    s, C = red._state, red.seq_len
    nch = mb.T // C
    _, row_map, _ = plan
    xp, _, _, hp, _, off = act
    dyp, dgp, dup = grads
    tok = row_map[:, 0] + mb.tok0  # the rows' global token ids (ascending per expert)
    bounds = _empty(nch + 1, dtype=_I64)
    try:
        for e, idx3 in enumerate(eidx):
            r0, r1 = off[e], off[e + 1]
            if r1 > r0:
                _k.moe_expert_chunks(tok[r0:r1].contiguous(), C, mb.chunk0, bounds)
                bd = bounds.tolist()
            else:
                bd = [0] * (nch + 1)
            for i, dy, x in zip(idx3, (dgp, dup, dyp), (xp, xp, hp)):
                if i is None:
                    continue
                for ch in range(nch):
                    a, b = r0 + bd[ch], r0 + bd[ch + 1]
                    if bound:
                        if a < b:
                            s.bound_exp(i, _k.wgrad_bound_exp(b - a, _max_abs(dy[a:b]),
                                                              _max_abs(x[a:b])))
                        continue
                    part = torch.zeros(dy.shape[1], x.shape[1], dtype=_F32)
                    if a < b:
                        _k.gemm(dy[a:b], x[a:b], "tn", part, num_threads=red.num_threads)
                    s.add(i, mb.chunk0 + ch, part)
    except Error as e:
        raise _renamed(e, red.names) from e


# ---- the router (no gradient of its own) -------------------------------------

def _router_opts(cfg):
    _, _, ng, tg, norm, rsf = cfg
    return dict(n_group=ng, topk_group=tg, norm_topk_prob=norm, routed_scaling_factor=rsf)


def _route(x2, rw, bias, cfg, C, nt, counts=None):
    E, K = cfg[0], cfg[1]
    T = x2.shape[0]
    logits = _empty(T, E)
    _k.gemm(x2, rw, "nt", logits, num_threads=nt)
    ids, w = _empty(T, K, dtype=_I64), _empty(T, K)
    _k.moe_router_forward(logits, bias, ids, w, C, counts, num_threads=nt, **_router_opts(cfg))
    return logits, ids, w


def _cfg(fn, E, K, n_group, topk_group, norm_topk_prob, routed_scaling_factor):
    if int(K) < 1 or int(K) > E:
        raise InvalidArgumentError(f"{fn}: num_experts_per_tok {K} must be in [1, {E}]")
    return (E, int(K), int(n_group), int(topk_group), bool(norm_topk_prob),
            float(routed_scaling_factor))


def _check_router(fn, x, router_weight, bias):
    rw = _check(fn, "router_weight", router_weight, ndim=(2,))
    E, H = rw.shape
    x = _check(fn, "input", x)
    if x.shape[-1] != H:
        raise _err(InvalidArgumentError, fn, "router_weight", f"has shape {tuple(rw.shape)}: "
                   f"[n_routed_experts, {x.shape[-1]}] expected for the input's {x.shape[-1]} "
                   "features")
    b = _check(fn, "e_score_correction_bias", bias, ndim=(1,))
    if b.shape[0] != E:
        raise _err(InvalidArgumentError, fn, "e_score_correction_bias", f"has {b.shape[0]} "
                   f"elements, the router weight {tuple(rw.shape)} has {E} experts")
    return x, rw, b


def moe_route(x, router_weight, e_score_correction_bias, num_experts_per_tok, n_group=1,
              topk_group=1, norm_topk_prob=True, routed_scaling_factor=1.0, chunk_tokens=None,
              num_threads=None):
    """The routing of :func:`moe` without autograd: (topk_ids [T, k] int64,
    ascending expert id; topk_weights [T, k]; counts [ceil(T/chunk), E]
    int64, the per-chunk expert loads, integers) computed by the same
    kernels, so the ids and weights are the ones :func:`moe` uses.
    chunk_tokens: default the active GradReduction's seq_len, else T."""
    fn = "bitexact.torch.moe_route"
    x, rw, b = _check_router(fn, x, router_weight, e_score_correction_bias)
    cfg = _cfg(fn, rw.shape[0], num_experts_per_tok, n_group, topk_group, norm_topk_prob,
               routed_scaling_factor)
    x2 = x.detach().reshape(-1, rw.shape[1])
    T = x2.shape[0]
    C = int(chunk_tokens) if chunk_tokens is not None else _chunk(max(T, 1))
    counts = _empty(-(-T // C), rw.shape[0], dtype=_I64)
    _, ids, w = _route(x2, rw.detach(), b, cfg, C, _threads(num_threads), counts)
    return ids, w, counts


# ---- the whole block -----------------------------------------------------------

class _MoEFn(torch.autograd.Function):
    """The block's forward (computed before apply, see moe()) and backward."""

    @staticmethod
    def forward(ctx, x, rw, *rest):
        st, mb, idx, ws = rest[0], rest[1], rest[2], rest[3:]
        ctx.save_for_backward(x, rw, *ws)  # torch's version checks on the inputs
        ctx.st, ctx.mb, ctx.idx, ctx.nws = st, mb, idx, len(ws)
        return st.pop("out").view(x.shape)

    @staticmethod
    def backward(ctx, dout):
        st, mb, idx = ctx.st, ctx.mb, ctx.idx
        if mb is not None:
            mb.check("MoE backward")  # first: a stale pass computes nothing
        x, rw, *ws = ctx.saved_tensors
        nt, cfg, H = st["nt"], st["cfg"], x.shape[-1]
        x2 = x.reshape(-1, H)
        ews = [tuple(ws[3 * e:3 * e + 3]) for e in range(cfg[0])]
        sgw, suw, sdw = ws[3 * cfg[0]:]
        d2 = dout.contiguous().view(-1, H)
        dx, dw, grads = _experts_bwd(d2, st["w"], st["plan"], ews, st["act"], nt)
        dlogits = _empty(st["logits"].shape)
        _k.moe_router_backward(st["logits"], st["ids"], dw, dlogits, num_threads=nt,
                               **_router_opts(cfg))
        _k.gemm(dlogits, rw, "nn", dx, accumulate=True, num_threads=nt)
        sg, su, sa = st["shared_act"]
        dsa, dsg, dsu = _empty(sa.shape), _empty(sa.shape), _empty(sa.shape)
        _k.gemm(d2, sdw, "nn", dsa, num_threads=nt)
        _k.swiglu_backward(sg, su, dsa, dsg, dsu, num_threads=nt)
        _k.gemm(dsg, sgw, "nn", dx, accumulate=True, num_threads=nt)
        _k.gemm(dsu, suw, "nn", dx, accumulate=True, num_threads=nt)
        ir, eidx, (isg, isu, isd) = idx
        lin = ((ir, dlogits, x2, "router"), (isg, dsg, x2, "shared gate_proj"),
               (isu, dsu, x2, "shared up_proj"), (isd, d2, sa, "shared down_proj"))
        for i, dy, xx, what in lin:
            if i is not None:
                _wgrad(mb, i, dy, xx, f"MoE backward ({what})")
        if mb is not None:
            _expert_wgrads(mb, eidx, st["plan"], st["act"], grads, "MoE backward (experts)")
        return (dx.view(x.shape) if ctx.needs_input_grad[0] else None,) + (None,) * (4 + ctx.nws)


def _check_experts(fn, gate, up, down, H, prefix="experts"):
    if not (len(gate) == len(up) == len(down)) or not gate:
        raise InvalidArgumentError(f"{fn}: gate/up/down weight lists of one length >= 1 expected, "
                                   f"got {len(gate)}, {len(up)}, {len(down)}")
    I = None
    ews = []
    for e, trio in enumerate(zip(gate, up, down)):
        names = [f"{prefix}.{e}.{p}_proj.weight" for p in ("gate", "up", "down")]
        wg, wu, wd = (_check(fn, n, t, ndim=(2,)) for n, t in zip(names, trio))
        I = wg.shape[0] if I is None else I
        for n, t, want in zip(names, (wg, wu, wd), ((I, H), (I, H), (H, I))):
            if tuple(t.shape) != want:
                raise _err(InvalidArgumentError, fn, n, f"has shape {tuple(t.shape)}, {want} "
                           "expected ([I, H], [I, H], [H, I], one I for all experts)")
        ews.append((wg, wu, wd))
    return ews, [t for trio in ews for t in trio]


def moe(x, router_weight, e_score_correction_bias, gate_weights, up_weights, down_weights,
        shared_gate_weight, shared_up_weight, shared_down_weight, num_experts_per_tok,
        n_group=1, topk_group=1, norm_topk_prob=True, routed_scaling_factor=1.0,
        num_threads=None):
    """Glm4MoeMoE.forward(x): x [T, H] or [B, L, H] (the post-attention
    norm's output); router_weight [E, H]; the bias [E] (no gradient);
    gate/up_weights E tensors [I, H], down_weights E tensors [H, I];
    shared_* the shared experts' MLP ([SI, H], [SI, H], [H, SI]).
    Returns routed + shared [.., H]; weight gradients into the active
    GradReduction (every trainable weight, one micro-batch's tokens)."""
    fn = "bitexact.torch.moe"
    x, rw, b = _check_router(fn, x, router_weight, e_score_correction_bias)
    E, H = rw.shape
    cfg = _cfg(fn, E, num_experts_per_tok, n_group, topk_group, norm_topk_prob,
               routed_scaling_factor)
    ews, flat = _check_experts(fn, gate_weights, up_weights, down_weights, H)
    if len(ews) != E:
        raise _err(InvalidArgumentError, fn, "gate_weights", f"holds {len(ews)} experts, the "
                   f"router weight {tuple(rw.shape)} has {E}")
    sh = [_check(fn, n, t, ndim=(2,)) for n, t in (
        ("shared_experts.gate_proj.weight", shared_gate_weight),
        ("shared_experts.up_proj.weight", shared_up_weight),
        ("shared_experts.down_proj.weight", shared_down_weight))]
    SI = sh[0].shape[0]
    if [tuple(t.shape) for t in sh] != [(SI, H), (SI, H), (H, SI)]:
        raise _err(InvalidArgumentError, fn, "shared_experts.gate_proj.weight", "shapes gate "
                   f"{tuple(sh[0].shape)}, up {tuple(sh[1].shape)}, down {tuple(sh[2].shape)} do "
                   f"not fit ([SI, {H}], [SI, {H}], [{H}, SI])")
    x2 = x.detach().reshape(-1, H)
    T = x2.shape[0]
    nt = _threads(num_threads)
    # the whole forward first: any failure leaves the reduction untouched
    logits, ids, w = _route(x2, rw, b, cfg, _chunk(max(T, 1)), nt)
    plan = _plan(ids, E, nt)
    sgw, suw, sdw = sh
    sg, su, sa, so = _empty(T, SI), _empty(T, SI), _empty(T, SI), _empty(T, H)
    _k.gemm(x2, sgw, "nt", sg, num_threads=nt)
    _k.gemm(x2, suw, "nt", su, num_threads=nt)
    _k.swiglu_forward(sg, su, sa, num_threads=nt)
    _k.gemm(sa, sdw, "nt", so, num_threads=nt)
    # train_moe_block.c computes the shared MLP after the experts; both are
    # independent outputs, so the order does not change a bit
    out, act = _experts_fwd(x2, w, plan, ews, so, nt)
    names = [("router_weight", rw)] + [(f"experts.{i // 3}.{('gate', 'up', 'down')[i % 3]}_proj"
                                        ".weight", t) for i, t in enumerate(flat)] + \
        [("shared_experts.gate_proj.weight", sgw), ("shared_experts.up_proj.weight", suw),
         ("shared_experts.down_proj.weight", sdw)]
    mb, idx = _capture(fn, [(t, n, T) for n, t in names])
    idx_t = (idx[0], [tuple(idx[1 + 3 * e:4 + 3 * e]) for e in range(E)], tuple(idx[-3:]))
    st = dict(out=out, nt=nt, cfg=cfg, logits=logits, ids=ids, w=w, plan=plan, act=act,
              shared_act=(sg, su, sa))
    return _MoEFn.apply(x, rw, st, mb, idx_t, *flat, *sh)


# ---- the routed experts alone (given routing) ------------------------------------

class _ExpertsFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, *rest):
        st, mb, eidx, ws = rest[0], rest[1], rest[2], rest[3:]
        ctx.save_for_backward(x, w, *ws)
        ctx.st, ctx.mb, ctx.eidx, ctx.nws = st, mb, eidx, len(ws)
        return st.pop("out").view(x.shape)

    @staticmethod
    def backward(ctx, dout):
        st, mb = ctx.st, ctx.mb
        if mb is not None:
            mb.check("moe_experts backward")
        x, w, *ws = ctx.saved_tensors
        H = x.shape[-1]
        ews = [tuple(ws[3 * e:3 * e + 3]) for e in range(len(ws) // 3)]
        dx, dw, grads = _experts_bwd(dout.contiguous().view(-1, H), w.detach(), st["plan"], ews,
                                     st["act"], st["nt"], ctx.needs_input_grad[1])
        if mb is not None:
            _expert_wgrads(mb, ctx.eidx, st["plan"], st["act"], grads, "moe_experts backward")
        return (dx.view(x.shape) if ctx.needs_input_grad[0] else None, dw) + (None,) * (3 + ctx.nws)


def moe_experts(x, topk_ids, topk_weights, gate_weights, up_weights, down_weights,
                num_threads=None):
    """Glm4MoeExperts.forward(x, top_k_index, top_k_weights) with 2-D
    experts: out[t] = sum over the slots j of token t, in ascending slot
    order, of fl(w[t][j] * expert_{ids[t][j]}(x[t])) (bx_moe_unpermute; the
    ids as :func:`moe_route` gives them, ascending, reproduce transformers'
    per-expert index_add_ order). Gradients to x and topk_weights (torch)
    and to the expert weights (the GradReduction)."""
    fn = "bitexact.torch.moe_experts"
    x = _check(fn, "input", x)
    ids = _check(fn, "topk_ids", topk_ids, (torch.int32, torch.int64), ndim=(2,))
    w = _check(fn, "topk_weights", topk_weights, ndim=(2,))
    H = x.shape[-1]
    ews, flat = _check_experts(fn, gate_weights, up_weights, down_weights, H)
    x2 = x.detach().reshape(-1, H)
    if tuple(ids.shape) != tuple(w.shape) or ids.shape[0] != x2.shape[0]:
        raise _err(InvalidArgumentError, fn, "topk_ids", f"has shape {tuple(ids.shape)}, "
                   f"topk_weights {tuple(w.shape)}, input {x2.shape[0]} tokens: [T, k] both")
    nt = _threads(num_threads)
    plan = _plan(ids, len(ews), nt)  # ids in range, distinct per token: checked here
    wd = w.detach()
    out, act = _experts_fwd(x2, wd, plan, ews, None, nt)
    names = [(f"experts.{i // 3}.{('gate', 'up', 'down')[i % 3]}_proj.weight", t)
             for i, t in enumerate(flat)]
    mb, idx = _capture(fn, [(t, n, x2.shape[0]) for n, t in names])
    eidx = [tuple(idx[3 * e:3 * e + 3]) for e in range(len(ews))]
    st = dict(out=out, nt=nt, plan=plan, act=act)
    return _ExpertsFn.apply(x, w, st, mb, eidx, *flat)


# ---- modules ------------------------------------------------------------------------

class MoERouter(torch.nn.Module):
    """Glm4MoeTopkRouter's state: weight [E, H] (a Parameter, trained
    through the block) and the e_score_correction_bias buffer [E] (zeros;
    not trained). Routing runs inside :class:`MoE` (one autograd node)."""

    def __init__(self, hidden_size, n_routed_experts):
        super().__init__()
        ref = Linear(hidden_size, n_routed_experts)
        self.weight = ref.weight
        self.register_buffer("e_score_correction_bias", torch.zeros(n_routed_experts, dtype=_F32))


class MoE(torch.nn.Module):
    """transformers' Glm4MoeMoE(config) through the bitexact kernels, with
    `bitexact train`'s parameter names: gate.weight,
    gate.e_score_correction_bias (buffer), experts.E.{gate,up,down}_proj.
    weight (2-D, E ascending), shared_experts.{gate,up,down}_proj.weight
    (intermediate moe_intermediate_size * n_shared_experts). Init: torch's
    Linear init for every weight (load a checkpoint for transformers' or
    `bitexact train`'s). forward(x [T, H] or [B, L, H]) -> same shape."""

    def __init__(self, hidden_size, moe_intermediate_size, n_routed_experts, num_experts_per_tok,
                 n_shared_experts=1, n_group=1, topk_group=1, norm_topk_prob=True,
                 routed_scaling_factor=1.0):
        super().__init__()
        self.cfg = dict(num_experts_per_tok=num_experts_per_tok, n_group=n_group,
                        topk_group=topk_group, norm_topk_prob=norm_topk_prob,
                        routed_scaling_factor=routed_scaling_factor)
        _cfg("bitexact.torch.MoE", n_routed_experts, num_experts_per_tok, n_group, topk_group,
             norm_topk_prob, routed_scaling_factor)
        self.gate = MoERouter(hidden_size, n_routed_experts)
        self.experts = torch.nn.ModuleList(
            [SwiGLUMLP(hidden_size, moe_intermediate_size) for _ in range(n_routed_experts)])
        self.shared_experts = SwiGLUMLP(hidden_size, moe_intermediate_size * n_shared_experts)
        self.num_threads = None

    @classmethod
    def from_config(cls, config):
        """From a transformers Glm4MoeConfig (or any object with its fields)."""
        return cls(config.hidden_size, config.moe_intermediate_size, config.n_routed_experts,
                   config.num_experts_per_tok, config.n_shared_experts, config.n_group,
                   config.topk_group, config.norm_topk_prob, config.routed_scaling_factor)

    def route(self, x):
        """(topk_ids, topk_weights, counts) of x, as :func:`moe_route`."""
        return moe_route(x, self.gate.weight, self.gate.e_score_correction_bias,
                         num_threads=self.num_threads, **self.cfg)

    def forward(self, x):
        ex, sh = self.experts, self.shared_experts
        return moe(x, self.gate.weight, self.gate.e_score_correction_bias,
                   [m.gate_proj.weight for m in ex], [m.up_proj.weight for m in ex],
                   [m.down_proj.weight for m in ex], sh.gate_proj.weight, sh.up_proj.weight,
                   sh.down_proj.weight, num_threads=self.num_threads, **self.cfg)
