"""bitexact.torch's clip and norm plumbing (the drop-ins of
bitexact.torch call it): which gradients this rank counts (owned=, DTensor
placements, FSDP1 refusal), the communicator over torch.distributed, and
:class:`_Plan`, one call's exported gradients with its norm dtype, device
and error names."""
import torch
import torch.distributed as _dist

from .. import (
    Comm, Error, InvalidArgumentError, NonFiniteError, _core, _frameworks, _norm_dtype,
    _rename)
from ._cuda import _cuda_scale
from ._fsdp import refuse_rank_local as _refuse_fsdp1_local
from ._ops import _OTHER, _dtype_mask, _is_special, _result_dtype, _surrogate, _torch_nonfinite

try:
    from torch.distributed.tensor import DTensor as _DTensor
except ImportError:  # torch without distributed
    _DTensor = None

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
                _frameworks.join_legacy_stream(self.views)
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


try:
    from torch.autograd.graph import increment_version as _increment_version
except ImportError:  # older torch
    _increment_version = None


def _bump_versions(tensors):
    """Tensors written through DLPack: bump their autograd version counters
    as torch's in-place mul_ would (saved-tensor checks keep working)."""
    if _increment_version is not None and tensors:
        _increment_version(tensors)
