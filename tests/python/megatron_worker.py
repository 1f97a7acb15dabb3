"""Megatron-core on CPU for test_megatron.py, and its multi-rank worker.

megatron-core 0.16.1's clip_grads runs on CPU except for where it names
the device: get_grad_norm_fp32 allocates its overflow buffer
(``torch.zeros(1, dtype=torch.int, device='cuda')``), the empty-list and
inf-norm results and the result of its pure-torch multi_tensor_l2norm
fallback (megatron.core.utils.local_multi_tensor_l2_norm:
``torch.tensor([...], device='cuda')``) on 'cuda';
clip_grad_by_total_norm_fp32 asserts ``param.grad.type() ==
'torch.cuda.FloatTensor'`` and allocates its overflow buffer on 'cuda';
FP32Optimizer.__init__ allocates its loss scale on 'cuda'. Without
Transformer Engine or Apex (absent here) it computes with that fallback
(local_multi_tensor_l2_norm: torch.norm per tensor, then the norm of those
norms; local_multi_tensor_scale: ``dst.copy_(src * scale)``).
:class:`CudaOnCpu` runs Megatron's own code with exactly those two things
redirected: a ``device='cuda'`` argument becomes 'cpu', and
``Tensor.type()`` of a CPU tensor answers its CUDA name. Everything else
(the arithmetic, the torch.distributed calls over gloo) is Megatron's.

main(rank, ws, dir): one gloo process; runs the scenarios and saves what it
saw to <dir>/rank<r>.pt (ws = 1 is the single-process reference).
"""
import os
import sys
import traceback
import warnings

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
warnings.filterwarnings("ignore", message="Transformer Engine and Apex are not installed")

import megatron.core.optimizer.clip_grads as CG  # noqa: E402
from megatron.core import parallel_state as PS  # noqa: E402
from megatron.core.optimizer import OptimizerConfig  # noqa: E402
from megatron.core.optimizer.optimizer import ChainedOptimizer, FP32Optimizer  # noqa: E402

import bitexact.megatron as bm  # noqa: E402
from helpers import random_tensors  # noqa: E402

# Megatron's own functions, taken before any patch()
MEG_NORM = CG.get_grad_norm_fp32
MEG_CLIP = CG.clip_grad_by_total_norm_fp32
MEG_CHAINED_NORM = ChainedOptimizer.get_grad_norm
CLIP = 0.05


class CudaOnCpu(TorchFunctionMode):
    """Megatron's 'cuda' allocations made on the CPU (see the module doc)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        dev = kwargs.get("device")
        if dev is not None and torch.device(dev).type == "cuda":
            kwargs = dict(kwargs, device="cpu")
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name = func(*args)
            return name if args[0].is_cuda else name.replace("torch.", "torch.cuda.", 1)
        return func(*args, **kwargs)


def meg_norm(grads, norm_type=2, group=None):
    with CudaOnCpu():
        return MEG_NORM(grads, norm_type, group)


def meg_clip(params, max_norm, total_norm, use_decoupled_grad=False):
    with CudaOnCpu():
        MEG_CLIP(params, max_norm, total_norm, use_decoupled_grad)


def meg_chained_norm(opt):
    with CudaOnCpu():
        return MEG_CHAINED_NORM(opt)


# ---- the model of the multi-rank scenarios -------------------------------

def dense_grads():
    """Dense gradients: 2-D weights (split along dim 0 under TP) and 1-D
    LayerNorm-like ones (every TP rank holds them whole)."""
    return random_tensors(300, ["float32"], count=8)


def expert_grads():
    """Expert gradients: 4 experts' weights (split over EP ranks)."""
    return random_tensors(301, ["float32"], count=4)


def make_params(grads, tp_parallel):
    """Parameters holding copies of grads; tp_parallel(g): whether Megatron
    marks it tensor_model_parallel (split, or an expert linear layer's
    weight: counted by every TP rank; else only by TP rank 0)."""
    ps = []
    for g in grads:
        p = torch.nn.Parameter(torch.zeros_like(g))
        p.grad = g.clone()
        if tp_parallel(g):
            p.tensor_model_parallel = True
        ps.append(p)
    return ps


def fp32_optimizer(params, group):
    """A real Megatron FP32Optimizer around torch.optim.Adam, set up as
    get_megatron_optimizer does (grad_stats_parallel_group, tp_group)."""
    cfg = OptimizerConfig(optimizer="adam", lr=1e-3, clip_grad=CLIP)
    with CudaOnCpu():
        opt = FP32Optimizer(torch.optim.Adam(params, lr=1e-3), cfg, lambda o: None)
    opt.grad_stats_parallel_group = group
    opt.tp_group = PS.get_tensor_model_parallel_group()
    return opt


def layout(rank, ws, kind):
    """This rank's dense and expert parameters for a layout:
    ep: TP=1, EP=ws (dense replicated on every rank, experts split);
    tp: TP=ws, expert TP=1, EP=1 (2-D dense weights split along dim 0,
        1-D ones replicated; every rank holds every expert)."""
    dense, experts = dense_grads(), expert_grads()
    if kind == "ep":
        PS.initialize_model_parallel(tensor_model_parallel_size=1, expert_model_parallel_size=ws)
        d = make_params(dense, lambda g: False)
        e = make_params(experts[rank::ws], lambda g: True)
    else:
        PS.initialize_model_parallel(tensor_model_parallel_size=ws,
                                     expert_tensor_parallel_size=1)
        mine = [torch.tensor_split(g, ws, dim=0)[rank].contiguous() if g.dim() >= 2 else g
                for g in dense]
        d = make_params(mine, lambda g: g.dim() >= 2)
        e = make_params(experts, lambda g: True)
    dense_opt = fp32_optimizer(d, PS.get_model_parallel_group())
    expert_opt = fp32_optimizer(e, PS.get_expert_tensor_model_pipeline_parallel_group())
    return d, e, ChainedOptimizer([dense_opt, expert_opt])


def scenario_chained(rank, ws, kind):
    d, e, chained = layout(rank, ws, kind)
    out = {"shared": chained.grads_states_parallel_group_is_shared(),
           "megatron": meg_chained_norm(chained)}
    with bm.patch():
        out["exact"] = chained.get_grad_norm()
    with bm.patch(flavor="megatron_fp32"):
        out["megatron_fp32"] = chained.get_grad_norm()
    with bm.patch():
        ok, norm, _ = chained.step()
    out["step"] = (ok, norm)
    out["grads"] = [p.grad.clone() for p in d + e]
    PS.destroy_model_parallel()
    return out


def scenario_shards(rank, ws):
    """Distributed-optimizer style: every element once over the world, each
    rank a different share (rank 0 more than rank 1)."""
    pieces = [p for t in dense_grads() + expert_grads() for p in t.flatten().split(700)]
    cut = (2 * len(pieces)) // 3 if ws == 2 else len(pieces)
    mine = pieces[:cut] if rank == 0 else pieces[cut:]
    out = {"n": len(mine)}
    for p in (2, 1, float("inf")):
        out[f"exact{p}"] = bm.get_grad_norm_fp32(mine, p, dist.group.WORLD)
    out["megatron_fp32"] = bm.get_grad_norm_fp32(mine, 2, None, flavor="megatron_fp32")
    out["megatron"] = meg_norm(mine, 2, dist.group.WORLD)
    out["megatron_inf"] = meg_norm(mine, float("inf"), dist.group.WORLD)
    # rank 1 holds nothing: still the same norm on both
    out["empty1"] = bm.get_grad_norm_fp32(pieces if rank == 0 else [], 2, dist.group.WORLD)
    return out


def scenario_dtensor(rank, ws):
    """Megatron FSDP style: DTensor gradients sharded over a 1-D mesh (the
    data-parallel group Megatron reduces over first), grad stats group =
    this rank alone (the model-parallel group at TP=PP=1)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    mesh = init_device_mesh("cpu", (ws,))
    selves = [dist.new_group([r]) for r in range(ws)]
    full = dense_grads()
    dts = [DTensor.from_local(torch.tensor_split(g, ws, dim=0)[rank].contiguous(), mesh,
                              [Shard(0)], run_check=False, shape=g.shape, stride=g.stride())
           for g in full]
    return {"exact": bm.get_grad_norm_fp32(dts, 2, selves[rank]),
            "exactinf": bm.get_grad_norm_fp32(dts, float("inf"), selves[rank]),
            "megatron": meg_norm(dts, 2, selves[rank]),
            "megatron_inf": meg_norm(dts, float("inf"), selves[rank])}


def scenario_errors(rank, ws):
    """Bad input on the last rank only: every rank raises (no hang), the
    last rank's message names its tensor."""
    grads = dense_grads()[:3]
    if rank == ws - 1:
        grads[1] = torch.ones(3, dtype=torch.int32)
    try:
        bm.get_grad_norm_fp32(grads, 2, dist.group.WORLD)
    except Exception as e:  # noqa: BLE001 (recorded for the test)
        return {"type": type(e).__name__, "msg": str(e), "rank": getattr(e, "rank", None)}
    return {"type": None}


def main(rank, ws, outdir):
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{outdir}/store", rank=rank,
                            world_size=ws)
    res = {}
    for name, fn in (("shards", lambda: scenario_shards(rank, ws)),
                     ("ep", lambda: scenario_chained(rank, ws, "ep")),
                     ("tp", lambda: scenario_chained(rank, ws, "tp")),
                     ("dtensor", lambda: scenario_dtensor(rank, ws)),
                     ("errors", lambda: scenario_errors(rank, ws))):
        try:
            res[name] = fn()
        except Exception:
            res[name] = {"exception": traceback.format_exc()}
            if PS.model_parallel_is_initialized():
                PS.destroy_model_parallel()
        dist.barrier()
    torch.save(res, os.path.join(outdir, f"rank{rank}.pt"))
    dist.destroy_process_group()
