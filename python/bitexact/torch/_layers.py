"""bitexact.torch layers: the training kernels (bitexact.kernels) as torch
autograd Functions and nn.Modules (docs/torch_layers.md).

Every forward and backward value is computed by a bitexact kernel (torch
only allocates, copies to contiguous and reshapes); the bits are those of
`bitexact train`'s kernels, composed as src/glm/train_layers.c composes
them. The kernel call sequences are nn/_layers.py's, shared with
bitexact.paddle (the Functions are made from them by
nn._layers.autograd_functions; the modules' bodies are its *Base). Weight
gradients never go through torch's accumulation into ``.grad``: each
Function adds its per-chunk partials to the active
:class:`~bitexact.torch._gradred.GradReduction` (its backward returns None
for the weight), which writes every ``.grad`` at ``finish``. Inputs that
are plain autograd leaves get torch's gradient as usual, once per pass.

Functions here run in the calling thread (the kernels release the GIL and
use up to ``num_threads`` workers: module attribute, else the active
reduction's, else the library default; bits never depend on it). The
GLM-4.5 MoE block is in torch/_moe.py, the model (with the q/k/v bias and
QK-norm) in torch/_glm.py. bf16 compute: GradReduction(compute_dtype=
"bf16") rounds every GEMM operand (the node (bitexact._core.glm_*)). Not covered yet: CUDA
tensors, torch.compile custom ops (a compiled model breaks the graph at
each op).
"""
import torch

from .. import InvalidArgumentError
from ..nn import _gradred as _g
from ..nn import _layers as _ops
from . import _compile as _tc
from ._gradred import GradReduction, _F32, _capture, _check, _err, _rows, _threads

__all__ = ["GradReduction", "Linear", "RMSNorm", "SwiGLUMLP", "Embedding", "CrossEntropyLoss",
           "RotaryEmbedding", "CausalAttention", "linear", "rms_norm", "swiglu", "swiglu_mlp",
           "embedding", "cross_entropy", "rope", "causal_attention", "qkv_projection"]


# The framework adapter of the shared numerics bodies (nn/_layers.py).
_FW = _ops.Adapter(f32=_F32, i64=torch.int64,
                   empty=lambda shape, dtype=_F32: torch.empty(shape, dtype=dtype),
                   rows=_rows, reshape=lambda t, shape: t.reshape(shape),
                   numel=lambda t: t.numel(), saved=lambda ctx: ctx.saved_tensors,
                   first=lambda t: int(t[0]), dx_args=lambda ctx, args: args,
                   need_dx=lambda ctx: ctx.needs_input_grad[0], n_grads=len,
                   from_numpy=torch.from_numpy,
                   bf16=torch.bfloat16)
_fn = _ops.autograd_functions(_tc.Function, _FW, __name__)


# ---- Linear ---------------------------------------------------------------

def linear(x, weight, bias=None, num_threads=None):
    """y = x W^T (bx_gemm NT, one fmaf chain per element over k), then
    fl(y + b) with a bias (train_layers.c's q/k/v bias: one rounding, as
    torch's addmm); dx = dy W (NN); dW (and db, the column sums of dy) as
    chunk partials into the active GradReduction."""
    if _tc.compiling():
        return _tc.call("linear", (x, weight, bias, num_threads))
    x, weight, bias, mb, idx = _ops.linear_args(_FW, _check, _capture, "bitexact.torch.linear", x,
                                                weight, bias)
    return _fn.linear.apply(x, weight, bias, _threads(num_threads), mb, idx)


class Linear(torch.nn.Module):
    """torch.nn.Linear through the bitexact kernels (GLM-4.5's projections:
    bias-free by default; q/k/v carry one with attention_bias). weight
    [out_features, in_features], bias [out_features] or None; torch's init."""

    def __init__(self, in_features, out_features, bias=False, device=None, dtype=None):
        super().__init__()
        ref = torch.nn.Linear(in_features, out_features, bias=bool(bias), device=device,
                              dtype=dtype)
        self.in_features, self.out_features = in_features, out_features
        self.weight = ref.weight
        self.bias = ref.bias
        self.num_threads = None

    def forward(self, x):
        return linear(x, self.weight, self.bias, self.num_threads)


# ---- RMSNorm --------------------------------------------------------------

def rms_norm(x, weight, eps=1e-6, num_threads=None):
    """Glm4MoeRMSNorm over the last dimension (bx_rmsnorm_*: sequential
    sum of squares, correctly rounded rsqrt); x [..., H] whose rows are
    tokens or a whole number of rows per token (QK-norm [T, heads, D])."""
    if _tc.compiling():
        return _tc.call("rms_norm", (x, weight, float(eps), num_threads))
    fn = "bitexact.torch.rms_norm"
    weight = _check(fn, "weight", weight, ndim=(1,))
    x = _check(fn, "input", x)
    if x.shape[-1] != weight.shape[0]:
        raise _err(InvalidArgumentError, fn, "input", f"last dimension {x.shape[-1]} != "
                   f"weight's {weight.shape[0]}")
    mb, (wi,) = _capture(fn, [(weight, "weight", x.numel() // max(1, x.shape[-1]))], exact=False)
    return _fn.rmsnorm.apply(x, weight, float(eps), _threads(num_threads), mb, wi)


class RMSNorm(torch.nn.Module):
    """Glm4MoeRMSNorm(hidden_size, eps) through bx_rmsnorm_forward/backward;
    the gain's gradient as per-chunk partials (bounded on the partials)."""

    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, dtype=_F32))
        self.eps, self.num_threads = eps, None

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps, self.num_threads)


# ---- SwiGLU -----------------------------------------------------------------

def swiglu(gate, up, num_threads=None):
    """h = SiLU(gate) * up (bx_swiglu_forward: SiLU correctly rounded, one
    product); the backward is torch's silu_backward formula with its FMA."""
    if _tc.compiling():
        return _tc.call("swiglu", (gate, up, num_threads))
    fn = "bitexact.torch.swiglu"
    gate, up = _check(fn, "gate", gate), _check(fn, "up", up)
    if gate.shape != up.shape:
        raise _err(InvalidArgumentError, fn, "up", f"has shape {tuple(up.shape)}, gate "
                   f"{tuple(gate.shape)}")
    return _fn.swiglu.apply(gate, up, _threads(num_threads))


def swiglu_mlp(x, gate_weight, up_weight, down_weight, num_threads=None):
    """down(SiLU(gate(x)) * up(x)) with bias-free projections (Glm4MoeMLP):
    gate_weight, up_weight [I, H], down_weight [H, I]."""
    if _tc.compiling():
        return _tc.call("swiglu_mlp", (x, gate_weight, up_weight, down_weight, num_threads))
    fn = "bitexact.torch.swiglu_mlp"
    wg = _check(fn, "gate_weight", gate_weight, ndim=(2,))
    wu = _check(fn, "up_weight", up_weight, ndim=(2,))
    wd = _check(fn, "down_weight", down_weight, ndim=(2,))
    x = _check(fn, "input", x)
    H, I = wg.shape[1], wg.shape[0]
    if wu.shape != wg.shape or wd.shape != (H, I):
        raise _err(InvalidArgumentError, fn, "up_weight" if wu.shape != wg.shape else "down_weight",
                   f"shapes gate {tuple(wg.shape)}, up {tuple(wu.shape)}, down {tuple(wd.shape)} "
                   f"do not fit ([I, H], [I, H], [H, I])")
    if x.shape[-1] != H:
        raise _err(InvalidArgumentError, fn, "input", f"has {x.shape[-1]} features, not {H}")
    rows = x.numel() // max(1, H)
    mb, idx = _capture(fn, [(wg, "gate_weight", rows), (wu, "up_weight", rows),
                            (wd, "down_weight", rows)])
    return _fn.mlp.apply(x, wg, wu, wd, _threads(num_threads), mb, tuple(idx))


class SwiGLUMLP(_ops.SwiGLUMLPBase, torch.nn.Module):
    """Glm4MoeMLP(hidden_size, intermediate_size): gate_proj, up_proj,
    down_proj (bias-free Linear weights, torch's init), one autograd node."""


# ---- Embedding ----------------------------------------------------------------

def embedding(ids, weight, padding_idx=None, num_threads=None):
    """y = weight[ids] (bits copied); the gradient as compact per-chunk rows
    (bx_embedding_backward), bounded and added to the GradReduction."""
    if _tc.compiling():
        return _tc.call("embedding", (ids, weight, padding_idx, num_threads))
    fn = "bitexact.torch.embedding"
    weight = _check(fn, "weight", weight, ndim=(2,))
    ids = _check(fn, "input", ids, (torch.int32, torch.int64))
    V = weight.shape[0]
    pad = -1 if padding_idx is None else (padding_idx + V if padding_idx < 0 else padding_idx)
    mb, (wi,) = _capture(fn, [(weight, "weight", ids.numel())])
    with _g.all_or_nothing(mb, (wi,)):  # an id out of range: nothing registered
        return _fn.embedding.apply(weight, ids, pad, _threads(num_threads), mb, wi)


class Embedding(torch.nn.Module):
    """torch.nn.Embedding(num_embeddings, embedding_dim, padding_idx) lookup
    (normal(0, 1) init as torch's) through bx_embedding_*."""

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None):
        super().__init__()
        ref = torch.nn.Embedding(num_embeddings, embedding_dim, padding_idx=padding_idx)
        self.weight, self.padding_idx, self.num_threads = ref.weight, padding_idx, None

    def forward(self, ids):
        return embedding(ids, self.weight, self.padding_idx, self.num_threads)


# ---- cross-entropy --------------------------------------------------------------

def cross_entropy(logits, targets, ignore_index=-100, num_threads=None):
    """The global-token-mean cross-entropy (bx_xent_forward_backward).
    Inside a GradReduction micro-batch: returns this micro-batch's sum over
    its valid targets / the step's n_targets (exact sum, rounded once); its
    gradient is that of the global mean; ``red.loss`` after finish is the
    step's loss. Without one: the mean over this call's valid targets (as
    F.cross_entropy's reduction='mean')."""
    if _tc.compiling():
        return _tc.call("cross_entropy", (logits, targets, ignore_index, num_threads))
    fn = "bitexact.torch.cross_entropy"
    logits = _check(fn, "input", logits, ndim=(2, 3))
    targets = _check(fn, "target", targets, (torch.int32, torch.int64), ndim=(1, 2))
    if tuple(targets.shape) != tuple(logits.shape[:-1]):
        raise _err(InvalidArgumentError, fn, "target", f"has shape {tuple(targets.shape)}, the "
                   f"logits {tuple(logits.shape)} want {tuple(logits.shape[:-1])}")
    mb, n_global = _ops.xent_step(_FW, fn, targets, ignore_index)
    with _g.all_or_nothing(mb, loss=True):  # a target out of range
        return _fn.xent.apply(logits, targets, int(ignore_index), _threads(num_threads), mb,
                              n_global)


class CrossEntropyLoss(_ops.CrossEntropyLossBase, torch.nn.Module):
    """torch.nn.CrossEntropyLoss(ignore_index=-100) over [T, V] / [B, L, V]
    logits and [T] / [B, L] targets; see :func:`cross_entropy`."""


# ---- RoPE and causal GQA attention (no weights) ----------------------------------

def rope(x, positions, head_dim, rotary_dim=None, theta=10000.0, num_threads=None):
    """transformers' apply_rotary_pos_emb (rotate_half, partial rotary: the
    first rotary_dim features of each head) on x [T, heads*head_dim] (or
    [T, heads, head_dim], [B, L, heads*head_dim]); positions int64, T
    elements. cos/sin correctly rounded (bx_rope_*)."""
    if _tc.compiling():
        return _tc.call("rope", (x, positions, head_dim, rotary_dim, float(theta), num_threads))
    fn = "bitexact.torch.rope"
    x = _check(fn, "input", x, min_ndim=2)
    positions = _check(fn, "positions", positions, (torch.int64,))
    rd = head_dim if rotary_dim is None else rotary_dim
    return _fn.rope.apply(x, positions, int(head_dim), int(rd), float(theta), _threads(num_threads))


class RotaryEmbedding(_ops.RotaryEmbeddingBase, torch.nn.Module):
    """RoPE of head_dim with rotary_dim = int(head_dim * partial_rotary_factor)."""


def causal_attention(q, k, v, seq_len, num_heads, num_kv_heads, head_dim, num_threads=None):
    """Causal GQA eager attention (transformers' eager_attention_forward, no
    dropout) on projected, normed, rotated q [T, Hq*D], k, v [T, Hkv*D]
    (or [B, L, F]), sequences of seq_len tokens never mixed
    (bx_attention_forward / backward)."""
    if _tc.compiling():
        return _tc.call("causal_attention", (q, k, v, seq_len, num_heads, num_kv_heads,
                                             head_dim, num_threads))
    fn = "bitexact.torch.causal_attention"
    q, k, v = (_check(fn, n, t, min_ndim=2) for n, t in (("query", q), ("key", k), ("value", v)))
    dims = (int(seq_len), int(num_heads), int(num_kv_heads), int(head_dim))
    return _fn.attention.apply(q, k, v, dims, _threads(num_threads))


def qkv_projection(x, q_weight, k_weight, v_weight, num_threads=None, *, q_bias=None,
                   k_bias=None, v_bias=None):
    """(x Wq^T [+ bq], x Wk^T [+ bk], x Wv^T [+ bv]) as one autograd node
    (dx one fmaf chain over the three, as `bitexact train`; each bias added
    after its product, fl(y + b))."""
    if _tc.compiling():
        return _tc.call("qkv_projection", (x, q_weight, k_weight, v_weight, num_threads,
                                           q_bias, k_bias, v_bias))
    x, ws, bs, mb, pairs = _ops.qkv_args(_FW, _check, _capture, "bitexact.torch.qkv_projection",
                                         x, (q_weight, k_weight, v_weight), (q_bias, k_bias, v_bias))
    return _fn.qkv.apply(x, *ws, *bs, _threads(num_threads), mb, pairs)


class CausalAttention(_ops.CausalAttentionBase, torch.nn.Module):
    """Glm4MoeAttention without biases and QK-norm: q/k/v/o projections
    (bitexact Linear weights; q/k/v as one qkv_projection node), RoPE on q and k, causal GQA attention per sequence
    of seq_len tokens. forward(x [B, L, H] or [T, H], positions [T])."""
