"""DeepSpeed 0.19.8 on CPU/gloo for test_deepspeed.py: one process per rank.

main(rank, ws, port, outdir): DS_ACCELERATOR=cpu (DeepSpeed's CPU
accelerator; without oneCCL it communicates over gloo), torch.distributed
initialised here, then every case of CASES runs twice with a real
``deepspeed.initialize`` engine: DeepSpeed's own norm ("stock") and
``bitexact.deepspeed.patch()`` ("exact"). Each run is one forward, backward
and ``engine.step()`` of a small MLP on this rank's batch, and records what
the test needs to rebuild the step in one process:

- ``grads``: this rank's reduced gradients as the optimizer holds them
  right before clipping (ZeRO-1/2: the flat fp32 partition of each
  parameter group; ZeRO-3: each sub-group's fp32 partition; BF16_Optimizer:
  its fp32 gradient partitions), ``norm_grads``: the gradients DeepSpeed
  takes the norm of on this rank (BF16_Optimizer: every parameter's whole
  fp32 gradient; ZeRO: the same partitions as ``grads``);
- ``before`` / ``after``: the fp32 master partitions around the step;
- ``norm``: the norm handed to the clipping (as DeepSpeed computed it: a
  tensor of its dtype), ``global_norm``: ``engine.get_global_grad_norm()``,
  ``loss_scale``, ``optimizer``: the class DeepSpeed chose.

Results go to <outdir>/rank<r>.pt; an exception is saved as its traceback.
"""
import os
import sys
import traceback

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("DS_BUILD_OPS", "0")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

# (name, ZeRO stage, bf16, fp32 gradient accumulation (BF16_Optimizer),
#  parallelism besides data parallel: None; "tp": every rank one tensor-
#  parallel rank (DP = 1) through TPMpu; "moe": a DeepSpeed MoE layer with
#  one expert per rank (expert parallel over both ranks))
CASES = [
    ("zero1_fp32", 1, False, False, None),
    ("zero2_fp32", 2, False, False, None),
    ("zero3_fp32", 3, False, False, None),
    ("zero1_bf16", 1, True, False, None),
    ("zero2_bf16", 2, True, False, None),
    ("zero3_bf16", 3, True, False, None),
    ("bf16_optimizer", 1, True, True, None),
    ("tp_zero2_bf16", 2, True, False, "tp"),
    ("tp_zero3_fp32", 3, False, False, "tp"),
    ("tp_bf16_optimizer", 1, True, True, "tp"),
    ("moe_zero2_fp32", 2, False, False, "moe"),
    ("moe_bf16_optimizer", 1, True, True, "moe"),
]
CLIP = 1e-3  # far below the norm: every step clips
LR = 1e-3
BATCH = 6
DATA_SEED = int(os.environ.get("BX_DS_SEED", "200"))  # a batch where stock norms are off


def make_model(tp_rank=None):
    """A small MLP (22,068 parameters, not a multiple of the world size).
    With tp_rank: the two middle Linear layers stand for tensor-parallel
    shards (marked ``tensor_model_parallel``, initialised differently on
    each rank); the others are replicated (DeepSpeed counts them on
    model-parallel rank 0 only)."""
    torch.manual_seed(1234)
    model = torch.nn.Sequential(
        torch.nn.Linear(40, 120), torch.nn.Tanh(),
        torch.nn.Linear(120, 100), torch.nn.LayerNorm(100),
        torch.nn.Linear(100, 48))
    if tp_rank is not None:
        g = torch.Generator().manual_seed(77 + tp_rank)
        for layer in (model[0], model[2]):
            for p in layer.parameters():
                with torch.no_grad():
                    p.copy_(torch.randn(p.shape, generator=g) * 0.1)
                p.tensor_model_parallel = True
    return model


class MoEModel(torch.nn.Module):
    """Dense input and output layers around a DeepSpeed MoE layer of
    ``ws`` experts, one per rank (top-1, no dropped tokens, no random
    token selection: deterministic)."""

    def __init__(self, ws):
        from deepspeed.moe.layer import MoE
        super().__init__()
        torch.manual_seed(1234)
        self.inp = torch.nn.Linear(40, 64)
        expert = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(),
                                     torch.nn.Linear(64, 64))
        self.moe = MoE(hidden_size=64, expert=expert, num_experts=ws, ep_size=ws, k=1,
                       min_capacity=BATCH, drop_tokens=False, use_rts=False)
        self.out = torch.nn.Linear(64, 48)

    def forward(self, x):
        h, _, _ = self.moe(torch.tanh(self.inp(x)))
        return self.out(h)


class TPMpu:
    """A Megatron-style mpu for DeepSpeed: tensor parallel over every rank,
    data parallel size 1 (each rank its own data-parallel group)."""

    def __init__(self, rank, ws):
        self.rank, self.ws = rank, ws
        self.selves = [dist.new_group([r]) for r in range(ws)]

    def get_model_parallel_group(self):
        return dist.group.WORLD

    def get_model_parallel_rank(self):
        return self.rank

    def get_model_parallel_world_size(self):
        return self.ws

    get_tensor_model_parallel_group = get_model_parallel_group
    get_tensor_model_parallel_rank = get_model_parallel_rank
    get_tensor_model_parallel_world_size = get_model_parallel_world_size

    def get_data_parallel_group(self):
        return self.selves[self.rank]

    def get_data_parallel_rank(self):
        return 0

    def get_data_parallel_world_size(self):
        return 1

    def get_pipeline_model_parallel_world_size(self):
        return 1


def batch(rank, bf16):
    g = torch.Generator().manual_seed(DATA_SEED + rank)
    x = torch.randn(BATCH, 40, generator=g)
    y = torch.randn(BATCH, 48, generator=g)
    dt = torch.bfloat16 if bf16 else torch.float32
    return x.to(dt), y.to(dt)


def make_optimizer(params):
    return torch.optim.AdamW(params, lr=LR, foreach=False)


def ds_config(stage, bf16, fp32_accum):
    cfg = {"train_micro_batch_size_per_gpu": BATCH, "gradient_accumulation_steps": 1,
           "gradient_clipping": CLIP, "zero_optimization": {"stage": stage},
           "steps_per_print": 10 ** 9, "wall_clock_breakdown": False}
    if bf16:
        cfg["bf16"] = {"enabled": True}
    if fp32_accum:
        cfg["data_types"] = {"grad_accum_dtype": "fp32"}
    return cfg


def masters(opt):
    """The fp32 master partitions this rank steps, one per group."""
    name = type(opt).__name__
    if name == "DeepSpeedZeroOptimizer":
        return [t.detach().clone() for t in opt.single_partition_of_fp32_groups]
    if name == "DeepSpeedZeroOptimizer_Stage3":
        return [t.detach().clone() for t in opt.fp32_partitioned_groups_flat]
    if name == "BF16_Optimizer":
        return [t.detach().clone() for t in opt.fp32_groups_flat_partition]
    raise RuntimeError(f"unexpected optimizer {name}")


def capture(opt, rec):
    """Instance-level wrappers recording the gradients right before clipping."""
    name = type(opt).__name__
    rec["grads"], rec["norms"] = [], []
    if name == "DeepSpeedZeroOptimizer":
        orig = opt.unscale_and_clip_grads

        def unscale_and_clip_grads(grad_groups_flat, total_norm):
            rec["grads"].extend(g.detach().clone() for g in grad_groups_flat)
            rec["norms"].append(total_norm.detach().clone())
            return orig(grad_groups_flat, total_norm)
        opt.unscale_and_clip_grads = unscale_and_clip_grads
    elif name == "DeepSpeedZeroOptimizer_Stage3":
        orig = opt.unscale_and_clip_grads

        def unscale_and_clip_grads(sub_group_id, total_norm):
            flat = opt.fp32_partitioned_groups_flat[sub_group_id]
            rec["grads"].append(flat.grad.detach().clone())
            rec["norms"].append(total_norm.detach().clone())
            return orig(sub_group_id, total_norm)
        opt.unscale_and_clip_grads = unscale_and_clip_grads
    else:  # BF16_Optimizer: clips inside step(); its gradients are complete after backward
        rec["grads"] = [t.detach().clone() for t in opt.fp32_groups_gradient_flat_partition]
        rec.setdefault("norm_grads", [t.detach().clone() for t in opt.get_grads_for_norm()[0]])
        import deepspeed.runtime.bf16_optimizer as B
        orig = B.clip_tensors_by_global_norm

        def clip_tensors_by_global_norm(input_tensors, max_norm=1.0, global_norm=None, mpu=None,
                                        eps=1e-6):
            if torch.is_tensor(global_norm):
                rec["norms"].append(global_norm.detach().clone())
            else:  # with MoE: a Python float
                rec["norm_python"] = True
                rec["norms"].append(torch.tensor(global_norm, dtype=torch.float64))
            return orig(input_tensors, max_norm, global_norm, mpu, eps)
        B.clip_tensors_by_global_norm = clip_tensors_by_global_norm
        rec["_restore"] = (B, orig)


def run_case(name, stage, bf16, fp32_accum, par, exact, rank, ws, mpu):
    import deepspeed
    from deepspeed.moe.utils import (is_moe_param,
                                     split_params_into_different_moe_groups_for_optimizer)
    from deepspeed.utils import safe_get_full_grad
    import bitexact.deepspeed as bd
    if par == "moe":
        model = MoEModel(ws)
        params = split_params_into_different_moe_groups_for_optimizer(
            {"params": list(model.parameters()), "name": "params"})
    else:
        model = make_model(rank if par == "tp" else None)
        params = model.parameters()
    if bf16:
        model = model.to(torch.bfloat16)
    engine, opt, _, _ = deepspeed.initialize(
        model=model, optimizer=make_optimizer(params),
        config=ds_config(stage, bf16, fp32_accum), mpu=mpu if par == "tp" else None,
        dist_init_required=False)
    x, y = batch(0 if par == "tp" else rank, bf16)  # TP: the same batch on every TP rank
    loss = torch.nn.functional.mse_loss(engine(x).float(), y.float())
    engine.backward(loss)
    opt = engine.optimizer
    rec = {"optimizer": type(opt).__name__, "norm_python": False}
    if par is not None:
        # what DeepSpeed counts: TP shards and experts on every rank, the
        # rest (replicated) once
        def counted(p):
            return rank == 0 or getattr(p, "tensor_model_parallel", False) or is_moe_param(p)
        full = [(p, safe_get_full_grad(p)) for p in engine.module.parameters()]
        rec["norm_grads"] = [g.detach().float().clone() for p, g in full if counted(p)]
    capture(opt, rec)
    rec["before"] = masters(opt)
    rec["loss_scale"] = float(getattr(opt, "loss_scale", 1.0) or 1.0)
    calls = []  # bitexact.deepspeed's reductions during the step
    exact_fn = bd._exact

    def counted_exact(*args, **kwargs):
        calls.append(1)
        return exact_fn(*args, **kwargs)
    bd._exact = counted_exact
    try:
        if exact:
            with bd.patch():
                engine.step()
        else:
            engine.step()
    finally:
        bd._exact = exact_fn
        rec["exact_calls"] = len(calls)
        restore = rec.pop("_restore", None)
        if restore is not None:
            setattr(restore[0], "clip_tensors_by_global_norm", restore[1])
    rec["after"] = masters(opt)
    rec.setdefault("norm_grads", rec["grads"])
    rec["norm"] = rec["norms"][0] if rec["norms"] else None
    rec["norm_all_same"] = all(bool((n == rec["norms"][0]).all()) for n in rec["norms"])
    g = engine.get_global_grad_norm()
    rec["global_norm"] = float(g) if g is not None else None
    engine.destroy()
    from deepspeed.utils import groups
    groups.mpu = None  # DeepSpeed keeps an engine's mpu process-wide; the next case has none
    return rec


def scenario_errors(rank, ws, mpu):
    """A bad gradient on the last rank only, summed over the model-parallel
    group: every rank raises (no hang), the last one naming its tensor."""
    import bitexact.deepspeed as bd
    grads = [torch.ones(5), torch.ones(3)]
    if rank == ws - 1:
        grads[1] = torch.ones(3, dtype=torch.int32)
    try:
        bd.tensors_norm(grads, 2, mpu)
    except Exception as e:  # noqa: BLE001 (recorded for the test)
        return {"type": type(e).__name__, "msg": str(e), "rank": getattr(e, "rank", None)}
    return {"type": None}


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(rank, ws, port, outdir):
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(ws), "LOCAL_RANK": str(rank),
                       "LOCAL_WORLD_SIZE": str(ws), "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"})
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=ws)
    import logging
    import deepspeed
    import deepspeed.ops
    deepspeed.utils.logger.setLevel(logging.ERROR)
    # No DeepSpeed C++ op is compiled here: the CPU comm backend would JIT-build
    # its shared-memory all_reduce (inference_all_reduce only; training
    # collectives are torch.distributed's) on first use; an empty table of
    # compatible ops skips that build and the compiler probes.
    deepspeed.ops.__compatible_ops__ = {}
    deepspeed.init_distributed(dist_backend="gloo", dist_init_required=False)
    res = {}
    only = os.environ.get("BX_DS_CASES")
    mpu = TPMpu(rank, ws)
    for name, stage, bf16, fp32_accum, par in CASES:
        if only and name not in only.split(","):
            continue
        for mode in ("stock", "exact"):
            try:
                res[(name, mode)] = run_case(name, stage, bf16, fp32_accum, par, mode == "exact",
                                             rank, ws, mpu)
            except Exception:  # noqa: BLE001 (recorded for the test)
                res[(name, mode)] = {"exception": traceback.format_exc()}
            dist.barrier()
    try:
        res["errors"] = scenario_errors(rank, ws, mpu)
    except Exception:  # noqa: BLE001
        res["errors"] = {"exception": traceback.format_exc()}
    torch.save(res, os.path.join(outdir, f"rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":  # by hand: python3 deepspeed_worker.py OUTDIR
    import torch.multiprocessing as mp
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    mp.spawn(main, args=(2, free_port(), sys.argv[1]), nprocs=2, join=True)
