"""The exact global gradient norm in a DeepSpeed run.

    import bitexact.deepspeed
    bitexact.deepspeed.patch()      # before engine.step(); unpatch() restores

switches DeepSpeed (0.19.8, pinned in scripts/clients_setup.sh) to
bitexact's norm in its three optimizer paths. DeepSpeed's own choice of
which gradients each rank counts, of the process groups it reduces over,
of the dtype it wants the norm in and of its clipping formula is kept;
only the arithmetic of the norm changes: every square exact, the int64
words of the accumulator all-reduced with SUM over DeepSpeed's groups, the
total rounded once (DESIGN.md §2, §5).

What patch() replaces:

- ZeRO-1 and ZeRO-2 (``DeepSpeedZeroOptimizer``): ``scaled_global_norm``
  and ``get_grad_norm_direct``. Each rank's gradient partitions
  (``averaged_gradients[i]``, with ``params_in_partition[i]``; DeepSpeed's
  rule: padding skipped, pipeline-replicated parameters skipped, a
  parameter that is not model-parallel counted on model-parallel rank 0
  only) of every parameter group, experts included, summed over the
  data-parallel group, then the model-parallel group. DeepSpeed computes
  each group's norm in fp64, rounds its square sum to fp32 before the
  fp32 all-reduce and the fp32 sqrt, then combines the group norms with
  ``vector_norm`` (and averages the expert group norms over their
  expert-data-parallel group): patched, the norm of all groups is one
  exact sum, correctly rounded to **fp32** once, as the fp32 tensor
  DeepSpeed expects.
- ZeRO-3 (``DeepSpeedZeroOptimizer_Stage3``): ``_get_norm_groups`` and
  ``get_grad_norm_direct``. Each sub-group's partitions summed over the
  parameters' partition group (``ds_process_group``), the model-parallel
  group unless that partition group already spans it, and the AutoEP
  expert-parallel group, as DeepSpeed reduces them (sub-groups reduced
  over different groups are separate blocks of the one reduction;
  bitexact.Comm). The total is correctly rounded once to DeepSpeed's norm
  dtype (``get_norm_dtype()``: **fp64**, fp32 on devices without fp64) and
  reaches ``step()`` unchanged: ``combine_grad_norm_groups`` (also
  replaced, in every deepspeed module that imported it) passes it through.
- ``BF16_Optimizer`` (ZeRO-1 with bf16 parameters and fp32 gradient
  accumulation; it keeps every reduced gradient whole on every rank):
  ``get_global_norm_of_tensors`` (in ``deepspeed.runtime.utils`` and where
  it was imported by name) and, in ``deepspeed.runtime.bf16_optimizer``,
  ``get_norm_with_moe_layers``. The non-expert gradients are summed over
  the model-parallel group (no data-parallel reduction: the gradients are
  replicated), each expert group's over the model- or pipeline-parallel
  group and its expert-parallel group, as DeepSpeed does; the result is
  the fp32 tensor DeepSpeed returns, and with MoE the one exact total of
  all groups, correctly rounded to fp64, as a Python float (DeepSpeed:
  ``sqrt`` of the fp32 sum of the rounded group norms squared).

Clipping is DeepSpeed's, untouched: ZeRO's ``unscale_and_clip_grads``
(``clamp(((norm / loss_scale) + 1e-6) / clip, min=1)``, then
``grad *= 1 / combined_scale``) and ``clip_tensors_by_global_norm``
(``clip / (norm + 1e-6)``, applied when < 1) now see the exact norm, the
same bits on every rank.

Differences from DeepSpeed, on purpose: the exact value (DeepSpeed's is a
few ulp off, 1-14 fp32 ulp in tests/python/clients/test_deepspeed.py, and
changes with the partitioning); DeepSpeed's
non-finite conventions are kept (``get_grad_norm_direct`` and
``get_global_norm_of_tensors`` give -1 for a NaN or infinite norm,
``scaled_global_norm`` and the combined ZeRO-3 norm +inf,
``get_norm_with_moe_layers`` -1), but an empty gradient list gives 0
(DeepSpeed's ``torch.stack`` of nothing raises). Refused with
:class:`bitexact.InvalidArgumentError` (naming the setting) instead of an
inexact or wrong norm: ZeRO optimizer offload (``offload_optimizer``:
DeepSpeed accumulates per-parameter norms during the reduction), a Muon
group whose update lacks the loss scale (``loss_scale != 1``), a norm type
other than 2 in ``scaled_global_norm`` (DeepSpeed asserts the same), and
``get_norm_with_moe_layers`` called with a norm that the patched
``get_global_norm_of_tensors`` did not produce. Gradients of an
unsupported dtype raise :class:`bitexact.DTypeError` naming the tensor.

Threading: called from the training thread, the same collectives in the
same order on every rank of each group (DeepSpeed's own requirement).
patch() keeps the originals; the only other state is BF16_Optimizer's
non-expert gradient list, kept from its get_global_norm_of_tensors call to
its get_norm_with_moe_layers call of the same step.
"""
import re as _re
import sys as _sys

import torch
import torch.distributed as _dist

from . import Comm, Error, InvalidArgumentError, total_norm
from .torch._groups import ChainComm as _ChainComm
from .torch._groups import Patched as _Patched

__all__ = ["patch", "unpatch", "is_patched", "zero_norm", "zero3_norm", "tensors_norm"]

DEEPSPEED_VERSION = "0.19.8"  # the version whose internals patch() replaces


# ---- the reduction: each block of words over its own chain of groups ------

def _parallel(group):
    """DeepSpeed's pg_utils.is_parallel: an optional group (None: absent)
    that spans more than one rank."""
    return group is not None and _dist.get_world_size(group) > 1


def _dp(group):
    """A data-parallel group as deepspeed.comm reads it (None: the world)."""
    return group if group is not None else _dist.group.WORLD


_POSITION = _re.compile(r"tensors\[(\d+)\]")


def _exact(blocks, chains, names, norm_type, norm_dtype):
    """The norm of all tensors of all blocks, block k summed over the
    process groups chains[k] (blocks with the same chain merged first),
    rounded once to norm_dtype. names[k][j] names blocks[k][j] in errors."""
    merged, merged_chains, merged_names = [], [], []
    for block, chain, nm in zip(blocks, chains, names):
        for m, c in enumerate(merged_chains):
            if len(c) == len(chain) and all(a is b for a, b in zip(c, chain)):
                merged[m].extend(block)
                merged_names[m].extend(nm)
                break
        else:
            merged.append(list(block))
            merged_chains.append(list(chain))
            merged_names.append(list(nm))
    flat, labels, flat_names = [], [], []
    for k, (block, nm) in enumerate(zip(merged, merged_names)):
        flat.extend(t.detach() for t in block)
        labels.extend([k] * len(block))
        flat_names.extend(nm)
    distributed = _dist.is_available() and _dist.is_initialized() and any(merged_chains)
    comm = Comm(_ChainComm(merged_chains, "bitexact.deepspeed"), _dist.get_rank()) if distributed else None
    try:
        total, _ = total_norm(flat, norm_type, groups=labels,
                              group_names=list(range(max(len(merged), 1))), comm=comm,
                              norm_dtype=norm_dtype)
    except Error as e:
        if getattr(e, "rank", -1) in (-1, comm.rank if comm is not None else 0) and e.args:
            msg = _POSITION.sub(lambda m: flat_names[int(m.group(1))]
                                if int(m.group(1)) < len(flat_names) else m.group(0),
                                str(e.args[0]))
            e.args = (f"bitexact.deepspeed: {msg}",) + e.args[1:]
        raise
    return total


def _finite(x):
    return x == x and x not in (float("inf"), float("-inf"))


def _device():
    """Where DeepSpeed keeps its norms: the accelerator's current device."""
    try:
        from deepspeed.accelerator import get_accelerator
        return torch.device(get_accelerator().current_device_name())
    except Exception:  # noqa: BLE001 (no deepspeed accelerator: the CPU)
        return torch.device("cpu")


# ---- ZeRO-1 and ZeRO-2 ------------------------------------------------------

def _zero12_counted(opt, gradients, params, where):
    """DeepSpeedZeroOptimizer.get_grad_norm_direct's choice of gradients:
    padding gradients dropped (the rest zipped with params), pipeline
    replicas skipped, non-model-parallel parameters on model-parallel rank
    0 only. Returns (tensors, names)."""
    from deepspeed.runtime.utils import is_model_parallel_parameter
    if gradients is None or params is None:
        raise InvalidArgumentError(
            f"bitexact.deepspeed: {where} is None (no reduced gradients: call step() after "
            "backward())")
    out, names = [], []
    kept = [(j, g) for j, g in enumerate(gradients) if not getattr(g, "_zero_padding", False)]
    for (j, g), p in zip(kept, params):
        if getattr(p, "ds_pipe_replicated", False):
            continue
        if is_model_parallel_parameter(p) or opt.model_parallel_rank == 0:
            out.append(g)
            names.append(f"{where}[{j}]")
    return out, names


def _averaged(opt, i):
    """opt.averaged_gradients[i] (a dict in 0.19.8), None when absent."""
    grads = opt.averaged_gradients
    if isinstance(grads, dict):
        return grads.get(i)
    return grads[i] if grads is not None and i < len(grads) else None


def _zero12_chain(opt):
    chain = [_dp(opt.dp_process_group)]
    if _parallel(opt.model_parallel_group):
        chain.append(opt.model_parallel_group)
    return chain


def _refuse_offload_and_muon(opt, stage, groups, offload):
    if offload:
        raise InvalidArgumentError(
            f"bitexact.deepspeed: ZeRO-{stage} with offload_optimizer is not supported (DeepSpeed "
            "accumulates per-parameter norms while reducing); turn the offload off or unpatch()")
    lacks = getattr(opt, "_muon_update_lacks_loss_scale", None)
    if lacks is not None:
        for i in range(len(groups)):
            if lacks(i):
                raise InvalidArgumentError(
                    f"bitexact.deepspeed: parameter group {i} holds a Muon update without the "
                    f"loss scale ({opt.loss_scale}); its norm cannot be rescaled exactly")


def zero_norm(optimizer, norm_type=2):
    """The exact norm ``DeepSpeedZeroOptimizer.scaled_global_norm`` returns
    (ZeRO-1/2; ``patch()`` installs it there): every parameter group's
    gradient partitions, over the data- and model-parallel groups, as one
    exact sum rounded once to fp32. Returns an fp32 0-dim tensor on the
    accelerator device, the same bits on every rank; +inf for a NaN or
    infinite norm (DeepSpeed's combine_grad_norm_groups convention)."""
    if norm_type != 2:
        raise InvalidArgumentError(
            f"bitexact.deepspeed: scaled_global_norm supports norm_type 2 only, not {norm_type!r}")
    opt = optimizer
    _refuse_offload_and_muon(opt, "1/2", opt.bit16_groups, opt.cpu_offload)
    chain = _zero12_chain(opt)
    tensors, names = [], []
    for i in range(len(opt.bit16_groups)):
        t, n = _zero12_counted(opt, _averaged(opt, i), opt.params_in_partition[i],
                               f"averaged_gradients[{i}]")
        tensors.extend(t)
        names.extend(n)
    total = _exact([tensors], [chain], [names], 2.0, "float32")
    if not _finite(total):
        total = float("inf")
    return torch.tensor(total, dtype=torch.float32, device=opt.device)


def _zero12_grad_norm_direct(self, gradients, params, norm_type=2):
    """DeepSpeedZeroOptimizer.get_grad_norm_direct, exact (bitexact.deepspeed)."""
    tensors, names = _zero12_counted(self, list(gradients), list(params), "gradients")
    total = _exact([tensors], [_zero12_chain(self)], [names], float(norm_type), "float32")
    if not _finite(total):
        total = -1.0
    return torch.tensor(total, dtype=torch.float32, device=self.device)


def _zero12_scaled_global_norm(self, norm_type=2):
    """DeepSpeedZeroOptimizer.scaled_global_norm, exact: bitexact.deepspeed.zero_norm."""
    return zero_norm(self, norm_type)


# ---- ZeRO-3 -------------------------------------------------------------------

class _ExactNormGroups(list):
    """_get_norm_groups' result when patched: one norm, the exact total of
    all sub-groups; the patched combine_grad_norm_groups returns it as it is."""

    __slots__ = ("total",)


def _zero3_norm_dtype():
    from deepspeed.runtime.zero.utils import get_norm_dtype
    return "float64" if get_norm_dtype() == torch.float64 else "float32"


def _zero3_block(opt, gradients, params, where):
    """(tensors, chain, names) of one ZeRO-3 sub-group, as
    DeepSpeedZeroOptimizer_Stage3.get_grad_norm_direct chooses them."""
    from deepspeed.runtime.utils import is_model_parallel_parameter
    if gradients is None:
        raise InvalidArgumentError(f"bitexact.deepspeed: {where} is None")
    gradients, params = list(gradients), list(params)
    if not params:
        return [], [], []
    opt._assert_same_partition_group(params)
    group = _dp(opt._get_param_partition_group(params[0]))
    every = opt._grad_norm_counts_every_rank(params, group)
    out, names = [], []
    for j, (g, p) in enumerate(zip(gradients, params)):
        if every or is_model_parallel_parameter(p) or opt.model_parallel_rank == 0:
            out.append(g)
            names.append(f"{where}[{j}]")
    chain = [group]
    if not every and _parallel(opt.model_parallel_group):
        chain.append(opt.model_parallel_group)
    ep = opt._autoep_expert_parallel_group(params)
    if _parallel(ep):
        chain.append(ep)
    return out, chain, names


def zero3_norm(optimizer):
    """The exact norm of a ZeRO-3 optimizer's gradient partitions (every
    sub-group over its own groups, one exact sum, rounded once to
    DeepSpeed's norm dtype). Returns a 0-dim tensor (fp64 where the
    accelerator has fp64) on the accelerator device, the same bits on every
    rank; +inf for a NaN or infinite norm."""
    opt = optimizer
    _refuse_offload_and_muon(opt, 3, opt.fp16_groups, opt.offload_optimizer)
    blocks, chains, names = [], [], []
    for i in range(len(opt.fp16_groups)):
        t, c, n = _zero3_block(opt, _averaged(opt, i), opt.fp16_groups[i],
                               f"averaged_gradients[{i}]")
        if c:
            blocks.append(t)
            chains.append(c)
            names.append(n)
    nd = _zero3_norm_dtype()
    total = _exact(blocks, chains, names, 2.0, nd) if blocks else 0.0
    if not _finite(total):
        total = float("inf")
    return torch.tensor(total, dtype=getattr(torch, nd), device=opt.device)


def _zero3_get_norm_groups(self):
    """DeepSpeedZeroOptimizer_Stage3._get_norm_groups, exact: one norm, the
    total of every sub-group (bitexact.deepspeed.zero3_norm)."""
    total = zero3_norm(self)
    out = _ExactNormGroups([total])
    out.total = total
    return out


def _zero3_grad_norm_direct(self, gradients, params, norm_type=2):
    """DeepSpeedZeroOptimizer_Stage3.get_grad_norm_direct, exact (bitexact.deepspeed)."""
    t, c, n = _zero3_block(self, gradients, params, "gradients")
    nd = _zero3_norm_dtype()
    total = _exact([t], [c], [n], float(norm_type), nd) if c else 0.0
    if not _finite(total):
        total = -1.0
    return torch.tensor(total, dtype=getattr(torch, nd), device=self.device)


def _make_combine(original):
    def combine_grad_norm_groups(norm_groups, norm_type=2):
        if isinstance(norm_groups, _ExactNormGroups):
            return norm_groups.total
        return original(norm_groups, norm_type)
    combine_grad_norm_groups.__doc__ = ("deepspeed.runtime.utils.combine_grad_norm_groups, "
                                        "passing bitexact.deepspeed's exact ZeRO-3 total through")
    combine_grad_norm_groups.__wrapped__ = original
    return combine_grad_norm_groups


# ---- BF16_Optimizer (and get_global_norm_of_tensors) -----------------------------

def _tensors_chain(mpu, moe_ep_group):
    """The groups get_global_norm_of_tensors sums over, in its order."""
    from deepspeed.runtime import utils as U
    chain = []
    if mpu is not None:
        if moe_ep_group is None or U.groups._get_expert_model_parallel_world_size() > 1:
            g = mpu.get_model_parallel_group()
            if _parallel(g):
                chain.append(g)
        elif U.bwc_pipeline_parallel_world_size(mpu) > 1:
            chain.append(U.bwc_pipeline_parallel_group(mpu))
    if _parallel(moe_ep_group):
        chain.append(moe_ep_group)
    return chain


def tensors_norm(input_tensors, norm_type=2, mpu=None, moe_ep_group=None):
    """``deepspeed.runtime.utils.get_global_norm_of_tensors``, exact:
    the norm of all elements of input_tensors summed over the model- (or,
    for experts without expert tensor parallelism, pipeline-) parallel
    group of ``mpu`` and over ``moe_ep_group``, as DeepSpeed sums them;
    rounded once to fp32. Returns an fp32 0-dim tensor on the first
    tensor's device, -1 for a NaN or infinite norm (DeepSpeed's sentinel).
    """
    tensors = list(input_tensors)
    for k, t in enumerate(tensors):
        if not torch.is_tensor(t):
            raise InvalidArgumentError(
                f"bitexact.deepspeed: input_tensors[{k}] is a {type(t).__name__}, not a tensor")
    chain = _tensors_chain(mpu, moe_ep_group)
    names = [f"input_tensors[{k}]" for k in range(len(tensors))]
    total = _exact([tensors], [chain], [names], float(norm_type), "float32")
    if not _finite(total):
        total = -1.0
    device = tensors[0].device if tensors else _device()
    out = torch.tensor(total, dtype=torch.float32, device=device)
    return out


def _bf16_global_norm_of_tensors(input_tensors, norm_type=2, mpu=None, moe_ep_group=None):
    """get_global_norm_of_tensors as BF16_Optimizer.step calls it (patched):
    tensors_norm, remembering its inputs for get_norm_with_moe_layers."""
    tensors = list(input_tensors)
    out = tensors_norm(tensors, norm_type, mpu, moe_ep_group)
    _state["bf16_last"] = (out, tensors, _tensors_chain(mpu, moe_ep_group), float(norm_type))
    return out


def _bf16_norm_with_moe_layers(non_expert_norm, mpu, expert_tensors, norm_type=2):
    """deepspeed.runtime.utils.get_norm_with_moe_layers as BF16_Optimizer.step
    calls it, exact: the non-expert gradients (those the patched
    get_global_norm_of_tensors just summed) and every expert group's, each
    over its groups, one exact sum rounded once to fp64. A Python float, -1
    for a NaN or infinite norm (DeepSpeed's)."""
    from deepspeed.utils import groups
    last = _state.get("bf16_last")
    if last is None or last[0] is not non_expert_norm:
        raise InvalidArgumentError(
            "bitexact.deepspeed: get_norm_with_moe_layers needs the non-expert norm of the "
            "patched get_global_norm_of_tensors (BF16_Optimizer.step's); got another value")
    _, tensors, chain, p = last
    _state["bf16_last"] = None
    if float(norm_type) != p:
        raise InvalidArgumentError(
            f"bitexact.deepspeed: norm_type {norm_type!r} differs from the non-expert norm's {p!r}")
    blocks, chains = [tensors], [chain]
    names = [[f"non_expert_grads[{k}]" for k in range(len(tensors))]]
    for name, ts in expert_tensors.items():
        ts = list(ts)
        blocks.append(ts)
        chains.append(_tensors_chain(mpu, groups._get_expert_parallel_group(name)))
        names.append([f"expert_grads[{name!r}][{k}]" for k in range(len(ts))])
    total = _exact(blocks, chains, names, p, "float64")
    return total if _finite(total) else -1


# ---- patch() ---------------------------------------------------------------------

_state = {"patched": None, "bf16_last": None}


def _deepspeed_modules():
    return [(n, m) for n, m in list(_sys.modules.items())
            if m is not None and (n == "deepspeed" or n.startswith("deepspeed."))]


def patch():
    """Switch DeepSpeed's gradient norm to bitexact's (see the module doc):
    ``DeepSpeedZeroOptimizer.scaled_global_norm`` / ``get_grad_norm_direct``
    (ZeRO-1/2), ``DeepSpeedZeroOptimizer_Stage3._get_norm_groups`` /
    ``get_grad_norm_direct`` and ``combine_grad_norm_groups`` (ZeRO-3),
    ``get_global_norm_of_tensors`` and BF16_Optimizer's
    ``get_norm_with_moe_layers``. Call it on every rank before the first
    ``engine.step()``; engines built before or after are both switched.
    Returns a context manager that unpatches on exit. Raises
    InvalidArgumentError (nothing patched) for a DeepSpeed whose version is
    not the pinned 0.19.8 (the internals replaced are not a stable API)."""
    import deepspeed
    version = str(getattr(deepspeed, "__version__", "?")).split("+")[0]
    if version != DEEPSPEED_VERSION:
        raise InvalidArgumentError(
            f"bitexact.deepspeed: DeepSpeed {version} is installed; this bitexact replaces the "
            f"internals of DeepSpeed {DEEPSPEED_VERSION} (scripts/clients_setup.sh's pin)")
    import deepspeed.runtime.bf16_optimizer as bf16
    import deepspeed.runtime.utils as U
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3 as Z3
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer as Z12
    if _state["patched"] is not None:
        unpatch()
    # (object, attribute, replacement): the optimizer classes' methods, the
    # module-level functions in every loaded deepspeed module that imported
    # them by name, and BF16_Optimizer's module, whose
    # get_global_norm_of_tensors also remembers its gradients for the exact
    # MoE combination
    plan = [(Z12, "scaled_global_norm", _zero12_scaled_global_norm),
            (Z12, "get_grad_norm_direct", _zero12_grad_norm_direct),
            (Z3, "_get_norm_groups", _zero3_get_norm_groups),
            (Z3, "get_grad_norm_direct", _zero3_grad_norm_direct)]
    for cls, name, _ in plan:
        if name not in cls.__dict__:
            raise InvalidArgumentError(
                f"bitexact.deepspeed: {cls.__name__}.{name} is missing (DeepSpeed changed?)")
    combine = _make_combine(U.combine_grad_norm_groups)
    functions = {"get_global_norm_of_tensors": (U.get_global_norm_of_tensors, tensors_norm),
                 "combine_grad_norm_groups": (U.combine_grad_norm_groups, combine)}
    for _, mod in _deepspeed_modules():
        for name, (original, ours) in functions.items():
            if getattr(mod, name, None) is original and not (
                    mod is bf16 and name == "get_global_norm_of_tensors"):
                plan.append((mod, name, ours))
    plan += [(bf16, "get_global_norm_of_tensors", _bf16_global_norm_of_tensors),
             (bf16, "get_norm_with_moe_layers", _bf16_norm_with_moe_layers)]
    records = []  # (object, attribute, original)
    for obj, name, ours in plan:
        records.append((obj, name, obj.__dict__[name]))
        setattr(obj, name, ours)
    _state["patched"] = {"records": records,
                         "functions": {name: pair for name, pair in functions.items()}}
    return _Patched(unpatch)


def unpatch():
    """Restore DeepSpeed's own functions (everything patch() replaced, and
    any deepspeed module imported since that took a patched function by
    name). No-op when not patched."""
    st = _state["patched"]
    if st is None:
        return
    for obj, name, original in reversed(st["records"]):
        setattr(obj, name, original)
    for _, mod in _deepspeed_modules():
        for name, (original, ours) in st["functions"].items():
            if getattr(mod, name, None) is ours:
                setattr(mod, name, original)
    _state["patched"] = None
    _state["bf16_last"] = None


def is_patched():
    """Whether patch() is in effect."""
    return _state["patched"] is not None
