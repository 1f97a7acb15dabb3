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
call torch custom ops (:mod:`bitexact._torch_ops`, namespace ``bitexact``)
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
import torch.distributed as _dist

from . import (
    Comm,
    Error,
    InvalidArgumentError,
    NonFiniteError,
    _FLAVORS,
    _SCALE_MODES,
    _core,
    _join_legacy_stream,
    _norm_dtype,
    _option,
    _rename,
    _torch_fast_export,
)

from . import _torch_ops as _ops
from ._torch_cuda import _cuda_scale
from ._torch_fsdp import fsdp_norm_args  # noqa: F401 (public: bitexact.torch.fsdp_norm_args)
from ._torch_fsdp import refuse_rank_local as _refuse_fsdp1_local
from ._torch_ops import (_OTHER, _dtype_mask, _is_special, _result_dtype, _surrogate,
                         _torch_nonfinite, _torch_scale)

try:
    from torch.distributed.tensor import DTensor as _DTensor
except ImportError:  # torch without distributed
    _DTensor = None

__all__ = ["clip_grad_norm_", "get_total_norm", "clip_grads_with_norm_", "comm", "fsdp_norm_args"]

# Plain tensors export through torch's C function directly (what
# Tensor.__dlpack__ calls for CPU tensors after its Python-level checks,
# which cost ~2 us a tensor); any other type goes through __dlpack__.
_torch_fast_export()

_Tensor = torch.Tensor
# torch dtype -> bx_norm_dtype: the format the library rounds the norm into
_NORM_DTYPE = {torch.float64: 0, torch.float32: 2, torch.bfloat16: 3, torch.float16: 4}
# ... and the integer dtype its bits come in (Views.norm's third result)
_INT_OF = {torch.float64: torch.int64, torch.float32: torch.int32, torch.bfloat16: torch.int16,
           torch.float16: torch.int16}
# ... and back: the dtype the library rounded into (Views.norm's fourth result)
_DTYPE_OF = {code: dt for dt, code in _NORM_DTYPE.items()}
_NORM_GRADS = 1  # bx_norm_dtype BX_NORM_GRADS: chosen by the library over all ranks


def _norm_dtype_arg(norm_dtype):
    """norm_dtype= as a torch dtype, or None for torch's promotion of the
    gradients' dtypes (None or "grads")."""
    if norm_dtype is None:
        return None
    code = _norm_dtype(norm_dtype)
    return None if code == _NORM_GRADS else _DTYPE_OF[code]


def _empty_norm(dtype):
    """The norm of no gradient: torch's tensor(0.), or 0 of the dtype asked for."""
    return torch.tensor(0.0) if dtype is None else torch.zeros((), dtype=dtype)


_compiling = torch.compiler.is_compiling


def comm(process_group=None):
    """A :class:`bitexact.Comm` over a torch.distributed group (None: the
    default group), for the framework-neutral API. The words travel as an
    int64 tensor (on the current CUDA device for NCCL-only groups)."""
    group = process_group if process_group is not None else _dist.group.WORLD
    backend = str(_dist.get_backend(group)).lower()
    on_cpu = "gloo" in backend or "mpi" in backend or "cpu" in backend
    device = torch.device("cpu") if on_cpu else torch.device("cuda", torch.cuda.current_device())
    ops = {"sum": _dist.ReduceOp.SUM, "max": _dist.ReduceOp.MAX}

    def allreduce(buf, op):
        words = torch.frombuffer(buf, dtype=torch.int64)
        if on_cpu:
            _dist.all_reduce(words, op=ops[op], group=group)
        else:
            moved = words.to(device)
            _dist.all_reduce(moved, op=ops[op], group=group)
            words.copy_(moved.cpu())

    return Comm(allreduce, _dist.get_rank())


# ---- which tensors this rank counts ------------------------------------

def _owned_test(owned):
    """owned= as a function obj -> bool (None: everything)."""
    if owned is None:
        return None
    if isinstance(owned, bool):
        return lambda obj: owned
    if callable(owned):
        return owned
    ids = {id(o) for o in owned}
    return lambda obj: id(obj) in ids


def _dtensor_local(g):
    """(local tensor, owned by this rank, mesh) of a DTensor gradient."""
    mesh = g.device_mesh
    coord = mesh.get_coordinate()
    if coord is None:  # this rank is not in the mesh: holds nothing
        return g.to_local(), False, mesh
    owned = True
    for dim, p in enumerate(g.placements):
        if p.is_partial():
            raise InvalidArgumentError(
                f"a DTensor gradient has a Partial placement on mesh dim {dim} "
                "(pending reduction); reduce it before computing the norm")
        if p.is_replicate() and coord[dim] != 0:
            owned = False
    return g.to_local(), owned, mesh


def _split(items, tensors, owned):
    """Split tensors into (mine, others, positions, meshes): local tensors
    this rank counts, local tensors it only scales, the index into items of
    each, and the DTensor meshes seen. items[k] is what owned() is asked
    about (the parameter, or the tensor itself)."""
    test = _owned_test(owned)
    mine, others, pos_mine, pos_others, meshes = [], [], [], [], {}
    plain = False
    for k, (item, t) in enumerate(zip(items, tensors)):
        if _DTensor is not None and isinstance(t, _DTensor):
            local, mine_, mesh = _dtensor_local(t)
            meshes[id(mesh)] = mesh
        else:
            local, mine_ = t, (True if test is None else bool(test(item)))
            plain = True
        if mine_:
            mine.append(local)
            pos_mine.append(k)
        else:
            others.append(local)
            pos_others.append(k)
    if meshes and plain and owned is None:
        raise InvalidArgumentError(
            "DTensor and plain-tensor gradients in one call: pass owned= to say which "
            "rank counts the plain (replicated?) ones")
    return mine, others, (pos_mine, pos_others), meshes


def _mesh_comm(meshes):
    """The reduction for DTensor gradients without process_group."""
    sets = {tuple(m.mesh.flatten().tolist()) for m in meshes.values()}
    if len(sets) != 1:
        raise InvalidArgumentError(
            "DTensor gradients live on device meshes over different ranks; pass "
            "process_group= (a group holding every rank that owns a shard)")
    mesh = next(iter(meshes.values()))
    if mesh.ndim == 1:
        return comm(mesh.get_group())
    if _dist.is_initialized() and mesh.size() == _dist.get_world_size():
        return comm(None)
    raise InvalidArgumentError(
        "DTensor gradients on a multi-dimensional mesh smaller than the world: the ranks "
        "outside it may hold other parts of the model (pipeline stages) or replicas; pass "
        "process_group= a group over every rank that holds a shard of any gradient: all ranks "
        "of the mesh and, under pipeline parallelism, of every stage (e.g. the world group); "
        "a group over this stage's mesh alone gives each stage its own norm")


class _Plan:
    """One call's exported gradients: group 0 counted by this rank, group 1
    only scaled; the result dtype and device; the communicator; names for
    error messages (name_of(k): the caller's name of tensors[k])."""

    __slots__ = ("views", "dtype", "device", "fn", "rank", "pos", "name_of", "tensors", "cuda",
                 "nplan", "meshes", "special", "agree_dtype")

    def __init__(self, tensors, items, owned, process_group, name_of, norm_type=2.0,
                 norm_dtype=None):
        self.name_of = name_of
        self.device = tensors[0].device if tensors else torch.device("cpu")
        self.special = None  # sparse/complex gradients: (dense locals, special locals)
        meshes = None
        if owned is None and all(type(t) is _Tensor for t in tensors):
            mine, others, self.pos = tensors, [], None
        else:
            mine, others, self.pos, meshes = _split(items, tensors, owned)
            local = mine or others
            if local:
                self.device = local[0].device
        if process_group is not None:
            c = comm(process_group)
        elif meshes:
            c = _mesh_comm(meshes)
        else:
            _refuse_fsdp1_local(items, tensors, name_of)
            c = None
        self.fn, self.rank = (c.allreduce, c.rank) if c is not None else (None, 0)
        self.meshes = meshes
        self.tensors = (mine, others)
        self.views = None
        try:
            try:
                self.views = _core.Views([mine, others])
            except Error:
                if not any(map(_is_special, mine + others)):
                    raise
            # sparse gradients fail the export, complex ones are "other"
            if self.views is None or self.views.dtypes & _OTHER:
                if any(map(_is_special, mine + others)):
                    self._special_views(mine, others, norm_type)
            kind = self.views.device[0]
            if kind == "mixed" or (kind == "cuda" and not _core.HAVE_CUDA):
                self.views.check_device()  # raises, naming the tensors
        except Error as e:
            raise self.renamed(e)
        self.cuda = kind == "cuda" and self.special is None
        self.nplan = None  # the CUDA norm plan, once used
        # the norm's dtype: asked for, or torch's promotion of the gradients'
        # dtypes; with a communicator the library promotes over every rank's
        # (a rank holding no gradient, or only other dtypes, gets the same),
        # except for complex gradients with p != 2, whose |z| is counted one
        # format wider than their dtype (then each rank's own promotion)
        self.dtype = norm_dtype or _result_dtype(self.views.dtypes if self.special is None
                                                 else _dtype_mask(mine + others))
        self.agree_dtype = (norm_dtype is None and self.fn is not None
                            and (self.special is None or norm_type == 2.0
                                 or not any(t.is_complex() for t in mine + others)))

    def _special_views(self, mine, others, norm_type):
        """Views over the counted gradients with each sparse/complex one
        replaced by its _surrogate (and without the uncounted special ones,
        which only torch scales); self.special keeps what clipping scales."""
        if self.views is not None:
            self.views.release()
            self.views = None
        pos = self.pos or (list(range(len(mine))), [])
        counted = [_surrogate(t, norm_type, self.name_of(pos[0][i]))
                   if _is_special(t) else t for i, t in enumerate(mine)]
        keep = [i for i, t in enumerate(others) if not _is_special(t)]
        self.pos = (pos[0], [pos[1][i] for i in keep])
        every = mine + others
        self.special = ([t for t in every if not _is_special(t)],
                        [t for t in every if _is_special(t)])
        self.views = _core.Views([counted, [others[i] for i in keep]])

    def renamed(self, e):
        pos = self.pos

        def namer(g, i):
            k = i if pos is None else (pos[g][i] if i < len(pos[g]) else None)
            return self.name_of(k) if k is not None else f"tensor {i}"

        def flat(k):
            n0 = len(pos[0]) if pos is not None else 1 << 62
            return (0, k) if k < n0 else (1, k - n0)
        if (isinstance(e, _core.DeviceError) and "device type" in str(e)
                and "cuda:" not in str(e)):
            e.args = (str(e.args[0]) + "; bitexact.torch supports CPU and CUDA tensors",)
        return _rename(e, namer, self.rank if self.fn else None, flat)

    def norm(self, norm_type, error_if_nonfinite, num_threads, flavor, scale_mode=0):
        """The total norm as a 0-dim tensor of torch's dtype and device.
        CUDA without a communicator: enqueued on the current stream (no
        host synchronisation unless error_if_nonfinite)."""
        if self.cuda and self.fn is None:
            return self._cuda_norm(norm_type, error_if_nonfinite, num_threads, flavor,
                                   scale_mode)
        try:
            if self.cuda:
                _join_legacy_stream(self.views)
            code = _NORM_GRADS if self.agree_dtype else _NORM_DTYPE[self.dtype]
            _, _, bits, code = self.views.norm(norm_type, error_if_nonfinite, num_threads,
                                               flavor, self.fn, self.rank, 1, False, code)
            self.dtype = _DTYPE_OF[code]
        except NonFiniteError as e:
            raise _torch_nonfinite(self.renamed(e), norm_type)
        except Error as e:
            raise self.renamed(e)
        # rounded once into self.dtype by the library, which gives its bits:
        # no conversion here, where torch.set_flush_denormal(True) would
        # flush a subnormal norm to zero
        bits = torch.tensor(bits, dtype=_INT_OF[self.dtype], device=self.device)
        return bits.view(self.dtype)

    def _cuda_norm(self, norm_type, error_if_nonfinite, num_threads, flavor, scale_mode):
        dev = self.device
        stream = torch.cuda.current_stream(dev).cuda_stream
        if not self.tensors[0]:  # this rank counts nothing
            return torch.zeros((), dtype=self.dtype, device=dev)
        try:
            # the plan of group 0 (the counted gradients), with the scale
            # mode too: when it covers every gradient it also scales them
            self.nplan = self.views.cuda_plan(1, 0, stream, norm_type, error_if_nonfinite,
                                              flavor, scale_mode)
            # the finishing kernel always writes the status (0 or a bx_status)
            status = (torch.empty((), dtype=torch.int32, device=dev) if error_if_nonfinite
                      else None)
            status_ptr = status.data_ptr() if status is not None else 0
            # rounded once into the result dtype on the device by the
            # library (the CPU path's finish, so the CPU path's bits)
            total = torch.empty((), dtype=self.dtype, device=dev)
            self.nplan.norm_async_dtype(stream, _NORM_DTYPE[self.dtype], total.data_ptr(),
                                        status_ptr)
            if status is not None and int(status.item()) != 0:  # synchronises, as torch
                # the blocking call names the first NaN/Inf tensor
                self.views.norm(norm_type, True, num_threads, flavor, None, 0, 1, False, 0)
                raise _core.NonFiniteError(
                    f"the total norm is non-finite (status {int(status.item())})")
        except NonFiniteError as e:
            raise _torch_nonfinite(self.renamed(e), norm_type)
        except Error as e:
            raise self.renamed(e)
        return total

    def cuda_scale(self, coef, mode):
        """Enqueue every gradient (counted and not) *= coef (a 0-dim tensor
        on the device, torch's clamped coefficient) on the current stream."""
        try:
            _cuda_scale(self.views, coef, mode, self.nplan if not self.tensors[1] else None,
                        self.device)
        except Error as e:
            raise self.renamed(e)
        _bump_versions(self.tensors[0])
        _bump_versions(self.tensors[1])

    def check_targets(self):
        """Before the norm of a clip: every gradient can be scaled in place
        (writable, its own elements disjoint, no two sharing memory), as
        torch's mul_ requires even when the coefficient is 1 (then skipped
        here). A LayoutError names the gradient; nothing was modified."""
        try:
            self.views.check_scale_targets()
        except Error as e:
            e = self.renamed(e)
            # the user called clip_grad_norm_, not the binding's check
            e.args = (str(e.args[0]).replace("check_scale_targets:", "clip_grad_norm_:", 1),)
            raise e

    def scale(self, coef, num_threads, mode):
        try:
            self.views.scale(coef, mode, num_threads)
        except Error as e:
            raise self.renamed(e)
        _bump_versions(self.tensors[0])
        _bump_versions(self.tensors[1])

    def release(self):
        if self.views is not None:
            self.views.release()

    def result(self, total):
        """The norm as torch returns it: with DTensor gradients on one mesh,
        a DTensor replicated over that mesh (torch: Replicate for p = 2,
        Partial(max) for inf, which full_tensor() also resolves), holding
        the exact norm every rank computed; otherwise total itself."""
        if not self.meshes:
            return total
        meshes = list(self.meshes.values())
        if any(m != meshes[0] for m in meshes[1:]):
            return total
        from torch.distributed.tensor import Replicate
        return _DTensor.from_local(total, meshes[0], [Replicate()] * meshes[0].ndim,
                                   run_check=False)


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
        if c != c:  # NaN: torch's own multiply (NaN everywhere)
            with torch.no_grad():
                torch._foreach_mul_(tensors, coef.to(tensors[0].device))
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


try:
    from torch.autograd.graph import increment_version as _increment_version
except ImportError:  # older torch
    _increment_version = None


def _bump_versions(tensors):
    """Tensors written through DLPack: bump their autograd version counters
    as torch's in-place mul_ would (saved-tensor checks keep working)."""
    if _increment_version is not None and tensors:
        _increment_version(tensors)


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
from ._torch_layers import (  # noqa: E402,F401
    CausalAttention, CrossEntropyLoss, Embedding, GradReduction, Linear, RMSNorm,
    RotaryEmbedding, SwiGLUMLP, causal_attention, cross_entropy, embedding, linear, rms_norm,
    qkv_projection, rope, swiglu, swiglu_mlp)
from ._torch_layers import __all__ as _layers_all  # noqa: E402

__all__ += _layers_all

# The GLM-4.5 MoE block (router, dispatch, experts, shared experts) as one
# autograd node with the same kernel sequence as `bitexact train`.
from ._torch_moe import MoE, MoERouter, moe, moe_experts, moe_route  # noqa: E402,F401
from ._torch_moe import __all__ as _moe_all  # noqa: E402

__all__ += _moe_all

# The GLM-4.5 model built from them, and AdamW with the kernels' bits
# (docs/train_python.md; `python -m bitexact.train --framework torch`).
from ._torch_glm import (AdamW, Glm4MoeAttention, Glm4MoeDecoderLayer,  # noqa: E402,F401
                         Glm4MoeForCausalLM, Glm4MoeModel)
from ._torch_glm import __all__ as _glm_all  # noqa: E402

__all__ += _glm_all
