"""bitexact: exact, layout-invariant gradient norms and clipping.

The norm is computed exactly (every square exact, summed in an integer
fixed-point accumulator, rounded once), so it is a pure function of the
multiset of gradient values: the same bits for any tensor order, split,
thread count or rank count.

Framework-neutral API, for any object with ``__dlpack__`` (NumPy, PyTorch,
JAX, CuPy, Paddle, ...) or a DLPack capsule, fp16/bf16/fp32/fp64, read in
place (no copies)::

    bitexact.total_norm(tensors, norm_type=2.0, error_if_nonfinite=False, groups=None)
    bitexact.clip_grad_norm(tensors, max_norm, norm_type=2.0, error_if_nonfinite=False,
                            groups=None)
    bitexact.scale(tensors, coef)

PyTorch drop-ins (``torch.nn.utils`` signatures, plus process_group= /
owned= / use_main_grad= / FSDP2 and DTensor shards) live in
:mod:`bitexact.torch`.

Errors are subclasses of :class:`bitexact.Error` (a RuntimeError) that are
also the builtin a Python user expects: :class:`InvalidArgumentError`,
:class:`LayoutError` and :class:`DeviceError` are ValueErrors,
:class:`DTypeError` is a TypeError, :class:`OutOfMemoryError` a
MemoryError. On any error no tensor has been modified.

Devices: CPU tensors (also CUDA host-pinned and managed memory) and, when
the package was built with the CUDA backend (nvcc found at install time;
:func:`cuda_available`), CUDA device tensors: all tensors of one call on
one GPU. These functions return Python floats, so on CUDA they block: the
work runs on the legacy default stream, which is what a DLPack producer
orders its work before when no stream is requested (torch tensors exported
from another current stream are joined to it first). For the
stream-ordered, graph-capturable path use :mod:`bitexact.torch`.
"""
import atexit as _atexit
import re as _re
import sys as _sys

from . import _core
from ._core import (
    CommError,
    DeviceError,
    DTypeError,
    Error,
    InternalError,
    InvalidArgumentError,
    LayoutError,
    MismatchError,
    NonFiniteError,
    OutOfMemoryError,
)

__version__ = "0.1.0"
__all__ = [
    "total_norm", "clip_grad_norm", "scale", "clip_coef", "Comm", "library_version", "isa",
    "cuda_available", "cuda_info", "cuda_plan_cache",
    "Error", "InvalidArgumentError", "DTypeError", "DeviceError", "LayoutError",
    "NonFiniteError", "OutOfMemoryError", "CommError", "MismatchError", "InternalError",
]

_FLAVORS = {"exact": 0, "megatron_fp32": 1}
_SCALE_MODES = {"torch": 0, "exact": 1}
_FORMULAS = {"torch": 0, "max": 1}


def library_version():
    """Version of the C library compiled into this package ('0.1.0')."""
    return _core.version()


def isa():
    """The CPU kernels in use: 'avx512', 'avx2' or 'portable' (env BX_ISA forces one)."""
    return _core.isa()


def cuda_available():
    """True when this build has the CUDA backend and a CUDA device is usable
    (bx_cuda_available()); :func:`cuda_info` says why not."""
    return _core.cuda_available()[0]


def cuda_info():
    """``{"built": bool, "available": bool, "reason": str}``: whether the
    package was built with the CUDA backend, whether a device is usable, and
    if not, why (the library's message)."""
    ok, reason = _core.cuda_available()
    return {"built": bool(_core.HAVE_CUDA), "available": bool(ok), "reason": reason}


def cuda_plan_cache(size=None, clear=False):
    """The cache of stream-ordered CUDA plans (used by :mod:`bitexact.torch`
    on CUDA gradients): one plan per set of gradient buffers and options,
    built on first use (it allocates and synchronises) and reused by every
    later call with the same buffers (which then only enqueues work). The
    least recently used plan is dropped beyond ``size`` (default 8).
    ``size``: set the size; ``clear``: drop every plan. Returns
    ``(plans cached, size)``."""
    if clear:
        _core.cuda_plan_cache_clear()
    if size is not None:
        if int(size) < 0:
            raise InvalidArgumentError(f"cuda_plan_cache: size must be >= 0, not {size}")
        _core.cuda_plan_cache(int(size))
    return _core.cuda_plan_cache(-1)


# Plans hold device memory: free them while the CUDA runtime is still up.
_atexit.register(_core.cuda_plan_cache_clear)


class Comm:
    """An int64 all-reduce for multi-rank calls (the C library's bx_comm).

    ``allreduce(buf, op)``: ``buf`` is a bytearray of native-endian int64
    words, ``op`` is ``"sum"`` or ``"max"``; replace ``buf``'s contents with
    the element-wise reduction over all ranks (or return a bytes-like object
    of the same size holding it). It is called at most three times per call,
    in the same order on every rank. ``rank`` is used in error messages.
    Every rank passes only the tensors it owns (each element of the model
    exactly once over all ranks) and gets the same bits.
    See :func:`bitexact.torch.comm` for torch.distributed.
    """

    __slots__ = ("allreduce", "rank")

    def __init__(self, allreduce, rank=0):
        if not callable(allreduce):
            raise TypeError("Comm: allreduce must be callable")
        self.allreduce = allreduce
        self.rank = int(rank)


def _comm_args(comm):
    if comm is None:
        return None, 0
    if isinstance(comm, Comm):
        return comm.allreduce, comm.rank
    if callable(comm):
        return comm, 0
    raise TypeError("comm must be None, a bitexact.Comm or a callable allreduce(buf, op)")


def _option(table, value, what):
    try:
        return table[value]
    except (KeyError, TypeError):
        raise InvalidArgumentError(
            f"{what} must be one of {', '.join(map(repr, table))}, not {value!r}") from None


_torch_fast = False


def _torch_fast_export():
    """Once torch is imported: export plain torch tensors through torch's C
    function (what Tensor.__dlpack__ calls after ~2 us of Python checks)."""
    global _torch_fast
    _torch_fast = True
    torch = _sys.modules["torch"]
    fn = getattr(getattr(torch, "_C", None), "_to_dlpack", None)
    if fn is not None:
        _core.register_exporter(torch.Tensor, fn)
        _core.register_exporter(torch.nn.Parameter, fn)


def _join_legacy_stream(views):
    """Before a blocking call on CUDA tensors (run on the legacy default
    stream): make that stream wait for torch's current stream, as
    Tensor.__dlpack__(stream=1) would. torch tensors are exported through
    torch's C function, which does not; other producers were asked for no
    stream, which per DLPack means the legacy default stream."""
    kind, dev = views.device
    if kind != "cuda":
        return
    views.check_device()  # a clear error first, naming the tensor
    torch = _sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return  # torch has queued no CUDA work
    cur = torch.cuda.current_stream(dev)
    if cur.cuda_stream != 0:
        torch.cuda.default_stream(dev).wait_stream(cur)


def _as_list(tensors):
    if not _torch_fast and "torch" in _sys.modules:
        _torch_fast_export()
    if hasattr(tensors, "__dlpack__") or type(tensors).__name__ == "PyCapsule":
        return [tensors]
    return list(tensors)


# "group G, tensor I" (optionally after "rank R, ") in the C library's
# messages, and bx_scale's flat "tensor I".
_WHERE = _re.compile(r"(rank (\d+), )?group (\d+), tensor (\d+)")
_FLAT = _re.compile(r"\btensor (\d+)\b")


def _rename(exc, namer, rank=None, flat=None):
    """Rewrite the C library's tensor positions in exc's message as the
    caller's names: namer(group, index) -> str; flat(index) -> (group, index)
    for bx_scale's flat numbering. Positions on another rank are kept."""
    if not exc.args or not isinstance(exc.args[0], str):
        return exc

    def where(m):
        r = m.group(2)
        if r is not None and rank is not None and int(r) != rank:
            return m.group(0)
        prefix = m.group(1) or ""
        return prefix + namer(int(m.group(3)), int(m.group(4)))

    msg, n = _WHERE.subn(where, exc.args[0])
    if n == 0 and flat is not None and msg.startswith("bx_scale"):
        msg = _FLAT.sub(lambda m: namer(*flat(int(m.group(1)))), msg)
    exc.args = (msg,) + exc.args[1:]
    return exc


def _flat_index(groups):
    sizes = [len(g) for g in groups]

    def flat(k):
        for g, n in enumerate(sizes):
            if k < n:
                return g, k
            k -= n
        return len(sizes) - 1, k
    return flat


def _bucket(tensors, groups, group_names, unowned):
    """The groups of tensors (plus the unowned ones last) and a namer."""
    tensors = _as_list(tensors)
    unowned = _as_list(unowned) if unowned is not None else []
    if groups is None:
        buckets, names, pos = [tensors], None, [None]
    else:
        labels = list(groups)
        if len(labels) != len(tensors):
            raise InvalidArgumentError(
                f"groups has {len(labels)} labels for {len(tensors)} tensors")
        names = list(group_names) if group_names is not None else list(dict.fromkeys(labels))
        index = {name: k for k, name in enumerate(names)}
        if len(index) != len(names):
            raise InvalidArgumentError("group_names has duplicates")
        buckets = [[] for _ in names]
        pos = [[] for _ in names]
        for k, (t, label) in enumerate(zip(tensors, labels)):
            try:
                g = index[label]
            except KeyError:
                raise InvalidArgumentError(
                    f"tensors[{k}] has group {label!r}, which is not in group_names") from None
            buckets[g].append(t)
            pos[g].append(k)
    ngroups = len(buckets)
    if unowned:
        buckets.append(unowned)
        pos.append(None)

    def namer(g, i):
        if g == ngroups:
            return f"unowned[{i}]"
        if g < len(pos) and pos[g] is not None and i < len(pos[g]):
            return f"tensors[{pos[g][i]}]"
        return f"tensors[{i}]"
    return buckets, names, namer


def total_norm(tensors, norm_type=2.0, error_if_nonfinite=False, groups=None, *,
               group_names=None, comm=None, num_threads=0, flavor="exact"):
    """The exact p-norm of all elements of all ``tensors``.

    tensors: an iterable of DLPack tensors (or one tensor); read in place.
    norm_type: 2 (default; correctly rounded sqrt of the exact sum of
        squares), 1, inf, -inf, 0 (number of non-zeros) are exact; any other
        p > 0 is deterministic but not exact.
    error_if_nonfinite: raise :class:`NonFiniteError` naming the first
        tensor holding NaN/Inf; otherwise NaN anywhere gives NaN, else any
        Inf gives inf.
    groups: None, or one label per tensor; then the result is
        ``(total, {label: group norm})``. ``group_names`` fixes the groups
        and their order (give it in multi-rank calls: all ranks must have
        the same groups, even where a rank holds no tensor of one).
    comm: None (this process alone) or a :class:`Comm`.
    flavor: "exact" or "megatron_fp32" (Megatron-LM's reproducible fp32
        norm, p = 2 only).

    Returns a Python float (the correctly rounded fp64 norm), or a tuple
    with the group norms when ``groups`` is given.
    """
    buckets, names, namer = _bucket(tensors, groups, group_names, None)
    fn, rank = _comm_args(comm)
    fl = _option(_FLAVORS, flavor, "flavor")
    try:
        with _core.Views(buckets) as views:
            _join_legacy_stream(views)
            total, gn = views.norm(float(norm_type), bool(error_if_nonfinite), int(num_threads),
                                   fl, fn, rank, -1, groups is not None, 0)
    except Error as e:
        raise _rename(e, namer, rank if fn else None)
    if groups is None:
        return total
    return total, dict(zip(names, gn))


def clip_grad_norm(tensors, max_norm, norm_type=2.0, error_if_nonfinite=False, groups=None, *,
                   unowned=None, group_names=None, comm=None, eps=1e-6, formula="torch",
                   scale_mode="torch", num_threads=0, flavor="exact"):
    """Clip the gradients ``tensors`` in place by their exact global norm.

    The norm is :func:`total_norm`'s; then, if ``max_norm > 0``,
    ``coef = min(1, max_norm / (total + eps))`` (``formula="torch"``) or
    ``max_norm / max(total, max_norm)`` (``formula="max"``), and every
    tensor (including ``unowned``: tensors this rank holds but another rank
    owns, scaled but not counted) is multiplied by coef unless coef == 1.
    ``max_norm == 0`` disables clipping (the norm is still returned);
    negative or NaN ``max_norm`` raises :class:`InvalidArgumentError`.
    scale_mode "torch": coef rounded to fp32, fp32 product, rounded to the
    grad dtype (torch's arithmetic); "exact": the exact product rounded
    once. All-or-nothing: on any error no tensor is modified.

    Returns the total norm (a float), or ``(total, {label: norm})`` when
    ``groups`` is given.
    """
    buckets, names, namer = _bucket(tensors, groups, group_names, unowned)
    fn, rank = _comm_args(comm)
    fl = _option(_FLAVORS, flavor, "flavor")
    mode = _option(_SCALE_MODES, scale_mode, "scale_mode")
    form = _option(_FORMULAS, formula, "formula")
    max_norm = float(max_norm)
    try:
        with _core.Views(buckets) as views:
            _join_legacy_stream(views)
            if groups is None and unowned is None:
                total, _ = views.clip(max_norm, float(norm_type), bool(error_if_nonfinite),
                                      int(num_threads), fl, mode, float(eps), form, fn, rank)
                return total
            ngroups = len(names) if names is not None else 1
            # checks that bx_clip_grad_norm would make before the norm
            _core.clip_coef(0.0, max_norm, float(eps), form)
            total, gn = views.norm(float(norm_type), bool(error_if_nonfinite), int(num_threads),
                                   fl, fn, rank, ngroups, groups is not None, 0)
            coef = _core.clip_coef(total, max_norm, float(eps), form)
            if coef != coef:
                # NaN norm without error_if_nonfinite: every element becomes
                # NaN, as g * NaN would (bx_scale refuses a NaN coef).
                views.scale(float("inf"), mode, int(num_threads))
                views.scale(0.0, mode, int(num_threads))
            elif coef != 1.0:
                views.scale(coef, mode, int(num_threads))
    except Error as e:
        raise _rename(e, namer, rank if fn else None, _flat_index(buckets))
    if groups is None:
        return total
    return total, dict(zip(names, gn))


def scale(tensors, coef, *, mode="torch", num_threads=0):
    """Multiply every tensor by ``coef`` in place (bx_scale): ``mode``
    "torch" (coef rounded to fp32, fp32 product, rounded to the dtype) or
    "exact" (exact product rounded once). Tensors must not overlap; all
    checks happen before the first write."""
    tensors = _as_list(tensors)
    m = _option(_SCALE_MODES, mode, "mode")
    try:
        with _core.Views([tensors]) as views:
            _join_legacy_stream(views)
            views.scale(float(coef), m, int(num_threads))
    except Error as e:
        raise _rename(e, lambda g, i: f"tensors[{i}]", None, lambda k: (0, k))


def clip_coef(total_norm, max_norm, *, eps=1e-6, formula="torch"):
    """The coefficient :func:`clip_grad_norm` applies for a given norm
    (computed in fp64; 1.0 when max_norm == 0)."""
    return _core.clip_coef(float(total_norm), float(max_norm), float(eps),
                           _option(_FORMULAS, formula, "formula"))
