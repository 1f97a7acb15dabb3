"""The numerics path of the training layers, shared by bitexact.torch
(torch/_layers.py) and bitexact.paddle (paddle/_layers.py).

Each op's forward and backward body here is the sequence of bitexact
kernel calls (bitexact.kernels) that computes it, as src/glm/train_layers.c
composes them, with the weight gradients handed to the framework-neutral
two-pass protocol of bitexact.nn._gradred. The framework files keep only the
autograd wrappers (a torch.autograd.Function or paddle.autograd.PyLayer
whose forward/backward call the bodies here), the argument checks and the
modules; the framework only allocates, copies to contiguous and reshapes
through a small :class:`Adapter`, so both bindings run the same kernel
calls in the same order on the same shapes and produce the same bits.

A forward body takes the wrapper's ``ctx`` (``save_for_backward`` and
attribute assignment are common to both frameworks), saves what its
backward needs and returns the op's outputs; a backward body returns the
input gradients the op computes (the wrapper appends the framework's
``None`` for the non-differentiable arguments). ``need_dx`` is torch's
``ctx.needs_input_grad[0]`` or Paddle's recorded ``stop_gradient`` state.
:func:`autograd_functions` makes the wrapper classes of a framework;
the ``*Base`` classes are the framework-neutral bodies of the modules
built from the ops (the framework subclass adds its module base class,
its docstring and ``_api``: its layers module, whose ops they call).

Threading: the bodies run in the calling thread; the kernels release the
GIL and use ``num_threads`` workers (bits never depend on it).
"""
import sys
import types

from .. import InvalidArgumentError, _core
from . import _gradred as _g
from .. import kernels as _k
from ._gradred import _active, _err


class Adapter:
    """What a framework supplies to the bodies: ``f32`` / ``i64`` its dtype
    objects; ``empty(shape, dtype=f32)`` a new uninitialised CPU tensor of
    a shape sequence (``[]``: a 0-d tensor); ``rows(t, last)`` t as
    ``[-1, last]``; ``reshape(t, shape)`` (shape a list); ``numel(t)``;
    ``saved(ctx)`` the tensors given to ``ctx.save_for_backward``;
    ``first(t)`` int of element 0 of a 1-D int64 tensor. For the wrappers:
    ``dx_args(ctx, args)`` the forward's arguments for a body that takes
    ``need_dx`` (Paddle's apply passes it last: kept on ctx),
    ``need_dx(ctx)`` whether the first input wants its gradient, and
    ``n_grads(args)`` how many values backward returns for these forward
    arguments (torch: one per argument; Paddle: one per tensor).
    ``from_numpy(a)``: a CPU tensor holding a's values (the MoE node's
    zero partial). ``bf16``: its bfloat16 dtype (the weights' bf16 copies,
    written by the model module's rounding, bitexact._core.glm_bf16_copy)."""

    def __init__(self, *, f32, i64, empty, rows, reshape, numel, saved, first, dx_args, need_dx,
                 n_grads, from_numpy, bf16):
        self.f32, self.i64, self.empty, self.rows = f32, i64, empty, rows
        self.reshape, self.numel, self.saved, self.first = reshape, numel, saved, first
        self.dx_args, self.need_dx, self.n_grads = dx_args, need_dx, n_grads
        self.from_numpy, self.bf16 = from_numpy, bf16


# The ops: (wrapper class name, body prefix, whether backward takes need_dx).
_OPS = (("_LinearFn", "linear", True), ("_QKVFn", "qkv", True), ("_RMSNormFn", "rmsnorm", True),
        ("_SwiGLUFn", "swiglu", False), ("_MLPFn", "mlp", True),
        ("_EmbeddingFn", "embedding", False), ("_XentFn", "xent", False),
        ("_RopeFn", "rope", False), ("_AttnFn", "attention", False))


def autograd_functions(base, fw, module):
    """A namespace holding, per body prefix (``.linear``, ``.qkv``, ...), a
    subclass of ``base`` (torch.autograd.Function or paddle.autograd.PyLayer)
    named as in _OPS, of ``module``, whose forward/backward call the bodies
    here with adapter ``fw``; backward returns the body's gradients followed
    by None up to fw.n_grads of the forward's arguments. Called once per
    framework at import."""
    out = {}
    for name, op, dx in _OPS:
        fwd, bwd = globals()[op + "_forward"], globals()[op + "_backward"]

        def forward(ctx, *args, fwd=fwd, dx=dx):
            ctx.n_grads = fw.n_grads(args)
            return fwd(fw, ctx, *(fw.dx_args(ctx, args) if dx else args))

        def backward(ctx, *grads, bwd=bwd, dx=dx):
            g = bwd(fw, ctx, *grads, *((fw.need_dx(ctx),) if dx else ()))
            g = g if isinstance(g, tuple) else (g,)
            return g + (None,) * (ctx.n_grads - len(g))

        out[op] = type(name, (base,), {"forward": staticmethod(forward),
                                       "backward": staticmethod(backward), "__module__": module,
                                       "__qualname__": name, "__doc__": fwd.__doc__})
    return types.SimpleNamespace(**out)


# ---- Linear and the fused q/k/v projection -----------------------------------

def bias_arg(check, fn, name, b, n):
    """A bias argument: None, or check(fn, name, b, ndim=(1,)) (the
    framework's argument check) of n elements."""
    if b is None:
        return None
    b = check(fn, name, b, ndim=(1,))
    if b.shape[0] != n:
        raise _err(InvalidArgumentError, fn, name, f"has {b.shape[0]} elements, the weight "
                   f"{n} output features")
    return b


def _shape(t):
    return tuple(int(n) for n in t.shape)


def linear_args(fw, check, capture, fn, x, weight, bias):
    """The argument handling of both bindings' ``linear``: check (the
    framework's argument check, returns the tensor contiguous) every
    argument, then capture (its GradReduction registration) the weight and
    bias. Returns (x, weight, bias, mb, (weight index, bias index))."""
    weight = check(fn, "weight", weight, ndim=(2,))
    bias = bias_arg(check, fn, "bias", bias, weight.shape[0])
    x = check(fn, "input", x)
    if x.shape[-1] != weight.shape[1]:
        raise _err(InvalidArgumentError, fn, "input", f"has {x.shape[-1]} features, weight "
                   f"{_shape(weight)} wants {weight.shape[1]}")
    rows = fw.numel(x) // max(1, x.shape[-1])
    mb, idx = capture(fn, [(weight, "weight", rows)] + ([(bias, "bias", rows)]
                                                        if bias is not None else []))
    return x, weight, bias, mb, (idx[0], idx[1] if bias is not None else None)


def qkv_args(fw, check, capture, fn, x, weights, biases):
    """The argument handling of both bindings' ``qkv_projection``: returns
    (x, [wq, wk, wv], [bq, bk, bv], mb, ((w, b) indices for q, k, v))."""
    names = ("q", "k", "v")
    ws = [check(fn, f"{n}_weight", w, ndim=(2,)) for n, w in zip(names, weights)]
    bs = [bias_arg(check, fn, f"{n}_bias", b, w.shape[0]) for n, b, w in zip(names, biases, ws)]
    x = check(fn, "input", x)
    for n, w in zip(names, ws):
        if w.shape[1] != x.shape[-1]:
            raise _err(InvalidArgumentError, fn, f"{n}_weight", f"has shape {_shape(w)}, the "
                       f"input {x.shape[-1]} features")
    rows = fw.numel(x) // max(1, x.shape[-1])
    mb, idx = capture(fn, [(t, f"{n}_{k}", rows) for n, w, b in zip(names, ws, bs)
                           for k, t in (("weight", w), ("bias", b)) if t is not None])
    it = iter(idx)
    return x, ws, bs, mb, tuple((next(it), next(it) if b is not None else None) for b in bs)


def _bf16(fw, t):
    """A new bf16 tensor of t rounded (the model module's rule)."""
    y = fw.empty(list(t.shape), fw.bf16)
    _core.glm_bf16_copy(t.detach(), y)
    return y


def _rounded(fw, t):
    """t's bf16 copy; a parameter of the active reduction is rounded once
    per step (GradReduction.begin clears the copies: the weights change
    only between steps), as `bitexact train`'s tr_bf16_weights."""
    red = _active()
    if red is None:
        return _bf16(fw, t)
    key = (t.data_ptr(), tuple(t.shape))
    if key not in red._param_keys:
        return _bf16(fw, t)
    r = red._bf16_copies.get(key)
    if r is None:
        r = red._bf16_copies[key] = _bf16(fw, t)
    return r


def _wbf(fw, ctx, w):
    """The node's bf16 copy of weight w (bf16 compute), else None."""
    return _rounded(fw, w) if ctx.bf else None


def _ix(i):
    return -1 if i is None else i


def linear_forward(fw, ctx, x, weight, bias, nt, mb, widx):
    """The node glm_linear_fwd: y = x W^T, then fl(y + b) with a bias."""
    ctx.bf = _g.bf16_active()  # bf16 compute: the GEMM's operands rounded (the node)
    x2 = fw.rows(x, weight.shape[1])
    y = fw.empty([x2.shape[0], weight.shape[0]])
    _core.glm_linear_forward(x2, weight, _wbf(fw, ctx, weight), bias, y, num_threads=nt)
    ctx.save_for_backward(x2, weight)
    ctx.meta = (list(x.shape), nt, mb, widx)
    return fw.reshape(y, list(x.shape[:-1]) + [weight.shape[0]])


def linear_backward(fw, ctx, dy, need_dx):
    """The node glm_linear_bwd: dx = dy W (or None); dW and db as chunk
    partials; widx = (weight index, bias index), either None."""
    shape, nt, mb, (wi, bi) = ctx.meta
    grads = _g.node_grads(mb, "Linear backward")  # first: a stale pass computes nothing
    x2, weight = fw.saved(ctx)
    dy2 = fw.rows(dy.contiguous(), weight.shape[0])
    dx = fw.empty(x2.shape) if need_dx else None
    if dx is not None or wi is not None or bi is not None:
        with _g.named(mb):
            _core.glm_linear_backward(dy2, x2, weight, _wbf(fw, ctx, weight), dx, grads, _ix(wi),
                                      _ix(bi), num_threads=nt)
    return fw.reshape(dx, shape) if dx is not None else None


def qkv_forward(fw, ctx, x, wq, wk, wv, bq, bk, bv, nt, mb, idx):
    """The node glm_qkv_fwd: (x Wq^T, x Wk^T, x Wv^T), each followed by
    fl(y + b) where its bias is given."""
    ctx.bf = _g.bf16_active()
    x2 = fw.rows(x, wq.shape[1])
    ws = (wq, wk, wv)
    outs = [fw.empty([x2.shape[0], w.shape[0]]) for w in ws]
    _core.glm_qkv_forward(x2, *ws, *(_wbf(fw, ctx, w) for w in ws), bq, bk, bv, *outs,
                          num_threads=nt)
    ctx.save_for_backward(x2, wq, wk, wv)
    ctx.meta = (list(x.shape), nt, mb, idx)
    return tuple(fw.reshape(y, list(x.shape[:-1]) + [w.shape[0]]) for y, w in zip(outs, ws))


def qkv_backward(fw, ctx, dq, dk, dv, need_dx):
    """The node glm_qkv_bwd: dx = dq Wq + dk Wk + dv Wv as ONE fmaf chain
    (or None), the three weight (and bias) gradients as chunk partials.
    Why one node: three autograd branches would leave the order of the two
    rounded additions to the framework's engine. idx: ((w, b) state
    indices, either None) for q, k, v."""
    shape, nt, mb, idx = ctx.meta
    grads = _g.node_grads(mb, "qkv_projection backward")
    x2, *ws = fw.saved(ctx)
    ds = [fw.rows(d.contiguous(), w.shape[0]) for d, w in zip((dq, dk, dv), ws)]
    dx = fw.empty(x2.shape) if need_dx else None
    with _g.named(mb):
        _core.glm_qkv_backward(*ds, x2, *ws, *(_wbf(fw, ctx, w) for w in ws), dx, grads,
                               tuple(_ix(i) for pair in idx for i in pair), num_threads=nt)
    return fw.reshape(dx, shape) if dx is not None else None


# ---- RMSNorm --------------------------------------------------------------

def rmsnorm_forward(fw, ctx, x, weight, eps, nt, mb, widx):
    """bx_rmsnorm_forward over rows of weight.shape[0] features."""
    x2 = fw.rows(x, weight.shape[0])
    y = fw.empty(x2.shape)
    rstd = fw.empty([x2.shape[0]])
    _k.rmsnorm_forward(x2, weight, eps, y, rstd, num_threads=nt)
    ctx.save_for_backward(x2, weight, rstd)
    ctx.meta = (list(x.shape), nt, mb, widx)
    return fw.reshape(y, list(x.shape))


def rmsnorm_backward(fw, ctx, dy, need_dx):
    """The node glm_rmsnorm_bwd: dx (always computed; returned if need_dx)
    and the gain's per-chunk partials (a chunk: rows per token * seq_len)."""
    shape, nt, mb, widx = ctx.meta
    grads = _g.node_grads(mb, "RMSNorm backward") if widx is not None else None
    x2, weight, rstd = fw.saved(ctx)
    dy2 = fw.rows(dy.contiguous(), weight.shape[0])
    dx = fw.empty(x2.shape)
    parts, per_chunk = None, max(1, x2.shape[0])
    if widx is not None:
        per_chunk = x2.shape[0] // mb.T * mb.red.seq_len  # rows per token * tokens per chunk
        parts = fw.empty([-(-x2.shape[0] // per_chunk), weight.shape[0]])
    with _g.named(mb):
        _core.glm_rmsnorm_backward(x2, weight, dy2, rstd, per_chunk, dx, parts, grads, _ix(widx),
                                   num_threads=nt)
    return fw.reshape(dx, shape) if need_dx else None


# ---- SwiGLU and the MLP -------------------------------------------------------

def swiglu_forward(fw, ctx, gate, up, nt):
    """h = SiLU(gate) * up (bx_swiglu_forward)."""
    h = fw.empty(gate.shape)
    _k.swiglu_forward(gate, up, h, num_threads=nt)
    ctx.save_for_backward(gate, up)
    ctx.nt = nt
    return h


def swiglu_backward(fw, ctx, dh):
    """(dgate, dup) by bx_swiglu_backward."""
    gate, up = fw.saved(ctx)
    dg, du = fw.empty(gate.shape), fw.empty(gate.shape)
    _k.swiglu_backward(gate, up, dh.contiguous(), dg, du, num_threads=ctx.nt)
    return dg, du


def mlp_forward(fw, ctx, x, wg, wu, wd, nt, mb, idx):
    """The node glm_mlp_fwd (Glm4MoeMLP): g = x Wg^T, u = x Wu^T,
    a = swiglu(g, u), y = a Wd^T."""
    ctx.bf = _g.bf16_active()
    I = wg.shape[0]
    x2 = fw.rows(x, wg.shape[1])
    T = x2.shape[0]
    g, u, a = (fw.empty([T, I]) for _ in range(3))
    y = fw.empty([T, wd.shape[0]])
    ws = (wg, wu, wd)
    _core.glm_mlp_forward(x2, *ws, *(_wbf(fw, ctx, w) for w in ws), g, u, a, y, num_threads=nt)
    ctx.save_for_backward(x2, wg, wu, wd, g, u, a)
    ctx.meta = (list(x.shape), nt, mb, idx)
    return fw.reshape(y, list(x.shape[:-1]) + [wd.shape[0]])


def mlp_backward(fw, ctx, dy, need_dx):
    """The node glm_mlp_bwd: da = dy Wd, (dg, du), then dx = dg Wg + du Wu
    as ONE fmaf chain per element (or None), the three weight gradients as
    chunk partials: the bits of `bitexact train`'s dense MLP."""
    shape, nt, mb, idx = ctx.meta
    grads = _g.node_grads(mb, "SwiGLUMLP backward")
    x2, wg, wu, wd, g, u, a = fw.saved(ctx)
    dy2 = fw.rows(dy.contiguous(), wd.shape[0])
    da, dg, du = (fw.empty(a.shape) for _ in range(3))
    dx = fw.empty(x2.shape) if need_dx else None
    ws = (wg, wu, wd)
    with _g.named(mb):
        _core.glm_mlp_backward(dy2, x2, g, u, a, *ws, *(_wbf(fw, ctx, w) for w in ws), da, dg, du,
                               dx, grads, tuple(_ix(i) for i in idx), num_threads=nt)
    return fw.reshape(dx, shape) if dx is not None else None


# ---- Embedding ----------------------------------------------------------------

def embedding_forward(fw, ctx, weight, ids, padding_idx, nt, mb, widx):
    """y = weight[ids] (bx_embedding_forward, bits copied)."""
    y = fw.empty(list(ids.shape) + [weight.shape[1]])
    _k.embedding_forward(weight, ids, y, padding_idx=padding_idx, num_threads=nt)
    ctx.save_for_backward(ids)
    ctx.meta = (list(weight.shape), padding_idx, nt, mb, widx)
    return y


def embedding_backward(fw, ctx, dy):
    """The node glm_embedding_bwd: the weight's gradient as compact
    per-chunk rows into the GradReduction; no input gradient."""
    (ids,) = fw.saved(ctx)
    (V, H), pad, nt, mb, widx = ctx.meta
    if widx is None:
        return
    grads = _g.node_grads(mb, "Embedding backward")  # first: a stale pass computes nothing
    T, C = fw.numel(ids), mb.red.seq_len
    row_ids, rows = fw.empty([T], fw.i64), fw.empty([T, H])
    offsets = fw.empty([-(-T // C) + 1], fw.i64)
    with _g.named(mb):
        _core.glm_embedding_backward(fw.reshape(ids, [-1]), fw.rows(dy.contiguous(), H), V, C,
                                     row_ids, rows, offsets, grads, widx,
                                     padding_idx=pad, num_threads=nt)


# ---- cross-entropy --------------------------------------------------------------

def xent_step(fw, fn, targets, ignore_index):
    """(mb, n_global) for a cross_entropy call: inside a micro-batch its
    MicroBatch (marked as holding the loss) and the step's n_targets; else
    (None, the count of this call's valid targets, at least 1)."""
    red = _active()
    mb = red._mb if red is not None else None
    if mb is not None:
        if mb.loss_used:
            raise InvalidArgumentError(f"{fn}: called twice in one micro-batch (the loss's chunk "
                                       "partials would be added twice)")
        if fw.numel(targets) != mb.T:
            raise _err(InvalidArgumentError, fn, "target", f"has {fw.numel(targets)} tokens, the "
                       f"micro-batch holds {mb.T}")
        mb.loss_used = True
        return mb, red.n_targets
    counts = fw.empty([1], fw.i64)
    _k.xent_count(fw.reshape(targets, [-1]), max(fw.numel(targets), 1), counts,
                  ignore_index=ignore_index)
    return None, max(fw.first(counts), 1)


def xent_forward(fw, ctx, logits, targets, ignore_index, nt, mb, n_global):
    """The node glm_xent_fwd: per-token losses, the dlogits for a unit loss
    gradient (kept for backward), inside a micro-batch the chunk partials
    into the loss reduction; returns sum(partials) / n_global, the exact
    sum rounded once, as a 0-d tensor."""
    z = fw.rows(logits, logits.shape[-1])
    T = z.shape[0]
    t1 = fw.reshape(targets, [-1])
    C = mb.red.seq_len if mb is not None else max(T, 1)
    losses, parts, dz, mean = fw.empty([T]), fw.empty([-(-T // C)]), fw.empty(z.shape), fw.empty([])
    lg = None
    if mb is not None:  # the step's loss: the partials into the loss reduction
        bound = mb.check("cross_entropy")
        lg = (mb.red._gr, 0 if bound else 1, mb.tok0, mb.chunk0)  # the node takes its loss state
    _core.glm_xent_forward(z, t1, n_global, C, ignore_index, losses, parts, dz, lg, mean,
                           num_threads=nt)
    if mb is not None:
        mb.token_losses = losses  # the per-token losses (a run record's loss_hash)
    ctx.save_for_backward(z, t1, dz)
    ctx.meta = (list(logits.shape), ignore_index, nt, n_global, mb)
    return mean


def xent_backward(fw, ctx, dloss):
    """dlogits: the forward's for a unit dloss, else bx_xent_backward with
    grad_scale = dloss."""
    shape, ign, nt, n_global, mb = ctx.meta
    if mb is not None:
        mb.check("cross_entropy backward")
    z, t1, dz = fw.saved(ctx)
    scale = float(dloss)
    if scale != 1.0:  # the kernels' grad_scale (1.0: the forward's dlogits)
        dz = fw.empty(z.shape)
        _k.xent_backward(z, t1, n_global, dz, ignore_index=ign, grad_scale=scale, num_threads=nt)
    return fw.reshape(dz, shape)


# ---- RoPE and causal GQA attention (no weights) ----------------------------------

def rope_forward(fw, ctx, x, positions, head_dim, rotary_dim, theta, nt):
    """bx_rope_forward."""
    y = fw.empty(x.shape)
    _k.rope_forward(x, positions, head_dim, rotary_dim, theta, y, num_threads=nt)
    ctx.save_for_backward(positions)
    ctx.meta = (head_dim, rotary_dim, theta, nt)
    return y


def rope_backward(fw, ctx, dy):
    """dx by bx_rope_backward."""
    (positions,) = fw.saved(ctx)
    hd, rd, theta, nt = ctx.meta
    dx = fw.empty(dy.shape)
    _k.rope_backward(dy.contiguous(), positions, hd, rd, theta, dx, num_threads=nt)
    return dx


def attention_forward(fw, ctx, q, k, v, dims, nt):
    """bx_attention_forward; dims = (seq_len, Hq, Hkv, head_dim)."""
    L, Hq, Hkv, D = dims
    T = fw.numel(q) // (Hq * D)
    o = fw.empty(q.shape)
    stats = fw.empty([T, Hq, 2])
    _k.attention_forward(q, k, v, L, Hq, Hkv, D, o, stats, num_threads=nt)
    ctx.save_for_backward(q, k, v, stats)
    ctx.meta = (dims, nt)
    return o


def attention_backward(fw, ctx, do):
    """(dq, dk, dv) by bx_attention_backward."""
    q, k, v, stats = fw.saved(ctx)
    (L, Hq, Hkv, D), nt = ctx.meta
    dq, dk, dv = (fw.empty(t.shape) for t in (q, k, v))
    _k.attention_backward(do.contiguous(), q, k, v, stats, L, Hq, Hkv, D, dq, dk, dv,
                          num_threads=nt)
    return dq, dk, dv


# ---- the module bodies (the framework subclass adds nn.Module / nn.Layer) -------

class _ModuleBase:
    """A module body calling its framework's ops through ``_bx_api``: the
    layers module (torch._layers / paddle._layers) its subclass is defined
    in."""

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        cls._bx_api = sys.modules[cls.__module__]


class SwiGLUMLPBase(_ModuleBase):
    def __init__(self, hidden_size, intermediate_size):
        super().__init__()
        Linear = self._bx_api.Linear
        self.gate_proj = Linear(hidden_size, intermediate_size)
        self.up_proj = Linear(hidden_size, intermediate_size)
        self.down_proj = Linear(intermediate_size, hidden_size)
        self.num_threads = None

    def forward(self, x):
        return self._bx_api.swiglu_mlp(x, self.gate_proj.weight, self.up_proj.weight,
                                       self.down_proj.weight, self.num_threads)


class CrossEntropyLossBase(_ModuleBase):
    def __init__(self, ignore_index=-100):
        super().__init__()
        self.ignore_index, self.num_threads = ignore_index, None

    def forward(self, logits, targets):
        return self._bx_api.cross_entropy(logits, targets, self.ignore_index, self.num_threads)


class RotaryEmbeddingBase(_ModuleBase):
    def __init__(self, head_dim, partial_rotary_factor=1.0, theta=10000.0):
        super().__init__()
        self.head_dim, self.rotary_dim = head_dim, int(head_dim * partial_rotary_factor)
        self.theta, self.num_threads = theta, None

    def forward(self, x, positions):
        return self._bx_api.rope(x, positions, self.head_dim, self.rotary_dim, self.theta,
                                 self.num_threads)


class CausalAttentionBase(_ModuleBase):
    def __init__(self, hidden_size, num_heads, num_kv_heads, head_dim, seq_len,
                 partial_rotary_factor=1.0, theta=10000.0):
        super().__init__()
        api = self._bx_api
        self.q_proj = api.Linear(hidden_size, num_heads * head_dim)
        self.k_proj = api.Linear(hidden_size, num_kv_heads * head_dim)
        self.v_proj = api.Linear(hidden_size, num_kv_heads * head_dim)
        self.o_proj = api.Linear(num_heads * head_dim, hidden_size)
        self.rope = api.RotaryEmbedding(head_dim, partial_rotary_factor, theta)
        self.dims = (seq_len, num_heads, num_kv_heads, head_dim)

    def forward(self, x, positions):
        L, Hq, Hkv, D = self.dims
        api = self._bx_api
        q, k, v = api.qkv_projection(x, self.q_proj.weight, self.k_proj.weight,
                                     self.v_proj.weight, self.q_proj.num_threads)
        q, k = self.rope(q, positions), self.rope(k, positions)
        return self.o_proj(api.causal_attention(q, k, v, L, Hq, Hkv, D))
