"""Worker of test_distributed.py: one process of a gloo group on CPU. Runs
every scenario and saves what it saw to <dir>/rank<r>.pt; the test compares
all ranks with the single-process, unsharded results."""
import os
import sys
import traceback
import types

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bitexact  # noqa: E402
import bitexact.torch as bt  # noqa: E402
from helpers import params_with_grads, random_tensors  # noqa: E402

MAX_NORM = 1e-2


def ddp_data():
    return random_tensors(100, ["float32", "bfloat16"], count=10)


def shard_pieces():
    """The hand-sharded model: every tensor cut into pieces of <= 500."""
    full = random_tensors(101, ["float32", "float16", "bfloat16"], count=12)
    return full, [p for t in full for p in t.flatten().split(500)]


def tp_data():
    """Megatron-like: 'replicated' tensors (LayerNorm weights, biases) that
    every TP rank holds whole, and weights split along dim 0."""
    full = random_tensors(102, ["float32", "bfloat16"], count=10)
    replicated = [t.dim() == 1 for t in full]
    return full, replicated


def fsdp_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(24, 48), torch.nn.GELU(),
                               torch.nn.LayerNorm(48), torch.nn.Linear(48, 40),
                               torch.nn.GELU(), torch.nn.Linear(40, 7))


def scenario_ddp(rank, ws):
    params = params_with_grads(ddp_data())
    total = bt.clip_grad_norm_(params, MAX_NORM, process_group=dist.group.WORLD,
                               owned=(rank == 0))
    return {"total": total, "grads": [p.grad for p in params]}


def scenario_sharded(rank, ws):
    _, pieces = shard_pieces()
    mine = params_with_grads(pieces[rank::ws])
    total = bt.clip_grad_norm_(mine, MAX_NORM, process_group=dist.group.WORLD)
    return {"total": total, "grads": [p.grad for p in mine]}


def scenario_tp(rank, ws):
    full, replicated = tp_data()
    params = []
    for t, rep in zip(full, replicated):
        g = t.clone() if rep else torch.tensor_split(t, ws, dim=0)[rank].clone()
        p = torch.nn.Parameter(torch.zeros_like(g))
        p.grad = g
        p.replicated = rep
        params.append(p)
    total = bt.clip_grad_norm_(params, MAX_NORM, process_group=dist.group.WORLD,
                               owned=lambda p: not p.replicated or rank == 0)
    return {"total": total, "grads": [p.grad for p in params]}


def _fsdp(rank, ws, hsdp):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    if hsdp:
        mesh = init_device_mesh("cpu", (2, ws // 2), mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh("cpu", (ws,))
    model = fsdp_model()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    torch.manual_seed(1)
    x = torch.randn(16, 24)
    model(x).pow(2).sum().backward()
    params = list(model.parameters())
    full = [p.grad.full_tensor() for p in params]  # the unsharded gradients
    placements = [tuple(str(pl) for pl in p.grad.placements) for p in params]
    total = bt.clip_grad_norm_(params, MAX_NORM)  # DTensors: automatic
    clipped_full = [p.grad.full_tensor() for p in params]
    return {"total": total.full_tensor(), "full": full, "clipped_full": clipped_full,
            "placements": placements, "result": _describe(total)}


def _describe(t):
    """What a returned norm is (DTensors do not travel through torch.save
    to the test's process): its type, placements, mesh, local bits."""
    out = {"type": type(t).__name__}
    if hasattr(t, "device_mesh"):
        out.update(placements=tuple(str(pl) for pl in t.placements),
                   mesh=t.device_mesh.mesh.tolist(), local=t.to_local().clone(),
                   full=t.full_tensor(), same_mesh=None)
    return out


def scenario_fsdp2_result(rank, ws):
    """torch's return types on FSDP2 gradients: get_total_norm and
    clip_grad_norm_ give a Replicate DTensor on the gradients' mesh,
    .full_tensor() works, clip_grads_with_norm_ takes it."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh("cpu", (ws,))
    model = fsdp_model()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    torch.manual_seed(2)
    model(torch.randn(16, 24)).pow(2).sum().backward()
    params = list(model.parameters())
    grads = [p.grad for p in params]
    saved = [g.to_local().clone() for g in grads]
    out = {"full": [g.full_tensor() for g in grads]}
    norm = bt.get_total_norm(grads)
    out["norm"] = _describe(norm)
    out["norm"]["same_mesh"] = norm.device_mesh == grads[0].device_mesh
    out["norm_inf"] = _describe(bt.get_total_norm(grads, float("inf")))
    out["torch_norm"] = _describe(torch.nn.utils.get_total_norm(grads))
    bt.clip_grads_with_norm_(params, MAX_NORM, norm)  # a DTensor total_norm
    out["two_step"] = [p.grad.full_tensor() for p in params]
    for g, s in zip(grads, saved):
        g.to_local().copy_(s)
    total = bt.clip_grad_norm_(params, MAX_NORM)
    out["clip"] = _describe(total)
    out["clipped"] = [p.grad.full_tensor() for p in params]
    out["clipped_local"] = [p.grad.to_local().clone() for p in params]
    return out


def scenario_fsdp2(rank, ws):
    return _fsdp(rank, ws, hsdp=False)


def scenario_hsdp(rank, ws):
    return _fsdp(rank, ws, hsdp=True) if ws >= 4 else None


MIDPOINT = [1.0, 2.0 ** -12, 2.0 ** -12, 2.0 ** -24, 2.0 ** -40]  # see test_no_double_rounding


def scenario_midpoint(rank, ws):
    """The fp64 norm is an fp32 midpoint: resolving it takes the exact sum
    of every rank (the library rounds it into fp32 itself, in the norm's
    one collective)."""
    mine = [torch.tensor(MIDPOINT[rank::ws], dtype=torch.float32)]
    return {"total": bt.get_total_norm(mine, process_group=dist.group.WORLD)}


def scenario_nonfinite(rank, ws):
    _, pieces = shard_pieces()
    mine = params_with_grads(pieces[rank::ws])
    if rank == ws - 1:
        mine[1].grad.view(-1)[3] = float("nan")
    before = [p.grad.clone() for p in mine]
    try:
        bt.clip_grad_norm_(mine, MAX_NORM, error_if_nonfinite=True,
                           process_group=dist.group.WORLD)
        err, where = None, None
    except bitexact.NonFiniteError as e:
        err, where = str(e), (e.rank, e.group, e.tensor)
    unchanged = all(torch.equal(p.grad.view(torch.int8), b.view(torch.int8))
                    for p, b in zip(mine, before))
    return {"error": err, "where": where, "unchanged": unchanged}


def scenario_local_failure(rank, ws):
    """The last rank passes an int32 gradient (its parameters[2]): it fails
    its local checks, every rank fails with its location."""
    params = params_with_grads(random_tensors(103, ["float32"], count=4))
    if rank == ws - 1:
        params[2] = types.SimpleNamespace(grad=torch.ones(3, dtype=torch.int32))
    try:
        bt.clip_grad_norm_(params, MAX_NORM, process_group=dist.group.WORLD)
        return {"error": None}
    except bitexact.Error as e:
        return {"error": str(e), "type": type(e).__name__, "where": (e.rank, e.group, e.tensor)}


def scenario_dtype_mismatch(rank, ws):
    """fp32 gradients on rank 0, bf16 elsewhere: each rank alone would
    promote to another dtype; the library promotes over all ranks (fp32 on
    every rank). Asking for different norm_dtypes is refused on every rank."""
    dt = torch.float32 if rank == 0 else torch.bfloat16
    out = {"total": bt.get_total_norm([torch.ones(3, dtype=dt)], process_group=dist.group.WORLD)}
    try:
        bt.get_total_norm([torch.ones(3, dtype=dt)], process_group=dist.group.WORLD,
                          norm_dtype=dt)
        out["error"] = None
    except bitexact.MismatchError as e:
        out["error"] = str(e)
    return out


def scenario_mismatch(rank, ws):
    try:
        bt.get_total_norm([torch.ones(3)], norm_type=2.0 if rank else 1.0,
                          process_group=dist.group.WORLD)
        return {"error": None}
    except bitexact.MismatchError as e:
        return {"error": str(e)}


SCENARIOS = ["ddp", "sharded", "tp", "fsdp2", "hsdp", "fsdp2_result", "midpoint", "nonfinite",
             "mismatch", "local_failure", "dtype_mismatch"]


def main(rank, ws, outdir):
    os.environ.setdefault("BX_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{outdir}/store", rank=rank,
                            world_size=ws)
    results = {}
    for name in SCENARIOS:
        try:
            results[name] = globals()["scenario_" + name](rank, ws)
        except Exception:  # noqa: BLE001 - the test reports it
            results[name] = {"exception": traceback.format_exc()}
        dist.barrier()
    torch.save(results, os.path.join(outdir, f"rank{rank}.pt"))
    dist.destroy_process_group()
