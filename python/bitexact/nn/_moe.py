"""The GLM-4.5 mixture-of-experts block (transformers' ``Glm4MoeMoE``) of
bitexact.torch (torch/_moe.py) and bitexact.paddle (paddle/_moe.py);
docs/torch_layers.md and docs/paddle_layers.md, "The MoE block".

The block is the model module's node (src/glm/glm_moe.h, through
bitexact._core.glm_moe_forward / _backward: router, dispatch, the routed
experts local or expert-parallel, the shared experts, every weight
gradient into the active GradReduction); ``moe_experts`` is its routed
stage alone (glm_moe_experts_forward / _backward). What is here is the
plumbing both frameworks share: the argument checks, the tensors the node
writes (allocated through the framework :class:`~bitexact.nn._layers.Adapter`),
the registration with the GradReduction after the forward succeeded (a
failing call changes nothing), and the autograd classes. The whole block
is ONE autograd node: as separate nodes the framework would add three
rounded branch gradients.

Expert parallelism: ``rows`` may be a bitexact.nn._ep.ExpertParallel
(``MoE.ep``, set by the trainer): the node sends the rows to their
experts' ranks through its all-to-all callbacks.

Threading: the bodies run in the calling thread; the node releases the GIL
and uses ``num_threads`` workers (bits never depend on it). bf16 compute
(the active reduction's compute_dtype): every GEMM but the router's, in
the block and in moe_experts (the weights' bf16 copies passed to the node).
Not here: capacity / token dropping, GPU tensors.
"""
import numpy as _np

from .. import InvalidArgumentError, _core
from . import _gradred as _g
from .. import kernels as _k
from ._gradred import _active, _err, _forward_tok0, _threads
from ._layers import _ModuleBase, _rounded

__all__ = ["Binding", "autograd_functions", "plan", "LOCAL_ROWS", "route", "moe", "moe_route",
           "moe_experts", "MoEBase"]

_PROJ = ("gate", "up", "down")


# ---- host-side helpers (numpy: the same values in every framework) ----------

def _shape(t):
    return tuple(int(s) for s in t.shape)


def chunk(default):
    """The token chunk of routing counts: the active GradReduction's
    seq_len inside a micro-batch, else default."""
    red = _active()
    return red.seq_len if red is not None and red._mb is not None else default


# ---- the framework binding ------------------------------------------------------

class Binding:
    """What a framework's MoE wrapper supplies to the call bodies:
    ``fw`` its nn._layers.Adapter; ``prefix`` its public module name
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


LOCAL_ROWS = None  # the routed experts on this rank (no expert parallelism)


def _bf(fw, ws, bf):
    """The node's weights_bf16 list: each weight's bf16 copy of the step
    (None where no copy: the router, the bias, the experts not given)."""
    return [None if w is None else _rounded(fw, w) for w in ws] if bf else None


def _rows_acts(fw, T, K, H, I, E, pl, local=True):
    """The routed stage's activations (offsets, row_map, pos: the plan pl
    or new), xp, gp, up, hp ([R, I]; [0, I] under expert parallelism,
    where the held experts' rows are the node's), yp."""
    R = T * K
    Rl = R if local else 0
    off, rmap, pos = pl if pl is not None else (fw.empty([E + 1], fw.i64),
                                                  fw.empty([R, 2], fw.i64), fw.empty([T, K], fw.i64))
    return [off, rmap, pos, fw.empty([R, H]), fw.empty([Rl, I]), fw.empty([Rl, I]),
            fw.empty([Rl, I]), fw.empty([R, H])]


def _rows_scratch(fw, T, K, H, I, C, local=True):
    """The routed stage's backward scratch (glm_moe_scr): dyp, dxp, dgp,
    dup, dhp, tok, bounds, part, zeros."""
    R = T * K
    Rl = R if local else 0
    return [fw.empty([R, H]), fw.empty([R, H]), fw.empty([Rl, I]), fw.empty([Rl, I]),
            fw.empty([Rl, I]), fw.empty([R], fw.i64), fw.empty([-(-T // C) + 1], fw.i64),
            fw.empty([I, H]), fw.from_numpy(_np.zeros((I, H), _np.float32))]


# ---- the router ---------------------------------------------------------------------

def route(fw, x2, rw, bias, cfg, C, nt, counts=None):
    """The node glm_moe_route: (logits [T, E], topk_ids [T, k] ascending,
    topk_weights [T, k]); counts [ceil(T/C), E] filled when given."""
    E, K = cfg[0], cfg[1]
    T = _shape(x2)[0]
    logits, ids, w = fw.empty([T, E]), fw.empty([T, K], fw.i64), fw.empty([T, K])
    _core.glm_moe_route(x2, rw, bias, cfg, C, logits, ids, w, counts, num_threads=nt)
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


def _check_experts(b, fn, gate, up, down, H, prefix="experts", first=0):
    gate, up, down = list(gate), list(up), list(down)
    if not (len(gate) == len(up) == len(down)) or not gate:
        raise _err(InvalidArgumentError, fn, "gate_weights", "gate/up/down weight lists of one "
                   f"length >= 1 expected, got {len(gate)}, {len(up)}, {len(down)}")
    I = None
    ews = []
    for e, trio in enumerate(zip(gate, up, down)):
        names = [f"{prefix}.{first + e}.{p}_proj.weight" for p in _PROJ]
        wg, wu, wd = (b.check(fn, n, t, ndim=(2,)) for n, t in zip(names, trio))
        I = _shape(wg)[0] if I is None else I
        for n, t, want in zip(names, (wg, wu, wd), ((I, H), (I, H), (H, I))):
            if _shape(t) != want:
                raise _err(InvalidArgumentError, fn, n, f"has shape {_shape(t)}, {want} "
                           "expected ([I, H], [I, H], [H, I], one I for all experts)")
        ews.append((wg, wu, wd))
    return ews, [t for trio in ews for t in trio]


def _expert_names(n, first=0):
    return [f"experts.{first + i // 3}.{_PROJ[i % 3]}_proj.weight" for i in range(3 * n)]


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
    gate_weights, up_weights, down_weights = list(gate_weights), list(up_weights), list(down_weights)
    first = 0  # the first expert given: all E, or under expert parallelism the held ones
    held = rows is not LOCAL_ROWS and len(gate_weights) != E
    if held:
        first = rows.first
        if len(gate_weights) != rows.nl:
            raise _err(InvalidArgumentError, fn, "gate_weights", f"holds {len(gate_weights)} "
                       f"experts: all {E}, or the {rows.nl} this rank holds under expert "
                       "parallelism expected")
    ews, flat = _check_experts(b, fn, gate_weights, up_weights, down_weights, H, first=first)
    if not held and len(ews) != E:
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
    SI, I, K = _shape(sh[0])[0], _shape(flat[0])[0], cfg[1]
    red = _active()
    mb0 = red._mb if red is not None else None
    tok0 = mb0.tok0 if mb0 is not None else _forward_tok0()
    if rows is not LOCAL_ROWS and tok0 is None:
        raise InvalidArgumentError(f"{fn}: expert parallel: the block must run inside a "
                                   "GradReduction micro-batch or forward_tokens(tok0) (the rows' "
                                   "global token ids)")
    C = chunk(max(T, 1))
    pad = [None] * (3 * first), [None] * (3 * (E - first - len(ews)))  # experts not held
    ws = [rw, bb] + pad[0] + flat + pad[1] + sh
    wbf = _bf(fw, [None, None] + pad[0] + flat + pad[1] + sh, bf)
    acts = [fw.empty([T, E]), fw.empty([T, K]), fw.empty([T, K], fw.i64)] + \
        _rows_acts(fw, T, K, H, I, E, None, rows is LOCAL_ROWS) + \
        [fw.empty([T, SI]), fw.empty([T, SI]), fw.empty([T, SI]), fw.empty([T, H])]
    out = fw.empty([T, H])
    # the whole forward first: any failure leaves the reduction untouched
    state = _core.glm_moe_forward(x2, ws, wbf, cfg, C, acts, out, ep=rows,
                                  first_token=tok0 if tok0 is not None else 0, num_threads=nt)
    names = [("router_weight", rw)] + list(zip(_expert_names(len(ews), first), flat)) + \
        [("shared_experts.gate_proj.weight", sh[0]), ("shared_experts.up_proj.weight", sh[1]),
         ("shared_experts.down_proj.weight", sh[2])]
    mb, idx = b.capture(fn, [(t, n, T) for n, t in names])
    st = dict(out=out, nt=nt, cfg=cfg, C=C, acts=acts, ecb=bb, wbf=wbf, rows=rows, state=state,
              dims=(T, K, H, I, SI), pad=pad)
    idx = [idx[0], None] + pad[0] + idx[1:1 + len(flat)] + pad[1] + idx[1 + len(flat):]
    return b.fns.moe.apply(x, rw, st, mb, idx, *flat, *sh, *b.need((x,)))


def block_forward(fw, ctx, x, rw, st, mb, idx, *ws):
    """The block's autograd forward: its values were computed by
    :func:`moe` before apply (so a failure registers nothing); saves the
    inputs and returns the output in x's shape."""
    ctx.save_for_backward(x, rw, *ws)  # the framework's version checks on the inputs
    ctx.st, ctx.mb, ctx.idx = st, mb, idx
    return fw.reshape(st.pop("out"), list(_shape(x)))


def block_backward(fw, ctx, dout, need_dx):
    """(dx,) of the block (None unless need_dx); every weight gradient
    into the GradReduction (the node glm_moe_bwd)."""
    st, mb, idx = ctx.st, ctx.mb, ctx.idx
    grads = _g.node_grads(mb, "MoE backward")  # first: a stale pass computes nothing
    x, rw, *ws = fw.saved(ctx)
    T, K, H, I, SI = st["dims"]
    E = st["cfg"][0]
    local = st["rows"] is LOCAL_ROWS
    scratch = [fw.empty([T, K]), fw.empty([T, E]), fw.empty([T, SI]), fw.empty([T, SI]),
               fw.empty([T, SI])] + _rows_scratch(fw, T, K, H, I, st["C"], local)
    dx = fw.empty([T, H])
    pad = st["pad"]
    ws = pad[0] + list(ws[:-3]) + pad[1] + list(ws[-3:])  # the experts not held: None
    with _g.named(mb):
        _core.glm_moe_backward(fw.rows(dout.contiguous(), H), fw.rows(x, H),
                               [rw, st["ecb"]] + ws, st["wbf"], st["cfg"], st["C"],
                               st["acts"], scratch, dx, grads, idx, ep=st["rows"],
                               ep_state=st["state"], num_threads=st["nt"])
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
    E, (T, K), I = len(ews), _shape(ids), _shape(flat[0])[0]
    pl = plan(fw, ids, E, nt)  # ids in range, distinct per token: checked here
    acts = [None] * 3 + _rows_acts(fw, T, K, H, I, E, pl) + [None] * 4
    out = fw.empty([T, H])
    wbf = _bf(fw, flat, bf)
    _core.glm_moe_experts_forward(x2, w.detach(), flat, wbf, acts, None, out, num_threads=nt)
    mb, idx = b.capture(fn, [(t, n, T) for n, t in zip(_expert_names(E), flat)])
    st = dict(out=out, nt=nt, acts=acts, wbf=wbf, dims=(T, K, H, I))
    return b.fns.experts.apply(x, w, st, mb, idx, *flat, *b.need((x, w)))


def experts_fn_forward(fw, ctx, x, w, st, mb, eidx, *ws):
    """moe_experts' autograd forward (values computed before apply)."""
    ctx.save_for_backward(x, w, *ws)
    ctx.st, ctx.mb, ctx.eidx = st, mb, eidx
    return fw.reshape(st.pop("out"), list(_shape(x)))


def experts_fn_backward(fw, ctx, dout, need_dx, need_dw):
    """(dx, dtopk_weights) (None where not needed); the expert weights'
    gradients into the GradReduction (the node glm_moe_experts_bwd)."""
    st, mb = ctx.st, ctx.mb
    grads = _g.node_grads(mb, "moe_experts backward")
    x, w, *ws = fw.saved(ctx)
    T, K, H, I = st["dims"]
    C = mb.red.seq_len if mb is not None else max(T, 1)
    dx, dw = fw.empty([T, H]), fw.empty([T, K]) if need_dw else None
    with _g.named(mb):
        _core.glm_moe_experts_backward(fw.rows(dout.contiguous(), H), w.detach(), list(ws),
                                       st["wbf"], C, st["acts"],
                                       [None] * 5 + _rows_scratch(fw, T, K, H, I, C), dx, dw,
                                       grads, ctx.eidx, num_threads=st["nt"])
    return (fw.reshape(dx, list(_shape(x))) if need_dx else None, dw)


# ---- the module body (the framework subclass adds nn.Module / nn.Layer) ---------------------

class MoEBase(_ModuleBase):
    """The body of the bindings' MoE module: gate (the framework's
    MoERouter), experts (its module list of SwiGLUMLPs), shared_experts;
    the framework module ``_bx_api`` provides MoERouter, SwiGLUMLP,
    ModuleList, moe, moe_route and _PREFIX."""

    def __init__(self, hidden_size, moe_intermediate_size, n_routed_experts, num_experts_per_tok,
                 n_shared_experts=1, n_group=1, topk_group=1, norm_topk_prob=True,
                 routed_scaling_factor=1.0, expert_parallel=None):
        super().__init__()
        api = self._bx_api
        self.cfg = dict(num_experts_per_tok=num_experts_per_tok, n_group=n_group,
                        topk_group=topk_group, norm_topk_prob=norm_topk_prob,
                        routed_scaling_factor=routed_scaling_factor)
        config(f"{api._PREFIX}.MoE", n_routed_experts, num_experts_per_tok, n_group, topk_group,
               norm_topk_prob, routed_scaling_factor)
        self.gate = api.MoERouter(hidden_size, n_routed_experts)
        ep = expert_parallel
        if ep is None:
            self.experts = api.ModuleList([api.SwiGLUMLP(hidden_size, moe_intermediate_size)
                                           for _ in range(n_routed_experts)])
        else:  # only the experts this rank holds, under their global numbers
            if ep.NE != n_routed_experts:
                raise InvalidArgumentError(f"{api._PREFIX}.MoE: expert_parallel is for "
                                           f"{ep.NE} experts, the block has {n_routed_experts}")
            self.experts = api.ModuleDict({str(e): api.SwiGLUMLP(hidden_size, moe_intermediate_size)
                                           for e in range(ep.first, ep.first + ep.nl)})
            for m in self.experts.values():
                ep.own([m.gate_proj.weight, m.up_proj.weight, m.down_proj.weight])
        self.ep = ep
        self.shared_experts = api.SwiGLUMLP(hidden_size, moe_intermediate_size * n_shared_experts)
        self.num_threads = None

    @classmethod
    def from_config(cls, config, expert_parallel=None):
        """From a transformers Glm4MoeConfig (or any object with its fields);
        ``expert_parallel`` (a bitexact.nn.ExpertParallel): build only this
        rank's experts (``experts`` then maps their global numbers, as
        strings, to the modules; the parameter names stay
        ``experts.E.*``)."""
        return cls(config.hidden_size, config.moe_intermediate_size, config.n_routed_experts,
                   config.num_experts_per_tok, config.n_shared_experts, config.n_group,
                   config.topk_group, config.norm_topk_prob, config.routed_scaling_factor,
                   expert_parallel=expert_parallel)

    def _expert_modules(self):
        ex = self.experts
        return list(ex.values()) if hasattr(ex, "values") else list(ex)

    def route(self, x):
        """(topk_ids, topk_weights, counts) of x, as the binding's moe_route."""
        return self._bx_api.moe_route(x, self.gate.weight, self.gate.e_score_correction_bias,
                                      num_threads=self.num_threads, **self.cfg)

    def forward(self, x):
        ex, sh = self._expert_modules(), self.shared_experts
        return self._bx_api.moe(x, self.gate.weight, self.gate.e_score_correction_bias,
                                [m.gate_proj.weight for m in ex], [m.up_proj.weight for m in ex],
                                [m.down_proj.weight for m in ex], sh.gate_proj.weight,
                                sh.up_proj.weight, sh.down_proj.weight,
                                num_threads=self.num_threads,
                                expert_parallel=getattr(self, "ep", None), **self.cfg)
