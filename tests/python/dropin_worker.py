"""Worker of test_dropin_shards.py: one gloo process on the CPU. Each
scenario of issue 24's defects runs once; its results (small dicts) go to
<dir>/rank<r>.pt and the test asserts:

- a rank holding no gradient (or other dtypes) gets the others' norm dtype;
- norm_dtype= on the torch drop-ins, agreed or refused by name;
- FSDP1 flat-parameter shards with process_group=None are refused by name,
  and fsdp_norm_args(model) gives the exact global norm on every rank, also
  when one rank's shard holds no gradient (a frozen embedding)."""
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_HERE, "torch_port"))

import bitexact  # noqa: E402
import bitexact.torch as bt  # noqa: E402
from port_models import gather_pieces, guard, init_group, save_and_close  # noqa: E402


def _grads(seed, dtype, n=3, numel=700):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(numel, generator=g) * 3).to(dtype) for _ in range(n)]


def empty_rank(rank):
    """bf16/fp16 gradients on rank 0 only; rank 1 passes []."""
    out = {}
    for dtype in (torch.bfloat16, torch.float16):
        grads = _grads(1, dtype) if rank == 0 else []
        total = bt.get_total_norm(grads, process_group=dist.group.WORLD)
        params = [nn.Parameter(torch.zeros_like(g)) for g in grads]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        clipped = bt.clip_grad_norm_(params, 1.0, process_group=dist.group.WORLD)
        out[str(dtype)] = {"total": total, "clipped": clipped,
                           "pieces": gather_pieces(grads),
                           "grads": [p.grad for p in params]}
    return out


def mixed_dtypes(rank):
    """bf16 on rank 0, fp16 on rank 1: torch's promotion over both is fp32."""
    grads = _grads(2, torch.bfloat16 if rank == 0 else torch.float16)
    return {"total": bt.get_total_norm(grads, process_group=dist.group.WORLD),
            "pieces": gather_pieces(grads)}


def norm_dtypes(rank):
    """norm_dtype= in a multi-rank call: fp32 and fp64 norms of bf16
    gradients (one rank empty), and ranks asking for different dtypes."""
    grads = _grads(3, torch.bfloat16) if rank == 1 else []
    out = {"pieces": gather_pieces(grads)}
    for nd in (torch.float32, "float64"):
        out[str(nd)] = bt.get_total_norm(grads, process_group=dist.group.WORLD, norm_dtype=nd)
    try:
        bt.get_total_norm(grads, process_group=dist.group.WORLD,
                          norm_dtype=torch.float32 if rank == 0 else torch.bfloat16)
        out["mismatch"] = None
    except bitexact.MismatchError as e:
        out["mismatch"] = str(e)
    return out


class _Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(64, 16)
        self.body = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16))
        self.head = nn.Linear(16, 8)

    def forward(self, ids):
        return self.head(self.body(self.embed(ids))).sum(1)


def _fsdp(strategy, orig, freeze_embed, rank, dtype=None):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
    torch.manual_seed(0)
    model = _Tiny()
    if freeze_embed:
        model.embed.weight.requires_grad_(False)
    mp = None
    if dtype is not None:
        mp = MixedPrecision(param_dtype=dtype, reduce_dtype=dtype, buffer_dtype=dtype,
                            keep_low_precision_grads=True)
    fsdp = FSDP(model, sharding_strategy=getattr(ShardingStrategy, strategy),
                use_orig_params=orig, device_id=torch.device("cpu"), mixed_precision=mp)
    g = torch.Generator().manual_seed(10 + rank)
    ids = torch.randint(0, 64, (4, 5), generator=g)
    fsdp(ids).pow(2).sum().backward()
    return fsdp


FSDP_CASES = [("SHARD_GRAD_OP", False, False, None), ("FULL_SHARD", True, False, None),
              ("SHARD_GRAD_OP", True, True, torch.bfloat16), ("NO_SHARD", False, False, None)]


def fsdp_case(case):
    strategy, orig, freeze, dtype = case
    return f"{strategy}-orig{int(orig)}-freeze{int(freeze)}-{dtype}"


def fsdp1(rank, case):
    """FSDP1 with process_group=None (refused unless NO_SHARD) and with
    fsdp_norm_args (the exact global norm)."""
    strategy, orig, freeze, dtype = case
    model = _fsdp(strategy, orig, freeze, rank, dtype)
    params = list(model.parameters())
    grads = [p.grad for p in params if p.grad is not None]
    out = {"ngrads": len(grads)}
    for name, call in (("clip_none", lambda: bt.clip_grad_norm_(params, 1e9)),
                       ("norm_none", lambda: bt.get_total_norm(grads))):
        try:
            out[name] = call()
        except bitexact.InvalidArgumentError as e:
            out[name] = str(e)
    args = bt.fsdp_norm_args(model)
    counted = [g for p, g in ((p, p.grad) for p in params) if g is not None and args["owned"](p)]
    out["pieces"] = gather_pieces(counted)
    out["norm_args"] = bt.get_total_norm(grads, **args)
    out["norm_fp32"] = bt.get_total_norm(grads, norm_dtype=torch.float32, **args)
    out["clip_args"] = bt.clip_grad_norm_(params, 1e9, **args)
    return out


def main(rank, ws, port, out_dir):
    torch.set_num_threads(1)
    init_group(rank, ws, port)
    res = {"empty_rank": guard(empty_rank, rank), "mixed": guard(mixed_dtypes, rank),
           "norm_dtypes": guard(norm_dtypes, rank)}
    for case in FSDP_CASES:
        res[("fsdp1", fsdp_case(case))] = guard(fsdp1, rank, case)
    save_and_close(res, rank, out_dir)
