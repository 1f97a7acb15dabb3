"""Drop-in, exact replacements for torch.nn.utils' gradient clipping.

    from bitexact.torch import clip_grad_norm_, get_total_norm, clip_grads_with_norm_

Same signatures and results as torch (>= 2.6): a 0-dim norm tensor on the
gradients' device, of the dtype torch would return (fp32 for fp32 or mixed
fp16/bf16/fp32 grads, bf16 for all-bf16 grads, the real dtype for complex
grads, ...); an empty list gives ``tensor(0.)``; parameters whose ``grad
is None`` are skipped; with DTensor gradients (FSDP2, tensor parallel) a
``Replicate`` DTensor on their mesh. docs/python.md lists, in one section,
what differs from torch on purpose. In short:

- the norm is exact: the correctly rounded norm of the exact sum, in the
  dtype torch returns, rounded once by the library (bx_norm_opts.norm_dtype),
  independent of order, threads, ranks and of the floating-point
  environment torch set; torch's is within its own rounding of it. With
  the same ``total_norm``, ``clip_grads_with_norm_`` produces bitwise
  torch's gradients: the coefficient is torch's own tensor ops
  (``clamp(max_norm / (total_norm + 1e-6), max=1)``), applied with torch's
  arithmetic (``scale_mode="torch"``); multiplying by exactly 1 is skipped;
- ``norm_type=0`` counts the non-zero elements (NaN and Inf count: the
  count is finite, ``error_if_nonfinite`` never fires for it); torch's
  total counts tensors;
- sparse COO gradients: the norm of the coalesced values (as torch), scaled
  by torch's own ``mul``; complex gradients: the norm of |z| (p = 2 exact
  from re and im; other p from |z| computed one format wider where one
  exists), scaled by torch's own complex ``mul``;
- the non-finite error is a :class:`bitexact.NonFiniteError` (a
  RuntimeError) whose message starts with torch's and goes on with the
  tensor and rank at fault;
- negative or NaN ``max_norm`` raises; the same memory passed twice to a
  clip raises LayoutError; ``foreach`` is accepted and ignored.

Under ``torch.compile`` (``fullgraph=True`` included) the three drop-ins
call torch custom ops (:mod:`bitexact.torch._ops`, namespace ``bitexact``)
whose implementation is the eager code below, so compiled and eager runs
give the same bits; in eager mode they do not go through the ops (the
dispatcher would add its overhead to every call). ``process_group=``,
``owned=``, DTensor and sparse gradients are eager only: under compile a
graph break (an error with ``fullgraph=True``).

CUDA gradients (when the package has the CUDA backend) follow torch's
stream semantics: the work is enqueued on ``torch.cuda.current_stream()``
with no host synchronisation (unless ``error_if_nonfinite``), so
``clip_grad_norm_`` can be captured in a CUDA graph after one eager
warm-up call; plans per set of buffers are cached
(:func:`bitexact.cuda_plan_cache`); the norm has the CPU path's bits and
the scaled gradients torch's CUDA ``_foreach_mul_`` bits. With
``process_group`` or DTensor gradients the norm is computed by the
blocking path.

Extensions (keyword-only):

- ``process_group``: a torch.distributed group; every rank passes the
  gradients it holds and gets the same bits as one process holding the
  whole model (an int64 ``all_reduce(SUM)`` plus a tiny ``all_reduce(MAX)``
  agreement step). Every rank of the group must call, also one holding no
  gradient (it passes an empty list). ``None`` is not torch.distributed's
  "the default group": it means the gradients' own group where they carry
  one (DTensor gradients: their mesh), otherwise this process alone, as
  torch's own clip_grad_norm_ (right for replicated gradients, as under
  DDP). FSDP1 flat-parameter shards (sharded strategies, ``use_orig_params``
  or not) with ``None`` are refused by name, never reduced rank-locally:
  pass ``**fsdp_norm_args(fsdp_model)``.
- ``norm_dtype``: the dtype of the returned norm, rounded once from the
  exact value: None (default) is torch's promotion of the gradients'
  dtypes (fp32 for fp32 or mixed fp16/bf16, bf16 for all-bf16, ...), agreed
  over the ranks of ``process_group``, so a rank holding no gradient
  returns the others' dtype; or ``torch.float32`` / ``float64`` /
  ``bfloat16`` / ``float16`` (or those names): e.g. an fp32 norm and
  coefficient for bf16 gradients, as fp32 master-weight optimizers clip.
- ``owned``: which plain (non-DTensor) tensors this rank owns, so that a
  replicated tensor is counted once: None (all), a bool, a predicate
  ``owned(param_or_tensor) -> bool``, or a collection of the owned
  parameters/tensors. Unowned gradients are still scaled.
- DTensor gradients: each rank counts its local shard; a ``Replicate`` mesh
  dimension is counted by the rank with coordinate 0 on it; ``Partial``
  gradients are refused. Without ``process_group`` the reduction runs over
  the DTensors' mesh.
- ``use_main_grad=True``: Megatron-style ``param.main_grad`` (fp32) is used
  instead of ``param.grad`` where present; any dtype mix in one call.
- ``scale_mode="exact"``: the exact product rounded once to the grad dtype.
"""
import sys as _sys
import types as _types
import warnings as _warnings

import torch

from .. import Error, InvalidArgumentError, _FLAVORS, _SCALE_MODES, _core, _frameworks, _option, _rename
from . import _ops
from ._cuda import _cuda_scale
from ._fsdp import fsdp_norm_args  # noqa: F401 (public: bitexact.torch.fsdp_norm_args)
from ._fsdp import refuse_rank_local as _refuse_fsdp1_local
from ._ops import _OTHER, _is_special, _torch_scale
from ._plan import _Plan, _bump_versions, _empty_norm, _norm_dtype_arg
from ._plan import comm  # noqa: F401 (public: bitexact.torch.comm)

try:
    from torch.distributed.tensor import DTensor as _DTensor
except ImportError:  # torch without distributed
    _DTensor = None

__all__ = ["clip_grad_norm_", "get_total_norm", "clip_grads_with_norm_", "comm", "fsdp_norm_args"]

# Plain tensors export through torch's C function directly (what
# Tensor.__dlpack__ calls for CPU tensors after its Python-level checks,
# which cost ~2 us a tensor); any other type goes through __dlpack__.
_frameworks.torch_fast_export()
_compiling = torch.compiler.is_compiling

def _validate_max_norm(max_norm):
    max_norm = float(max_norm)
    if not max_norm >= 0:
        raise InvalidArgumentError(
            f"max_norm must be >= 0, got {max_norm} (torch would scale the gradients by a "
            "negative or NaN coefficient)")
    return max_norm


def _grads_of(parameters, use_main_grad):
    if use_main_grad:
        out = []
        for p in parameters:
            g = getattr(p, "main_grad", None)
            if g is None:
                g = p.grad
            if g is not None:
                out.append((p, g))
        return [p for p, _ in out], [g for _, g in out]
    params = [p for p in parameters if p.grad is not None]
    return params, [p.grad for p in params]


def _coef(max_norm, total_norm):
    """torch's clamped coefficient, computed by torch itself (same ops, same
    dtype as its clip_grads_with_norm_), so the product is bitwise torch's."""
    with torch.no_grad():
        return torch.clamp(max_norm / (total_norm + 1e-6), max=1.0)


def get_total_norm(tensors, norm_type=2.0, error_if_nonfinite=False, foreach=None, *,
                   process_group=None, owned=None, num_threads=0, flavor="exact",
                   norm_dtype=None):
    """torch.nn.utils.get_total_norm, exact. See the module docstring."""
    if isinstance(tensors, torch.Tensor):
        tensors = [tensors]
    else:
        tensors = list(tensors)
    if _compiling():
        return _ops.get_total_norm(tensors, norm_type, error_if_nonfinite, process_group, owned,
                                   num_threads, flavor, norm_dtype)
    fl = _option(_FLAVORS, flavor, "flavor")
    nd = _norm_dtype_arg(norm_dtype)
    if not tensors and process_group is None:
        return _empty_norm(nd)
    return _total_norm_impl(tensors, lambda k: f"tensors[{k}]", float(norm_type),
                            bool(error_if_nonfinite), process_group, owned, int(num_threads), fl,
                            nd)


def _total_norm_impl(tensors, name_of, norm_type, error_if_nonfinite, process_group, owned,
                     num_threads, fl, norm_dtype=None):
    """get_total_norm's eager body (also the custom op's): options checked;
    norm_dtype a torch dtype or None."""
    plan = _Plan(tensors, tensors, owned, process_group, name_of, norm_type, norm_dtype)
    try:
        return plan.result(plan.norm(norm_type, error_if_nonfinite, num_threads, fl))
    finally:
        plan.release()


def clip_grads_with_norm_(parameters, max_norm, total_norm, foreach=None, *,
                          use_main_grad=False, scale_mode="torch", num_threads=0):
    """torch.nn.utils.clip_grads_with_norm_: scale the gradients in place by
    ``clamp(max_norm / (total_norm + 1e-6), max=1)``, bitwise as torch does
    (scale_mode="torch"). DTensor gradients: the local shards are scaled;
    a DTensor total_norm is resolved with full_tensor()."""
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    _, grads = _grads_of(parameters, use_main_grad)
    max_norm = _validate_max_norm(max_norm)
    if _compiling():
        return _ops.clip_grads_with_norm_(grads, max_norm, total_norm, scale_mode, num_threads)
    mode = _option(_SCALE_MODES, scale_mode, "scale_mode")
    if not grads:
        return
    _clip_with_norm_impl(grads, max_norm, total_norm, mode, int(num_threads))


def _clip_with_norm_impl(grads, max_norm, total_norm, mode, num_threads):
    if _DTensor is not None and isinstance(total_norm, _DTensor):
        total_norm = total_norm.full_tensor()
    if not isinstance(total_norm, torch.Tensor):
        total_norm = torch.tensor(float(total_norm))
    coef = _coef(max_norm, total_norm)
    _scale_locals([_local(g) for g in grads], coef, num_threads, mode, "parameters")


class _HasSpecial(Exception):
    pass


def _scale_locals(tensors, coef, num_threads, mode, label):
    """tensors *= coef (torch's clamped coefficient, a 0-dim tensor): dense
    real ones by the library (torch's arithmetic), sparse and complex ones
    by torch's own _foreach_mul_ (torch's bits); all checks before any write."""
    try:
        _scale_dense(tensors, coef, num_threads, mode, lambda i: f"{label}[{i}]")
    except _HasSpecial:
        dense = [i for i, t in enumerate(tensors) if not _is_special(t)]
        _scale_dense([tensors[i] for i in dense], coef, num_threads, mode,
                     lambda i: f"{label}[{dense[i]}]")
        _torch_scale([t for t in tensors if _is_special(t)], coef)


def _scale_dense(tensors, coef, num_threads, mode, name):
    """tensors *= coef by the library (raises _HasSpecial, before any write,
    when some are sparse or complex); name(i): the caller's name of tensors[i]."""
    if not tensors:
        return
    cuda = tensors[0].device.type == "cuda"
    if not cuda:
        c = float(coef)
        if c != c:  # NaN: g * NaN is NaN everywhere; stored as the library's
            # canonical NaN (docs/design.md "NaN": torch's multiply would keep
            # a NaN gradient's payload, x86 and aarch64 differently)
            with torch.no_grad():
                for t in tensors:
                    t.fill_(float("nan"))  # 0x7FC00000, 0x7FC0 (bf16), 0x7E00 (fp16)
            return
        if c == 1.0:
            return
    try:
        with _core.Views([tensors]) as views:
            if views.dtypes & _OTHER and any(map(_is_special, tensors)):
                raise _HasSpecial
            if cuda:
                kind, dev = views.device
                if kind != "cuda" or not _core.HAVE_CUDA:
                    views.check_device()
                _cuda_scale(views, coef, mode, None, torch.device("cuda", dev))
            else:
                views.scale(c, mode, int(num_threads))
    except Error as e:
        if any(map(_is_special, tensors)):
            raise _HasSpecial from None
        raise _rename(e, lambda g, i: name(i), None, lambda k: (0, k))
    _bump_versions(tensors)


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False,
                    foreach=None, *, use_main_grad=False, process_group=None, owned=None,
                    scale_mode="torch", num_threads=0, flavor="exact", norm_dtype=None):
    """torch.nn.utils.clip_grad_norm_, exact and layout-invariant. Returns
    the total norm (0-dim tensor; a Replicate DTensor for DTensor
    gradients). See the module docstring for the keyword-only extensions."""
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    else:
        is_generator = isinstance(parameters, _types.GeneratorType)
        parameters = list(parameters)
        if is_generator and not parameters:
            _warnings.warn("`parameters` is an empty generator, no gradient clipping will occur.",
                           stacklevel=2)
    max_norm = _validate_max_norm(max_norm)
    params, grads = _grads_of(parameters, use_main_grad)
    if _compiling():
        return _ops.clip_grad_norm_(parameters, grads, max_norm, norm_type, error_if_nonfinite,
                                    use_main_grad, process_group, owned, scale_mode,
                                    num_threads, flavor, norm_dtype)
    mode = _option(_SCALE_MODES, scale_mode, "scale_mode")
    fl = _option(_FLAVORS, flavor, "flavor")
    nd = _norm_dtype_arg(norm_dtype)
    if not grads and process_group is None:
        # no gradient here: still refuse what would be a rank-local norm of
        # FSDP1 shards on the ranks that hold some
        _refuse_fsdp1_local(parameters, parameters, lambda k: f"parameters[{k}]")
        return _empty_norm(nd)
    return _clip_impl(grads, params, _param_namer(parameters, params), max_norm,
                      float(norm_type), bool(error_if_nonfinite), process_group, owned, mode,
                      int(num_threads), fl, nd)


def _clip_impl(grads, params, name_of, max_norm, norm_type, error_if_nonfinite, process_group,
               owned, mode, num_threads, fl, norm_dtype=None):
    """clip_grad_norm_'s eager body (also the custom op's): options checked,
    grads non-empty or a process_group given; norm_dtype a torch dtype or None."""
    plan = _Plan(grads, params, owned, process_group, name_of, norm_type, norm_dtype)
    try:
        if grads and not plan.cuda and plan.fn is None:
            # one process: refuse what cannot be scaled even when the clip
            # turns out inactive. With a communicator the norm's agreement
            # step must run first (a local failure fails every rank there);
            # the scaling's own check follows it.
            plan.check_targets()
        total = plan.norm(norm_type, error_if_nonfinite, num_threads, fl, mode)
        if grads and plan.cuda:  # stream-ordered: no host synchronisation
            plan.cuda_scale(_coef(max_norm, total), mode)
        elif grads:
            coef = _coef(max_norm, total)
            c = float(coef)
            if c != c or plan.special is not None:
                # NaN norm: torch's own multiply (NaN everywhere); sparse or
                # complex gradients: the dense ones by the library, the
                # others by torch (both after every check)
                plan.release()
                _scale_locals([_local(g) for g in grads], coef, num_threads, mode, "parameters")
            elif c != 1.0:  # x * 1 == x bitwise for every non-NaN x: skipped
                plan.scale(c, num_threads, mode)
        return plan.result(total)
    finally:
        plan.release()


def _local(g):
    return g.to_local() if _DTensor is not None and isinstance(g, _DTensor) else g


def _param_namer(parameters, params):
    """name_of(k) for params[k]: its position in `parameters`, found only
    when an error message needs it."""
    def name_of(k):
        p = params[k]
        for j, q in enumerate(parameters):
            if q is p:
                return f"parameters[{j}]"
        return f"parameters[?{k}]"
    return name_of


_ops._BT = _sys.modules[__name__]  # the custom ops' implementation

# The training kernels as autograd Functions / nn.Modules with layout-
# invariant weight gradients (docs/torch_layers.md).
from ._layers import (  # noqa: E402,F401
    CausalAttention, CrossEntropyLoss, Embedding, GradReduction, Linear, RMSNorm,
    RotaryEmbedding, SwiGLUMLP, causal_attention, cross_entropy, embedding, linear, rms_norm,
    qkv_projection, rope, swiglu, swiglu_mlp)
from ._layers import __all__ as _layers_all  # noqa: E402

__all__ += _layers_all

# The GLM-4.5 MoE block (router, dispatch, experts, shared experts) as one
# autograd node with the same kernel sequence as `bitexact train`.
from ._moe import MoE, MoERouter, moe, moe_experts, moe_route  # noqa: E402,F401
from ._moe import __all__ as _moe_all  # noqa: E402

__all__ += _moe_all

# The GLM-4.5 model built from them, and AdamW with the kernels' bits
# (docs/train_python.md; `python -m bitexact.train --framework torch`).
from ._glm import (  # noqa: E402,F401
    AdamW, Glm4MoeAttention, Glm4MoeDecoderLayer, Glm4MoeForCausalLM, Glm4MoeModel)
from ._glm import __all__ as _glm_all  # noqa: E402

__all__ += _glm_all

# First-divergence traces of any nn.Module (docs/trace.md; bitexact diff --trace).
from ._trace import Tracer, trace  # noqa: E402,F401

__all__ += ["trace", "Tracer"]
