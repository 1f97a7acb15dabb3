"""Worker of test_fully_shard_clip.py: one gloo process on the CPU running
the FSDP2 (fully_shard, DTensor gradients) scenarios of upstream's
test/distributed/_composable/fsdp/test_fully_shard_clip_grad_norm_.py,
with torch.nn.utils.clip_grad_norm_ replaced by bitexact.torch's on both
the reference (replicate, plain gradients) and the sharded model. What
each iteration saw is recorded; the test asserts. "1d": 2 ranks, a token
transformer, fully_shard per block. "2d": 4 ranks, mesh (dp 2, tp 2), an
MLP stack with colwise/rowwise tensor parallelism, fully_shard on dp."""
import copy
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed._composable import replicate
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                               parallelize_module)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bitexact.torch as bt  # noqa: E402
from port_models import Block, TokenTransformer, init_group  # noqa: E402
from port_models import guard, save_and_close  # noqa: E402

INF = float("inf")
NORMS_1D = (2, 1, INF)
NORMS_2D = (2, 1, 3, INF)
ITERS = 10  # upstream: 10 identical iterations (no optimizer step)
ITERS_2D = 4  # fewer on 4 processes (2 shared cores); same check per iteration


def _exact_bits(tensors, dtype, p):
    """exact_ref's norm (p = 1, 2, inf; None for other p)."""
    from exact_ref import exact_norm
    from helpers import FMT
    if float(p) not in (1.0, 2.0, INF):
        return None
    return exact_norm(tensors, FMT[dtype], float(p))


def _run(max_norm, norm_type, ref_model, model, inp, iters):
    vnorm = lambda g: float(torch.linalg.vector_norm(g, norm_type))  # noqa: E731
    out = []
    for k in range(iters):
        ref_model.zero_grad()
        ref_model(inp).sum().backward()
        model.zero_grad()
        model(inp).sum().backward()
        ref_grads = [p.grad.detach().clone() for p in ref_model.parameters()]
        local_grads = [p.grad.to_local().detach().clone() for p in model.parameters()]
        full = [p.grad.full_tensor() for p in model.parameters()]
        it = {"placements": [tuple(p.grad.placements) for p in model.parameters()]}
        it["grads_close"] = all(torch.allclose(a, b, rtol=1.3e-6, atol=1e-5)
                                for a, b in zip(ref_grads, full))
        it["ref_any_above"] = any(vnorm(g) > max_norm for g in ref_grads)
        it["local_any_above"] = any(vnorm(g) > max_norm for g in local_grads)
        it["ref_total"] = bt.clip_grad_norm_(ref_model.parameters(), max_norm=max_norm,
                                             norm_type=norm_type)
        comm = CommDebugMode()
        with comm:
            total = bt.clip_grad_norm_(model.parameters(), max_norm=max_norm,
                                       norm_type=norm_type, foreach=True)
        it["comm"] = {str(k): v for k, v in comm.get_comm_counts().items()}
        it["is_dtensor"] = isinstance(total, DTensor)
        if it["is_dtensor"]:
            it["total_placements"] = tuple(total.placements)
            it["total_full"] = total.full_tensor()
            total = total.to_local()
        it["total"] = total
        # the exact reference (pure Python, slow) on the first iteration;
        # every iteration: the single-process norm of the full gradients
        it["exact"] = _exact_bits(full, total.dtype, norm_type) if k == 0 else None
        it["ref_exact"] = (_exact_bits(ref_grads, it["ref_total"].dtype, norm_type)
                           if k == 0 else None)
        it["single"] = bt.get_total_norm(list(reversed(full)), norm_type)
        it["ref_after_ok"] = all(vnorm(p.grad) <= max_norm for p in ref_model.parameters())
        it["ref_changed"] = all(not torch.equal(p.grad, g) for p, g in
                                zip(ref_model.parameters(), ref_grads) if torch.count_nonzero(g))
        it["local_after_ok"] = all(vnorm(p.grad.to_local()) <= max_norm
                                   for p in model.parameters())
        it["local_changed"] = all(not torch.equal(p.grad.to_local(), g) for p, g in
                                  zip(model.parameters(), local_grads) if torch.count_nonzero(g))
        out.append(it)
    return out


def scenario_1d(rank, ws, norm_type):
    torch.manual_seed(42)
    model = TokenTransformer()
    ref_model = replicate(copy.deepcopy(model))
    mesh = init_device_mesh("cpu", (ws,))
    for m in model.modules():
        if isinstance(m, Block):
            fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    torch.manual_seed(42 + mesh.get_local_rank() + 1)
    inp = torch.randint(0, model.vocab, (3, 16))
    return _run(1, norm_type, ref_model, model, inp, ITERS)


def _mlp_stack():
    return nn.Sequential(*[nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 16))
                           for _ in range(2)])


def scenario_2d(rank, ws, norm_type):
    mesh = init_device_mesh("cpu", (2, ws // 2), mesh_dim_names=("dp", "tp"))
    dp_mesh, tp_mesh = mesh["dp"], mesh["tp"]
    torch.manual_seed(42)
    model = _mlp_stack()
    ref_model = replicate(copy.deepcopy(model), process_group=dp_mesh.get_group())
    for block in model:
        parallelize_module(block, tp_mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        fully_shard(block, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)
    torch.manual_seed(42 + dp_mesh.get_local_rank() + 1)
    inp = torch.randn(2, 16)
    return _run(0.5, norm_type, ref_model, model, inp, ITERS_2D)


def main(rank, ws, port, out_dir):
    init_group(rank, ws, port)
    torch.set_num_threads(1)
    res = {}
    if ws == 2:
        for p in NORMS_1D:
            res[("1d", p)] = guard(scenario_1d, rank, ws, p)
    else:
        for p in NORMS_2D:
            res[("2d", p)] = guard(scenario_2d, rank, ws, p)
    save_and_close(res, rank, out_dir)
