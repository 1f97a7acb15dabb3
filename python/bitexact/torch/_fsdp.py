"""FSDP1 (torch.distributed.fsdp.FullyShardedDataParallel) for the torch
drop-ins (bitexact.torch): ``fsdp_norm_args(model)``, the group and
ownership that make a clip of an FSDP1 model's gradients global, and the
check that refuses a rank-local norm of FSDP1 shards (process_group=None).
docs/python.md, "FSDP1". No numerics here."""
import functools as _functools
import gc as _gc
import sys as _sys
import weakref as _weakref

import torch.distributed as _dist

from .. import InvalidArgumentError

# FSDP1 keeps a module's parameters in one FlatParameter per wrapped module,
# sharded over the FlatParamHandle's process group; its gradients are plain
# tensors (the flat shard, or with use_orig_params views of it), so nothing
# on a gradient says it is a shard. The handles are found once by a scan of
# the live objects and afterwards by a hook on FlatParamHandle.__init__
# that only records each new handle (weakly): enough to refuse a
# rank-local norm of shards (process_group=None) by name.

_FSDP1_HANDLES = _weakref.WeakSet()
_fsdp1_watching = False


def _fsdp1_handles():
    """The live FSDP1 FlatParamHandles (empty when FSDP1 was never imported)."""
    global _fsdp1_watching
    mod = _sys.modules.get("torch.distributed.fsdp._flat_param")
    cls = getattr(mod, "FlatParamHandle", None) if mod is not None else None
    if cls is None:
        return ()
    if not _fsdp1_watching:
        _fsdp1_watching = True
        init = cls.__init__

        @_functools.wraps(init)
        def __init__(self, *args, **kwargs):
            init(self, *args, **kwargs)
            _FSDP1_HANDLES.add(self)
        cls.__init__ = __init__
        for obj in _gc.get_objects():  # the handles made before this hook
            if type(obj) is cls:
                _FSDP1_HANDLES.add(obj)
    return tuple(_FSDP1_HANDLES)


def _fsdp1_shard_of(items, tensors):
    """(k, handle) for the first tensors[k] (or items[k], its parameter)
    that is a gradient of an FSDP1 flat parameter sharded over more than one
    rank, or None."""
    handles = [h for h in _fsdp1_handles() if h.uses_sharded_strategy and h.world_size > 1]
    if not handles:
        return None
    ids = {}
    for h in handles:
        fp = h.flat_param
        for obj in (fp, *(getattr(fp, "_params", None) or ())):
            ids[id(obj)] = h
            if obj.grad is not None:
                ids[id(obj.grad)] = h
    for k, (item, t) in enumerate(zip(items, tensors)):
        h = ids.get(id(t)) or ids.get(id(item))
        if h is not None:
            return k, h
    return None


def refuse_rank_local(items, tensors, name_of):
    """process_group=None over FSDP1 shards would be this rank's shard
    alone (the under-clipping bug): refused, naming the fix."""
    if not (_dist.is_available() and _dist.is_initialized()) or _dist.get_world_size() < 2:
        return
    found = _fsdp1_shard_of(items, tensors)
    if found is None:
        return
    k, h = found
    raise InvalidArgumentError(
        f"{name_of(k)} is a gradient of an FSDP1 flat parameter sharded over "
        f"{h.world_size} ranks ({h._sharding_strategy.name}): with process_group=None the "
        "norm would be this rank's shard alone, not the model's. Pass the FSDP group and "
        "ownership: **bitexact.torch.fsdp_norm_args(fsdp_model) (process_group= the group "
        "FSDP shards over, owned= counting NO_SHARD replicas once); every rank must call, "
        "also one whose shard holds no gradient (docs/python.md, 'FSDP1')")


def fsdp_norm_args(module):
    """The ``process_group=`` and ``owned=`` that make :func:`clip_grad_norm_`
    / :func:`get_total_norm` compute an FSDP1 model's global norm, as
    ``FullyShardedDataParallel.clip_grad_norm_`` does::

        bt.clip_grad_norm_(model.parameters(), 1.0, **bt.fsdp_norm_args(model))

    ``module``: the root FSDP1 module (or any module holding FSDP1 modules).
    process_group: the group the sharded handles shard over (every sharded
    handle must use the same one; HYBRID_SHARD: the intra-node shard group,
    whose replicas outside it hold the same gradients). owned: a predicate
    counting the gradients of NO_SHARD handles (whole replicas on every
    rank) on that group's rank 0 only, and everything else (disjoint flat
    shards, ``use_orig_params`` views of them) on every rank. Without FSDP1
    modules: ``{}`` (this process alone). Every rank must call the norm,
    also one whose shard holds no gradient."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    sharded, replicated_group, replicated = {}, None, set()
    for m in FSDP.fsdp_modules(module):
        h = getattr(m, "_handle", None)
        if h is None:
            continue
        if h.uses_sharded_strategy:
            sharded[id(h.process_group)] = h.process_group
            continue
        replicated_group = replicated_group or h.process_group
        fp = h.flat_param  # its parameters and their gradients (get_total_norm is given those)
        for obj in (fp, *(getattr(fp, "_params", None) or ())):
            replicated.add(id(obj))
            if obj.grad is not None:
                replicated.add(id(obj.grad))
    if len(sharded) > 1:
        raise InvalidArgumentError(
            "fsdp_norm_args: the FSDP1 modules shard over different process groups; pass "
            "process_group= a group over every rank holding a shard, and owned=")
    group = next(iter(sharded.values())) if sharded else replicated_group
    if group is None:
        return {}
    first = _dist.get_rank(group) == 0

    def owned(p):
        return first or id(p) not in replicated
    return {"process_group": group, "owned": owned}
