"""Exact drop-ins for Megatron-core's gradient norm and clipping.

    import bitexact.megatron
    bitexact.megatron.patch()            # or patch(flavor="megatron_fp32")

switches a Megatron run (megatron-core 0.16.1, pinned in
scripts/py_setup.sh) to bitexact: every Megatron optimizer's grad norm
and clipping then go through the functions below. ``unpatch()`` restores
Megatron's own. The functions can also be called directly:

    get_grad_norm_fp32(grads_for_norm, norm_type=2, grad_stats_parallel_group=None)
    clip_grad_by_total_norm_fp32(parameters, max_norm, total_norm, use_decoupled_grad=False)

with the signatures, arguments and return values of
``megatron.core.optimizer.clip_grads``'s functions (a Python float; None),
plus keyword-only ``flavor=`` and ``num_threads=``.

What is computed. ``get_grad_norm_fp32`` returns the p-norm of all
elements of ``grads_for_norm`` on every rank of
``grad_stats_parallel_group`` (None: the default group; DTensor gradients
(Megatron FSDP): their data-parallel group first, then that group, as
Megatron reduces). The reduction is bitexact's: the accumulator's int64
words are all-reduced with SUM (MAX for inf), so the result is a pure
function of the multiset of gradient values the group holds, whatever the
sharding, the world size, the order of the tensors or the thread count.

- ``flavor="exact"`` (default): squares exact, sum exact, the norm rounded
  once to fp64 (norm_type 2, 1 and inf exact; 0 counts non-zeros; other p
  deterministic, not exact). Megatron's value is its fp32 arithmetic: each
  tensor's torch.norm, the norm of those norms, squared in fp32, summed over
  ranks in fp32, then ``** 0.5`` in fp64: within a few fp32 roundings of
  this one, and it overflows to inf once the norm passes ~1.8e19.
- ``flavor="megatron_fp32"`` (bitexact's BX_MEGATRON_FP32, norm_type 2
  only): Megatron-LM's reproducible integer-bin norm: each square rounded
  to fp32, those summed exactly, rounded once to fp32, fp32 sqrt; the fp32
  value as a float. megatron-core 0.16.1 has no such option itself.

``clip_grad_by_total_norm_fp32`` computes Megatron's coefficient
``max_norm / (total_norm + 1e-6)`` in fp64 and, when it is < 1, scales
every gradient as Megatron's multi_tensor_scale does (coefficient rounded
to fp32, fp32 product, rounded to the gradient's dtype), so the clipped
gradients are bitwise Megatron's for the same total norm. All-or-nothing:
every check happens before the first write.

The dense/expert split. Megatron keeps expert and dense parameters in two
optimizers of a ChainedOptimizer. When their grad_stats groups are the
same (the distributed optimizer) it calls get_grad_norm_fp32 once on both
lists, which the patched function makes exact. When they differ (the
non-distributed optimizer with expert parallelism: the dense norm is
reduced over the model-parallel group, the expert norm over the
expert-tensor-model-pipeline group) Megatron combines two rounded norms as
``sqrt(dense**2 + expert**2)`` in fp64. ``patch()`` replaces
``ChainedOptimizer.get_grad_norm`` with :func:`chained_grad_norm`: each
optimizer's gradients are accumulated into its own exact accumulator,
each accumulator is summed over its own group, and the total is the exact
sum of the two, rounded once.

Differences from Megatron, on purpose: the exact value (no fp32 overflow,
no dependence on layout); an empty ``grads_for_norm`` with norm_type inf
gives 0.0 (Megatron's ``max()`` of nothing raises ValueError); norm_type 0
counts the non-zero elements (Megatron divides by zero); negative or NaN
``max_norm`` and a negative ``total_norm`` raise InvalidArgumentError
(Megatron would scale by a negative or NaN factor); gradients that are not
fp32 (fp32 or bf16 with use_decoupled_grad) raise DTypeError instead of
Megatron's bare assertion; CPU tensors are accepted (Megatron allocates
its buffers on 'cuda'); without an initialised torch.distributed the norm
is this process's alone (Megatron's all_reduce would raise). A NaN
``total_norm`` scales nothing, as in Megatron (NaN < 1 is false).

Threading: like Megatron's, these functions are called from the training
thread, the same collectives in the same order on every rank of each
group; they keep no state between calls (patch() keeps the originals).
"""
import sys as _sys

import torch
import torch.distributed as _dist

from . import (
    _FLAVORS,
    DTypeError,
    Error,
    InvalidArgumentError,
    _core,
    _frameworks,
    _option,
    _rename,
)
from .torch import _bump_versions, _local  # also registers torch's fast DLPack export
from .torch._groups import ChainComm as _ChainComm
from .torch._groups import check_signature as _check_signature
from .torch._groups import Patched as _Patched

__all__ = ["get_grad_norm_fp32", "clip_grad_by_total_norm_fp32", "chained_grad_norm",
           "patch", "unpatch", "is_patched"]

_SCALE_TORCH = 0  # bx_scale_mode BX_SCALE_TORCH: fp32 coefficient, fp32 product


# ---- the reduction: one bitexact call, each group's words over its own groups

def _chain(grads, group):
    """The process groups a list of gradients is summed over, in Megatron's
    order: the DTensors' data-parallel group (Megatron FSDP), then the grad
    stats group (None: the default group). Empty when torch.distributed is
    not initialised."""
    if not (_dist.is_available() and _dist.is_initialized()):
        return []
    dp = None
    for k, g in enumerate(grads):
        mesh = getattr(g, "device_mesh", None)
        if mesh is not None and hasattr(g, "to_local"):
            cur = mesh.get_group()
            if dp is not None and cur is not dp:
                raise InvalidArgumentError(
                    f"grads_for_norm[{k}] is a DTensor on another data-parallel group than "
                    "the gradients before it")
            dp = cur
    return ([dp] if dp is not None else []) + [group if group is not None else _dist.group.WORLD]


def _norm(blocks, chains, norm_type, flavor, num_threads, namer):
    """The norm over the blocks of gradients, block k summed over chains[k]."""
    fl = _option(_FLAVORS, flavor, "flavor")
    if isinstance(norm_type, bool) or not isinstance(norm_type, (int, float)):
        raise InvalidArgumentError(f"norm_type must be an int or float, not {norm_type!r}")
    p = float(norm_type)
    fn = _ChainComm(chains, "bitexact.megatron") if any(chains) else None
    rank = _dist.get_rank() if fn is not None else 0
    try:
        with _core.Views([[_local(g) for g in b] for b in blocks]) as views:
            _frameworks.join_legacy_stream(views)
            total, _, _, _ = views.norm(p, False, int(num_threads), fl, fn, rank, -1, False, 0)
    except Error as e:
        raise _rename(e, namer, rank if fn is not None else None)
    return total


def get_grad_norm_fp32(grads_for_norm, norm_type=2, grad_stats_parallel_group=None, *,
                       flavor="exact", num_threads=0):
    """megatron.core.optimizer.clip_grads.get_grad_norm_fp32, exact.

    grads_for_norm: a tensor or a list of tensors (DTensors: their local
        shards), any of fp32/bf16/fp16/fp64, CPU or CUDA; read in place.
        Each rank passes the gradients Megatron passes (no shared, no
        tensor-parallel duplicate): every element once over the group.
    norm_type: 2 (default), 1, inf, 0 or any other p > 0.
    grad_stats_parallel_group: the group the norm is summed over (None:
        the default group).
    flavor: "exact" (fp64, correctly rounded) or "megatron_fp32".
    Returns the norm as a Python float, the same bits on every rank.
    """
    if isinstance(grads_for_norm, torch.Tensor):
        grads_for_norm = [grads_for_norm]
    grads = list(grads_for_norm)
    chain = _chain(grads, grad_stats_parallel_group)
    return _norm([grads], [chain], norm_type, flavor, num_threads,
                 lambda g, i: f"grads_for_norm[{i}]")


def _is_fp32_tensor(t):
    return isinstance(t, torch.Tensor) and t.dtype == torch.float32


def clip_grad_by_total_norm_fp32(parameters, max_norm, total_norm, use_decoupled_grad=False, *,
                                 num_threads=0):
    """megatron.core.optimizer.clip_grads.clip_grad_by_total_norm_fp32.

    Scales each parameter's ``.grad`` (``.decoupled_grad`` with
    use_decoupled_grad; parameters without one are skipped) in place by
    ``max_norm / (total_norm + 1e-6)`` when that is < 1, bitwise as
    Megatron does for the same total_norm (fp32 coefficient, fp32 product,
    rounded to the gradient's dtype). Gradients must be fp32 (or bf16 with
    use_decoupled_grad), as Megatron asserts. All-or-nothing. Returns None.
    """
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    grads, where = [], []
    for k, param in enumerate(parameters):
        if use_decoupled_grad:
            g = getattr(param, "decoupled_grad", None)
            allowed = (torch.float32, torch.bfloat16)
        else:
            g = param.grad
            allowed = (torch.float32,)
        if g is None:
            continue
        local = _local(g)
        if not isinstance(local, torch.Tensor) or local.dtype not in allowed:
            what = "decoupled_grad" if use_decoupled_grad else "grad"
            raise DTypeError(
                f"parameters[{k}].{what} is {getattr(local, 'dtype', type(local).__name__)}; "
                f"Megatron's clip_grad_by_total_norm_fp32 takes "
                f"{' or '.join(str(a) for a in allowed)} gradients")
        grads.append(local.detach())
        where.append(k)
    max_norm = float(max_norm)
    total_norm = float(total_norm)
    if not max_norm >= 0:
        raise InvalidArgumentError(
            f"max_norm must be >= 0, not {max_norm} (Megatron would scale the gradients by a "
            "negative or NaN factor)")
    if total_norm < 0:
        raise InvalidArgumentError(f"total_norm must be >= 0 (or NaN), not {total_norm}")
    clip_coeff = max_norm / (total_norm + 1.0e-6)  # Megatron's fp64 arithmetic
    if not clip_coeff < 1.0 or not grads:
        return
    try:
        with _core.Views([grads]) as views:
            _frameworks.join_legacy_stream(views)
            views.scale(clip_coeff, _SCALE_TORCH, int(num_threads))
    except Error as e:
        raise _rename(e, lambda g, i: f"parameters[{where[i]}]", None, lambda i: (0, i))
    _bump_versions(grads)


def chained_grad_norm(chained, *, flavor="exact", num_threads=0):
    """The total grad norm of a Megatron ChainedOptimizer, exact: what
    ``ChainedOptimizer.get_grad_norm`` computes (``patch()`` installs it
    there), with the dense and expert optimizers' gradients accumulated
    separately, each summed over its own grad stats group, and the two
    exact sums added before the one rounding (Megatron: sqrt(a**2 + b**2)
    of two rounded norms). A sub-optimizer must use MegatronOptimizer's own
    get_grad_norm (its gradients are get_main_grads_for_grad_norm())."""
    opts = list(chained.chained_optimizers)
    if len(opts) == 1:
        return opts[0].get_grad_norm()
    base = _megatron_base()
    blocks, chains = [], []
    for k, opt in enumerate(opts):
        if type(opt).get_grad_norm is not base.get_grad_norm:
            raise InvalidArgumentError(
                f"chained_optimizers[{k}] ({type(opt).__name__}) has its own get_grad_norm; "
                "bitexact.megatron cannot combine its norm exactly")
        grads = list(opt.get_main_grads_for_grad_norm())
        blocks.append(grads)
        chains.append(_chain(grads, opt.get_grad_stats_parallel_group()))
    if chains and all(c == chains[0] for c in chains):  # shared: one group, as Megatron
        blocks, chains = [[g for b in blocks for g in b]], [chains[0]]
        sizes = None
    else:
        sizes = [len(b) for b in blocks]

    def namer(g, i):
        if sizes is None:
            return f"grads_for_norm[{i}]"
        return f"chained_optimizers[{g}] grads_for_norm[{i}]"
    return _norm(blocks, chains, 2.0, flavor, num_threads, namer)


# ---- patch(): switch a Megatron run ---------------------------------------

_NAMES = ("get_grad_norm_fp32", "clip_grad_by_total_norm_fp32")
_state = {"patched": None}  # while patched: {"flavor", "records", "originals", "ours"}


def _megatron_base():
    from megatron.core.optimizer.optimizer import MegatronOptimizer
    return MegatronOptimizer


def patch(flavor="exact", *, num_threads=0):
    """Switch Megatron to bitexact: replace ``get_grad_norm_fp32`` and
    ``clip_grad_by_total_norm_fp32`` in megatron.core.optimizer.clip_grads
    and wherever a loaded ``megatron*`` module imported them by name (as
    megatron.core.optimizer.optimizer and .layer_wise_optimizer do; modules
    imported later take clip_grads' patched attribute), and
    ``ChainedOptimizer.get_grad_norm`` by :func:`chained_grad_norm`.
    ``flavor`` ("exact" or "megatron_fp32") and ``num_threads`` apply to
    every norm. Calling patch() again switches the flavour. Returns a
    context manager that unpatches on exit. Raises InvalidArgumentError
    (nothing patched) for an unknown flavour or if megatron-core's
    signatures differ from the pinned 0.16.1's."""
    _option(_FLAVORS, flavor, "flavor")
    import megatron.core.optimizer.clip_grads as cg
    import megatron.core.optimizer.layer_wise_optimizer  # noqa: F401  (imports them by name)
    from megatron.core.optimizer.optimizer import ChainedOptimizer
    if _state["patched"] is not None:
        unpatch()
    originals = {name: getattr(cg, name) for name in _NAMES}
    nt = int(num_threads)

    def get_grad_norm_fp32_(grads_for_norm, norm_type=2, grad_stats_parallel_group=None):
        return get_grad_norm_fp32(grads_for_norm, norm_type, grad_stats_parallel_group,
                                  flavor=flavor, num_threads=nt)

    def clip_grad_by_total_norm_fp32_(parameters, max_norm, total_norm,
                                      use_decoupled_grad=False):
        return clip_grad_by_total_norm_fp32(parameters, max_norm, total_norm,
                                            use_decoupled_grad, num_threads=nt)

    def get_grad_norm(self):
        with torch.no_grad():
            return chained_grad_norm(self, flavor=flavor, num_threads=nt)

    ours = {"get_grad_norm_fp32": get_grad_norm_fp32_,
            "clip_grad_by_total_norm_fp32": clip_grad_by_total_norm_fp32_}
    for name in _NAMES:
        _check_signature(originals[name], ours[name],
                         f"bitexact.megatron: megatron-core's {name}", "megatron-core 0.16.1's")
        ours[name].__name__ = name
        ours[name].__qualname__ = name
        ours[name].__doc__ = f"bitexact.megatron's {name} (flavor={flavor!r}), see bitexact.megatron."
        ours[name].__wrapped__ = originals[name]
    get_grad_norm.__doc__ = f"bitexact.megatron.chained_grad_norm (flavor={flavor!r})"
    records = []  # (object, attribute, original)
    for modname, mod in list(_sys.modules.items()):
        if mod is None or not (modname == "megatron" or modname.startswith("megatron.")):
            continue
        for name in _NAMES:
            if getattr(mod, name, None) is originals[name]:
                records.append((mod, name, originals[name]))
    records.append((ChainedOptimizer, "get_grad_norm", ChainedOptimizer.__dict__["get_grad_norm"]))
    for obj, name, _ in records:
        setattr(obj, name, ours.get(name, get_grad_norm))
    _state["patched"] = {"flavor": flavor, "records": records, "originals": originals,
                         "ours": ours}
    return _Patched(unpatch)


def unpatch():
    """Restore Megatron's own functions (everything patch() replaced, and
    any megatron* module that imported a patched function since). No-op
    when not patched."""
    st = _state["patched"]
    if st is None:
        return
    for obj, name, original in st["records"]:
        setattr(obj, name, original)
    for modname, mod in list(_sys.modules.items()):
        if mod is None or not (modname == "megatron" or modname.startswith("megatron.")):
            continue
        for name in _NAMES:
            if getattr(mod, name, None) is st["ours"][name]:
                setattr(mod, name, st["originals"][name])
    _state["patched"] = None


def is_patched():
    """The flavour patch() installed, or None when Megatron's own are in use."""
    st = _state["patched"]
    return st["flavor"] if st is not None else None
