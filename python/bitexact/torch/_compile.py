"""The training layers of bitexact.torch as torch custom ops, so that
``torch.compile(model, fullgraph=True)`` traces a whole training step's
forward and backward through them (docs/torch_layers.md, "torch.compile").

Two ops (namespace ``bitexact``, ``torch.library.custom_op``) carry every
layer function of torch/_layers.py and torch/_moe.py:

- ``torch.ops.bitexact.layer(name, tensors, ints, floats, grad, slots) ->
  Tensor[]``: the layer function ``name`` (``"linear"``, ``"moe"``, ...;
  :data:`_LAYERS`) on its arguments, flattened by :func:`call` (tensors,
  lists of tensors, ints, floats, bools, None; ``grad[j]`` whether flat
  tensor j takes part in autograd, decided at trace time from grad mode
  and ``requires_grad``; ``slots`` the flat tensors that get a gradient
  from autograd). Returns the function's outputs and a 0-d int64 *ticket*.
- ``torch.ops.bitexact.layer_backward(name, grads, ticket, like, slots) ->
  Tensor[]``: the backward of the call the ticket names: the gradients of
  ``slots`` (shaped as ``like``), first a 0-d zero for the *sink*.

Their implementation is the eager code, so the bits are the eager bits:
the op runs the public function itself, whose autograd Function (the
:class:`Function` base of torch._layers' and torch._moe's) is *recorded*
instead of applied: its forward body runs with a plain context, kept in a
table under the ticket's number until the backward op runs the backward
body on it (then dropped; a second backward raises). Inductor never sees,
fuses or reorders a kernel's arithmetic; the torch code between the ops
(residual additions, reshapes) is IEEE single-rounding arithmetic, the same
bits compiled or not. The weight gradients go to the active GradReduction
inside the backward op (a side effect the graph cannot see): so that the
compiler does not drop a backward whose input gradients nobody needs, each
call also takes :data:`SINK`, a 0-d leaf that requires grad, whose gradient
(always 0) is the backward op's first output. The ticket's lifetime is the
autograd graph's (a weakref finalizer drops the table entry when the graph
that saved the ticket is freed, or at once without grad).

Not traced (a graph break; with ``fullgraph=True`` Dynamo's error):
``moe_route`` (its chunk count depends on the active reduction at run
time). Threading: the ops run in the calling thread (the table is shared,
its numbers unique); the call being run is thread-local.
"""
import itertools
import weakref

import torch
from torch import Tensor

from .. import InvalidArgumentError
from ..nn import _gradred as _g
from . import _gradred as _tg

__all__ = ["compiling", "call", "Function", "SINK", "register_layers"]

SINK = torch.zeros((), requires_grad=True)  # the sink: see the module docstring
_RECORDS = {}  # ticket number -> (Function class, ctx, flat slot of id(arg), output shapes)
_COUNT = itertools.count(1)
_tls = _tg._tls  # .rec: the call being recorded (a _Recording), or None; thread-local


def compiling():
    """Whether Dynamo is tracing (the layer functions then call the op)."""
    return torch.compiler.is_compiling()


# ---- the flattened arguments ----------------------------------------------------------------

_NONE, _INT, _BOOL, _FLOAT, _TENSOR, _LIST, _OBJECT = range(7)


def call(name, args):
    """The layer function ``name`` on positional ``args`` through the op
    (called while Dynamo traces): args flattened, the grad flags and slots
    decided here, the outputs returned as the function returns them."""
    flat, ints, floats, slots = [], [], [], []
    diff = _LAYERS[name][2]
    for pos, a in enumerate(args):
        if a is None:
            ints += [_NONE, 0]
        elif isinstance(a, Tensor):
            if pos in diff:
                slots.append(len(flat))
            ints += [_TENSOR, len(flat)]
            flat.append(a)
        elif isinstance(a, (list, tuple)) and all(isinstance(t, Tensor) for t in a):
            ints += [_LIST, len(a)]
            flat.extend(a)
        elif isinstance(a, bool):
            ints += [_BOOL, int(a)]
        elif isinstance(a, int):
            ints += [_INT, a]
        elif isinstance(a, float):
            ints += [_FLOAT, len(floats)]
            floats.append(a)
        elif hasattr(a, "_bx_key"):  # an object of the layer (expert_parallel=): its key
            ints += [_OBJECT, a._bx_key]
        else:  # what the eager checks refuse too (a list for a tensor, ...)
            raise InvalidArgumentError(f"bitexact.torch.{name}: argument {pos} is a "
                                       f"{type(a).__name__}, which a compiled bitexact layer "
                                       "does not take (tensors, lists of tensors, numbers)")
    on = torch.is_grad_enabled()
    grad = [bool(on and t.requires_grad) for t in flat]
    slots = [j for j in slots if grad[j]]
    grad.append(any(grad))
    out = torch.ops.bitexact.layer(name, flat + [SINK], ints, floats, grad, slots)
    n = _LAYERS[name][3]
    return out[0] if n == 1 else tuple(out[:n])


def _decode(tensors, ints, floats):
    args, k = [], 0
    for i in range(0, len(ints), 2):
        kind, v = ints[i], ints[i + 1]
        if kind == _NONE:
            args.append(None)
        elif kind == _TENSOR:
            args.append(tensors[v])
            k = v + 1
        elif kind == _LIST:
            args.append(list(tensors[k:k + v]))
            k += v
        elif kind == _BOOL:
            args.append(bool(v))
        elif kind == _INT:
            args.append(int(v))
        elif kind == _FLOAT:
            args.append(float(floats[v]))
        else:
            args.append(_g.registered(v))
    return args


# ---- recording an autograd Function ----------------------------------------------------------

class _Ctx:
    """The context a recorded Function's bodies get (what they use of
    torch's: save_for_backward, saved_tensors, needs_input_grad)."""

    def save_for_backward(self, *tensors):
        self.saved_tensors = tensors


class _Recording:
    def __init__(self, flags):
        self.flags, self.cls, self.ctx = flags, None, None


class Function(torch.autograd.Function):
    """The base of the layers' autograd Functions: ``apply`` as torch's,
    except inside the op, where the call is recorded (see the module
    docstring)."""

    @classmethod
    def apply(cls, *args):
        rec = getattr(_tls, "rec", None)
        if rec is None:
            return super().apply(*args)
        if rec.cls is not None:
            raise InvalidArgumentError(f"{cls.__name__}: one Function per recorded call")
        ctx = _Ctx()
        ctx.needs_input_grad = tuple(isinstance(a, Tensor) and rec.flags.get(id(a), False)
                                     for a in args)
        ctx.args = args
        out = cls.forward(ctx, *args)
        rec.cls, rec.ctx = cls, ctx
        return out


def _layer_impl(name, tensors, ints, floats, grad, slots):
    tensors = list(tensors[:-1])  # the sink is not an argument
    flags = {id(t): g for t, g in zip(tensors, grad) if t is not None}
    rec = _Recording(flags)
    _tls.rec = rec  # also what _torch_gradred._capture reads the flags from
    try:
        out = _LAYERS[name][0](*_decode(tensors, ints, floats))
    finally:
        _tls.rec = None
    outs = list(out) if isinstance(out, tuple) else [out]
    key = next(_COUNT)
    ticket = torch.tensor(key, dtype=torch.int64)
    if rec.cls is not None and grad[-1]:
        slot_of = {id(t): j for j, t in enumerate(tensors) if t is not None}
        _RECORDS[key] = (rec.cls, rec.ctx, slot_of, [tuple(o.shape) for o in outs])
        weakref.finalize(ticket, _RECORDS.pop, key, None)
    return outs + [ticket]


def _layer_fake(name, tensors, ints, floats, grad, slots):
    outs = _LAYERS[name][1](*_decode(list(tensors[:-1]), ints, floats))
    return list(outs) + [torch.empty((), dtype=torch.int64)]


def _backward_impl(name, grads, ticket, like, slots):
    rec = _RECORDS.pop(int(ticket), None)
    if rec is None:
        raise InvalidArgumentError(f"bitexact.torch.{name} backward: this call's backward ran "
                                   "already (a compiled bitexact layer runs its backward once: "
                                   "retain_graph is not supported)")
    cls, ctx, slot_of, shapes = rec
    grads = [g if g is not None else torch.zeros(s) for g, s in zip(grads, shapes)]
    gin = cls.backward(ctx, *grads)
    by_slot = {}
    for a, g in zip(ctx.args, gin):
        if g is not None and isinstance(a, Tensor) and id(a) in slot_of:
            by_slot[slot_of[id(a)]] = g
    out = [torch.zeros(())]
    for j, t in zip(slots, like):
        g = by_slot.get(j)
        out.append(torch.zeros_like(t) if g is None else g.reshape(t.shape))
    return out


def _backward_fake(name, grads, ticket, like, slots):
    return [torch.empty(())] + [torch.empty_like(t) for t in like]


_layer_op = torch.library.custom_op("bitexact::layer", _layer_impl, mutates_args=(),
                                    schema="(str name, Tensor?[] tensors, int[] ints, "
                                    "float[] floats, bool[] grad, int[] slots) -> Tensor[]")
_layer_op.register_fake(_layer_fake)
_backward_op = torch.library.custom_op("bitexact::layer_backward", _backward_impl,
                                       mutates_args=(),
                                       schema="(str name, Tensor?[] grads, Tensor ticket, "
                                       "Tensor[] like, int[] slots) -> Tensor[]")
_backward_op.register_fake(_backward_fake)


def _setup_context(ctx, inputs, output):
    name, tensors, ints, floats, grad, slots = inputs
    ctx.name, ctx.n, ctx.slots = name, len(tensors), list(slots)
    # torch's custom-op autograd wants an empty list's "gradient" as []
    ctx.empty = [[] if not a else None for a in (ints, floats, grad, slots)]
    ctx.save_for_backward(output[-1], *[tensors[j] for j in slots])


def _backward(ctx, grads):
    ticket, *like = ctx.saved_tensors
    outs = torch.ops.bitexact.layer_backward(ctx.name, list(grads[:-1]), ticket, like, ctx.slots)
    g = [None] * ctx.n
    g[-1] = outs[0]  # the sink
    for j, t in zip(ctx.slots, outs[1:]):
        g[j] = t
    return (None, g, *ctx.empty)


_layer_op.register_autograd(_backward, setup_context=_setup_context)


# ---- the layer functions: (eager function, output shapes, differentiable args, outputs) ------

def _f32(shape):
    return torch.empty(tuple(shape), dtype=torch.float32)  # sizes may be symbolic


def _lead(x, n):
    return list(x.shape[:-1]) + [n]


def _layers():
    from . import _layers as L
    from . import _moe as M

    def qkv(x, wq, wk, wv, nt, bq, bk, bv):
        return L.qkv_projection(x, wq, wk, wv, nt, q_bias=bq, k_bias=bk, v_bias=bv)

    def moe(x, rw, bias, g, u, d, sg, su, sd, k, ng, tg, norm, scale, nt, ep):
        return M.moe(x, rw, bias, g, u, d, sg, su, sd, k, ng, tg, norm, scale, nt,
                     expert_parallel=ep)

    return {
        "linear": (L.linear, lambda x, w, b, nt: [_f32(_lead(x, w.shape[0]))], (0,), 1),
        "qkv_projection": (qkv, lambda x, wq, wk, wv, *_: [_f32(_lead(x, w.shape[0]))
                                                            for w in (wq, wk, wv)], (0,), 3),
        "rms_norm": (L.rms_norm, lambda x, *_: [_f32(x.shape)], (0,), 1),
        "swiglu": (L.swiglu, lambda g, u, nt: [_f32(g.shape)], (0, 1), 1),
        "swiglu_mlp": (L.swiglu_mlp, lambda x, wg, wu, wd, nt: [_f32(_lead(x, wd.shape[0]))],
                       (0,), 1),
        "embedding": (L.embedding, lambda ids, w, *_: [_f32(list(ids.shape) + [w.shape[1]])],
                      (), 1),
        "cross_entropy": (L.cross_entropy, lambda *_: [_f32(())], (0,), 1),
        "rope": (L.rope, lambda x, *_: [_f32(x.shape)], (0,), 1),
        "causal_attention": (L.causal_attention, lambda q, *_: [_f32(q.shape)], (0, 1, 2), 1),
        "moe": (moe, lambda x, *_: [_f32(x.shape)], (0,), 1),
        "moe_experts": (M.moe_experts, lambda x, *_: [_f32(x.shape)], (0, 2), 1),
    }


_LAYERS = {}  # filled by register_layers() (the layer modules import this one)


def register_layers():
    """Fill :data:`_LAYERS` (the end of _torch_moe's import)."""
    _LAYERS.update(_layers())
