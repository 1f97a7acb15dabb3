"""Worker for test_torchtitan.py: torchtitan 0.3.0's own Trainer (its
__init__: ParallelDims meshes, parallelize_llama / parallelize_qwen3,
pipeline_llm, optimizers) and Trainer.train_step, on CPU with gloo, one
training step per layout, with the clip patched by bitexact.torchtitan.

What is adapted for CPU/gloo, and nothing else:
- torchtitan.tools.utils.device_type is "cpu" and device_module a small
  shim over torch.cpu (torchtitan picks "cuda" when no accelerator is
  found; its memory monitor asks the device module for peak statistics);
- attention is torch's SDPA (causal) instead of FlexAttention;
- FSDP reduces gradients with a plain sum (set_force_sum_reduction_for_comms:
  gloo has no PREMUL_SUM);
- the tokenizer and data loader are a fixed random token stream (the
  global batch is the same for every layout; each data-parallel rank reads
  its rows), built through torchtitan's Configurable configs.

Per layout the recorder around the patched clip saves, on every rank: the
full gradients before and after the clip (DTensors gathered with
full_tensor(), keyed by parameter name; each pipeline stage its own), the
norm the patched function returned, the norm torchtitan's own function
computes on the same gradients (max_norm = inf: it scales by 1), and the
norm bitexact.torch.clip_grad_norm_ gives without process_group (the
per-stage norm of the issue, or its error).
"""
import math
import os
import sys
import traceback
import types
from dataclasses import dataclass

import torch
import torch.distributed as dist

LAYOUTS = {
    # name: (dp_replicate, dp_shard, tp, pp, ep, model). No two with the same
    # degrees: a second Trainer of the same degrees in one process fails in
    # fully_shard ("Expected param's DTensor mesh to be the same mesh passed
    # to fully_shard"), a torchtitan/torch cache across Trainers.
    "fsdp_tp": (1, 2, 2, 1, 1, "llama3"),
    "hsdp": (2, 2, 1, 1, 1, "llama3"),
    "pp_fsdp": (1, 2, 1, 2, 1, "llama3"),
    "pp_tp": (1, 1, 2, 2, 1, "llama3"),
    "moe_ep": (1, 4, 1, 1, 2, "qwen3_moe"),
    "lora_ddp_tp": (2, 1, 2, 1, 1, "llama3_lora"),
}

VOCAB = 256
SEQ = 16
LOCAL_BATCH = 2
MAX_NORM = 0.25  # well below the norm: the clip scales
SEED = 0  # torchtitan's init seed: the same weights on every run


# ---- CPU adaptation (before any other torchtitan module is imported) -----

class _CpuDeviceModule(types.ModuleType):
    """torch.cpu plus the calls torchtitan's device-memory monitor makes."""

    def __getattr__(self, name):
        return getattr(torch.cpu, name)

    @staticmethod
    def get_device_name(device=None):
        return "cpu"

    @staticmethod
    def get_device_properties(device=None):
        return types.SimpleNamespace(total_memory=1 << 34)

    @staticmethod
    def memory_stats(device=None):
        return {}

    @staticmethod
    def reset_peak_memory_stats(device=None):
        pass

    @staticmethod
    def empty_cache():
        pass

    @staticmethod
    def set_device(device):
        pass

    @staticmethod
    def device_count():
        return 1


class _GlooDist(types.ModuleType):
    """torch.distributed with an all_to_all that gloo can run: gloo's list
    all_to_all needs equal chunks, the MoE token exchange sends uneven ones;
    all_to_all_single with split sizes moves the same rows (data movement
    only: no arithmetic)."""

    def __getattr__(self, name):
        return getattr(dist, name)

    @staticmethod
    def all_to_all(output_tensor_list, input_tensor_list, group=None, async_op=False):
        assert not async_op
        row = math.prod(input_tensor_list[0].shape[1:])  # elements per row
        inp = torch.cat([t.reshape(t.shape[0], row) for t in input_tensor_list])
        out = torch.empty((sum(t.shape[0] for t in output_tensor_list), row), dtype=inp.dtype)
        dist.all_to_all_single(out, inp, [t.shape[0] for t in output_tensor_list],
                               [t.shape[0] for t in input_tensor_list], group=group)
        for t, o in zip(output_tensor_list, out.split([t.shape[0] for t in output_tensor_list])):
            t.copy_(o.reshape(t.shape))


def _cpu_torchtitan():
    import spmd_types._dist
    import torchtitan.tools.utils as tu
    tu.device_type = "cpu"
    tu.device_module = _CpuDeviceModule("torchtitan_cpu_device")
    spmd_types._dist.dist = _GlooDist("torch_distributed_gloo")


# ---- tokenizer and data ----------------------------------------------------

def _global_tokens(step):
    g = torch.Generator().manual_seed(1234 + step)
    return torch.randint(0, VOCAB, (64, SEQ + 1), generator=g)


def _make_components():
    from torchtitan.components.dataloader import BaseDataLoader
    from torchtitan.components.tokenizer import BaseTokenizer

    class FixedTokenizer(BaseTokenizer):
        @dataclass(kw_only=True, slots=True)
        class Config(BaseTokenizer.Config):
            pass

        def __init__(self, config, tokenizer_path=None):
            super().__init__()
            self.eos_id = 0

        def encode(self, *a, **k):
            raise NotImplementedError

        def decode(self, *a, **k):
            raise NotImplementedError

        def get_vocab_size(self):
            return VOCAB

    class FixedLoader(BaseDataLoader):
        @dataclass(kw_only=True, slots=True)
        class Config(BaseDataLoader.Config):
            pass

        def __init__(self, config, *, dp_world_size, dp_rank, tokenizer, seq_len,
                     local_batch_size, snapshot_every_n_steps=None):
            self.rank, self.world, self.lb = dp_rank, dp_world_size, local_batch_size

        def __iter__(self):
            step = 0
            while True:
                toks = _global_tokens(step)
                rows = toks[self.rank * self.lb:(self.rank + 1) * self.lb]
                yield {"input": rows[:, :-1].contiguous()}, rows[:, 1:].contiguous()
                step += 1

        def state_dict(self):
            return {}

        def load_state_dict(self, sd):
            pass

    return FixedTokenizer, FixedLoader


# ---- models ----------------------------------------------------------------

def _sdpa(cfg):
    """Swap every FlexAttention config in the model config for SDPA."""
    from torchtitan.models.common.attention import FlexAttention, ScaledDotProductAttention
    for layer in cfg.layers:
        attn = layer.attention
        if isinstance(attn.inner_attention, FlexAttention.Config):
            attn.inner_attention = ScaledDotProductAttention.Config()
    return cfg


def _llama3_spec():
    from torchtitan.models import llama3 as L
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    spec = L.model_registry("debugmodel")
    dim = 32
    spec.model = _sdpa(L.Llama3Model.Config(
        dim=dim, vocab_size=VOCAB,
        tok_embeddings=Embedding.Config(num_embeddings=VOCAB, embedding_dim=dim,
                                        param_init=L._EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=dim, param_init=L._NORM_INIT),
        lm_head=Linear.Config(in_features=dim, out_features=VOCAB,
                              param_init=L._output_linear_init(dim)),
        layers=L._build_llama3_layers(
            fuse_qkv=True, n_layers=4, dim=dim, n_heads=4, hidden_dim=64,
            rope=ComplexRoPE.Config(dim=dim // 4, max_seq_len=SEQ * 4, theta=10000,
                                    scaling="none"),
            attn_backend="flex")))
    return spec


def _qwen3_moe_spec():
    from torchtitan.models import qwen3 as Q
    from torchtitan.models.common import CosSinRoPE, Embedding, Linear
    spec = Q.model_registry("debugmodel_moe")
    dim, head_dim = 32, 8
    spec.model = _sdpa(Q.Qwen3Model.Config(
        vocab_size=VOCAB, dim=dim, norm=Q._qwen3_norm(dim),
        tok_embeddings=Embedding.Config(num_embeddings=VOCAB, embedding_dim=dim,
                                        param_init=Q._EMBEDDING_INIT),
        lm_head=Linear.Config(in_features=dim, out_features=VOCAB, param_init=Q._LINEAR_INIT),
        layers=Q._build_qwen3_moe_layers(
            fuse_qkv=True, n_layers=2, dim=dim, n_heads=4, n_kv_heads=2, head_dim=head_dim,
            moe_hidden_dim=16, num_experts=4, top_k=2, attn_backend="flex",
            rope=CosSinRoPE.Config(dim=head_dim, max_seq_len=SEQ * 4, theta=10000.0),
            moe_comm_backend="standard")))
    return spec


def _trainer_config(layout):
    from torchtitan.components.checkpoint import CheckpointManager
    from torchtitan.components.loss import CrossEntropyLoss
    from torchtitan.components.metrics import MetricsProcessor
    from torchtitan.components.optimizer import LRSchedulersContainer, default_adamw
    from torchtitan.config import DebugConfig, ParallelismConfig, TrainingConfig
    from torchtitan.trainer import Trainer
    dp_rep, dp_shard, tp, pp, ep, model = LAYOUTS[layout]
    spec = _qwen3_moe_spec() if model == "qwen3_moe" else _llama3_spec()
    if model == "llama3_lora":  # adapters on every Linear, the base weights frozen
        from torchtitan.components.lora import LoRAConverter
        spec.model = LoRAConverter.Config(rank=4, alpha=8.0).build().convert(spec.model)
    tok, loader = _make_components()
    return Trainer.Config(
        model_spec=spec,
        loss=CrossEntropyLoss.Config(global_vocab_size=VOCAB),
        tokenizer=tok.Config(),
        dataloader=loader.Config(),
        optimizer=default_adamw(lr=1e-3),
        lr_scheduler=LRSchedulersContainer.Config(warmup_steps=1),
        training=TrainingConfig(local_batch_size=LOCAL_BATCH, seq_len=SEQ, steps=1,
                                max_norm=MAX_NORM, disable_cuda_graphs=True,
                                mixed_precision_param="float32"),
        parallelism=ParallelismConfig(
            data_parallel_replicate_degree=dp_rep, data_parallel_shard_degree=dp_shard,
            tensor_parallel_degree=tp, pipeline_parallel_degree=pp,
            expert_parallel_degree=ep, pipeline_parallel_schedule="1F1B",
            pipeline_parallel_microbatch_size=1),
        checkpoint=CheckpointManager.Config(enable=False),
        metrics=MetricsProcessor.Config(log_freq=1),
        debug=DebugConfig(seed=SEED, enable_structured_logging=False),
        dump_folder=os.environ["TT_DUMP"],
    )


# ---- the recorder ----------------------------------------------------------

def _full_grads(model_parts):
    from torch.distributed.tensor import DTensor
    out = {}
    for m in model_parts:
        for name, p in m.named_parameters():
            if p.grad is None:
                continue
            g = p.grad
            out[name] = (g.full_tensor() if isinstance(g, DTensor) else g).detach().clone()
    return out


def _recorder(rec, trainer_ref, patched, original):
    import bitexact.torch as bt

    def clip(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None,
             pp_mesh=None, ep_enabled=False):
        parameters = list(parameters)
        model_parts = trainer_ref["trainer"].model_parts
        rec["before"] = _full_grads(model_parts)
        rec["args"] = {"max_norm": max_norm, "foreach": foreach, "pp_mesh": pp_mesh is not None,
                       "ep_enabled": ep_enabled}
        # torchtitan's own norm on the same gradients (inf max_norm: scale 1)
        rec["stock"] = original(parameters, float("inf"), norm_type, error_if_nonfinite,
                                foreach, pp_mesh, ep_enabled).clone()
        # bitexact.torch without process_group: the per-stage norm of the issue
        try:
            naive = bt.get_total_norm([p.grad for p in parameters if p.grad is not None])
            naive = naive.full_tensor() if hasattr(naive, "full_tensor") else naive
            rec["naive"] = naive.clone()
        except Exception as e:  # noqa: BLE001 (recorded for the test)
            rec["naive"] = f"{type(e).__name__}: {e}"
        total = patched(parameters, max_norm, norm_type, error_if_nonfinite, foreach,
                        pp_mesh, ep_enabled)
        rec["returned"] = total
        rec["returned_type"] = type(total).__name__
        rec["after"] = _full_grads(model_parts)
        return total

    return clip


def run_layout(layout, rank):
    import bitexact.torchtitan as btt
    import torchtitan.distributed.utils as dist_utils
    from torchtitan.trainer import Trainer
    original = dist_utils.clip_grad_norm_
    btt.patch()
    patched = dist_utils.clip_grad_norm_
    rec = {"patched_installed": patched is not original and btt.is_patched() == "exact"}
    ref = {}
    dist_utils.clip_grad_norm_ = _recorder(rec, ref, patched, original)
    logged = []
    try:
        config = _trainer_config(layout)
        trainer = Trainer(config)
        ref["trainer"] = trainer
        from torch.distributed.fsdp import FSDPModule
        for m in trainer.model_parts:
            for mod in m.modules():
                if isinstance(mod, FSDPModule):
                    mod.set_force_sum_reduction_for_comms(True)
        if LAYOUTS[layout][5] == "llama3_lora":
            # LoRAConverter builds the base weights with requires_grad False,
            # yet after Trainer.__init__ here they require grad again
            # (recorded in frozen_by_torchtitan): freeze them, as LoRA means
            params = [(n, p) for m in trainer.model_parts for n, p in m.named_parameters()]
            rec["frozen_by_torchtitan"] = sum(1 for _, p in params if not p.requires_grad)
            for n, p in params:
                if "lora_" not in n:
                    p.requires_grad_(False)
        mp = trainer.metrics_processor
        orig_log = mp.log

        def log(step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=None):
            logged.append(grad_norm)
        mp.log = log
        trainer.step = 1
        trainer.train_step(trainer.batch_generator(trainer.dataloader))
        mp.log = orig_log
        rec["logged"] = logged
        pd = trainer.parallel_dims
        rec["pp_rank"] = pd.get_mesh("pp").get_local_rank() if pd.pp_enabled else 0
        params = [p for m in trainer.model_parts for p in m.parameters()]
        rec["frozen"] = sum(1 for p in params if not p.requires_grad)
        rec["meshes"] = sorted({tuple(p.grad.device_mesh.mesh_dim_names) for p in params
                                if p.grad is not None and hasattr(p.grad, "device_mesh")})
        rec["placements"] = sorted({str(p.grad.placements) for p in params
                                    if p.grad is not None and hasattr(p.grad, "placements")})
        if pd.pp_enabled:  # the pipeline without pp_mesh: refused on every rank
            try:
                btt.clip_grad_norm_(params, float("inf"))
                rec["no_pp_mesh"] = None
            except Exception as e:  # noqa: BLE001 (recorded for the test)
                rec["no_pp_mesh"] = f"{type(e).__name__}: {e}"
    finally:
        dist_utils.clip_grad_norm_ = patched
        btt.unpatch()
    rec["unpatched"] = dist_utils.clip_grad_norm_ is original and btt.is_patched() is None
    return rec


def stage_tensor(stage):
    """The full gradient stage `stage` of the direct-call scenario holds."""
    return torch.randn(6, 5, generator=torch.Generator().manual_seed(77 + stage))


def run_direct(rank):
    """bitexact.torchtitan.clip_grad_norm_ called directly on a 2x2 mesh:
    'pp' x 'tp', a gradient sharded over 'tp', a different one per stage."""
    import bitexact.torchtitan as btt
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "tp"))
    pp, tp = mesh["pp"], mesh["tp"]
    stage = pp.get_local_rank()
    p = torch.nn.Parameter(distribute_tensor(torch.zeros(6, 5), tp, [Shard(0)]))
    p.grad = distribute_tensor(stage_tensor(stage), tp, [Shard(0)])
    rec = {}

    def attempt(key, *args, **kw):
        try:
            out = btt.clip_grad_norm_(*args, **kw)
            rec[key] = (out.clone(), p.grad.full_tensor())
        except Exception as e:  # noqa: BLE001 (recorded for the test)
            rec[key] = f"{type(e).__name__}: {e}"

    attempt("no_pp_mesh", [p], 1.0)  # a mesh of 2 of 4 ranks: refused
    attempt("pp_mesh_wrong", [p], 1.0, pp_mesh=tp)  # the 'pp' given is the mesh itself
    q = torch.nn.Parameter(torch.zeros(3))
    q.grad = torch.ones(3)
    attempt("plain", [q], 1.0, pp_mesh=pp)  # plain grads, a stage of 2 ranks: refused
    attempt("ok", [p], 0.5, pp_mesh=pp)  # both stages, clipped
    # one element a stage, 1 and 91/4096: torchtitan's fp32 arithmetic
    # (1 + 8281 * 2^-24 is a tie, rounded to even, then sqrt) gives
    # 1.0002466440200806; the exact norm rounds to 1.0002467632293701
    import torchtitan.distributed.utils as tu
    r = torch.nn.Parameter(distribute_tensor(torch.zeros(2), tp, [Shard(0)]))
    r.grad = distribute_tensor(torch.tensor([1.0 if stage == 0 else 91 / 4096, 0.0]), tp,
                               [Shard(0)])
    rec["tie_stock"] = tu.clip_grad_norm_([r], float("inf"), pp_mesh=pp)
    rec["tie_exact"] = btt.clip_grad_norm_([r], float("inf"), pp_mesh=pp)
    return rec


def main(rank, ws, outdir, layouts):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(ws),
                      LOCAL_WORLD_SIZE=str(ws), OMP_NUM_THREADS="1", TT_DUMP=outdir)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{outdir}/store", rank=rank,
                            world_size=ws)
    _cpu_torchtitan()
    res = {}
    for layout in layouts:
        try:
            res[layout] = run_direct(rank) if layout == "direct" else run_layout(layout, rank)
        except Exception:
            res[layout] = {"exception": traceback.format_exc()}
        dist.barrier()
    torch.save(res, os.path.join(outdir, f"rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":  # manual run: python torchtitan_worker.py LAYOUT...
    import tempfile
    import torch.multiprocessing as mproc
    with tempfile.TemporaryDirectory() as d:
        mproc.spawn(main, args=(4, d, sys.argv[1:]), nprocs=4, join=True)
        for r in range(4):
            res = torch.load(os.path.join(d, f"rank{r}.pt"), weights_only=False)
            for k, v in res.items():
                if "exception" in v:
                    print(r, k, v["exception"])
                else:
                    print(r, k, {a: v.get(a) for a in ("returned", "stock", "naive", "logged")}
                          if k != "direct" else v)
