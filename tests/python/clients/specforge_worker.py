"""Worker of test_specforge.py: one gloo process on the CPU running
SpecForge 0.2.0's own training code (EAGLE3 draft model with its frozen
embedding, OnlineEagle3Model, Eagle3TrainStrategy, TrainerCore,
FSDPTrainingBackend's FSDP1 wrapping with bf16 mixed precision, and
BF16Optimizer) with the gradient-norm step of BF16Optimizer replaced by
bitexact.torch, as a user would (the two patches below). Each rank saves
what the test needs to rebuild the run in one process: its local gradient
and parameter pieces, the norm and coefficient it got, the clipped fp32
master gradients AdamW saw, the masters after the step, SpecForge's stock
norm on the same gradients, and the direct checks of issue 24's defects.
Results go to <dir>/rank<r>.pt; the test asserts.

What a CPU user has to change in SpecForge (documented in the test):
FSDP1 on the CPU needs device_id=cpu (FSDPTrainingBackend passes none);
the Triton LogSoftmaxLoss kernel is GPU-only, so its own reference
implementation (specforge.core.loss._compute_loss) stands in; torch.compile
(SpecForge's target-probability helper) is switched off (dynamo disabled)
to keep the run short. None of these touches the gradients' reduction,
the norm or the optimizer."""
import contextlib
import datetime
import os
import sys
import traceback
import warnings

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import bitexact  # noqa: E402
import bitexact.torch as bt  # noqa: E402

CPU = torch.device("cpu")
MAX_GRAD_NORM = 0.02  # below the draft's gradient norm (~0.05): clipping is active
LR = 1e-3
WEIGHT_DECAY = 0.01
HIDDEN = 32
DRAFT_VOCAB = 256
# vocab 1024: the frozen embedding (32768 values) fills rank 0's half of the
# one root flat parameter, so rank 0 holds no gradient at all (issue 24,
# defect 1). vocab 256: both ranks hold trainable pieces.
VOCABS = {"rank0_empty": 1024, "split": 256}


# ---- the user's patches (docs/python.md shows bitexact_fsdp_norm) --------
def bitexact_norm_and_coef(self):
    """BF16Optimizer._grad_norm_and_clip_coefficient with bitexact's norm,
    SpecForge's fp32 path otherwise unchanged: the norm is rounded once to
    fp32 (SpecForge's norm dtype) from the exact sum over every rank's
    bf16 gradient shards, and the coefficient is SpecForge's own formula,
    applied by SpecForge's step to the fp32 master gradients."""
    grads = [p.grad for p in self.model_params if p.grad is not None]
    reduce = self._reduce_grad_norm_across_ranks and dist.is_initialized()
    total = bt.get_total_norm(grads, 2.0, norm_dtype=torch.float32,
                              process_group=self._grad_norm_process_group if reduce else None)
    clip_coef = torch.clamp(self.max_grad_norm / (total + 1e-6), max=1.0)
    return total, clip_coef


def bitexact_clip(self):
    """The same step with bitexact.torch.clip_grad_norm_ over the model's
    (FSDP) parameters, SpecForge's process group passed through as it is
    (None when the ParallelConfig has no fsdp_process_group: bitexact then
    refuses the FSDP1 shards by name, pointing to fsdp_norm_args). The bf16
    gradients are scaled in place (torch's arithmetic), so SpecForge's own
    multiply gets a coefficient of exactly 1."""
    reduce = self._reduce_grad_norm_across_ranks and dist.is_initialized()
    total = bt.clip_grad_norm_(self.model_params, self.max_grad_norm, 2.0,
                               norm_dtype=torch.float32,
                               process_group=self._grad_norm_process_group if reduce else None)
    return total, torch.ones((), dtype=torch.float32)


def use_fsdp_norm_args(opt, wrapped):
    """The fix bitexact's refusal of process_group=None names: the group
    and ownership of the FSDP1 model (wrapped: backend.module, the FSDP
    root; {} under DDP), kept on the optimizer for bitexact_fsdp_norm."""
    opt.bitexact_norm_args = bt.fsdp_norm_args(wrapped)


def bitexact_fsdp_norm(self):
    """bitexact_norm_and_coef with the FSDP model's own group and ownership
    (use_fsdp_norm_args) instead of SpecForge's process group: what
    docs/python.md shows."""
    grads = [p.grad for p in self.model_params if p.grad is not None]
    total = bt.get_total_norm(grads, 2.0, norm_dtype=torch.float32,
                              **getattr(self, "bitexact_norm_args", {}))
    clip_coef = torch.clamp(self.max_grad_norm / (total + 1e-6), max=1.0)
    return total, clip_coef


PATCHES = {"norm": bitexact_norm_and_coef, "clip": bitexact_clip,
           "fsdp_args": bitexact_fsdp_norm}


@contextlib.contextmanager
def patched(variant):
    """BF16Optimizer's norm step replaced by PATCHES[variant] (class-wide,
    as a user's monkeypatch), restored afterwards."""
    from specforge.optimizer import BF16Optimizer
    stock = BF16Optimizer._grad_norm_and_clip_coefficient
    BF16Optimizer._grad_norm_and_clip_coefficient = PATCHES[variant]
    try:
        yield stock
    finally:
        BF16Optimizer._grad_norm_and_clip_coefficient = stock


def make_optimizer(module):
    from specforge.optimizer import BF16Optimizer
    return BF16Optimizer(module, lr=LR, weight_decay=WEIGHT_DECAY, max_grad_norm=MAX_GRAD_NORM,
                         total_steps=10, warmup_ratio=0.0, lr_scheduler="constant")


def record_adamw_grads(opt, rec):
    """Keep the clipped fp32 master gradients AdamW steps with."""
    def pre_step(optimizer, args, kwargs):
        rec["master_grads"] = [None if m.grad is None else m.grad.detach().clone()
                               for m in opt.fp32_params]
    opt.optimizer.register_step_pre_hook(pre_step)


# ---- CPU stand-ins (see the module docstring) ----------------------------
@contextlib.contextmanager
def cpu_specforge():
    import torch.distributed.fsdp as fsdp_pkg
    import specforge.algorithms.eagle3.model as eagle3_model
    from specforge.core.loss import _compute_loss

    fsdp_cls = fsdp_pkg.FullyShardedDataParallel

    class CpuFSDP(fsdp_cls):
        def __init__(self, *args, **kwargs):
            kwargs.setdefault("device_id", CPU)
            super().__init__(*args, **kwargs)

    class ReferenceLoss:  # the Triton kernel's reference implementation
        apply = staticmethod(_compute_loss)

    loss_cls = eagle3_model.LogSoftmaxLoss
    fsdp_pkg.FullyShardedDataParallel = CpuFSDP
    eagle3_model.LogSoftmaxLoss = ReferenceLoss
    try:
        yield
    finally:
        fsdp_pkg.FullyShardedDataParallel = fsdp_cls
        eagle3_model.LogSoftmaxLoss = loss_cls


def build_eagle3(vocab):
    """SpecForge's EAGLE3 draft (LlamaForCausalLMEagle3 via AutoDraftModel, as
    build_eagle3_draft makes it: bf16, frozen embedding) inside
    OnlineEagle3Model; the same weights on every rank."""
    from transformers import LlamaConfig
    from specforge.algorithms.eagle3.model import OnlineEagle3Model
    from specforge.modeling.auto import AutoDraftModel

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      rms_norm_eps=1e-5, pad_token_id=0,
                      architectures=["LlamaForCausalLMEagle3"])
    cfg.draft_vocab_size = DRAFT_VOCAB
    torch.manual_seed(0)
    draft = AutoDraftModel.from_config(cfg, attention_backend="sdpa", torch_dtype=torch.bfloat16)
    with torch.no_grad():  # vocab mapping: the first DRAFT_VOCAB target tokens
        draft.t2d.zero_()
        draft.t2d[:DRAFT_VOCAB] = True
    draft.freeze_embedding()
    draft = draft.to(dtype=torch.bfloat16)
    return OnlineEagle3Model(draft_model=draft, length=2, attention_backend="sdpa").to(
        dtype=torch.bfloat16)


def batch(rank, vocab):
    from specforge.runtime.contracts import TrainBatch
    g = torch.Generator().manual_seed(100 + rank)
    b, s = 2, 16
    return TrainBatch(sample_ids=[f"r{rank}s0", f"r{rank}s1"], strategy="eagle3", tensors={
        "input_ids": torch.randint(0, vocab, (b, s), generator=g),
        "attention_mask": torch.ones(b, s, dtype=torch.long),
        "loss_mask": torch.ones(b, s, 1, dtype=torch.long),
        "hidden_state": torch.randn(b, s, 3 * HIDDEN, generator=g).bfloat16(),
        "target": (3 * torch.randn(b, s, vocab, generator=g)).bfloat16()}, metadata={})


def _try(fn):
    try:
        return {"value": fn()}
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}


def _clones(ts):
    return [None if t is None else t.detach().clone() for t in ts]


def scenario_specforge(rank, case):
    """One SpecForge training step (forward, backward, BF16Optimizer.step)
    under the patch case["patch"]; see module docstring."""
    from specforge.optimizer import BF16Optimizer
    from specforge.training.backend import FSDPTrainingBackend, ParallelConfig
    from specforge.training.controller import TrainerCore
    from specforge.training.strategies.base import Eagle3TrainStrategy

    vocab = VOCABS[case["layout"]]
    with cpu_specforge(), patched(case["patch"]) as stock_fn:
        model = build_eagle3(vocab)
        names = [n for n, p in model.draft_model.named_parameters() if p.requires_grad]
        shapes = [tuple(p.shape) for p in model.draft_model.parameters() if p.requires_grad]
        if case["group"] == "from_distributed":  # SpecForge's trainer: the WORLD group
            pc = ParallelConfig.from_distributed(sharding_strategy=case["strategy"])
        else:  # a ParallelConfig built by hand: fsdp_process_group None
            pc = ParallelConfig(world_size=dist.get_world_size(),
                                sharding_strategy=case["strategy"])
        backend = FSDPTrainingBackend(pc, optimizer_factory=make_optimizer)
        wrapped = backend.prepare_model(model, optimizer_target=model.draft_model)
        opt = backend.optimizer
        if case["patch"] == "fsdp_args":
            use_fsdp_norm_args(opt, wrapped)
        core = TrainerCore(Eagle3TrainStrategy(wrapped), backend)
        rec = {"names": names, "shapes": shapes, "wrapper": backend._wrapper_kind,
               "group_is_none": opt._grad_norm_process_group is None,
               "reduce": opt._reduce_grad_norm_across_ranks,
               "params_before": _clones(opt.model_params),
               "masters_before": _clones(opt.fp32_params)}
        record_adamw_grads(opt, rec)
        user_fn = opt._grad_norm_and_clip_coefficient

        def instrumented():
            params = opt.model_params
            grads = [p.grad for p in params]
            rec["grads"] = _clones(grads)
            present = [g for g in grads if g is not None]
            # SpecForge's stock norm on the same gradients (collective)
            stock_norm, stock_coef = stock_fn(opt)
            rec["stock"] = (stock_norm.clone(), stock_coef.clone())
            if case["direct"] and backend._wrapper_kind == "fsdp":
                world = dist.group.WORLD
                # defect 1: bf16 grads, a rank with none, torch's default dtype
                rec["d1_get_total_norm"] = _try(
                    lambda: bt.get_total_norm(present, process_group=world))
                rec["d1_clip_huge"] = _try(
                    lambda: bt.clip_grad_norm_(params, 1e30, process_group=world))
                rec["d3_str"] = _try(lambda: bt.get_total_norm(
                    present, process_group=world, norm_dtype="float32"))
                # defect 2: FSDP1 shards, no group: the FSDP group's norm, or a
                # refusal naming fsdp_norm_args; never the shard's norm
                rec["d2_clip_none"] = _try(lambda: bt.clip_grad_norm_(
                    params, 1e30, process_group=None, norm_dtype=torch.float32))
                rec["d2_get_total_norm_none"] = _try(lambda: bt.get_total_norm(
                    present, process_group=None, norm_dtype=torch.float32))
                rec["d2_fsdp_args"] = _try(lambda: bt.clip_grad_norm_(
                    params, 1e30, norm_dtype=torch.float32, **bt.fsdp_norm_args(wrapped)))
                # the seed bug, as a negative control: the same values as plain
                # clones and no group are one rank's shard norm
                rec["shard_norm"] = bt.get_total_norm(
                    [g.clone() for g in present], norm_dtype=torch.float32)
                rec["grads_after_direct"] = _clones(grads)
            try:
                total, coef = user_fn()
            except Exception:
                rec["grads_after_refusal"] = _clones(grads)
                raise
            rec["norm"], rec["coef"] = total.clone(), coef.clone()
            return total, coef
        opt._grad_norm_and_clip_coefficient = instrumented
        try:
            core.train_step(batch(dist.get_rank(), vocab))
        except bitexact.InvalidArgumentError as e:  # bitexact's refusal (process_group=None)
            rec["refused"] = str(e)
            return rec
        rec["masters_after"] = _clones(opt.fp32_params)
        rec["params_after"] = _clones(opt.model_params)
        rec["last_grad_norm"] = opt.last_grad_norm.clone()
        rec["is_bf16_optimizer"] = isinstance(opt, BF16Optimizer)
    return rec


def scenario_empty_rank(rank, dtype):
    """Defect 1 without FSDP: rank 0 holds low-precision gradients, rank 1
    none; every rank gets the same norm in the gradients' dtype."""
    g = torch.Generator().manual_seed(7)
    grads = [(torch.randn(n, generator=g) * 2.0 ** k).to(dtype)
             for n, k in ((300, -3), (77, 2), (1000, -9))] if rank == 0 else []
    params = []
    for gr in grads:
        p = torch.nn.Parameter(torch.zeros_like(gr))
        p.grad = gr.clone()
        params.append(p)
    params.append(torch.nn.Parameter(torch.zeros(5, dtype=dtype)))  # no grad
    world = dist.group.WORLD
    return {"grads": _clones(grads),
            "get_total_norm": _try(lambda: bt.get_total_norm(grads, process_group=world)),
            "clip": _try(lambda: bt.clip_grad_norm_(params, 0.5, process_group=world)),
            "clipped": _clones([p.grad for p in params if p.grad is not None]),
            "fp32": _try(lambda: bt.get_total_norm(grads, process_group=world,
                                                   norm_dtype=torch.float32))}


def scenario_fsdp_direct(rank, case):
    """Defect 2 without SpecForge: FSDP1 (bf16 mixed precision, fp32
    parameters) with and without use_orig_params, no process group given."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
    strategy, orig = case
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 24), torch.nn.ReLU(), torch.nn.Linear(24, 6))
    fsdp = FSDP(net, sharding_strategy=getattr(ShardingStrategy, strategy), use_orig_params=orig,
                mixed_precision=MixedPrecision(param_dtype=torch.bfloat16), device_id=CPU)
    g = torch.Generator().manual_seed(11 + rank)
    fsdp(torch.randn(5, 8, generator=g)).square().sum().backward()
    params = list(fsdp.parameters())
    rec = {"grads": _clones([p.grad for p in params if p.grad is not None])}
    rec["none"] = _try(lambda: bt.clip_grad_norm_(params, 1e30))
    rec["world"] = _try(lambda: bt.clip_grad_norm_(params, 1e30, process_group=dist.group.WORLD,
                                                    owned=rank == 0 or strategy != "NO_SHARD"))
    rec["fsdp_args"] = _try(lambda: bt.clip_grad_norm_(params, 1e30, **bt.fsdp_norm_args(fsdp)))
    rec["grads_after"] = _clones([p.grad for p in params if p.grad is not None])
    return rec


def _case(patch, layout, group, strategy="SHARD_GRAD_OP", direct=False):
    return dict(patch=patch, layout=layout, group=group, strategy=strategy, direct=direct)


# patch: PATCHES key; layout: VOCABS key; group: "from_distributed" (SpecForge's
# trainer: WORLD) or "manual" (ParallelConfig by hand: None); the direct checks
# of the defects ride on the first two.
SPECFORGE_CASES = [
    _case("norm", "rank0_empty", "from_distributed", direct=True),
    _case("clip", "split", "manual", direct=True),  # None passed through
    _case("fsdp_args", "split", "manual"),
    _case("fsdp_args", "rank0_empty", "manual"),
    _case("clip", "rank0_empty", "from_distributed"),
    _case("clip", "split", "from_distributed"),
    _case("norm", "split", "from_distributed", "FULL_SHARD"),
    _case("norm", "split", "from_distributed", "NO_SHARD"),  # SpecForge wraps in DDP
]
FSDP_DIRECT = [(s, o) for s in ("SHARD_GRAD_OP", "NO_SHARD") for o in (False, True)]


def case_id(case):
    return f"{case['patch']}-{case['layout']}-{case['group']}-{case['strategy']}"


def main(rank, ws, port, out_dir):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    import torch._dynamo.config as dynamo_config
    dynamo_config.disable = True  # SpecForge's @torch.compile helpers run eagerly
    # a failed collective must not hang CI: the partner errors out instead
    dist.init_process_group("gloo", rank=rank, world_size=ws,
                            timeout=datetime.timedelta(seconds=120))
    res = {}

    def guard(key, fn, *args):
        try:
            res[key] = fn(*args)
        except Exception:  # noqa: BLE001
            res[key] = {"exception": traceback.format_exc()}
    for case in SPECFORGE_CASES:
        guard(("specforge", case_id(case)), scenario_specforge, rank, case)
    for dtype in (torch.bfloat16, torch.float16):
        guard(("empty_rank", str(dtype)), scenario_empty_rank, rank, dtype)
    for case in FSDP_DIRECT:
        guard(("fsdp_direct", case), scenario_fsdp_direct, rank, case)
    torch.save(res, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()
