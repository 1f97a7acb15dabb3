"""Exact global-norm gradient clipping for PaddlePaddle (dynamic graph).

    import bitexact.paddle
    clip = bitexact.paddle.ClipGradByGlobalNorm(1.0)
    opt = paddle.optimizer.AdamW(parameters=model.parameters(), grad_clip=clip)

:class:`ClipGradByGlobalNorm` is a ``paddle.nn.clip.ClipGradBase`` (what
Paddle's optimizers accept as ``grad_clip``) with the constructor and the
call contract of ``paddle.nn.ClipGradByGlobalNorm`` (``clip_norm``,
``group_name``, ``auto_skip_clip``; called by the optimizer with its
``[(param, grad), ...]``, returns the same kind of list). The
global norm is the library's exact one (every square exact, summed in an
integer accumulator, rounded once): the same bits for any parameter order
or grouping, where Paddle's sums per-tensor squared norms in floating point
in the order of the list. Two formulas:

- ``formula="paddle"`` (default): Paddle's ``clip_norm / max(global_norm,
  clip_norm)`` (with ``auto_skip_clip``: ``clip_norm / global_norm`` only
  when ``global_norm > clip_norm``), evaluated by Paddle's own tensor ops in
  Paddle's norm dtype (float64 if any gradient is float64, else float32),
  the norm being the exact one rounded once into that dtype. Each gradient
  is multiplied by that coefficient cast to its dtype by Paddle's
  ``astype``, the product rounded once to the gradient's dtype (what
  Paddle's ``multiply_`` computes on CPU for float32/float64/bfloat16;
  Paddle's CPU build has no float16 multiply, so its own class cannot clip
  float16 gradients there). So when the two norms agree, the clipped
  gradients are Paddle's bit for bit.
- ``formula="exact"``: bitexact's ``clip_norm / max(norm, clip_norm)`` in
  fp64 from the fp64 norm, the exact product rounded once per element
  (``scale_mode="exact"``; ``"torch"``: fp32 coefficient and product);
  ``clip_norm == 0`` disables clipping (:func:`bitexact.clip_grad_norm`).

Gradients: float32, float64, bfloat16, float16 and any mix, CPU tensors.
Parameters whose gradient is None are dropped from the returned list, and
those with ``need_clip=False`` (their ``ParamAttr``) are neither counted nor
scaled, as Paddle does. Gradients are scaled in place (Paddle's
``multiply_``; their ``inplace_version`` is bumped); a 0-D gradient is
returned as a new tensor of shape [1], as Paddle's ``g * clip_var`` is.

Paddle tensors with ``stop_gradient=False`` (every parameter and gradient)
refuse ``__dlpack__``; they are exported through their DenseTensor's own
DLPack export (``Tensor.get_tensor()._to_dlpack_versioned()``), which shares
their memory (no copy). The exporter is registered with the library when
this module is imported, or by the first neutral-API call
(:func:`bitexact.total_norm`, ...) after ``import paddle``.

Errors: the library's (:class:`bitexact.DTypeError` for integer or complex
gradients, ...), naming the parameter (``parameter 'linear_0.w_0'
(params_grads[2])``); on any error no gradient is modified. NaN/Inf: as
Paddle, a NaN norm gives NaN gradients and an infinite one a 0 coefficient
(``error_if_nonfinite=True``: :class:`bitexact.NonFiniteError` naming the
first gradient holding NaN/Inf instead, nothing modified). Negative or NaN
``clip_norm`` raises :class:`bitexact.InvalidArgumentError` (Paddle would
flip or NaN the gradients).

Not covered: static-graph / PIR programs (the norm runs in the C library,
outside a program: ``_static_clip`` raises), SelectedRows (sparse)
gradients, GPU tensors, and distributed Paddle (fleet hybrid parallel,
sharding, auto-parallel DistTensors): there Paddle replaces or reconfigures
its own ``ClipGradByGlobalNorm`` (not this class) for cross-rank norms;
this class refuses DistTensor gradients and a sharded call
(``should_comm_on_shard_dim``); under fleet tensor/pipeline parallel Paddle
leaves this class in place and each rank would clip by its local norm: do
not use it there. Pure data parallel, where every rank holds the full
all-reduced gradients, works as on one process.

Thread safety: one call at a time per instance (it records
``last_global_norm``); the library call itself is thread-safe.

Also exported here (imported at the end of this module): the training
kernels as ``paddle.autograd.PyLayer`` ops and ``paddle.nn.Layer``
modules with bitexact.torch's names, bits and two-pass
:class:`GradReduction` (python/bitexact/paddle/_layers.py,
docs/paddle_layers.md).
"""
import numpy as _np
import paddle
from paddle.nn.clip import ClipGradBase as _ClipGradBase

from .. import (DeviceError, Error, InvalidArgumentError, LayoutError, _SCALE_MODES, _core,
                _frameworks, _option, _rename)

__all__ = ["ClipGradByGlobalNorm"]

_frameworks.paddle_fast_export()

# Views.dtypes: the bit of float64
_F64 = 8
_FORMULAS = ("paddle", "exact")
# bx_norm_dtype codes (Views.norm) and the numpy types of their bits
_ND_F64, _ND_F32 = 0, 2
_BITS = {_ND_F64: (_np.int64, _np.float64, "float64"), _ND_F32: (_np.int32, _np.float32, "float32")}


def _name(p, k):
    name = getattr(p, "name", None)
    return f"parameter {name!r} (params_grads[{k}])" if name else f"params_grads[{k}]"


def _check_grad(p, g, k):
    """What the library cannot see through DLPack: refused before any work."""
    if g.is_selected_rows():
        raise LayoutError(
            f"{_name(p, k)}: SelectedRows (sparse) gradients are not supported by "
            "bitexact.paddle (dense gradients only)")
    if g.is_dist():
        raise InvalidArgumentError(
            f"{_name(p, k)}: a distributed (auto-parallel) gradient; bitexact.paddle "
            "computes single-process norms only")
    if not g.place.is_cpu_place():
        raise DeviceError(
            f"{_name(p, k)}: the gradient is on {g.place}; bitexact.paddle supports CPU "
            "tensors")


def _norm_tensor(bits, nd):
    """The 0-D Paddle tensor holding the norm whose bit pattern is `bits`
    (the library's rounding, taken as bits: no conversion that a
    flush-to-zero mode could change)."""
    it, ft, _ = _BITS[nd]
    return paddle.to_tensor(_np.array(bits, dtype=it).view(ft).reshape(()))


class ClipGradByGlobalNorm(_ClipGradBase):
    """``paddle.nn.ClipGradByGlobalNorm`` with the exact global norm.

    clip_norm, group_name, auto_skip_clip: as Paddle's (group_name is kept
    for compatibility; Paddle uses it only in static graphs).
    formula: "paddle" (Paddle's coefficient and rounding) or "exact"
    (bitexact's); see the module docstring.
    scale_mode: formula="exact" only: "exact" (default) or "torch".
    error_if_nonfinite: raise NonFiniteError for a NaN/Inf norm instead of
    scaling by Paddle's NaN / 0 coefficient.
    num_threads: library threads (0: its default); results never depend on it.

    After each call ``last_global_norm`` holds the norm used (a 0-D Paddle
    tensor: Paddle's norm dtype for formula="paddle", float64 for "exact";
    None when no gradient was counted).
    """

    def __init__(self, clip_norm, group_name="default_group", auto_skip_clip=False, *,
                 formula="paddle", scale_mode=None, error_if_nonfinite=False, num_threads=0):
        super().__init__()
        clip_norm = float(clip_norm)
        if not clip_norm >= 0:
            raise InvalidArgumentError(
                f"clip_norm must be >= 0, got {clip_norm} (Paddle would scale the gradients by "
                "a negative or NaN coefficient)")
        if not isinstance(auto_skip_clip, bool):
            raise InvalidArgumentError(f"auto_skip_clip must be a bool, not {auto_skip_clip!r}")
        if formula not in _FORMULAS:
            raise InvalidArgumentError(
                f"formula must be one of 'paddle', 'exact', not {formula!r}")
        if formula == "paddle" and scale_mode is not None:
            raise InvalidArgumentError(
                "scale_mode applies to formula='exact'; formula='paddle' rounds as Paddle does")
        self.clip_norm = clip_norm
        self.group_name = group_name
        self.auto_skip_clip = auto_skip_clip
        self.formula = formula
        self.scale_mode = scale_mode or "exact"
        self._mode = _option(_SCALE_MODES, self.scale_mode, "scale_mode")
        self.error_if_nonfinite = bool(error_if_nonfinite)
        self.num_threads = int(num_threads)
        # Paddle's sharded optimizers set this (and a group) on the clip
        # object to make it reduce across ranks; refused in _dygraph_clip.
        self.should_comm_on_shard_dim = False
        self.last_global_norm = None

    def __str__(self):
        return (f"Gradient Clip By GlobalNorm (bitexact, formula={self.formula}), "
                f"global_norm={self.clip_norm:f}")

    def _static_clip(self, params_grads):
        raise InvalidArgumentError(
            "bitexact.paddle.ClipGradByGlobalNorm works in dynamic graph mode only (its norm "
            "runs in the C library, outside a static program)")

    _pir_clip = _static_clip

    @paddle.no_grad()
    def _dygraph_clip(self, params_grads):
        if self.should_comm_on_shard_dim:
            raise InvalidArgumentError(
                "bitexact.paddle.ClipGradByGlobalNorm was asked to reduce across ranks "
                "(Paddle sharding/FSDP); distributed Paddle is not supported")
        sel = []  # (position in params_grads, param, grad) of the clipped grads
        for k, (p, g) in enumerate(params_grads):
            if g is None or getattr(p, "need_clip", True) is False:
                continue
            _check_grad(p, g, k)
            sel.append((k, p, g))
        if not sel:  # all filtered out: Paddle returns its input as is
            self.last_global_norm = None
            return params_grads
        names = [_name(p, k) for k, p, _ in sel]
        grads = [g for _, _, g in sel]
        if self.formula == "paddle":
            targets = self._clip_paddle(grads, names)
        else:
            targets = self._clip_exact(grads, names)
        if targets is None:
            return [(p, g) for p, g in params_grads if g is not None]
        new = {k: t for (k, _, _), t in zip(sel, targets)}
        return [(p, new.get(k, g)) for k, (p, g) in enumerate(params_grads) if g is not None]

    # ---- formula="paddle" -------------------------------------------------

    def _clip_paddle(self, grads, names):
        """The exact norm in Paddle's dtype, Paddle's coefficient (its ops),
        each dtype scaled by the coefficient cast to it. Returns the list of
        (scaled) gradients, or None when Paddle would not scale."""
        def namer(g, i):
            return names[i]

        def flat(k):
            return 0, k
        try:
            with _core.Views([grads]) as views:
                nd = _ND_F64 if views.dtypes & _F64 else _ND_F32
                _, _, bits, _ = views.norm(2.0, self.error_if_nonfinite, self.num_threads, 0,
                                           None, 0, 1, False, nd)
                global_norm = _norm_tensor(bits, nd)
                self.last_global_norm = global_norm
                coefs = self._paddle_coefs(global_norm, _BITS[nd][2], grads)
                if coefs is None:
                    return None
                if len(coefs) == 1 and all(len(g.shape) for g in grads):
                    # one dtype, no 0-D gradient: these views are the targets
                    # (Views.scale checks every target before the first write)
                    c = next(iter(coefs.values()))
                    if c != 1.0:
                        _scale(views, c, self.num_threads)
                        _bump(grads)
                    return grads
        except Error as e:
            raise _rename(e, namer, None, flat)
        targets = _targets(grads)
        _scale_by_dtype(targets, coefs, names, self.num_threads)
        return targets

    def _paddle_coefs(self, global_norm, sum_dtype, grads):
        """Paddle's ClipGradByGlobalNorm._dygraph_clip from its sqrt on, with
        Paddle's ops: {grad dtype: clip_var.astype(dtype) as a float (bf16,
        fp16 and fp32 values widen exactly)}, or None when Paddle would not
        scale (auto_skip_clip and norm <= clip_norm)."""
        max_global_norm = paddle.full(shape=[1], dtype=sum_dtype, fill_value=self.clip_norm)
        if not self.auto_skip_clip:
            clip_var = paddle.divide(x=max_global_norm,
                                     y=paddle.maximum(x=global_norm, y=max_global_norm))
        elif global_norm > max_global_norm:
            clip_var = paddle.divide(x=max_global_norm, y=global_norm)
        else:
            return None
        coefs = {}
        for g in grads:
            if g.dtype not in coefs:
                c = clip_var.astype(g.dtype) if clip_var.dtype != g.dtype else clip_var
                coefs[g.dtype] = float(c.astype("float64").reshape([]))
        return coefs

    # ---- formula="exact" --------------------------------------------------

    def _clip_exact(self, grads, names):
        """bitexact.clip_grad_norm(formula="max"): the fp64 norm, coefficient
        and scaling in one library call (all-or-nothing)."""
        targets = _targets(grads)
        try:
            with _core.Views([targets]) as views:
                total, coef = views.clip(self.clip_norm, 2.0, self.error_if_nonfinite,
                                         self.num_threads, 0, self._mode, 0.0, 1, None, 0, 0)
        except Error as e:
            raise _rename(e, lambda g, i: names[i], None, lambda k: (0, k))
        self.last_global_norm = paddle.to_tensor(_np.float64(total).reshape(()))
        if coef != 1.0:
            _bump(targets)
        return targets


def _targets(grads):
    """What gets scaled: the gradients themselves, and for 0-D ones a new
    tensor of shape [1] (Paddle does not scale 0-D tensors in place: it
    returns g * clip_var, broadcast to clip_var's shape [1])."""
    return [g.clone().reshape([1]) if len(g.shape) == 0 else g for g in grads]


def _scale_by_dtype(targets, coefs, names, num_threads):
    """targets[i] *= coefs[its dtype], the exact product rounded once to the
    dtype (the library's torch mode with a coefficient already in the
    tensor's dtype: the fp32 product of two fp32-or-narrower values rounded
    to the dtype, and of two bf16/fp16 values it is exact). Every check
    (writable, no two targets sharing memory) is made over all targets
    before the first write."""
    try:
        with _core.Views([targets]) as views:
            views.check_scale_targets()
    except Error as e:
        raise _rename(e, lambda g, i: names[i], None, lambda k: (0, k))
    for dtype, c in coefs.items():
        if c == 1.0:  # x * 1 == x bitwise (NaN stays NaN): skipped
            continue
        idx = [i for i, t in enumerate(targets) if t.dtype == dtype]
        try:
            with _core.Views([[targets[i] for i in idx]]) as views:
                _scale(views, c, num_threads)
        except Error as e:
            raise _rename(e, lambda g, i: names[idx[i]], None, lambda k: (0, k))
        _bump([targets[i] for i in idx])


def _scale(views, c, num_threads):
    """Every tensor of views *= c (torch mode: see _scale_by_dtype)."""
    if c != c:  # NaN coefficient (bx_scale refuses it): NaN everywhere, as g * NaN
        views.scale(float("inf"), 0, num_threads)
        views.scale(0.0, 0, num_threads)
    else:
        views.scale(c, 0, num_threads)


def _bump(tensors):
    """Tensors written in place through DLPack: bump their inplace_version
    as Paddle's multiply_ would."""
    for t in tensors:
        t._bump_inplace_version()


# The training kernels as paddle.autograd.PyLayer ops / paddle.nn.Layer
# modules with layout-invariant weight gradients (docs/paddle_layers.md).
from ._layers import (  # noqa: E402,F401
    CausalAttention, CrossEntropyLoss, Embedding, GradReduction, Linear, RMSNorm, RotaryEmbedding,
    SwiGLUMLP, causal_attention, comm, cross_entropy, embedding, linear, qkv_projection, rms_norm,
    rope, swiglu, swiglu_mlp)
from ._layers import __all__ as _layers_all  # noqa: E402

__all__ += _layers_all

# The GLM-4.5 MoE block as PyLayers / nn.Layers (docs/paddle_layers.md,
# "The MoE block"; numerics shared with bitexact.torch in nn/_moe.py).
from ._moe import MoE, MoERouter, moe, moe_experts, moe_route  # noqa: E402,F401
from ._moe import __all__ as _moe_all  # noqa: E402

__all__ += _moe_all

# The GLM-4.5 model built from them, and AdamW with the kernels' bits
# (docs/train_python.md; `python -m bitexact.train --framework paddle`).
from ._glm import (  # noqa: E402,F401
    AdamW, Glm4MoeAttention, Glm4MoeDecoderLayer, Glm4MoeForCausalLM, Glm4MoeModel)
from ._glm import __all__ as _glm_all  # noqa: E402

__all__ += _glm_all

# First-divergence traces of any nn.Layer, in bitexact.torch.trace's
# format (docs/trace.md; bitexact diff --trace).
from ._trace import Tracer, trace  # noqa: E402,F401

__all__ += ["trace", "Tracer"]
