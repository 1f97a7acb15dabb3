"""bitexact.torch's GLM-4.5 MoE model (``Glm4MoeForCausalLM``) and its
AdamW (docs/torch_layers.md, "The model and the trainer").

The module bodies are bitexact.train._model's (shared with bitexact.paddle);
this file adds ``torch.nn.Module`` and names the layers they call (the
``_bx_api`` of the bodies is this module). A model loads a `bitexact
train` checkpoint (transformers' names) with
:meth:`Glm4MoeForCausalLM.load_checkpoint` and trains through a
:class:`~bitexact.torch.GradReduction` and :class:`AdamW`; ``python -m
bitexact.train --framework torch`` runs `bitexact train`'s loop on it
(bitexact.train._run) with byte-identical records and checkpoints.

Threading: as the layers (one thread per model and optimizer).
"""
import numpy as _np
import torch

from .. import _frameworks
from ..train import _model as _gm
from .. import kernels as _k
from ._layers import (  # noqa: F401
    Embedding, Linear, RMSNorm, SwiGLUMLP, causal_attention, cross_entropy, qkv_projection,
    rms_norm, rope)
from ._moe import MoE  # noqa: F401
from ._compile import compiling as _compiling  # noqa: F401 (ForCausalLMBase.forward)

__all__ = ["Glm4MoeForCausalLM", "Glm4MoeModel", "Glm4MoeDecoderLayer", "Glm4MoeAttention",
           "AdamW"]

ModuleList = torch.nn.ModuleList
_frameworks.torch_fast_export()  # parameters (requires_grad) reach the kernels without a detach


def _positions(B, L):
    """Token t = b*L + i has position i (int64 [B*L])."""
    return torch.arange(L, dtype=torch.int64).repeat(B)


class Glm4MoeAttention(_gm.AttentionBase, torch.nn.Module):
    __doc__ = _gm.AttentionBase.__doc__


class Glm4MoeDecoderLayer(_gm.DecoderLayerBase, torch.nn.Module):
    __doc__ = _gm.DecoderLayerBase.__doc__


class Glm4MoeModel(_gm.ModelBase, torch.nn.Module):
    __doc__ = _gm.ModelBase.__doc__


class Glm4MoeForCausalLM(_gm.ForCausalLMBase, torch.nn.Module):
    """transformers' Glm4MoeForCausalLM through bitexact's kernels.
    ``Glm4MoeForCausalLM(config)``: config a path to config.json, a dict,
    or a transformers Glm4MoeConfig. Initial values: torch's module inits
    (load a checkpoint for `bitexact train`'s). forward(input_ids [B, L],
    labels [B, L] or None): the loss (labels) or logits [B, L, V]; call it
    inside a GradReduction micro-batch to train."""

    def load_checkpoint(self, tensors):
        """Copy every parameter and buffer from ``tensors`` (a mapping name
        -> numpy array, e.g. safetensors.numpy.load_file of a `bitexact
        train` model.safetensors). Every name, shape and dtype (float32) is
        checked first; a missing or extra tensor raises
        InvalidArgumentError and nothing is copied. Under expert
        parallelism the other ranks' experts are skipped (not read)."""
        own = dict(self.named_parameters())
        own.update(self.named_buffers())
        arrays = _gm.checked_arrays(own, tensors, lambda t: tuple(t.shape), self._foreign)
        with torch.no_grad():
            for n, a in arrays.items():
                own[n].copy_(torch.from_numpy(a))


def _adamw(params, grads, exp_avgs, exp_avg_sqs, steps, lr, beta1, beta2, eps, weight_decay,
           num_threads):
    """bx_adamw_step on each parameter in order, its step count (a 0-d int64
    tensor) incremented first; a failing parameter raises (the ones before
    it are updated)."""
    for p, g, m, v, s in zip(params, grads, exp_avgs, exp_avg_sqs, steps):
        n = int(s) + 1
        _k.adamw_step(p.detach(), g, m, v, n, lr=lr, beta1=beta1, beta2=beta2, eps=eps,
                      weight_decay=weight_decay, num_threads=num_threads)
        s.fill_(n)


# AdamW's update as a custom op: torch.compile(opt.step, fullgraph=True) traces it
_adamw_op = torch.library.custom_op("bitexact::adamw_", _adamw,
                                    mutates_args=("params", "exp_avgs", "exp_avg_sqs", "steps"),
                                    schema="(Tensor(a!)[] params, Tensor[] grads, "
                                    "Tensor(b!)[] exp_avgs, Tensor(c!)[] exp_avg_sqs, "
                                    "Tensor(d!)[] steps, float lr, float beta1, float beta2, "
                                    "float eps, float weight_decay, int num_threads) -> ()")
_adamw_op.register_fake(lambda *args: None)


class AdamW(torch.optim.Optimizer):
    """torch.optim.AdamW's update computed by ``bx_adamw_step`` (the bits of
    `bitexact train`; the formula is torch's: decoupled weight decay, bias
    corrections, eps added to sqrt(v_hat)). fp32 CPU contiguous parameters
    only. State per parameter: ``step`` (a 0-d int64 tensor, as torch keeps
    its step in a tensor), ``exp_avg``, ``exp_avg_sq`` (fp32, created as
    zeros at the first step). ``step()`` updates every parameter with a
    gradient, in place; a failing parameter raises (a bitexact error naming
    it) and the parameters before it are already updated.
    ``torch.compile(opt.step, fullgraph=True)`` traces it (the custom op
    ``torch.ops.bitexact.adamw_``, the same bits).
    ``foreach``/``fused``/``amsgrad``/``maximize`` are not offered."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                 num_threads=0):
        _gm.check_adamw(lr, betas, eps, weight_decay)
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps,
                                      weight_decay=weight_decay, num_threads=num_threads))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for g in self.param_groups:
            b1, b2 = g["betas"]
            ps, gs, ms, vs, ss = [], [], [], [], []
            for p in g["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if not st:
                    st["step"] = torch.zeros((), dtype=torch.int64)
                    st["exp_avg"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
                    st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
                ps.append(p)
                gs.append(p.grad)
                ms.append(st["exp_avg"])
                vs.append(st["exp_avg_sq"])
                ss.append(st["step"])
            if not ps:
                continue
            args = (ps, gs, ms, vs, ss, float(g["lr"]), float(b1), float(b2), float(g["eps"]),
                    float(g["weight_decay"]), int(g["num_threads"]))
            if _compiling():
                torch.ops.bitexact.adamw_(*args)
            else:
                _adamw(*args)
        return loss

    def load_moments(self, p, exp_avg, exp_avg_sq, step):
        """p's state := the arrays (copied) and the step count (a `bitexact
        train` checkpoint's optimizer.safetensors and trainer_state step)."""
        self.state[p] = {"step": torch.tensor(int(step), dtype=torch.int64),
                         "exp_avg": torch.tensor(_np.asarray(exp_avg, dtype=_np.float32)),
                         "exp_avg_sq": torch.tensor(_np.asarray(exp_avg_sq, dtype=_np.float32))}

    def moments(self, p):
        """(exp_avg, exp_avg_sq) of p (zeros before its first step)."""
        st = self.state.get(p)
        if not st:
            return torch.zeros_like(p), torch.zeros_like(p)
        return st["exp_avg"], st["exp_avg_sq"]


class _Runner(_gm.RunnerBase):
    """The framework hooks of bitexact.train._run (``python -m bitexact.train
    --framework torch``)."""
    name = "torch"
    Model = Glm4MoeForCausalLM
    AdamW = AdamW

    @staticmethod
    def GradReduction(*args, **kw):
        from ._gradred import GradReduction
        return GradReduction(*args, **kw)

    @staticmethod
    def compile(f):
        """torch.compile(f, fullgraph=True), f the model (one graph per
        forward, the layers as bitexact's custom ops, torch/_compile.py) or
        AdamW.step (the custom op bitexact::adamw_): the same bits."""
        return torch.compile(f, fullgraph=True)

    no_grad = staticmethod(torch.no_grad)

    @staticmethod
    def tracer(module, path, **kw):
        """bitexact.torch.trace's Tracer (python -m bitexact.train --trace)."""
        from ._trace import Tracer
        return Tracer(module, path, **kw)

    @staticmethod
    def ids(a):
        return torch.from_numpy(_np.ascontiguousarray(a, dtype=_np.int64))

    @staticmethod
    def numpy(t):
        return t.detach().numpy().copy()

    @staticmethod
    def alltoall(rank, world, ep):
        """torch.distributed.all_to_all_single over this rank's EP group
        (gloo on the CPU); every rank creates every group, in one order."""
        import numpy as np
        import torch.distributed as dist
        groups = [dist.new_group(list(range(g, g + ep))) for g in range(0, world, ep)]
        group = groups[rank // ep]

        def a2a(send, sbytes, rbytes):
            out = torch.empty(int(sum(rbytes)), dtype=torch.uint8)
            inp = torch.from_numpy(np.frombuffer(send, dtype=np.uint8).copy())
            dist.all_to_all_single(out, inp, [int(n) for n in rbytes], [int(n) for n in sbytes],
                                   group=group)
            return out.numpy()
        return a2a

    @staticmethod
    def replica(rank, world, ep):
        """bitexact.torch.comm over the replica group of rank (the ranks
        r with r % ep == rank % ep); every rank creates every group, in one
        order. None with one replica (ep == world)."""
        if world // ep <= 1:
            return None
        import torch.distributed as dist
        from . import comm
        groups = [dist.new_group(list(range(d, world, ep))) for d in range(ep)]
        return comm(groups[rank % ep])

    @staticmethod
    def init_distributed():
        """(rank, world, comm, group) from torchrun's environment (gloo)."""
        import os
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return 0, 1, None, None
        import torch.distributed as dist
        if not dist.is_initialized():
            dist.init_process_group("gloo")
        from . import comm
        return dist.get_rank(), dist.get_world_size(), comm(), None

    @staticmethod
    def finalize_distributed():
        """The end of a run: every rank waits for the others, then the
        process groups (the world's and the EP / replica groups) are
        destroyed, so that no gloo thread is alive at interpreter exit
        ("terminate called without an active exception" otherwise, now and
        then, on a rank that exits first)."""
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()


RUNNER = _Runner
