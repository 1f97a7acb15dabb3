"""The numerics of the GLM-4.5 mixture-of-experts block (transformers'
``Glm4MoeMoE``), shared by bitexact.torch (_torch_moe.py) and
bitexact.paddle (_paddle_moe.py); docs/torch_layers.md and
docs/paddle_layers.md, "The MoE block".

Every value is a bitexact kernel's, in the sequence and orders of
`bitexact train` (src/glm/train_moe_block.c), written against the
framework :class:`~bitexact._layer_ops.Adapter` (allocation, reshape,
the saved tensors), so both bindings run the same kernel calls on the same
shapes and produce the same bits:

forward  logits = x W_r^T (bx_gemm NT); bx_moe_router_forward (sigmoid,
         e_score_correction_bias for the choice only, group-limited top-k,
         norm_topk_prob, routed_scaling_factor; ids ascending); the dispatch
         plan (rows sorted by (expert, token)); bx_moe_permute; per expert
         with rows: g = X_e W_g^T, u = X_e W_u^T, h = SiLU(g) u, y = h W_d^T
         (:func:`experts_rows_forward`); the shared experts' MLP on x;
         out = bx_moe_unpermute(y, weights, initial = shared output)
         = fl(sum_j fl(w_j y_j) + shared).
backward bx_moe_unpermute_backward (dy per row, dweights per slot); per
         expert dH = dY W_d, bx_swiglu_backward, dX_e = dG W_g + dU W_u (one
         fmaf chain; :func:`experts_rows_backward`); bx_moe_permute_backward
         (dx = the gather of dX_e); bx_moe_router_backward; dx += dlogits
         W_r, then the shared MLP's dG W_g and dU W_u accumulate onto the
         same chains. The whole block is ONE autograd node: as separate
         nodes the framework would add three rounded branch gradients.
weights  the router and the shared experts as linear layers
         (linear_wgrad_bound / linear_wgrad over the token rows); each
         routed expert per global chunk over its rows of that chunk
         (:func:`expert_wgrads`: moe_expert_chunks; a TN GEMM, a zero
         partial where a chunk sent it nothing; bound a priori with
         wgrad_bound_exp), exactly train_wgrad.c's tr_wg_expert. All go to
         the active GradReduction (bitexact._gradred).

The expert computation on the permuted rows is separable: a block's state
holds ``rows`` = (forward, backward) with the signatures of
:func:`experts_rows_forward` / :func:`experts_rows_backward` (the local
experts, :data:`LOCAL_ROWS`), so an expert-parallel version (rows sent to
their owner and back) can replace it without touching the rest.

A framework wrapper supplies a :class:`Binding` (its Adapter, its
argument check and capture, its autograd classes from
:func:`autograd_functions`); the call bodies :func:`moe`,
:func:`moe_route` and :func:`moe_experts` here run every check and the
whole forward before the weights are registered with the GradReduction,
so a failing call changes nothing (no partial, no registration).
Host-side values (expert offsets, chunk bounds, max |.| of the wgrad
bounds) are read through numpy (``Tensor.numpy()`` / ``tolist()``, which
both frameworks have): the same code, so the same values in both.

Expert parallelism: ``rows`` may instead be a bitexact._moe_ep.ExpertParallel
(``MoE.ep``, set by the trainer), which sends the rows to their experts'
ranks and back and adds the held experts' weight gradients itself.

Threading: the bodies run in the calling thread; the kernels release the
GIL and use ``num_threads`` workers (bits never depend on it). bf16
compute (the active reduction's compute_dtype): every GEMM but the
router's, in the block and in moe_experts. Not here: capacity / token
dropping, GPU tensors.
"""
import numpy as _np

from . import Error, InvalidArgumentError
from . import _gradred as _g
from . import kernels as _k
from ._gradred import _active, _err, _renamed, _threads
from ._layer_ops import _ModuleBase, mm

__all__ = ["Binding", "autograd_functions", "plan", "experts_rows_forward",
           "experts_rows_backward", "LOCAL_ROWS", "experts_forward", "experts_backward",
           "expert_wgrads", "route", "moe", "moe_route", "moe_experts", "MoEBase"]

_PROJ = ("gate", "up", "down")


# ---- host-side helpers (numpy: the same values in every framework) ----------

def _shape(t):
    return tuple(int(s) for s in t.shape)


def max_abs(t):
    """max |t| over the finite elements, 0 if none (exact; train_wgrad.c's
    max_abs, the input of bx_wgrad_bound_exp)."""
    a = _np.abs(t if isinstance(t, _np.ndarray) else _np.asarray(t.numpy()))
    a = a[_np.isfinite(a)]
    return float(a.max()) if a.size else 0.0


def wgrad_bound_exp(rows, dy, x, bf):
    """train_wgrad.c's tr_wg_bound_exp: bx_wgrad_bound_exp(rows, max|dy|,
    max|x|) over the finite elements, each max rounded to bf16 with bf16
    compute (the bound of the rounded operands)."""
    ma, mb = max_abs(dy), max_abs(x)
    if bf:
        ma, mb = _g.bf16_round(ma), _g.bf16_round(mb)
    return _k.wgrad_bound_exp(rows, ma, mb)


def chunk(default):
    """The token chunk of routing counts: the active GradReduction's
    seq_len inside a micro-batch, else default."""
    red = _active()
    return red.seq_len if red is not None and red._mb is not None else default


# ---- the framework binding ------------------------------------------------------

class Binding:
    """What a framework's MoE wrapper supplies to the call bodies:
    ``fw`` its _layer_ops.Adapter; ``prefix`` its public module name
    (``"bitexact.torch"``) for messages; ``check(fn, name, t, dtypes=,
    ndim=, min_ndim=)`` its argument check (returns t contiguous);
    ``ints`` its int32/int64 dtypes; ``capture(fn, [(w, name, rows)])``
    -> (micro-batch, state indices); ``fns`` its classes from
    :func:`autograd_functions`; ``need(tensors)`` the trailing apply
    arguments telling backward which of these inputs want a gradient
    (torch: none, it has ``ctx.needs_input_grad``; Paddle: one tuple of
    booleans, from stop_gradient)."""

    def __init__(self, *, fw, prefix, check, ints, capture, fns, need):
        self.fw, self.prefix, self.check, self.ints = fw, prefix, check, ints
        self.capture, self.fns, self.need = capture, fns, need


def autograd_functions(base, fw, module, need):
    """A namespace with ``.moe`` (_MoEFn) and ``.experts`` (_ExpertsFn),
    subclasses of ``base`` (torch.autograd.Function or PyLayer) of
    ``module`` whose forward/backward call :func:`block_forward` /
    :func:`block_backward` and :func:`experts_fn_forward` /
    :func:`experts_fn_backward` with adapter ``fw``; ``need(ctx, i)``:
    whether forward argument i wants its gradient. Backward returns the
    body's gradients then None up to ``fw.n_grads`` of the arguments."""
    import types

    def make(name, fwd, bwd, n_need):
        def forward(ctx, *args):
            ctx.n_grads = fw.n_grads(args)
            return fwd(fw, ctx, *fw.dx_args(ctx, args))

        def backward(ctx, dout):
            g = bwd(fw, ctx, dout, *(need(ctx, i) for i in range(n_need)))
            return g + (None,) * (ctx.n_grads - len(g))
        return type(name, (base,), {"forward": staticmethod(forward),
                                    "backward": staticmethod(backward), "__module__": module,
                                    "__qualname__": name, "__doc__": fwd.__doc__})
    return types.SimpleNamespace(moe=make("_MoEFn", block_forward, block_backward, 1),
                                 experts=make("_ExpertsFn", experts_fn_forward,
                                              experts_fn_backward, 2))


# ---- dispatch and the routed experts ----------------------------------------------

def plan(fw, ids, E, nt):
    """The dispatch plan of topk_ids [T, k]: offsets [E+1], row_map [R, 2],
    pos [T, k] (bx_moe_dispatch_plan; checks ids in range and distinct)."""
    T, K = _shape(ids)
    offsets, row_map, pos = fw.empty([E + 1], fw.i64), fw.empty([T * K, 2], fw.i64), \
        fw.empty([T, K], fw.i64)
    _k.moe_dispatch_plan(ids, None, offsets, row_map, pos, num_threads=nt)
    return offsets, row_map, pos


def experts_rows_forward(fw, xp, off, ews, nt, bf=False):
    """Each expert's SwiGLU MLP on its rows: for e with off[e] < off[e+1],
    rows a:b of xp [R, H] (a host list off [E+1]; ews [(W_g, W_u, W_d)]).
    Returns yp [R, H] and the state its backward needs (xp, gp, up, hp)."""
    R, H = _shape(xp)
    I = _shape(ews[0][0])[0]
    gp, up, hp, yp = fw.empty([R, I]), fw.empty([R, I]), fw.empty([R, I]), fw.empty([R, H])
    for e, (wg, wu, wd) in enumerate(ews):
        a, b = off[e], off[e + 1]
        if a == b:
            continue
        mm(fw, bf, xp[a:b], wg, "nt", gp[a:b], num_threads=nt)
        mm(fw, bf, xp[a:b], wu, "nt", up[a:b], num_threads=nt)
        _k.swiglu_forward(gp[a:b], up[a:b], hp[a:b], num_threads=nt)
        mm(fw, bf, hp[a:b], wd, "nt", yp[a:b], num_threads=nt)
    return yp, (xp, gp, up, hp)


def experts_rows_backward(fw, dyp, off, ews, act, nt, bf=False):
    """The backward of :func:`experts_rows_forward` for dyp [R, H]:
    dH = dY W_d, bx_swiglu_backward, dX = dG W_g + dU W_u (one fmaf chain
    per element). Returns dxp [R, H] and (dgp, dup), the weight
    gradients' row factors."""
    _, gp, up, _ = act
    R, H = _shape(dyp)
    I = _shape(gp)[1]
    dhp, dgp, dup, dxp = fw.empty([R, I]), fw.empty([R, I]), fw.empty([R, I]), fw.empty([R, H])
    for e, (wg, wu, wd) in enumerate(ews):
        a, b = off[e], off[e + 1]
        if a == b:
            continue
        mm(fw, bf, dyp[a:b], wd, "nn", dhp[a:b], num_threads=nt)
        _k.swiglu_backward(gp[a:b], up[a:b], dhp[a:b], dgp[a:b], dup[a:b], num_threads=nt)
        mm(fw, bf, dgp[a:b], wg, "nn", dxp[a:b], num_threads=nt)
        mm(fw, bf, dup[a:b], wu, "nn", dxp[a:b], accumulate=True, num_threads=nt)
    return dxp, (dgp, dup)


LOCAL_ROWS = (experts_rows_forward, experts_rows_backward)


def experts_forward(fw, x2, w, pl, ews, initial, nt, rows=LOCAL_ROWS, bf=False):
    """Permute, the experts on their rows (rows[0]), unpermute (+ initial,
    or None). Returns out [T, H] and the state (rows' state, yp, off)."""
    offsets, row_map, pos = pl
    R, H = _shape(row_map)[0], _shape(x2)[1]
    xp = fw.empty([R, H])
    _k.moe_permute(x2, row_map, xp, num_threads=nt)
    off = offsets.tolist()
    if isinstance(rows, tuple):
        yp, ract = rows[0](fw, xp, off, ews, nt, bf)
    else:  # expert parallel (bitexact._moe_ep.ExpertParallel): the rows travel to their experts
        yp, ract = rows.forward(fw, xp, off, ews, nt, row_map, bf)
    out = fw.empty([_shape(x2)[0], H])
    _k.moe_unpermute(yp, w, row_map, pos, initial, out, num_threads=nt)
    return out, (ract, yp, off)


def experts_backward(fw, dout, w, pl, ews, act, nt, want_dw=True, rows=LOCAL_ROWS, bf=False):
    """unpermute backward, the experts' backward (rows[1]), permute
    backward: dx [T, H] (the gather of the rows' dX, j ascending),
    dweights [T, k] (None unless want_dw), and the weight gradients' row
    factors (dyp, dgp, dup)."""
    _, row_map, pos = pl
    ract, yp, off = act
    dyp = fw.empty(_shape(yp))
    dw = fw.empty(_shape(w)) if want_dw else None
    _k.moe_unpermute_backward(dout, yp, w, row_map, pos, dyp, dw, num_threads=nt)
    if isinstance(rows, tuple):
        dxp, (dgp, dup) = rows[1](fw, dyp, off, ews, ract, nt, bf)
        grads = (dyp, dgp, dup)
    else:  # expert parallel: the weight gradients' factors stay on the experts' ranks
        dxp, grads = rows.backward(fw, dyp, ract, nt, bf), None
    dx = fw.empty(_shape(dout))
    _k.moe_permute_backward(dxp, row_map, pos, dx, num_threads=nt)
    return dx, dw, grads


def expert_wgrads(fw, mb, eidx, tok, off, ract, grads, what, bf=False, chunk0=None, span=None,
                  chunks=None):
    """tr_wg_expert for every expert weight that needs a gradient (eidx:
    per expert the state indices of (gate, up, down) or None): per global
    chunk of the micro-batch, the TN GEMM over the expert's rows of that
    chunk (pass 1; a zero partial for a chunk without rows) or the
    a-priori bound of that GEMM (pass 0; nothing for a chunk without rows).
    tok: the rows' global token ids (int64 [R], ascending per expert);
    ract: the rows' forward state (xp, gp, up, hp); grads (dyp, dgp, dup).
    Expert parallelism (bitexact._moe_ep) gives the chunk range its rows
    come from: chunks [chunk0, chunk0 + span) (default the micro-batch's),
    of which the offsets ``chunks`` are the EP peers' micro-batches."""
    if all(i is None for t in eidx for i in t):
        return
    bound = mb.check(what)
    red = mb.red
    s, C = red._state, red.seq_len
    chunk0 = mb.chunk0 if chunk0 is None else chunk0
    span = mb.T // C if span is None else span
    chunks = range(span) if chunks is None else chunks
    xp, _, _, hp = ract
    dyp, dgp, dup = grads
    bounds = fw.empty([span + 1], fw.i64)
    try:
        for e, idx3 in enumerate(eidx):
            r0, r1 = off[e], off[e + 1]
            if r1 > r0:
                _k.moe_expert_chunks(tok[r0:r1].contiguous(), C, chunk0, bounds)
                bd = bounds.tolist()
            else:
                bd = [0] * (span + 1)
            for i, dy, x in zip(idx3, (dgp, dup, dyp), (xp, xp, hp)):
                if i is None:
                    continue
                for ch in chunks:
                    a, b = r0 + bd[ch], r0 + bd[ch + 1]
                    if bound:
                        if a < b:
                            s.bound_exp(i, wgrad_bound_exp(b - a, dy[a:b], x[a:b], bf))
                        continue
                    shape = [_shape(dy)[1], _shape(x)[1]]
                    if a < b:
                        part = fw.empty(shape)
                        mm(fw, bf, dy[a:b], x[a:b], "tn", part, num_threads=red.num_threads)
                    else:  # the coverage check wants every chunk once: an exact zero
                        part = _np.zeros(shape, _np.float32)
                    s.add(i, chunk0 + ch, part)
    except Error as e:
        raise _renamed(e, red.names) from e


# ---- the router ---------------------------------------------------------------------

def _router_opts(cfg):
    _, _, ng, tg, norm, rsf = cfg
    return dict(n_group=ng, topk_group=tg, norm_topk_prob=norm, routed_scaling_factor=rsf)


def route(fw, x2, rw, bias, cfg, C, nt, counts=None):
    """logits [T, E] = x2 W_r^T, then bx_moe_router_forward: (logits,
    topk_ids [T, k] ascending, topk_weights [T, k]); counts [ceil(T/C), E]
    filled when given."""
    E, K = cfg[0], cfg[1]
    T = _shape(x2)[0]
    logits = fw.empty([T, E])
    _k.gemm(x2, rw, "nt", logits, num_threads=nt)
    ids, w = fw.empty([T, K], fw.i64), fw.empty([T, K])
    _k.moe_router_forward(logits, bias, ids, w, C, counts, num_threads=nt, **_router_opts(cfg))
    return logits, ids, w


def config(fn, E, K, n_group, topk_group, norm_topk_prob, routed_scaling_factor):
    """The router's options as a tuple (E, k, n_group, topk_group, norm,
    scaling), k checked in [1, E] (the kernel checks the groups)."""
    if int(K) < 1 or int(K) > E:
        raise _err(InvalidArgumentError, fn, "num_experts_per_tok",
                   f"{K} must be in [1, {E}] (the number of routed experts)")
    return (E, int(K), int(n_group), int(topk_group), bool(norm_topk_prob),
            float(routed_scaling_factor))


def _check_router(b, fn, x, router_weight, bias):
    rw = b.check(fn, "router_weight", router_weight, ndim=(2,))
    E, H = _shape(rw)
    x = b.check(fn, "input", x)
    if _shape(x)[-1] != H:
        raise _err(InvalidArgumentError, fn, "router_weight", f"has shape {_shape(rw)}: "
                   f"[n_routed_experts, {_shape(x)[-1]}] expected for the input's "
                   f"{_shape(x)[-1]} features")
    bb = b.check(fn, "e_score_correction_bias", bias, ndim=(1,))
    if _shape(bb)[0] != E:
        raise _err(InvalidArgumentError, fn, "e_score_correction_bias", f"has {_shape(bb)[0]} "
                   f"elements, the router weight {_shape(rw)} has {E} experts")
    return x, rw, bb


def _check_experts(b, fn, gate, up, down, H, prefix="experts"):
    gate, up, down = list(gate), list(up), list(down)
    if not (len(gate) == len(up) == len(down)) or not gate:
        raise _err(InvalidArgumentError, fn, "gate_weights", "gate/up/down weight lists of one "
                   f"length >= 1 expected, got {len(gate)}, {len(up)}, {len(down)}")
    I = None
    ews = []
    for e, trio in enumerate(zip(gate, up, down)):
        names = [f"{prefix}.{e}.{p}_proj.weight" for p in _PROJ]
        wg, wu, wd = (b.check(fn, n, t, ndim=(2,)) for n, t in zip(names, trio))
        I = _shape(wg)[0] if I is None else I
        for n, t, want in zip(names, (wg, wu, wd), ((I, H), (I, H), (H, I))):
            if _shape(t) != want:
                raise _err(InvalidArgumentError, fn, n, f"has shape {_shape(t)}, {want} "
                           "expected ([I, H], [I, H], [H, I], one I for all experts)")
        ews.append((wg, wu, wd))
    return ews, [t for trio in ews for t in trio]


def _expert_names(n):
    return [f"experts.{i // 3}.{_PROJ[i % 3]}_proj.weight" for i in range(3 * n)]


# ---- the call bodies of the public functions ------------------------------------------

def moe_route(b, x, router_weight, e_score_correction_bias, num_experts_per_tok, n_group,
              topk_group, norm_topk_prob, routed_scaling_factor, chunk_tokens, num_threads):
    """The body of the bindings' moe_route (their docstring): (ids,
    weights, counts) by the kernels of the block, no autograd."""
    fn = f"{b.prefix}.moe_route"
    x, rw, bb = _check_router(b, fn, x, router_weight, e_score_correction_bias)
    E, H = _shape(rw)
    cfg = config(fn, E, num_experts_per_tok, n_group, topk_group, norm_topk_prob,
                 routed_scaling_factor)
    x2 = b.fw.rows(x.detach(), H)
    T = _shape(x2)[0]
    C = int(chunk_tokens) if chunk_tokens is not None else chunk(max(T, 1))
    if C < 1:
        raise _err(InvalidArgumentError, fn, "chunk_tokens", f"{C} must be >= 1")
    counts = b.fw.empty([-(-T // C), E], b.fw.i64)
    _, ids, w = route(b.fw, x2, rw.detach(), bb, cfg, C, _threads(num_threads), counts)
    return ids, w, counts


def moe(b, x, router_weight, e_score_correction_bias, gate_weights, up_weights, down_weights,
        shared_gate_weight, shared_up_weight, shared_down_weight, num_experts_per_tok,
        n_group, topk_group, norm_topk_prob, routed_scaling_factor, num_threads,
        rows=LOCAL_ROWS):
    """The body of the bindings' moe (their docstring): checks, the whole
    forward, then the weights' registration and the autograd node."""
    fw, fn = b.fw, f"{b.prefix}.moe"
    x, rw, bb = _check_router(b, fn, x, router_weight, e_score_correction_bias)
    E, H = _shape(rw)
    cfg = config(fn, E, num_experts_per_tok, n_group, topk_group, norm_topk_prob,
                 routed_scaling_factor)
    ews, flat = _check_experts(b, fn, gate_weights, up_weights, down_weights, H)
    if len(ews) != E:
        raise _err(InvalidArgumentError, fn, "gate_weights", f"holds {len(ews)} experts, the "
                   f"router weight {_shape(rw)} has {E}")
    sh = [b.check(fn, n, t, ndim=(2,)) for n, t in (
        ("shared_experts.gate_proj.weight", shared_gate_weight),
        ("shared_experts.up_proj.weight", shared_up_weight),
        ("shared_experts.down_proj.weight", shared_down_weight))]
    SI = _shape(sh[0])[0]
    if [_shape(t) for t in sh] != [(SI, H), (SI, H), (H, SI)]:
        raise _err(InvalidArgumentError, fn, "shared_experts.gate_proj.weight", "shapes gate "
                   f"{_shape(sh[0])}, up {_shape(sh[1])}, down {_shape(sh[2])} do "
                   f"not fit ([SI, {H}], [SI, {H}], [{H}, SI])")
    x2 = fw.rows(x.detach(), H)
    T = _shape(x2)[0]
    nt = _threads(num_threads)
    bf = _g.bf16_active()  # bf16 compute: every GEMM but the router's (train_cli.md)
    # the whole forward first: any failure leaves the reduction untouched
    logits, ids, w = route(fw, x2, rw, bb, cfg, chunk(max(T, 1)), nt)
    pl = plan(fw, ids, E, nt)
    sgw, suw, sdw = sh
    sg, su, sa, so = fw.empty([T, SI]), fw.empty([T, SI]), fw.empty([T, SI]), fw.empty([T, H])
    mm(fw, bf, x2, sgw, "nt", sg, num_threads=nt)
    mm(fw, bf, x2, suw, "nt", su, num_threads=nt)
    _k.swiglu_forward(sg, su, sa, num_threads=nt)
    mm(fw, bf, sa, sdw, "nt", so, num_threads=nt)
    # train_moe_block.c computes the shared MLP after the experts; both are
    # independent outputs, so the order does not change a bit
    out, act = experts_forward(fw, x2, w, pl, ews, so, nt, rows, bf)
    names = [("router_weight", rw)] + list(zip(_expert_names(E), flat)) + \
        [("shared_experts.gate_proj.weight", sgw), ("shared_experts.up_proj.weight", suw),
         ("shared_experts.down_proj.weight", sdw)]
    mb, idx = b.capture(fn, [(t, n, T) for n, t in names])
    idx_t = (idx[0], [tuple(idx[1 + 3 * e:4 + 3 * e]) for e in range(E)], tuple(idx[-3:]))
    st = dict(out=out, nt=nt, bf=bf, cfg=cfg, logits=logits, ids=ids, w=w, plan=pl, act=act,
              shared_act=(sg, su, sa), rows=rows)
    return b.fns.moe.apply(x, rw, st, mb, idx_t, *flat, *sh, *b.need((x,)))


def _tokens(pl, mb):
    """The permuted rows' global token ids (ascending per expert)."""
    return pl[1][:, 0] + mb.tok0


def block_forward(fw, ctx, x, rw, st, mb, idx, *ws):
    """The block's autograd forward: its values were computed by
    :func:`moe` before apply (so a failure registers nothing); saves the
    inputs and returns the output in x's shape."""
    ctx.save_for_backward(x, rw, *ws)  # the framework's version checks on the inputs
    ctx.st, ctx.mb, ctx.idx = st, mb, idx
    return fw.reshape(st.pop("out"), list(_shape(x)))


def block_backward(fw, ctx, dout, need_dx):
    """(dx,) of the block (None unless need_dx); every weight gradient
    into the GradReduction (see the module docstring)."""
    st, mb, idx = ctx.st, ctx.mb, ctx.idx
    if mb is not None:
        mb.check("MoE backward")  # first: a stale pass computes nothing
    x, rw, *ws = fw.saved(ctx)
    nt, cfg, H = st["nt"], st["cfg"], _shape(x)[-1]
    x2 = fw.rows(x, H)
    ews = [tuple(ws[3 * e:3 * e + 3]) for e in range(cfg[0])]
    sgw, suw, sdw = ws[3 * cfg[0]:]
    d2 = fw.rows(dout.contiguous(), H)
    dx, dw, grads = experts_backward(fw, d2, st["w"], st["plan"], ews, st["act"], nt,
                                     rows=st["rows"], bf=st["bf"])
    dlogits = fw.empty(_shape(st["logits"]))
    _k.moe_router_backward(st["logits"], st["ids"], dw, dlogits, num_threads=nt,
                           **_router_opts(cfg))
    _k.gemm(dlogits, rw, "nn", dx, accumulate=True, num_threads=nt)
    sg, su, sa = st["shared_act"]
    dsa, dsg, dsu = (fw.empty(_shape(sa)) for _ in range(3))
    bf = st["bf"]
    mm(fw, bf, d2, sdw, "nn", dsa, num_threads=nt)
    _k.swiglu_backward(sg, su, dsa, dsg, dsu, num_threads=nt)
    mm(fw, bf, dsg, sgw, "nn", dx, accumulate=True, num_threads=nt)
    mm(fw, bf, dsu, suw, "nn", dx, accumulate=True, num_threads=nt)
    ir, eidx, (isg, isu, isd) = idx
    lin = ((ir, dlogits, x2, "router"), (isg, dsg, x2, "shared gate_proj"),
           (isu, dsu, x2, "shared up_proj"), (isd, d2, sa, "shared down_proj"))
    for i, dy, xx, what in lin:
        if i is not None:
            _g.wgrad(mb, i, dy, xx, f"MoE backward ({what})",  # the router: fp32
                     bf=fw.bf16 if bf and what != "router" else None)
    if mb is not None:
        ract, _, off = st["act"]
        if grads is None:  # expert parallel: the held experts, over every EP peer's chunks
            st["rows"].wgrads(mb, eidx, ract, bf)
        else:
            expert_wgrads(fw, mb, eidx, _tokens(st["plan"], mb), off, ract, grads,
                          "MoE backward (experts)", bf)
    return (fw.reshape(dx, list(_shape(x))) if need_dx else None,)


# ---- the routed experts alone (given routing) --------------------------------------------

def moe_experts(b, x, topk_ids, topk_weights, gate_weights, up_weights, down_weights,
                num_threads):
    """The body of the bindings' moe_experts (their docstring)."""
    fw, fn = b.fw, f"{b.prefix}.moe_experts"
    x = b.check(fn, "input", x)
    ids = b.check(fn, "topk_ids", topk_ids, b.ints, ndim=(2,))
    w = b.check(fn, "topk_weights", topk_weights, ndim=(2,))
    H = _shape(x)[-1]
    ews, flat = _check_experts(b, fn, gate_weights, up_weights, down_weights, H)
    x2 = fw.rows(x.detach(), H)
    if _shape(ids) != _shape(w) or _shape(ids)[0] != _shape(x2)[0]:
        raise _err(InvalidArgumentError, fn, "topk_ids", f"has shape {_shape(ids)}, "
                   f"topk_weights {_shape(w)}, input {_shape(x2)[0]} tokens: [T, k] both")
    nt = _threads(num_threads)
    bf = _g.bf16_active()  # bf16 compute: the experts' GEMMs, as in the block
    pl = plan(fw, ids, len(ews), nt)  # ids in range, distinct per token: checked here
    out, act = experts_forward(fw, x2, w.detach(), pl, ews, None, nt, bf=bf)
    mb, idx = b.capture(fn, [(t, n, _shape(x2)[0]) for n, t in zip(_expert_names(len(ews)),
                                                                     flat)])
    eidx = [tuple(idx[3 * e:3 * e + 3]) for e in range(len(ews))]
    st = dict(out=out, nt=nt, plan=pl, act=act, bf=bf)
    return b.fns.experts.apply(x, w, st, mb, eidx, *flat, *b.need((x, w)))


def experts_fn_forward(fw, ctx, x, w, st, mb, eidx, *ws):
    """moe_experts' autograd forward (values computed before apply)."""
    ctx.save_for_backward(x, w, *ws)
    ctx.st, ctx.mb, ctx.eidx = st, mb, eidx
    return fw.reshape(st.pop("out"), list(_shape(x)))


def experts_fn_backward(fw, ctx, dout, need_dx, need_dw):
    """(dx, dtopk_weights) (None where not needed); the expert weights'
    gradients into the GradReduction."""
    st, mb = ctx.st, ctx.mb
    if mb is not None:
        mb.check("moe_experts backward")
    x, w, *ws = fw.saved(ctx)
    H = _shape(x)[-1]
    ews = [tuple(ws[3 * e:3 * e + 3]) for e in range(len(ws) // 3)]
    dx, dw, grads = experts_backward(fw, fw.rows(dout.contiguous(), H), w.detach(), st["plan"],
                                     ews, st["act"], st["nt"], need_dw, bf=st["bf"])
    if mb is not None:
        ract, _, off = st["act"]
        expert_wgrads(fw, mb, ctx.eidx, _tokens(st["plan"], mb), off, ract, grads,
                      "moe_experts backward", st["bf"])
    return (fw.reshape(dx, list(_shape(x))) if need_dx else None, dw)


# ---- the module body (the framework subclass adds nn.Module / nn.Layer) ---------------------

class MoEBase(_ModuleBase):
    """The body of the bindings' MoE module: gate (the framework's
    MoERouter), experts (its module list of SwiGLUMLPs), shared_experts;
    the framework module ``_bx_api`` provides MoERouter, SwiGLUMLP,
    ModuleList, moe, moe_route and _PREFIX."""

    def __init__(self, hidden_size, moe_intermediate_size, n_routed_experts, num_experts_per_tok,
                 n_shared_experts=1, n_group=1, topk_group=1, norm_topk_prob=True,
                 routed_scaling_factor=1.0):
        super().__init__()
        api = self._bx_api
        self.cfg = dict(num_experts_per_tok=num_experts_per_tok, n_group=n_group,
                        topk_group=topk_group, norm_topk_prob=norm_topk_prob,
                        routed_scaling_factor=routed_scaling_factor)
        config(f"{api._PREFIX}.MoE", n_routed_experts, num_experts_per_tok, n_group, topk_group,
               norm_topk_prob, routed_scaling_factor)
        self.gate = api.MoERouter(hidden_size, n_routed_experts)
        self.experts = api.ModuleList(
            [api.SwiGLUMLP(hidden_size, moe_intermediate_size) for _ in range(n_routed_experts)])
        self.shared_experts = api.SwiGLUMLP(hidden_size, moe_intermediate_size * n_shared_experts)
        self.num_threads = None

    @classmethod
    def from_config(cls, config):
        """From a transformers Glm4MoeConfig (or any object with its fields)."""
        return cls(config.hidden_size, config.moe_intermediate_size, config.n_routed_experts,
                   config.num_experts_per_tok, config.n_shared_experts, config.n_group,
                   config.topk_group, config.norm_topk_prob, config.routed_scaling_factor)

    def route(self, x):
        """(topk_ids, topk_weights, counts) of x, as the binding's moe_route."""
        return self._bx_api.moe_route(x, self.gate.weight, self.gate.e_score_correction_bias,
                                      num_threads=self.num_threads, **self.cfg)

    def forward(self, x):
        ex, sh = self.experts, self.shared_experts
        return self._bx_api.moe(x, self.gate.weight, self.gate.e_score_correction_bias,
                                [m.gate_proj.weight for m in ex], [m.up_proj.weight for m in ex],
                                [m.down_proj.weight for m in ex], sh.gate_proj.weight,
                                sh.up_proj.weight, sh.down_proj.weight,
                                num_threads=self.num_threads,
                                expert_parallel=getattr(self, "ep", None), **self.cfg)
