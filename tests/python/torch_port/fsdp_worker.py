"""Worker of test_fsdp_clip.py: one gloo process on the CPU running the
FSDP1 (FullyShardedDataParallel, device_id=cpu) scenarios of upstream's
test/distributed/fsdp/test_fsdp_clip_grad_norm.py, with
FSDP.clip_grad_norm_ / torch.nn.utils.clip_grad_norm_ replaced by
bitexact.torch.clip_grad_norm_. FSDP1's flat-parameter shards are
disjoint per rank, so the sharded gradients are counted by every rank
(process_group=WORLD); NO_SHARD gradients are replicated and are counted
by rank 0 only (owned=), as FSDP's own clip_grad_norm_ separates them.
Results (small dicts) are saved to <dir>/rank<r>.pt; the test asserts."""
import itertools
import os
import sys
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import CPUOffload, MixedPrecision, ShardingStrategy
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bitexact.torch as bt  # noqa: E402
from port_models import SharedTransformer, gather_pieces, init_group, nested_linears  # noqa: E402
from port_models import guard, save_and_close  # noqa: E402

CPU = torch.device("cpu")
INF = float("inf")
PARITY = list(itertools.product([1, 2.5], [1, 2, INF], ["FULL_SHARD", "NO_SHARD", "mixed"],
                                [False, True]))
LOW_PRECISION = list(itertools.product([1, 2.5], [1, 2, INF], ["FULL_SHARD", "NO_SHARD"],
                                       [False, True]))


def parity_id(case):
    m, p, s, o = case
    return f"max{m}-p{p}-{s}-orig{int(o)}"


def _nonsharded(root):
    """ids of the parameters FSDP keeps whole on every rank (NO_SHARD
    handles), as FSDP.clip_grad_norm_ tells them apart (private
    attributes: _handle, uses_sharded_strategy, flat_param._params)."""
    ids = set()
    for m in FSDP.fsdp_modules(root):
        h = m._handle
        if h is None or h.uses_sharded_strategy:
            continue
        if h._use_orig_params:
            ids.update(id(p) for p in h.flat_param._params)
        else:
            ids.add(id(h.flat_param))
    return ids


def _fsdp_clip(model, max_norm, norm_type, rank):
    """bitexact's clip of an FSDP1 model: (total, exact-reference pieces)."""
    ids = _nonsharded(model)
    params = list(model.parameters())

    def owned(p):
        return rank == 0 or id(p) not in ids
    counted = [p.grad for p in params if p.grad is not None and owned(p)]
    pieces = gather_pieces(counted)
    total = bt.clip_grad_norm_(params, max_norm, norm_type, process_group=dist.group.WORLD,
                               owned=owned)
    return total, pieces


def _exact(pieces, dtype, p):
    from exact_ref import exact_norm
    from helpers import FMT
    return exact_norm(pieces, FMT[dtype], p)


def scenario_parity(rank, case):
    max_norm, norm_type, strategy, orig = case
    ddp = DDP(SharedTransformer())
    kw = {"cpu_offload": CPUOffload(offload_params=False), "use_orig_params": orig,
          "device_id": CPU}
    if strategy == "mixed":
        model = SharedTransformer()
        model.transformer.encoder = FSDP(model.transformer.encoder,
                                         sharding_strategy=ShardingStrategy.NO_SHARD, **kw)
        model.transformer.decoder = FSDP(model.transformer.decoder,
                                         sharding_strategy=ShardingStrategy.FULL_SHARD, **kw)
        fsdp = FSDP(model, sharding_strategy=ShardingStrategy.FULL_SHARD, **kw)
    else:
        fsdp = FSDP(SharedTransformer(), sharding_strategy=getattr(ShardingStrategy, strategy),
                    auto_wrap_policy=ModuleWrapPolicy({nn.TransformerEncoderLayer,
                                                       nn.TransformerDecoderLayer}), **kw)
    optims = [torch.optim.Adam(m.parameters(), lr=1e-2) for m in (ddp, fsdp)]
    inp = SharedTransformer.get_input(rank)
    for m in (ddp, fsdp):
        m(*inp).sum().backward()
    for p in itertools.chain(ddp.parameters(), fsdp.parameters()):
        if p.grad is not None:  # None for empty shards with use_orig_params
            p.grad *= 100  # so that clipping is active
    orig_ddp = [p.grad.detach().clone() for p in ddp.parameters()]
    orig_fsdp = [None if p.grad is None else p.grad.detach().clone() for p in fsdp.parameters()]
    ddp_exact = _exact(orig_ddp, torch.float32, float(norm_type))
    ddp_total = bt.clip_grad_norm_(ddp.parameters(), max_norm=max_norm, norm_type=norm_type)
    fsdp_total, pieces = _fsdp_clip(fsdp, max_norm, norm_type, rank)
    out = {"ddp": ddp_total, "fsdp": fsdp_total, "ddp_exact": ddp_exact,
           "fsdp_exact": _exact(pieces, fsdp_total.dtype, float(norm_type)),
           "ddp_modified": all(not torch.equal(p.grad, g)
                               for p, g in zip(ddp.parameters(), orig_ddp)),
           "fsdp_modified": all((p.grad is None and g is None)
                                or (p.grad is not None and not torch.equal(p.grad, g))
                                for p, g in zip(fsdp.parameters(), orig_fsdp))}
    for o in optims:
        o.step()
    with FSDP.summon_full_params(fsdp):
        pairs = list(zip(ddp.module.named_parameters(), fsdp.named_parameters()))
        out["names"] = [(n1, n2) for (n1, _), (n2, _) in pairs]
        out["params"] = [(p1.detach().clone(), p2.detach().clone()) for (_, p1), (_, p2) in pairs]
    # a few more iterations (upstream: without CPU offload only)
    out["later"] = []
    for i in range(3):
        for o in optims:
            o.zero_grad(set_to_none=(i % 2 == 0))
        inp = SharedTransformer.get_input(rank, step=i + 1)
        for m in (ddp, fsdp):
            m(*inp).sum().backward()
        d = bt.clip_grad_norm_(ddp.parameters(), max_norm=max_norm, norm_type=norm_type)
        f, _ = _fsdp_clip(fsdp, max_norm, norm_type, rank)
        out["later"].append((d, f))
        for o in optims:
            o.step()
    return out


def scenario_low_precision(rank, case):
    max_norm, norm_type, strategy, orig = case
    kw = {"sharding_strategy": getattr(ShardingStrategy, strategy), "use_orig_params": orig,
          "mixed_precision": MixedPrecision(param_dtype=torch.float16,
                                            reduce_dtype=torch.float16,
                                            keep_low_precision_grads=True),
          "device_id": CPU}
    fsdp = FSDP(nested_linears(lambda m: FSDP(m, **kw)), **kw)
    g = torch.Generator().manual_seed(1 + rank)
    fsdp(torch.randn(4, 8, generator=g)).sum().backward()
    dtypes = {p.grad.dtype for p in fsdp.parameters() if p.grad is not None}
    total, pieces = _fsdp_clip(fsdp, max_norm, norm_type, rank)
    return {"grad_dtypes": dtypes, "total": total,
            "exact": _exact(pieces, total.dtype, float(norm_type)),
            "after": [float(torch.linalg.vector_norm(p.grad, norm_type))
                      for p in fsdp.parameters() if p.grad is not None]}


def scenario_no_gradients(rank, orig):
    mp = MixedPrecision(param_dtype=torch.float16, reduce_dtype=torch.float32,
                        buffer_dtype=torch.float32)
    torch.manual_seed(0)
    fsdp = FSDP(nn.Linear(24, 24), sharding_strategy=ShardingStrategy.SHARD_GRAD_OP,
                mixed_precision=mp, device_id=CPU, use_orig_params=orig)
    fsdp(torch.randn(32, 24))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        total = bt.clip_grad_norm_(fsdp.parameters(), 1, process_group=dist.group.WORLD)
    return {"total": total, "warnings": [str(x.message) for x in w]}


def scenario_non_uniform(rank):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 5), nn.Linear(5, 5))
    model[0] = FSDP(model[0], mixed_precision=MixedPrecision(
        param_dtype=torch.bfloat16, keep_low_precision_grads=True, cast_forward_inputs=True),
        device_id=CPU)
    model[1] = FSDP(model[1], mixed_precision=MixedPrecision(
        param_dtype=torch.float32, cast_forward_inputs=True), device_id=CPU)
    fsdp = FSDP(model, device_id=CPU)
    fsdp(torch.randn(2, 5, generator=torch.Generator().manual_seed(rank))).sum().backward()
    dtypes = {p.grad.dtype for p in fsdp.parameters() if p.grad is not None}
    total, pieces = _fsdp_clip(fsdp, 1, 2.0, rank)
    return {"grad_dtypes": dtypes, "total": total, "exact": _exact(pieces, total.dtype, 2.0)}


def main(rank, ws, port, out_dir):
    init_group(rank, ws, port)
    torch.set_num_threads(1)
    res = {}
    for case in PARITY:
        res[("parity", parity_id(case))] = guard(scenario_parity, rank, case)
    for case in LOW_PRECISION:
        res[("low_precision", parity_id(case))] = guard(scenario_low_precision, rank, case)
    for orig in (False, True):
        res[("no_gradients", orig)] = guard(scenario_no_gradients, rank, orig)
    res[("non_uniform", None)] = guard(scenario_non_uniform, rank)
    save_and_close(res, rank, out_dir)
