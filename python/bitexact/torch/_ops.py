"""The torch side of :mod:`bitexact.torch`: its torch custom ops, and the
torch operations it applies to the gradients the C library does not read.

Custom ops (namespace ``bitexact``, ``torch.library.custom_op``, each with
a fake implementation that only gives the result's dtype and device):

- ``torch.ops.bitexact.total_norm(tensors, norm_type, error_if_nonfinite,
  flavor, num_threads) -> Tensor``;
- ``torch.ops.bitexact.clip_grad_norm_(grads, positions, max_norm,
  norm_type, error_if_nonfinite, scale_mode, flavor, num_threads) ->
  Tensor`` (mutates ``grads``; ``positions[k]``: the index in the caller's
  ``parameters`` of grads[k], for error messages);
- ``torch.ops.bitexact.clip_grads_with_norm_(grads, max_norm, total_norm,
  scale_mode, num_threads) -> ()`` (mutates ``grads``).

Their implementation is the drop-ins' eager code (the same functions, so
the same bits): the norm, torch's coefficient computed by torch's ops at
run time inside the op, and the scaling. So a ``torch.compile``'d step
(``fullgraph=True`` included, inductor included) that clips gives the
eager bits: inductor never sees, fuses or reorders the clipping's
arithmetic. The drop-ins call these ops only while Dynamo traces
(``torch.compiler.is_compiling()``): in eager mode the dispatcher would add
its cost to every call for nothing (bench/python/bench_clip.py measures
it). ``process_group=``, ``owned=``, DTensor and sparse gradients are not
traced: those calls run eagerly through a ``torch.compiler.disable``'d
function, which is a graph break (with ``fullgraph=True``, Dynamo's error,
giving the reason below). Threading: each op runs in the calling thread
(the library's worker threads inside it, as in eager mode).

Gradients the library does not read (see :func:`_surrogate`): sparse COO
and complex ones. Their norm is the exact norm of a real dense tensor made
with torch's ops; they are scaled by torch's own ``_foreach_mul_`` (so the
bits are torch's).
"""
import torch
from torch import Tensor

from .. import LayoutError, _FLAVORS, _SCALE_MODES, _option

# Views.dtypes bit mask -> the dtype torch's get_total_norm returns
# (torch.stack promotes the per-tensor norms).
_F16, _BF16, _F32, _F64 = 1, 2, 4, 8
_BIT = {torch.float16: _F16, torch.bfloat16: _BF16, torch.float32: _F32, torch.float64: _F64}
_OTHER = 16  # Views.dtypes: a dtype the library does not take (complex, integer, ...)


def _result_dtype(mask):
    if mask & _F64:
        return torch.float64
    if mask & _F32 or (mask & (_F16 | _BF16)) == (_F16 | _BF16):
        return torch.float32
    if mask & _BF16:
        return torch.bfloat16
    if mask & _F16:
        return torch.float16
    return torch.get_default_dtype()


def _dtype_mask(tensors):
    """The Views.dtypes mask of tensors, complex counted as their real dtype."""
    mask = 0
    for t in tensors:
        mask |= _BIT.get(t.dtype.to_real() if t.is_complex() else t.dtype, _OTHER)
    return mask


def _is_special(t):
    return t.layout is not torch.strided or t.is_complex()


# |z| of a complex gradient, for p != 2, is computed in the next wider
# complex dtype where there is one (then torch.abs rounds it once there)
_WIDER = {torch.complex32: torch.complex64, torch.complex64: torch.complex128}


def _surrogate(t, norm_type, name):
    """The dense real tensor whose norm (of order norm_type) is the norm
    torch takes of a sparse or complex gradient t (a new tensor or a view;
    t is not modified):

    - sparse COO: its coalesced values (duplicates summed by torch's
      coalesce, in t's dtype), as torch's norm of a sparse tensor; so
      p = -inf is the smallest stored |x|, as torch's, not 0;
    - complex, p = 2: torch.view_as_real(z): re^2 + im^2 summed exactly,
      so the norm is exact;
    - complex, other p: |z| by torch.abs, computed in complex128 for
      complex64 (complex64 for complex32; complex128's own precision for
      complex128), so one rounding of |z| finer than the result's format;
      then the library's exact p-norm of those values, rounded once into
      the real dtype. p = 0 counts z != 0 (NaN included), exact; p = inf
      and -inf are the largest/smallest such |z|, rounded once more."""
    if t.layout is torch.sparse_coo:
        t = t.coalesce().values()
    elif t.layout is not torch.strided:
        raise LayoutError(f"{name}: layout {t.layout} is not supported (sparse COO and "
                          "strided are; torch's clip_grad_norm_ cannot take it either)")
    if t.is_complex():
        if norm_type == 2.0:
            return torch.view_as_real(t)
        return torch.abs(t.to(_WIDER.get(t.dtype, t.dtype)))
    return t


def _torch_nonfinite(e, norm_type):
    """e (a NonFiniteError) with torch's message first, then bitexact's
    (which tensor, which rank)."""
    e.args = (f"The total norm of order {float(norm_type)} for gradients from `parameters` is "
              "non-finite, so it cannot be clipped. To disable this error and scale the "
              "gradients by the non-finite norm anyway, set `error_if_nonfinite=False`; "
              f"bitexact: {e.args[0] if e.args else ''}",) + tuple(e.args[1:])
    return e


def _torch_scale(tensors, coef):
    """torch's clip_grads_with_norm_ scaling: _foreach_mul_ per device and dtype."""
    groups = {}
    for t in tensors:
        groups.setdefault((t.device, t.dtype), []).append(t)
    with torch.no_grad():
        for (dev, _), ts in groups.items():
            torch._foreach_mul_(ts, coef.to(dev))


try:
    from torch.distributed.tensor import DTensor as _DTensor
except ImportError:  # torch without distributed
    _DTensor = None

_BT = None  # bitexact.torch, set at the end of its import (it imports this module first)


def _bt():
    return _BT


# ---- the custom ops --------------------------------------------------------

@torch.library.custom_op("bitexact::total_norm", mutates_args=())
def total_norm_op(tensors: list[Tensor], norm_type: float, error_if_nonfinite: bool,
                  flavor: str, num_threads: int, norm_dtype: str = "") -> Tensor:
    """get_total_norm (single process): the exact norm, in norm_dtype (a
    torch dtype's name; "": torch's promotion of the gradients' dtypes)."""
    fl = _option(_FLAVORS, flavor, "flavor")
    nd = _bt()._norm_dtype_arg(norm_dtype or None)
    if not tensors:
        return _bt()._empty_norm(nd)
    return _bt()._total_norm_impl(list(tensors), lambda k: f"tensors[{k}]", float(norm_type),
                                  bool(error_if_nonfinite), None, None, int(num_threads), fl, nd)


def _fake_norm(tensors, norm_dtype):
    nd = _bt()._norm_dtype_arg(norm_dtype or None)
    if not tensors:
        return torch.empty((), dtype=nd or torch.get_default_dtype())
    return torch.empty((), dtype=nd or _result_dtype(_dtype_mask(tensors)),
                       device=tensors[0].device)


@total_norm_op.register_fake
def _(tensors, norm_type, error_if_nonfinite, flavor, num_threads, norm_dtype=""):
    return _fake_norm(tensors, norm_dtype)


@torch.library.custom_op("bitexact::clip_grad_norm_", mutates_args=("grads",))
def clip_grad_norm_op(grads: list[Tensor], positions: list[int], max_norm: float,
                      norm_type: float, error_if_nonfinite: bool, scale_mode: str, flavor: str,
                      num_threads: int, norm_dtype: str = "") -> Tensor:
    """clip_grad_norm_ (single process): scales grads in place, returns the norm."""
    mode = _option(_SCALE_MODES, scale_mode, "scale_mode")
    fl = _option(_FLAVORS, flavor, "flavor")
    bt = _bt()
    nd = bt._norm_dtype_arg(norm_dtype or None)
    if not grads:
        return bt._empty_norm(nd)
    grads = list(grads)
    return bt._clip_impl(grads, grads, lambda k: f"parameters[{positions[k]}]",
                         bt._validate_max_norm(max_norm), float(norm_type),
                         bool(error_if_nonfinite), None, None, mode, int(num_threads), fl, nd)


@clip_grad_norm_op.register_fake
def _(grads, positions, max_norm, norm_type, error_if_nonfinite, scale_mode, flavor,
      num_threads, norm_dtype=""):
    return _fake_norm(grads, norm_dtype)


@torch.library.custom_op("bitexact::clip_grads_with_norm_", mutates_args=("grads",))
def clip_grads_with_norm_op(grads: list[Tensor], max_norm: float, total_norm: Tensor,
                            scale_mode: str, num_threads: int) -> None:
    """clip_grads_with_norm_: grads *= clamp(max_norm / (total_norm + 1e-6), max=1)."""
    mode = _option(_SCALE_MODES, scale_mode, "scale_mode")
    if grads:
        bt = _bt()
        bt._clip_with_norm_impl(list(grads), bt._validate_max_norm(max_norm), total_norm, mode,
                                int(num_threads))


@clip_grads_with_norm_op.register_fake
def _(grads, max_norm, total_norm, scale_mode, num_threads):
    return None


# ---- what the drop-ins call while Dynamo traces ------------------------------

_EAGER_ONLY = ("bitexact.torch: process_group=, owned=, DTensor and sparse gradients are "
               "not traced by torch.compile; this call runs eagerly, a graph break (an error "
               "with fullgraph=True: call it outside the compiled function)")


def _eager_only(tensors, process_group, owned):
    if process_group is not None or owned is not None:
        return True
    for t in tensors:
        if (_DTensor is not None and isinstance(t, _DTensor)) or t.layout is not torch.strided:
            return True
    return False


@torch.compiler.disable(reason=_EAGER_ONLY)
def _eager_get_total_norm(*args, **kwargs):
    return _bt().get_total_norm(*args, **kwargs)


@torch.compiler.disable(reason=_EAGER_ONLY)
def _eager_clip_grad_norm_(*args, **kwargs):
    return _bt().clip_grad_norm_(*args, **kwargs)


@torch.compiler.disable(reason=_EAGER_ONLY)
def _eager_clip_grads_with_norm_(*args, **kwargs):
    return _bt().clip_grads_with_norm_(*args, **kwargs)


def _dtype_name(norm_dtype):
    """norm_dtype= (None, a torch dtype or a name) as the ops' string."""
    nd = _bt()._norm_dtype_arg(norm_dtype)
    return "" if nd is None else str(nd).rsplit(".", 1)[-1]


def get_total_norm(tensors, norm_type, error_if_nonfinite, process_group, owned, num_threads,
                   flavor, norm_dtype):
    if _eager_only(tensors, process_group, owned):
        return _eager_get_total_norm(tensors, norm_type, error_if_nonfinite,
                                     process_group=process_group, owned=owned,
                                     num_threads=num_threads, flavor=flavor,
                                     norm_dtype=norm_dtype)
    return torch.ops.bitexact.total_norm(tensors, float(norm_type), bool(error_if_nonfinite),
                                         str(flavor), int(num_threads), _dtype_name(norm_dtype))


def clip_grad_norm_(parameters, grads, max_norm, norm_type, error_if_nonfinite, use_main_grad,
                    process_group, owned, scale_mode, num_threads, flavor, norm_dtype):
    if _eager_only(grads, process_group, owned):
        return _eager_clip_grad_norm_(parameters, max_norm, norm_type, error_if_nonfinite,
                                      use_main_grad=use_main_grad, process_group=process_group,
                                      owned=owned, scale_mode=scale_mode,
                                      num_threads=num_threads, flavor=flavor,
                                      norm_dtype=norm_dtype)
    # where each gradient's parameter is in `parameters` (error messages)
    positions = [k for k, p in enumerate(parameters)
                 if p.grad is not None or (use_main_grad and
                                           getattr(p, "main_grad", None) is not None)]
    return torch.ops.bitexact.clip_grad_norm_(grads, positions, float(max_norm),
                                              float(norm_type), bool(error_if_nonfinite),
                                              str(scale_mode), str(flavor), int(num_threads),
                                              _dtype_name(norm_dtype))


def clip_grads_with_norm_(grads, max_norm, total_norm, scale_mode, num_threads):
    if _eager_only(grads, None, None) or (_DTensor is not None
                                          and isinstance(total_norm, _DTensor)):
        return _eager_clip_grads_with_norm_([_Holder(g) for g in grads], max_norm, total_norm,
                                            scale_mode=scale_mode, num_threads=num_threads)
    if not isinstance(total_norm, Tensor):
        total_norm = torch.tensor(float(total_norm))
    torch.ops.bitexact.clip_grads_with_norm_(grads, float(max_norm), total_norm,
                                             str(scale_mode), int(num_threads))


class _Holder:
    """A parameter-like holder of a gradient (clip_grads_with_norm_ reads .grad)."""
    __slots__ = ("grad",)

    def __init__(self, grad):
        self.grad = grad
