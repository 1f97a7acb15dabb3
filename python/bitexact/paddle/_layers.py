"""bitexact.paddle layers: the training kernels (bitexact.kernels) as
``paddle.autograd.PyLayer`` ops and ``paddle.nn.Layer`` modules, with the
names and semantics of bitexact.torch's (docs/paddle_layers.md,
docs/torch_layers.md).

Every forward and backward value is computed by a bitexact kernel (Paddle
only allocates with ``paddle.empty``, copies to contiguous and reshapes;
the kernel call sequences, the PyLayers and the modules' bodies are
nn/_layers.py's, shared with bitexact.torch),
so the bits are those of bitexact.torch's layers and of `bitexact train`'s
kernels: a model built from these modules and one built from
bitexact.torch's, from the same weights and data, train byte-identically
(tests/python/test_paddle_layers.py). Weight gradients never go through
Paddle's accumulation into ``.grad``: each PyLayer's backward returns None
for its weight and adds the per-chunk partials to the active
:class:`GradReduction` (the framework-neutral protocol of
bitexact.nn._gradred), which sets every ``.grad`` at ``finish``. Inputs that
are plain Paddle leaves with ``stop_gradient=False`` get Paddle's gradient
as usual, once per pass.

Differs from Paddle's own layers: :class:`Linear`'s weight is
``[out_features, in_features]`` (torch's and `bitexact train`'s layout;
``paddle.nn.Linear`` stores ``[in, out]``) and bias-free; initial values
follow torch's distributions (Linear U(+-1/sqrt(in)), Embedding N(0, 1),
RMSNorm ones), not Paddle's Xavier. Paddle tensors with
``stop_gradient=False`` are exported through the DenseTensor's DLPack
export (bitexact.paddle registers it): the kernels read and write their
memory without a copy; Paddle's inplace version counters are not bumped
(only outputs Paddle has not seen yet are written).

Dynamic graph only: the layer functions are marked
``paddle.jit.not_to_static``, so under ``paddle.jit.to_static(...,
full_graph=True)`` they receive the program's static Values and refuse
them with a named InvalidArgumentError (rather than failing inside Paddle's
translator); the default SOT mode fails inside Paddle's translator
(UnboundLocalError, Paddle 3.3.1; docs/paddle_layers.md).

Threading: as bitexact.torch's (calling thread; ``num_threads`` workers:
module attribute, else the active reduction's, else the library default;
bits never depend on it). The MoE block is paddle/_moe.py, the model
paddle/_glm.py. Not covered: GPU tensors, static graph.
"""
import paddle

from .. import InvalidArgumentError
from ..nn import _gradred as _g
from ..nn import _layers as _ops
from ..nn._gradred import _err, _threads
from ._gradred import (  # noqa: F401
    GradReduction, _F32, _INTS, _capture, _check, _numel, _rows, _wants_grad, comm)
from ._gradred import empty

__all__ = ["GradReduction", "Linear", "RMSNorm", "SwiGLUMLP", "Embedding", "CrossEntropyLoss",
           "RotaryEmbedding", "CausalAttention", "linear", "rms_norm", "swiglu", "swiglu_mlp",
           "embedding", "cross_entropy", "rope", "causal_attention", "qkv_projection", "comm"]


def _dx_args(ctx, args):
    """The PyLayer's forward arguments less the trailing need_dx (the
    input's stop_gradient state at apply: Paddle has no needs_input_grad),
    which is kept for backward."""
    ctx.need_dx = args[-1]
    return args[:-1]


# The framework adapter of the shared numerics bodies (nn/_layers.py).
_FW = _ops.Adapter(f32=_F32, i64=paddle.int64,
                   empty=empty,
                   rows=_rows, reshape=lambda t, shape: t.reshape(list(shape)), numel=_numel,
                   saved=lambda ctx: ctx.saved_tensor(), first=lambda t: int(t.numpy()[0]),
                   dx_args=_dx_args, need_dx=lambda ctx: ctx.need_dx,
                   n_grads=lambda args: sum(isinstance(a, paddle.Tensor) for a in args),
                   from_numpy=paddle.to_tensor,
                   bf16=paddle.bfloat16)
_fn = _ops.autograd_functions(paddle.autograd.PyLayer, _FW, __name__)


# ---- Linear and the fused q/k/v projection -----------------------------------

@paddle.jit.not_to_static
def linear(x, weight, bias=None, num_threads=None):
    """y = x W^T (bx_gemm NT), W [out, in], then fl(y + b) with a bias; dx
    = dy W (NN); dW (and db) as chunk partials into the active
    GradReduction."""
    x, weight, bias, mb, idx = _ops.linear_args(_FW, _check, _capture, "bitexact.paddle.linear", x,
                                                weight, bias)
    return _fn.linear.apply(x, weight, bias, _threads(num_threads), mb, idx, _wants_grad(x))


def _uniform(bound):
    return paddle.nn.initializer.Uniform(-bound, bound)


class Linear(paddle.nn.Layer):
    """A linear layer through the bitexact kernels (bias-free by default;
    bias=True: a bias [out_features]); weight [out_features, in_features]
    (torch's layout, not paddle.nn.Linear's), weight and bias initialised
    U(-1/sqrt(in), 1/sqrt(in)) as torch's distribution."""

    def __init__(self, in_features, out_features, bias=False):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = self.create_parameter([out_features, in_features], dtype="float32",
                                            default_initializer=_uniform(in_features ** -0.5))
        self.bias = self.create_parameter([out_features], dtype="float32",
                                          default_initializer=_uniform(in_features ** -0.5)) \
            if bias else None
        self.num_threads = None

    def forward(self, x):
        return linear(x, self.weight, self.bias, self.num_threads)


@paddle.jit.not_to_static
def qkv_projection(x, q_weight, k_weight, v_weight, num_threads=None, *, q_bias=None,
                   k_bias=None, v_bias=None):
    """(x Wq^T [+ bq], x Wk^T [+ bk], x Wv^T [+ bv]), one PyLayer (dx one
    chain; each bias added after its product)."""
    x, ws, bs, mb, pairs = _ops.qkv_args(_FW, _check, _capture, "bitexact.paddle.qkv_projection",
                                         x, (q_weight, k_weight, v_weight), (q_bias, k_bias, v_bias))
    return _fn.qkv.apply(x, *ws, *bs, _threads(num_threads), mb, pairs, _wants_grad(x))


# ---- RMSNorm --------------------------------------------------------------

@paddle.jit.not_to_static
def rms_norm(x, weight, eps=1e-6, num_threads=None):
    """Glm4MoeRMSNorm over the last dimension (bx_rmsnorm_*); x [..., H]
    whose rows are tokens or a whole number of rows per token."""
    fn = "bitexact.paddle.rms_norm"
    weight = _check(fn, "weight", weight, ndim=(1,))
    x = _check(fn, "input", x)
    if x.shape[-1] != weight.shape[0]:
        raise _err(InvalidArgumentError, fn, "input", f"last dimension {x.shape[-1]} != "
                   f"weight's {weight.shape[0]}")
    mb, (wi,) = _capture(fn, [(weight, "weight", _numel(x) // max(1, x.shape[-1]))], exact=False)
    return _fn.rmsnorm.apply(x, weight, float(eps), _threads(num_threads), mb, wi, _wants_grad(x))


class RMSNorm(paddle.nn.Layer):
    """Glm4MoeRMSNorm(hidden_size, eps): gain initialised to ones."""

    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = self.create_parameter([hidden_size], dtype="float32",
                                            default_initializer=paddle.nn.initializer.Constant(1.0))
        self.eps, self.num_threads = eps, None

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps, self.num_threads)


# ---- SwiGLU -----------------------------------------------------------------

@paddle.jit.not_to_static
def swiglu(gate, up, num_threads=None):
    """h = SiLU(gate) * up (bx_swiglu_forward / backward)."""
    fn = "bitexact.paddle.swiglu"
    gate, up = _check(fn, "gate", gate), _check(fn, "up", up)
    if list(gate.shape) != list(up.shape):
        raise _err(InvalidArgumentError, fn, "up", f"has shape {list(up.shape)}, gate "
                   f"{list(gate.shape)}")
    return _fn.swiglu.apply(gate, up, _threads(num_threads))


@paddle.jit.not_to_static
def swiglu_mlp(x, gate_weight, up_weight, down_weight, num_threads=None):
    """down(SiLU(gate(x)) * up(x)), bias-free: gate_weight, up_weight [I, H],
    down_weight [H, I]."""
    fn = "bitexact.paddle.swiglu_mlp"
    wg = _check(fn, "gate_weight", gate_weight, ndim=(2,))
    wu = _check(fn, "up_weight", up_weight, ndim=(2,))
    wd = _check(fn, "down_weight", down_weight, ndim=(2,))
    x = _check(fn, "input", x)
    H, I = wg.shape[1], wg.shape[0]
    if list(wu.shape) != list(wg.shape) or list(wd.shape) != [H, I]:
        raise _err(InvalidArgumentError, fn,
                   "up_weight" if list(wu.shape) != list(wg.shape) else "down_weight",
                   f"shapes gate {list(wg.shape)}, up {list(wu.shape)}, down {list(wd.shape)} "
                   "do not fit ([I, H], [I, H], [H, I])")
    if x.shape[-1] != H:
        raise _err(InvalidArgumentError, fn, "input", f"has {x.shape[-1]} features, not {H}")
    rows = _numel(x) // max(1, H)
    mb, idx = _capture(fn, [(wg, "gate_weight", rows), (wu, "up_weight", rows),
                            (wd, "down_weight", rows)])
    return _fn.mlp.apply(x, wg, wu, wd, _threads(num_threads), mb, tuple(idx), _wants_grad(x))


class SwiGLUMLP(_ops.SwiGLUMLPBase, paddle.nn.Layer):
    """Glm4MoeMLP(hidden_size, intermediate_size): gate_proj, up_proj,
    down_proj (bitexact Linear weights), one PyLayer."""


# ---- Embedding ----------------------------------------------------------------

@paddle.jit.not_to_static
def embedding(ids, weight, padding_idx=None, num_threads=None):
    """y = weight[ids] (bits copied); the gradient as compact per-chunk rows
    into the GradReduction."""
    fn = "bitexact.paddle.embedding"
    weight = _check(fn, "weight", weight, ndim=(2,))
    ids = _check(fn, "input", ids, _INTS)
    V = weight.shape[0]
    pad = -1 if padding_idx is None else (padding_idx + V if padding_idx < 0 else padding_idx)
    mb, (wi,) = _capture(fn, [(weight, "weight", _numel(ids))])
    with _g.all_or_nothing(mb, (wi,)):  # an id out of range: nothing registered
        return _fn.embedding.apply(weight, ids, pad, _threads(num_threads), mb, wi)


class Embedding(paddle.nn.Layer):
    """An embedding lookup (normal(0, 1) init, as torch.nn.Embedding)
    through bx_embedding_*."""

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None):
        super().__init__()
        self.weight = self.create_parameter([num_embeddings, embedding_dim], dtype="float32",
                                            default_initializer=paddle.nn.initializer.Normal(0, 1))
        if padding_idx is not None:
            with paddle.no_grad():
                self.weight[padding_idx] = 0.0
        self.padding_idx, self.num_threads = padding_idx, None

    def forward(self, ids):
        return embedding(ids, self.weight, self.padding_idx, self.num_threads)


# ---- cross-entropy --------------------------------------------------------------

@paddle.jit.not_to_static
def cross_entropy(logits, targets, ignore_index=-100, num_threads=None):
    """The global-token-mean cross-entropy, as bitexact.torch.cross_entropy
    (inside a micro-batch: its sum / the step's n_targets; else the mean
    over this call's valid targets, as torch's reduction='mean'; Paddle
    3.3.1's F.cross_entropy(reduction='mean', ignore_index=...) divides
    by all targets, ignored ones included)."""
    fn = "bitexact.paddle.cross_entropy"
    logits = _check(fn, "input", logits, ndim=(2, 3))
    targets = _check(fn, "target", targets, _INTS, ndim=(1, 2))
    if list(targets.shape) != list(logits.shape[:-1]):
        raise _err(InvalidArgumentError, fn, "target", f"has shape {list(targets.shape)}, the "
                   f"logits {list(logits.shape)} want {list(logits.shape[:-1])}")
    mb, n_global = _ops.xent_step(_FW, fn, targets, ignore_index)
    with _g.all_or_nothing(mb, loss=True):  # a target out of range
        return _fn.xent.apply(logits, targets, int(ignore_index), _threads(num_threads), mb,
                              n_global)


class CrossEntropyLoss(_ops.CrossEntropyLossBase, paddle.nn.Layer):
    """The cross-entropy over [T, V] / [B, L, V] logits and [T] / [B, L]
    targets; see :func:`cross_entropy`."""


# ---- RoPE and causal GQA attention (no weights) ----------------------------------

@paddle.jit.not_to_static
def rope(x, positions, head_dim, rotary_dim=None, theta=10000.0, num_threads=None):
    """transformers' rotate_half RoPE (bx_rope_*) on x [T, heads*head_dim]
    (or [T, heads, head_dim], [B, L, F]); positions int64, T elements."""
    fn = "bitexact.paddle.rope"
    x = _check(fn, "input", x, min_ndim=2)
    positions = _check(fn, "positions", positions, (paddle.int64,))
    rd = head_dim if rotary_dim is None else rotary_dim
    return _fn.rope.apply(x, positions, int(head_dim), int(rd), float(theta), _threads(num_threads))


class RotaryEmbedding(_ops.RotaryEmbeddingBase, paddle.nn.Layer):
    """RoPE of head_dim with rotary_dim = int(head_dim * partial_rotary_factor)."""


@paddle.jit.not_to_static
def causal_attention(q, k, v, seq_len, num_heads, num_kv_heads, head_dim, num_threads=None):
    """Causal GQA eager attention on q [T, Hq*D], k, v [T, Hkv*D] (or
    [B, L, F]), sequences of seq_len tokens (bx_attention_*)."""
    fn = "bitexact.paddle.causal_attention"
    q, k, v = (_check(fn, n, t, min_ndim=2) for n, t in (("query", q), ("key", k), ("value", v)))
    dims = (int(seq_len), int(num_heads), int(num_kv_heads), int(head_dim))
    return _fn.attention.apply(q, k, v, dims, _threads(num_threads))


class CausalAttention(_ops.CausalAttentionBase, paddle.nn.Layer):
    """Glm4MoeAttention without biases and QK-norm, as bitexact.torch's:
    q/k/v/o projections (q/k/v one qkv_projection node), RoPE on q and k,
    causal GQA attention per sequence of seq_len tokens."""
