"""bitexact.paddle's GradReduction (the framework-neutral protocol of
bitexact.nn._gradred with Paddle's checks, allocation and .grad), comm()
over paddle.distributed, and the argument checks of paddle/_layers.py
(docs/paddle_layers.md). Threading: as bitexact.nn._gradred."""
import numpy as _np
import paddle

from .. import Comm, DeviceError, DTypeError, InvalidArgumentError, LayoutError
from ..nn import _gradred as _g
from ..nn._gradred import _err

__all__ = ["GradReduction", "comm"]

_F32 = paddle.float32
_INTS = (paddle.int32, paddle.int64)
_DOC = "docs/paddle_layers.md"


def _dname(d):
    return str(d).replace("paddle.", "")


def _check(fn, name, t, dtypes=(_F32,), ndim=None, min_ndim=1):
    """The checks every argument gets before any kernel runs (the kernels
    check again; these name the layer's own argument). Returns t
    contiguous (a Paddle copy where it is not)."""
    if not isinstance(t, paddle.Tensor):
        if not paddle.in_dynamic_mode():  # paddle.jit.to_static builds a program
            raise _err(InvalidArgumentError, fn, name, f"is a static-graph {type(t).__name__}: "
                       "bitexact's Paddle layers run in the dynamic graph only, not under "
                       "paddle.jit.to_static (docs/paddle_layers.md)")
        raise _err(InvalidArgumentError, fn, name, f"is a {type(t).__name__}, not a paddle.Tensor")
    if not t.place.is_cpu_place():
        raise _err(DeviceError, fn, name, f"is on {t.place}; bitexact's training kernels run on "
                   "CPU tensors")
    if t.is_selected_rows() or t.is_dist():
        raise _err(LayoutError, fn, name, "is a SelectedRows or distributed tensor; a dense "
                   "tensor is needed")
    if t.dtype not in dtypes:
        want = " or ".join(_dname(d) for d in dtypes)
        raise _err(DTypeError, fn, name, f"dtype must be {want}, not {_dname(t.dtype)}")
    nd = len(t.shape)
    if (ndim is not None and nd not in ndim) or nd < min_ndim:
        raise _err(InvalidArgumentError, fn, name, f"has shape {list(t.shape)}: "
                   f"{'/'.join(map(str, ndim)) if ndim else f'at least {min_ndim}'} dimensions expected")
    return t if t.is_contiguous() else t.contiguous()


def _fast_empty():
    """paddle.empty without its Python argument handling (a layer step
    allocates a few hundred outputs): the eager op itself on the CPU place,
    checked once against paddle.empty; else paddle.empty."""
    try:
        from paddle import _C_ops
        place = paddle.CPUPlace()
        t = _C_ops.empty([2, 3], _F32, place)
        if isinstance(t, paddle.Tensor) and list(t.shape) == [2, 3] and t.dtype == _F32 \
                and t.place.is_cpu_place() and t.stop_gradient:
            return lambda shape, dtype=_F32: _C_ops.empty(list(shape), dtype, place)
    except Exception:  # another Paddle: the public call
        pass
    return lambda shape, dtype=_F32: paddle.empty(list(shape), dtype=dtype)


empty = _fast_empty()  # empty(shape, dtype=float32): an uninitialised CPU tensor


def _empty(*shape, dtype=_F32):
    return empty(shape, dtype)


def _rows(t, last):
    return t.reshape([-1, last])


def _numel(t):
    return int(_np.prod(t.shape)) if len(t.shape) else 1


def _wants_grad(t):
    return paddle.is_grad_enabled() and not t.stop_gradient


def _capture(fn, weights, exact=True):
    grad = paddle.is_grad_enabled()
    return _g.capture(fn, weights, lambda w: grad and not w.stop_gradient, _DOC, exact)


# ---- the step's gradient reduction ---------------------------------------

class GradReduction(_g.GradReductionBase):
    """bitexact.torch.GradReduction for Paddle: the same protocol (begin,
    micro_batch, agree, the same micro-batches, finish; or run_two_pass; or
    the one-pass run_step on a grid stated from the history),
    the same errors and the same bits. ``parameters``: fp32 CPU Paddle
    parameters with ``stop_gradient=False`` or ``named_parameters()`` pairs.
    ``finish`` sets every parameter's ``.grad`` (a new tensor, replacing
    any previous one; nothing set on error). ``comm``: None, a
    :class:`bitexact.Comm` (:func:`comm`), or a paddle.distributed group."""

    def _fw_check_param(self, name, p):
        _check("GradReduction", name, p, min_ndim=0)
        if not p.is_contiguous():
            raise _err(LayoutError, "GradReduction", name, "must be contiguous")
        if p.stop_gradient:
            raise _err(InvalidArgumentError, "GradReduction", name, "does not require grad "
                       "(stop_gradient=True)")

    def _fw_empty_f32(self, shape):
        return empty(shape, _F32)

    def _fw_set_grad(self, p, g):
        p.grad = g

    def _fw_comm(self, c):
        if c is not None and not isinstance(c, Comm) and not callable(c):
            c = comm(c)  # a paddle.distributed Group
        return super()._fw_comm(c)

    def _fw_targets(self, fn, targets):
        return _check(fn, "targets", targets, _INTS).reshape([-1])

    def _fw_empty_i64(self, n):
        return empty([n], paddle.int64)

    def _fw_bytes(self, t):
        return t.numpy().tobytes()


def comm(group=None):
    """A :class:`bitexact.Comm` over a paddle.distributed group (None: the
    global group): the int64 words travel as a CPU int64 Paddle tensor
    through paddle.distributed.all_reduce (SUM or MAX)."""
    import paddle.distributed as dist
    ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}

    def allreduce(buf, op):
        words = paddle.to_tensor(_np.frombuffer(bytes(buf), dtype=_np.int64).copy())
        dist.all_reduce(words, op=ops[op], group=group)
        buf[:] = words.numpy().tobytes()

    return Comm(allreduce, dist.get_rank(group) if group is not None else dist.get_rank())
