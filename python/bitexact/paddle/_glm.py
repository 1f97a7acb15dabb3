"""bitexact.paddle's GLM-4.5 MoE model (``Glm4MoeForCausalLM``) and its
AdamW (docs/paddle_layers.md, docs/train_python.md): the module bodies of
bitexact.train._model (shared with bitexact.torch) as ``paddle.nn.Layer``s,
so a step of this model, of bitexact.torch's and of `bitexact train` give
the same bits. ``python -m bitexact.train --framework paddle`` trains it.

Threading: as the layers (one thread per model and optimizer).
"""
import numpy as _np
import paddle

from .. import InvalidArgumentError, _frameworks
from ..train import _model as _gm
from .. import kernels as _k
from ._layers import (  # noqa: F401
    Embedding, Linear, RMSNorm, SwiGLUMLP, causal_attention, cross_entropy, qkv_projection,
    rms_norm, rope)
from ._moe import MoE  # noqa: F401
from ..train._model import checked_arrays

__all__ = ["Glm4MoeForCausalLM", "Glm4MoeModel", "Glm4MoeDecoderLayer", "Glm4MoeAttention",
           "AdamW"]

ModuleList = paddle.nn.LayerList
_frameworks.paddle_fast_export()  # parameters (stop_gradient=False) reach the kernels without a copy


def _compiling():
    """Whether torch.compile traces (never, for Paddle: the model body's hook)."""
    return False


def _positions(B, L):
    """Token t = b*L + i has position i (int64 [B*L])."""
    return paddle.tile(paddle.arange(L, dtype="int64"), [B])


class Glm4MoeAttention(_gm.AttentionBase, paddle.nn.Layer):
    __doc__ = _gm.AttentionBase.__doc__


class Glm4MoeDecoderLayer(_gm.DecoderLayerBase, paddle.nn.Layer):
    __doc__ = _gm.DecoderLayerBase.__doc__


class Glm4MoeModel(_gm.ModelBase, paddle.nn.Layer):
    __doc__ = _gm.ModelBase.__doc__


class Glm4MoeForCausalLM(_gm.ForCausalLMBase, paddle.nn.Layer):
    """transformers' Glm4MoeForCausalLM through bitexact's kernels, as a
    paddle.nn.Layer with transformers' parameter names (linear weights
    [out, in], torch's layout). See bitexact.torch.Glm4MoeForCausalLM."""

    def load_checkpoint(self, tensors):
        """Copy every parameter and buffer from ``tensors`` (name -> numpy
        array); names, shapes and dtypes are checked first (nothing is
        copied on a mismatch: InvalidArgumentError naming the tensor)."""
        own = dict(self.named_parameters())
        own.update(self.named_buffers())
        for n, a in checked_arrays(own, tensors, lambda t: tuple(t.shape), self._foreign).items():
            own[n].set_value(a)


class AdamW:
    """torch.optim.AdamW's update by ``bx_adamw_step`` (the bits of
    `bitexact train` and of bitexact.torch.AdamW) for Paddle parameters:
    ``AdamW(parameters, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
    weight_decay=0.01, num_threads=0)``. ``step()`` updates, in place,
    every parameter whose ``.grad`` is set; ``clear_grad()`` drops the
    gradients. Not a paddle.optimizer.Optimizer (no LR scheduler, no
    static graph); fp32 CPU parameters only. State per parameter (by
    position): step count and the fp32 moments."""

    def __init__(self, parameters, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                 num_threads=0):
        _gm.check_adamw(lr, betas, eps, weight_decay)
        self.params = list(parameters)
        self.lr, self.betas, self.eps, self.weight_decay = lr, tuple(betas), eps, weight_decay
        self.num_threads = num_threads
        self.state = [None] * len(self.params)
        self._pos = {id(p): i for i, p in enumerate(self.params)}

    def _index(self, p):
        i = self._pos.get(id(p))
        if i is None:
            raise InvalidArgumentError("AdamW: not one of this optimizer's parameters")
        return i

    def step(self):
        for i, p in enumerate(self.params):
            if p.grad is None:
                continue
            st = self.state[i]
            if st is None:
                st = self.state[i] = {"step": 0, "exp_avg": paddle.zeros(p.shape, "float32"),
                                      "exp_avg_sq": paddle.zeros(p.shape, "float32")}
            _k.adamw_step(p, p.grad, st["exp_avg"], st["exp_avg_sq"], st["step"] + 1, lr=self.lr,
                          beta1=self.betas[0], beta2=self.betas[1], eps=self.eps,
                          weight_decay=self.weight_decay, num_threads=self.num_threads)
            st["step"] += 1

    def clear_grad(self):
        for p in self.params:
            p.clear_gradient(False)

    def load_moments(self, p, exp_avg, exp_avg_sq, step):
        """p's state := the arrays (copied) and the step count."""
        self.state[self._index(p)] = {
            "step": int(step), "exp_avg": paddle.to_tensor(_np.asarray(exp_avg, _np.float32)),
            "exp_avg_sq": paddle.to_tensor(_np.asarray(exp_avg_sq, _np.float32))}

    def moments(self, p):
        """(exp_avg, exp_avg_sq) of p (zeros before its first step)."""
        st = self.state[self._index(p)]
        if st is None:
            return paddle.zeros(p.shape, "float32"), paddle.zeros(p.shape, "float32")
        return st["exp_avg"], st["exp_avg_sq"]


class _Runner(_gm.RunnerBase):
    """The framework hooks of bitexact.train._run (``--framework paddle``)."""
    name = "paddle"
    Model = Glm4MoeForCausalLM
    AdamW = AdamW

    @staticmethod
    def GradReduction(*args, **kw):
        from ._gradred import GradReduction
        return GradReduction(*args, **kw)

    no_grad = staticmethod(paddle.no_grad)

    @staticmethod
    def tracer(module, path, **kw):
        """bitexact.paddle.trace's Tracer (python -m bitexact.train --trace)."""
        from ._trace import Tracer
        return Tracer(module, path, **kw)

    @staticmethod
    def ids(a):
        return paddle.to_tensor(_np.ascontiguousarray(a, dtype=_np.int64))

    @staticmethod
    def numpy(t):
        return _np.array(t.numpy())

    @staticmethod
    def init_distributed():
        """(rank, world, comm, group) from paddle.distributed.launch's
        environment (gloo on CPU)."""
        import os
        world = int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))
        if world <= 1:
            return 0, 1, None, None
        import paddle.distributed as dist
        dist.init_parallel_env()
        from ._gradred import comm
        return dist.get_rank(), dist.get_world_size(), comm(), None

    @staticmethod
    def finalize_distributed():
        """The end of a run: nothing to do (Paddle keeps its gloo context to
        the end of the process; its CPU barrier is not used: Paddle 3.3's
        gloo point-to-point calls time out, docs/train_python.md)."""


RUNNER = _Runner
