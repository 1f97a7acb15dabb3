"""bitexact: exact, layout-invariant gradient norms and clipping.

The norm is computed exactly (every square exact, summed in an integer
fixed-point accumulator, rounded once), so it is a pure function of the
multiset of gradient values: the same bits for any tensor order, split,
thread count or rank count, and whatever floating-point environment the
caller set (``torch.set_flush_denormal(True)`` included: the library runs
its arithmetic in its own and gives the caller's back). Calls may be made
from a forked child (``os.fork``, multiprocessing's "fork") and from inside
a :class:`Comm`'s all-reduce.

Framework-neutral API, for any object with ``__dlpack__`` (NumPy, PyTorch,
JAX, CuPy, Paddle, ...) or a DLPack capsule, fp16/bf16/fp32/fp64, read in
place (no copies)::

    bitexact.total_norm(tensors, norm_type=2.0, error_if_nonfinite=False, groups=None)
    bitexact.clip_grad_norm(tensors, max_norm, norm_type=2.0, error_if_nonfinite=False,
                            groups=None)
    bitexact.scale(tensors, coef)

PyTorch drop-ins (``torch.nn.utils`` signatures, plus process_group= /
owned= / use_main_grad= / FSDP2 and DTensor shards) live in
:mod:`bitexact.torch`; Paddle's ``ClipGradByGlobalNorm`` in
:mod:`bitexact.paddle`. Paddle tensors with ``stop_gradient=False`` (which
refuse ``__dlpack__``) are read through their DenseTensor's DLPack export.

Errors are subclasses of :class:`bitexact.Error` (a RuntimeError) that are
also the builtin a Python user expects: :class:`InvalidArgumentError`,
:class:`LayoutError` and :class:`DeviceError` are ValueErrors,
:class:`DTypeError` is a TypeError, :class:`OutOfMemoryError` a
MemoryError. On any error no tensor has been modified. The message names
the caller's tensors (``tensors[3]``, ``parameters[3]``); the exception also
says where as integers (-1: none): ``e.status`` (the bx_status), ``e.rank``
(the rank at fault: this one for its own failure, else the lowest failing
rank), ``e.group`` and ``e.tensor`` (the position of the tensor at fault in
the library's call), ``e.other_group`` and ``e.other_tensor`` (the second
of two tensors sharing memory).

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

from . import _core, _frameworks
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

# The version of the C library compiled into this package (bx_version_string):
# one source, include/bitexact.h's BX_VERSION_MAJOR/MINOR/PATCH.
__version__ = _core.version()
__all__ = [
    "total_norm", "clip_grad_norm", "scale", "clip_coef", "Comm", "library_version", "isa",
    "cuda_available", "cuda_info", "cuda_plan_cache",
    "Error", "InvalidArgumentError", "DTypeError", "DeviceError", "LayoutError",
    "NonFiniteError", "OutOfMemoryError", "CommError", "MismatchError", "InternalError",
]

_FLAVORS = {"exact": 0, "megatron_fp32": 1}
# bx_norm_dtype: the format the library rounds the norms into (once)
_NORM_DTYPES = {"float64": 0, "grads": 1, "float32": 2, "bfloat16": 3, "float16": 4}
_SCALE_MODES = {"torch": 0, "exact": 1}
_FORMULAS = {"torch": 0, "max": 1}


def library_version():
    """Version of the C library compiled into this package, 'major.minor.patch'
    (bx_version_string(); the same text as ``bitexact.__version__``)."""
    return _core.version()


def isa():
    """The CPU kernels in use: 'avx512', 'avx512-pf1' (the same with one prefetch a
    line, chosen on AMD EPYC 9005), 'avx2' or 'portable' (env BX_ISA forces one)."""
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
    of the same size holding it). It is called twice per call (a small
    ``"max"`` agreement step, then the norm's one fixed-size reduction), in
    the same order on every rank, from the calling thread; it may itself
    call bitexact (a logging hook computing another norm), up to 4 calls
    deep. ``rank`` is used in error messages and exceptions (``e.rank``).
    Every rank passes only the tensors it owns (each element of the model
    exactly once over all ranks) and gets the same bits.
    The norm's reduction holds one block of words per group, in group
    order, all of equal size (bx_comm in bitexact.h): ``allreduce`` may
    reduce each block over a different set of ranks (bitexact.megatron's
    dense and expert groups); the total combines the reduced blocks exactly.
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


def _norm_dtype(value):
    """norm_dtype= as a bx_norm_dtype: "float64", "grads", "float32",
    "bfloat16", "float16" (or a dtype object whose name ends so, like
    torch.float32 or numpy.float32)."""
    name = value if isinstance(value, str) else str(getattr(value, "__name__", value))
    return _option(_NORM_DTYPES, name.rsplit(".", 1)[-1], "norm_dtype")


def _option(table, value, what):
    try:
        return table[value]
    except (KeyError, TypeError):
        raise InvalidArgumentError(
            f"{what} must be one of {', '.join(map(repr, table))}, not {value!r}") from None


def _as_list(tensors):
    _frameworks.use_fast()
    if hasattr(tensors, "__dlpack__") or type(tensors).__name__ == "PyCapsule":
        return [tensors]
    return list(tensors)


def _position(group, tensor):
    """How the library's (and the binding's) messages write a position."""
    return f"group {group}, tensor {tensor}" if group >= 0 else f"tensor {tensor}"


def _replace_position(msg, phrase, name):
    """msg with each occurrence of the position phrase (one not followed by
    a digit: "tensor 1" is not in "tensor 12") replaced by name."""
    out, start = [], 0
    while True:
        k = msg.find(phrase, start)
        if k < 0:
            break
        end = k + len(phrase)
        out.append(msg[start:k])
        out.append(msg[k:end] if end < len(msg) and msg[end].isdigit() else name)
        start = end
    out.append(msg[start:])
    return "".join(out)


def _rename(exc, namer, rank=None, flat=None):
    """Name the caller's tensors in exc's message, from the positions the
    exception carries as integers (exc.group / exc.tensor and
    exc.other_group / exc.other_tensor: bx_last_error_location() or the
    binding's own): namer(group, index) -> str; flat(index) -> (group,
    index) for a flat position (group -1: bx_scale's numbering). Positions
    on another rank (exc.rank set and not this `rank`) are that rank's
    tensors: kept as they are."""
    if not exc.args or not isinstance(exc.args[0], str):
        return exc
    at = getattr(exc, "rank", -1)
    if at >= 0 and rank is not None and at != rank:
        return exc
    msg = exc.args[0]
    for g, i in ((getattr(exc, "group", -1), getattr(exc, "tensor", -1)),
                 (getattr(exc, "other_group", -1), getattr(exc, "other_tensor", -1))):
        if i < 0 or (g < 0 and flat is None):
            continue
        name = namer(g, i) if g >= 0 else namer(*flat(i))
        msg = _replace_position(msg, _position(g, i), name)
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
               group_names=None, comm=None, num_threads=0, flavor="exact",
               norm_dtype="float64"):
    """The exact p-norm of all elements of all ``tensors``.

    tensors: an iterable of DLPack tensors (or one tensor); read in place,
        with any strides (gaps, transposed, expanded stride-0 dims: every
        logical element counts, a stride-0 dim of size k k times, as in
        torch).
    norm_type: 2 (default; correctly rounded sqrt of the exact sum of
        squares), 1, inf, -inf, 0 (number of non-zeros: NaN and Inf count
        as non-zero, so it stays finite) are exact; any other p, negative
        included, is deterministic but not exact ((sum |x|^p)^(1/p), each
        |x|^p in fp64 by bitexact's own power function, the sum exact). For
        p < 0, as torch: a zero element gives 0 (|0|^p = inf), an Inf
        element adds nothing, every element Inf gives inf, NaN gives NaN.
    error_if_nonfinite: raise :class:`NonFiniteError` naming the first
        tensor holding NaN/Inf when the total norm is NaN or infinite
        (torch's rule: so p = 0 never raises, p = -inf only when the
        smallest |x| is NaN or Inf, p < 0 only for NaN or an infinite
        total); otherwise NaN anywhere gives NaN, else any Inf gives inf
        (p > 0).
    groups: None, or one label per tensor; then the result is
        ``(total, {label: group norm})``. ``group_names`` fixes the groups
        and their order (give it in multi-rank calls: all ranks must have
        the same groups, even where a rank holds no tensor of one).
    comm: None (this process alone) or a :class:`Comm`.
    flavor: "exact" or "megatron_fp32" (Megatron-LM's reproducible fp32
        norm, p = 2 only).
    norm_dtype: the format the norms are rounded into, once, by the
        library: "float64" (default), "float32", "bfloat16", "float16", or
        "grads" (the tensors' dtype as torch promotes it, over all tensors
        of all ranks: what torch.nn.utils.get_total_norm returns). p = 2
        and 1 are rounded from the exact sum (never the fp64 norm rounded
        again); with a comm every rank gets the same bits, with no extra
        collective.

    Returns a Python float (the correctly rounded norm, a value of
    ``norm_dtype``), or a tuple with the group norms when ``groups`` is
    given.
    """
    buckets, names, namer = _bucket(tensors, groups, group_names, None)
    fn, rank = _comm_args(comm)
    fl = _option(_FLAVORS, flavor, "flavor")
    nd = _norm_dtype(norm_dtype)
    try:
        with _core.Views(buckets) as views:
            _frameworks.join_legacy_stream(views)
            total, gn, _, _ = views.norm(float(norm_type), bool(error_if_nonfinite),
                                         int(num_threads), fl, fn, rank, -1, groups is not None,
                                         nd)
    except Error as e:
        raise _rename(e, namer, rank if fn else None)
    if groups is None:
        return total
    return total, dict(zip(names, gn))


def clip_grad_norm(tensors, max_norm, norm_type=2.0, error_if_nonfinite=False, groups=None, *,
                   unowned=None, group_names=None, comm=None, eps=1e-6, formula="torch",
                   scale_mode="torch", num_threads=0, flavor="exact", norm_dtype="float64"):
    """Clip the gradients ``tensors`` in place by their exact global norm.

    The norm is :func:`total_norm`'s (in ``norm_dtype``, from which the
    coefficient is computed); then, if ``max_norm > 0``,
    ``coef = min(1, max_norm / (total + eps))`` (``formula="torch"``) or
    ``max_norm / max(total, max_norm)`` (``formula="max"``), and every
    tensor (including ``unowned``: tensors this rank holds but another rank
    owns, scaled but not counted) is multiplied by coef unless coef == 1.
    ``max_norm == 0`` disables clipping (the norm is still returned);
    negative or NaN ``max_norm`` raises :class:`InvalidArgumentError`.
    scale_mode "torch": coef rounded to fp32, fp32 product, rounded to the
    grad dtype (torch's arithmetic); "exact": the exact product rounded
    once. Any strides: each logical element is scaled once, the bytes
    between them untouched; a tensor whose logical elements overlap in
    memory (an expanded stride-0 view, overlapping strides) or two tensors
    sharing a byte raise :class:`LayoutError` (interleaved but disjoint
    views, e.g. the even and odd columns of one buffer, are fine).
    All-or-nothing: on any error no tensor is modified.

    Returns the total norm (a float), or ``(total, {label: norm})`` when
    ``groups`` is given.
    """
    buckets, names, namer = _bucket(tensors, groups, group_names, unowned)
    fn, rank = _comm_args(comm)
    fl = _option(_FLAVORS, flavor, "flavor")
    mode = _option(_SCALE_MODES, scale_mode, "scale_mode")
    form = _option(_FORMULAS, formula, "formula")
    nd = _norm_dtype(norm_dtype)
    max_norm = float(max_norm)
    try:
        with _core.Views(buckets) as views:
            _frameworks.join_legacy_stream(views)
            if groups is None and unowned is None:
                total, _ = views.clip(max_norm, float(norm_type), bool(error_if_nonfinite),
                                      int(num_threads), fl, mode, float(eps), form, fn, rank,
                                      nd)
                return total
            ngroups = len(names) if names is not None else 1
            # checks that bx_clip_grad_norm would make before the norm
            _core.clip_coef(0.0, max_norm, float(eps), form)
            total, gn, _, _ = views.norm(float(norm_type), bool(error_if_nonfinite),
                                         int(num_threads), fl, fn, rank, ngroups,
                                         groups is not None, nd)
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
            _frameworks.join_legacy_stream(views)
            views.scale(float(coef), m, int(num_threads))
    except Error as e:
        raise _rename(e, lambda g, i: f"tensors[{i}]", None, lambda k: (0, k))


def clip_coef(total_norm, max_norm, *, eps=1e-6, formula="torch"):
    """The coefficient :func:`clip_grad_norm` applies for a given norm
    (computed in fp64; 1.0 when max_norm == 0)."""
    return _core.clip_coef(float(total_norm), float(max_norm), float(eps),
                           _option(_FORMULAS, formula, "formula"))
