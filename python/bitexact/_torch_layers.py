"""bitexact.torch layers: the training kernels (bitexact.kernels) as torch
autograd Functions and nn.Modules (docs/torch_layers.md).

Every forward and backward value is computed by a bitexact kernel (torch
only allocates, copies to contiguous and reshapes); the bits are those of
`bitexact train`'s kernels, composed as src/cli/train_layers.c composes
them. Weight gradients never go through torch's accumulation into
``.grad``: each Function adds its per-chunk partials to the active
:class:`~bitexact._torch_gradred.GradReduction` (its backward returns None
for the weight), which writes every ``.grad`` at ``finish``. Inputs that
are plain autograd leaves get torch's gradient as usual, once per pass.

Functions here run in the calling thread (the kernels release the GIL and
use up to ``num_threads`` workers: module attribute, else the active
reduction's, else the library default; bits never depend on it). The
GLM-4.5 MoE block is in _torch_moe.py. Not covered yet: bias terms, QK-norm
inside CausalAttention (RMSNorm on [T, heads, D] works), bf16 compute,
CUDA tensors, torch.compile custom ops.
"""
import torch

from . import InvalidArgumentError
from . import _gradred as _g
from . import kernels as _k
from ._torch_gradred import (GradReduction, _F32, _active, _capture, _check, _err, _partials,
                             _rows, _threads, _wgrad)

__all__ = ["GradReduction", "Linear", "RMSNorm", "SwiGLUMLP", "Embedding", "CrossEntropyLoss",
           "RotaryEmbedding", "CausalAttention", "linear", "rms_norm", "swiglu", "swiglu_mlp",
           "embedding", "cross_entropy", "rope", "causal_attention", "qkv_projection"]


# ---- Linear ---------------------------------------------------------------

class _LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, num_threads, mb, widx):
        K = weight.shape[1]
        x2 = _rows(x, K)
        y = torch.empty(x2.shape[0], weight.shape[0], dtype=_F32)
        _k.gemm(x2, weight, "nt", y, num_threads=num_threads)
        ctx.save_for_backward(x2, weight)
        ctx.meta = (x.shape, num_threads, mb, widx)
        return y.view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, dy):
        shape, nt, mb, widx = ctx.meta
        if widx is not None:
            mb.check("Linear backward")  # first: a stale pass computes nothing
        x2, weight = ctx.saved_tensors
        dy2 = _rows(dy.contiguous(), weight.shape[0])
        dx = None
        if ctx.needs_input_grad[0]:
            dx = torch.empty(x2.shape, dtype=_F32)
            _k.gemm(dy2, weight, "nn", dx, num_threads=nt)
            dx = dx.view(shape)
        if widx is not None:
            _wgrad(mb, widx, dy2, x2, "Linear backward")
        return dx, None, None, None, None


def linear(x, weight, num_threads=None):
    """y = x W^T (bx_gemm NT, one fmaf chain per element over k); dx = dy W
    (NN); dW as chunk partials into the active GradReduction."""
    fn = "bitexact.torch.linear"
    weight = _check(fn, "weight", weight, ndim=(2,))
    x = _check(fn, "input", x)
    if x.shape[-1] != weight.shape[1]:
        raise _err(InvalidArgumentError, fn, "input", f"has {x.shape[-1]} features, weight "
                   f"{tuple(weight.shape)} wants {weight.shape[1]}")
    rows = x.numel() // max(1, x.shape[-1])
    mb, (wi,) = _capture(fn, [(weight, "weight", rows)])
    return _LinearFn.apply(x, weight, _threads(num_threads), mb, wi)


class Linear(torch.nn.Module):
    """torch.nn.Linear without bias (GLM-4.5's projections), through the
    bitexact kernels. weight [out_features, in_features], torch's init."""

    def __init__(self, in_features, out_features, bias=False, device=None, dtype=None):
        super().__init__()
        if bias:
            raise InvalidArgumentError("bitexact.torch.Linear: bias is not supported yet")
        ref = torch.nn.Linear(in_features, out_features, bias=False, device=device, dtype=dtype)
        self.in_features, self.out_features = in_features, out_features
        self.weight = ref.weight
        self.num_threads = None

    def forward(self, x):
        return linear(x, self.weight, self.num_threads)


# ---- RMSNorm --------------------------------------------------------------

class _RMSNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps, num_threads, mb, widx):
        H = weight.shape[0]
        x2 = _rows(x, H)
        y = torch.empty(x2.shape, dtype=_F32)
        rstd = torch.empty(x2.shape[0], dtype=_F32)
        _k.rmsnorm_forward(x2, weight, eps, y, rstd, num_threads=num_threads)
        ctx.save_for_backward(x2, weight, rstd)
        ctx.meta = (x.shape, num_threads, mb, widx)
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        shape, nt, mb, widx = ctx.meta
        if widx is not None:
            mb.check("RMSNorm backward")
        x2, weight, rstd = ctx.saved_tensors
        dy2 = _rows(dy.contiguous(), weight.shape[0])
        dx = torch.empty(x2.shape, dtype=_F32)
        parts, per_chunk = None, x2.shape[0]
        if widx is not None:
            per_chunk = x2.shape[0] // mb.T * mb.red.seq_len  # rows per token * tokens per chunk
            parts = torch.empty(-(-x2.shape[0] // per_chunk), weight.shape[0], dtype=_F32)
        _k.rmsnorm_backward(x2, weight, dy2, rstd, per_chunk, dx, parts, num_threads=nt)
        if widx is not None:
            _partials(mb, widx, parts, "RMSNorm backward")
        return (dx.view(shape) if ctx.needs_input_grad[0] else None), None, None, None, None, None


def rms_norm(x, weight, eps=1e-6, num_threads=None):
    """Glm4MoeRMSNorm over the last dimension (bx_rmsnorm_*: sequential
    sum of squares, correctly rounded rsqrt); x [..., H] whose rows are
    tokens or a whole number of rows per token (QK-norm [T, heads, D])."""
    fn = "bitexact.torch.rms_norm"
    weight = _check(fn, "weight", weight, ndim=(1,))
    x = _check(fn, "input", x)
    if x.shape[-1] != weight.shape[0]:
        raise _err(InvalidArgumentError, fn, "input", f"last dimension {x.shape[-1]} != "
                   f"weight's {weight.shape[0]}")
    mb, (wi,) = _capture(fn, [(weight, "weight", x.numel() // max(1, x.shape[-1]))], exact=False)
    return _RMSNormFn.apply(x, weight, float(eps), _threads(num_threads), mb, wi)


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

class _SwiGLUFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up, num_threads):
        h = torch.empty(gate.shape, dtype=_F32)
        _k.swiglu_forward(gate, up, h, num_threads=num_threads)
        ctx.save_for_backward(gate, up)
        ctx.nt = num_threads
        return h

    @staticmethod
    def backward(ctx, dh):
        gate, up = ctx.saved_tensors
        dg, du = torch.empty(gate.shape, dtype=_F32), torch.empty(gate.shape, dtype=_F32)
        _k.swiglu_backward(gate, up, dh.contiguous(), dg, du, num_threads=ctx.nt)
        return dg, du, None


def swiglu(gate, up, num_threads=None):
    """h = SiLU(gate) * up (bx_swiglu_forward: SiLU correctly rounded, one
    product); the backward is torch's silu_backward formula with its FMA."""
    fn = "bitexact.torch.swiglu"
    gate, up = _check(fn, "gate", gate), _check(fn, "up", up)
    if gate.shape != up.shape:
        raise _err(InvalidArgumentError, fn, "up", f"has shape {tuple(up.shape)}, gate "
                   f"{tuple(gate.shape)}")
    return _SwiGLUFn.apply(gate, up, _threads(num_threads))


class _MLPFn(torch.autograd.Function):
    """Glm4MoeMLP as train_layers.c computes it: g = x Wg^T, u = x Wu^T,
    a = swiglu(g, u), y = a Wd^T; backward da = dy Wd, (dg, du), then
    dx = dg Wg + du Wu as ONE fmaf chain per element (the second NN GEMM
    accumulates onto the first), so the bits equal `bitexact train`'s
    (two autograd branches would add two rounded products instead)."""

    @staticmethod
    def forward(ctx, x, wg, wu, wd, num_threads, mb, idx):
        H, I = wg.shape[1], wg.shape[0]
        x2 = _rows(x, H)
        T = x2.shape[0]
        g, u, a = (torch.empty(T, I, dtype=_F32) for _ in range(3))
        _k.gemm(x2, wg, "nt", g, num_threads=num_threads)
        _k.gemm(x2, wu, "nt", u, num_threads=num_threads)
        _k.swiglu_forward(g, u, a, num_threads=num_threads)
        y = torch.empty(T, wd.shape[0], dtype=_F32)
        _k.gemm(a, wd, "nt", y, num_threads=num_threads)
        ctx.save_for_backward(x2, wg, wu, wd, g, u, a)
        ctx.meta = (x.shape, num_threads, mb, idx)
        return y.view(*x.shape[:-1], wd.shape[0])

    @staticmethod
    def backward(ctx, dy):
        shape, nt, mb, (ig, iu, idd) = ctx.meta
        if mb is not None:
            mb.check("SwiGLUMLP backward")
        x2, wg, wu, wd, g, u, a = ctx.saved_tensors
        dy2 = _rows(dy.contiguous(), wd.shape[0])
        da = torch.empty(a.shape, dtype=_F32)
        _k.gemm(dy2, wd, "nn", da, num_threads=nt)
        if idd is not None:
            _wgrad(mb, idd, dy2, a, "SwiGLUMLP backward (down_proj)")
        dg, du = torch.empty(g.shape, dtype=_F32), torch.empty(u.shape, dtype=_F32)
        _k.swiglu_backward(g, u, da, dg, du, num_threads=nt)
        dx = None
        if ctx.needs_input_grad[0]:
            dx = torch.empty(x2.shape, dtype=_F32)
            _k.gemm(dg, wg, "nn", dx, num_threads=nt)
            _k.gemm(du, wu, "nn", dx, accumulate=True, num_threads=nt)
            dx = dx.view(shape)
        if ig is not None:
            _wgrad(mb, ig, dg, x2, "SwiGLUMLP backward (gate_proj)")
        if iu is not None:
            _wgrad(mb, iu, du, x2, "SwiGLUMLP backward (up_proj)")
        return dx, None, None, None, None, None, None


def swiglu_mlp(x, gate_weight, up_weight, down_weight, num_threads=None):
    """down(SiLU(gate(x)) * up(x)) with bias-free projections (Glm4MoeMLP):
    gate_weight, up_weight [I, H], down_weight [H, I]."""
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
    return _MLPFn.apply(x, wg, wu, wd, _threads(num_threads), mb, tuple(idx))


class SwiGLUMLP(torch.nn.Module):
    """Glm4MoeMLP(hidden_size, intermediate_size): gate_proj, up_proj,
    down_proj (bias-free Linear weights, torch's init), one autograd node."""

    def __init__(self, hidden_size, intermediate_size):
        super().__init__()
        self.gate_proj = Linear(hidden_size, intermediate_size)
        self.up_proj = Linear(hidden_size, intermediate_size)
        self.down_proj = Linear(intermediate_size, hidden_size)
        self.num_threads = None

    def forward(self, x):
        return swiglu_mlp(x, self.gate_proj.weight, self.up_proj.weight, self.down_proj.weight,
                          self.num_threads)


# ---- Embedding ----------------------------------------------------------------

class _EmbeddingFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, weight, ids, padding_idx, num_threads, mb, widx):
        y = torch.empty(*ids.shape, weight.shape[1], dtype=_F32)
        _k.embedding_forward(weight, ids, y, padding_idx=padding_idx, num_threads=num_threads)
        ctx.save_for_backward(ids)
        ctx.meta = (weight.shape, padding_idx, num_threads, mb, widx)
        return y

    @staticmethod
    def backward(ctx, dy):
        (ids,) = ctx.saved_tensors
        (V, H), pad, nt, mb, widx = ctx.meta
        if widx is None:
            return None, None, None, None, None, None
        mb.check("Embedding backward")  # first: a stale pass computes nothing
        T, C = ids.numel(), mb.red.seq_len
        nch = -(-T // C)
        row_ids = torch.empty(T, dtype=torch.int64)
        rows = torch.empty(T, H, dtype=_F32)
        offsets = torch.empty(nch + 1, dtype=torch.int64)
        ids1 = ids.reshape(-1)
        _k.embedding_backward(ids1, _rows(dy.contiguous(), H), V, C, row_ids, rows, offsets,
                              padding_idx=pad, num_threads=nt)
        _g.embedding_grad(mb, widx, row_ids, rows, offsets)
        return None, None, None, None, None, None


def embedding(ids, weight, padding_idx=None, num_threads=None):
    """y = weight[ids] (bits copied); the gradient as compact per-chunk rows
    (bx_embedding_backward), bounded and added to the GradReduction."""
    fn = "bitexact.torch.embedding"
    weight = _check(fn, "weight", weight, ndim=(2,))
    ids = _check(fn, "input", ids, (torch.int32, torch.int64))
    V = weight.shape[0]
    pad = -1 if padding_idx is None else (padding_idx + V if padding_idx < 0 else padding_idx)
    mb, (wi,) = _capture(fn, [(weight, "weight", ids.numel())])
    return _EmbeddingFn.apply(weight, ids, pad, _threads(num_threads), mb, wi)


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

def _exact_mean(partials, chunk, total, divisor):
    """sum(partials) / divisor, the exact sum rounded once."""
    return _g.exact_mean(lambda j: partials[j], partials.shape[0], chunk, total, divisor,
                         torch.empty((), dtype=_F32))


class _XentFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, ignore_index, num_threads, mb, n_global):
        V = logits.shape[-1]
        z = _rows(logits, V)
        T = z.shape[0]
        t1 = targets.reshape(-1)
        C = mb.red.seq_len if mb is not None else max(T, 1)
        nch = -(-T // C)
        losses = torch.empty(T, dtype=_F32)
        parts = torch.empty(nch, dtype=_F32)
        dz = torch.empty(z.shape, dtype=_F32)
        _k.xent_forward_backward(z, t1, n_global, C, losses, parts, None, dz,
                                 ignore_index=ignore_index, num_threads=num_threads)
        if mb is not None:  # the step's loss: the partials into the loss reduction
            _g.loss_partials(mb, lambda j: parts[j], nch, "cross_entropy")
        ctx.save_for_backward(z, t1, dz)
        ctx.meta = (logits.shape, ignore_index, num_threads, n_global, mb)
        return _exact_mean(parts, C, T, n_global)

    @staticmethod
    def backward(ctx, dloss):
        shape, ign, nt, n_global, mb = ctx.meta
        if mb is not None:
            mb.check("cross_entropy backward")
        z, t1, dz = ctx.saved_tensors
        scale = float(dloss)
        if scale != 1.0:  # the kernels' grad_scale (1.0: the forward's dlogits)
            dz = torch.empty(z.shape, dtype=_F32)
            _k.xent_backward(z, t1, n_global, dz, ignore_index=ign, grad_scale=scale, num_threads=nt)
        return dz.view(shape), None, None, None, None, None


def cross_entropy(logits, targets, ignore_index=-100, num_threads=None):
    """The global-token-mean cross-entropy (bx_xent_forward_backward).
    Inside a GradReduction micro-batch: returns this micro-batch's sum over
    its valid targets / the step's n_targets (exact sum, rounded once); its
    gradient is that of the global mean; ``red.loss`` after finish is the
    step's loss. Without one: the mean over this call's valid targets (as
    F.cross_entropy's reduction='mean')."""
    fn = "bitexact.torch.cross_entropy"
    logits = _check(fn, "input", logits, ndim=(2, 3))
    targets = _check(fn, "target", targets, (torch.int32, torch.int64), ndim=(1, 2))
    if tuple(targets.shape) != tuple(logits.shape[:-1]):
        raise _err(InvalidArgumentError, fn, "target", f"has shape {tuple(targets.shape)}, the "
                   f"logits {tuple(logits.shape)} want {tuple(logits.shape[:-1])}")
    red = _active()
    mb = red._mb if red is not None else None
    if mb is not None:
        if mb.loss_used:
            raise InvalidArgumentError(f"{fn}: called twice in one micro-batch (the loss's chunk "
                                       "partials would be added twice)")
        if targets.numel() != mb.T:
            raise _err(InvalidArgumentError, fn, "target", f"has {targets.numel()} tokens, the "
                       f"micro-batch holds {mb.T}")
        mb.loss_used = True
        n_global = red.n_targets
    else:
        counts = torch.empty(1, dtype=torch.int64)
        _k.xent_count(targets.reshape(-1), max(targets.numel(), 1), counts, ignore_index=ignore_index)
        n_global = max(int(counts[0]), 1)
    return _XentFn.apply(logits, targets, int(ignore_index), _threads(num_threads), mb, n_global)


class CrossEntropyLoss(torch.nn.Module):
    """torch.nn.CrossEntropyLoss(ignore_index=-100) over [T, V] / [B, L, V]
    logits and [T] / [B, L] targets; see :func:`cross_entropy`."""

    def __init__(self, ignore_index=-100):
        super().__init__()
        self.ignore_index, self.num_threads = ignore_index, None

    def forward(self, logits, targets):
        return cross_entropy(logits, targets, self.ignore_index, self.num_threads)


# ---- RoPE and causal GQA attention (no weights) ----------------------------------

class _RopeFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, positions, head_dim, rotary_dim, theta, num_threads):
        y = torch.empty(x.shape, dtype=_F32)
        _k.rope_forward(x, positions, head_dim, rotary_dim, theta, y, num_threads=num_threads)
        ctx.save_for_backward(positions)
        ctx.meta = (head_dim, rotary_dim, theta, num_threads)
        return y

    @staticmethod
    def backward(ctx, dy):
        (positions,) = ctx.saved_tensors
        hd, rd, theta, nt = ctx.meta
        dx = torch.empty(dy.shape, dtype=_F32)
        _k.rope_backward(dy.contiguous(), positions, hd, rd, theta, dx, num_threads=nt)
        return dx, None, None, None, None, None


def rope(x, positions, head_dim, rotary_dim=None, theta=10000.0, num_threads=None):
    """transformers' apply_rotary_pos_emb (rotate_half, partial rotary: the
    first rotary_dim features of each head) on x [T, heads*head_dim] (or
    [T, heads, head_dim], [B, L, heads*head_dim]); positions int64, T
    elements. cos/sin correctly rounded (bx_rope_*)."""
    fn = "bitexact.torch.rope"
    x = _check(fn, "input", x, min_ndim=2)
    positions = _check(fn, "positions", positions, (torch.int64,))
    rd = head_dim if rotary_dim is None else rotary_dim
    return _RopeFn.apply(x, positions, int(head_dim), int(rd), float(theta), _threads(num_threads))


class RotaryEmbedding(torch.nn.Module):
    """RoPE of head_dim with rotary_dim = int(head_dim * partial_rotary_factor)."""

    def __init__(self, head_dim, partial_rotary_factor=1.0, theta=10000.0):
        super().__init__()
        self.head_dim, self.rotary_dim = head_dim, int(head_dim * partial_rotary_factor)
        self.theta, self.num_threads = theta, None

    def forward(self, x, positions):
        return rope(x, positions, self.head_dim, self.rotary_dim, self.theta, self.num_threads)


class _AttnFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, dims, num_threads):
        L, Hq, Hkv, D = dims
        T = q.numel() // (Hq * D)
        o = torch.empty(q.shape, dtype=_F32)
        stats = torch.empty(T, Hq, 2, dtype=_F32)
        _k.attention_forward(q, k, v, L, Hq, Hkv, D, o, stats, num_threads=num_threads)
        ctx.save_for_backward(q, k, v, stats)
        ctx.meta = (dims, num_threads)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, stats = ctx.saved_tensors
        (L, Hq, Hkv, D), nt = ctx.meta
        dq, dk, dv = (torch.empty(t.shape, dtype=_F32) for t in (q, k, v))
        _k.attention_backward(do.contiguous(), q, k, v, stats, L, Hq, Hkv, D, dq, dk, dv,
                              num_threads=nt)
        return dq, dk, dv, None, None


def causal_attention(q, k, v, seq_len, num_heads, num_kv_heads, head_dim, num_threads=None):
    """Causal GQA eager attention (transformers' eager_attention_forward, no
    dropout) on projected, normed, rotated q [T, Hq*D], k, v [T, Hkv*D]
    (or [B, L, F]), sequences of seq_len tokens never mixed
    (bx_attention_forward / backward)."""
    fn = "bitexact.torch.causal_attention"
    q, k, v = (_check(fn, n, t, min_ndim=2) for n, t in (("query", q), ("key", k), ("value", v)))
    dims = (int(seq_len), int(num_heads), int(num_kv_heads), int(head_dim))
    return _AttnFn.apply(q, k, v, dims, _threads(num_threads))


class _QKVFn(torch.autograd.Function):
    """q, k, v = x Wq^T, x Wk^T, x Wv^T as one node: backward dx = dq Wq +
    dk Wk + dv Wv as ONE fmaf chain (the k and v NN GEMMs accumulate onto
    q's), as train_layers.c; three autograd branches would leave the order
    of the two rounded additions to the framework's engine."""

    @staticmethod
    def forward(ctx, x, wq, wk, wv, num_threads, mb, idx):
        K = wq.shape[1]
        x2 = _rows(x, K)
        outs = []
        for w in (wq, wk, wv):
            y = torch.empty(x2.shape[0], w.shape[0], dtype=_F32)
            _k.gemm(x2, w, "nt", y, num_threads=num_threads)
            outs.append(y.view(*x.shape[:-1], w.shape[0]))
        ctx.save_for_backward(x2, wq, wk, wv)
        ctx.meta = (x.shape, num_threads, mb, idx)
        return tuple(outs)

    @staticmethod
    def backward(ctx, dq, dk, dv):
        shape, nt, mb, idx = ctx.meta
        if mb is not None:
            mb.check("qkv_projection backward")
        x2, *ws = ctx.saved_tensors
        ds = [_rows(d.contiguous(), w.shape[0]) for d, w in zip((dq, dk, dv), ws)]
        dx = None
        if ctx.needs_input_grad[0]:
            dx = torch.empty(x2.shape, dtype=_F32)
            for j, (d, w) in enumerate(zip(ds, ws)):
                _k.gemm(d, w, "nn", dx, accumulate=j > 0, num_threads=nt)
            dx = dx.view(shape)
        for i, d, what in zip(idx, ds, ("q_proj", "k_proj", "v_proj")):
            if i is not None:
                _wgrad(mb, i, d, x2, f"qkv_projection backward ({what})")
        return dx, None, None, None, None, None, None


def qkv_projection(x, q_weight, k_weight, v_weight, num_threads=None):
    """(x Wq^T, x Wk^T, x Wv^T), bias-free, as one autograd node (dx one
    fmaf chain over the three, as `bitexact train`)."""
    fn = "bitexact.torch.qkv_projection"
    ws = [_check(fn, n, w, ndim=(2,)) for n, w in
          (("q_weight", q_weight), ("k_weight", k_weight), ("v_weight", v_weight))]
    x = _check(fn, "input", x)
    for n, w in zip(("q_weight", "k_weight", "v_weight"), ws):
        if w.shape[1] != x.shape[-1]:
            raise _err(InvalidArgumentError, fn, n, f"has shape {tuple(w.shape)}, the input "
                       f"{x.shape[-1]} features")
    rows = x.numel() // max(1, x.shape[-1])
    mb, idx = _capture(fn, [(w, n, rows) for n, w in zip(("q_weight", "k_weight", "v_weight"), ws)])
    return _QKVFn.apply(x, *ws, _threads(num_threads), mb, tuple(idx))


class CausalAttention(torch.nn.Module):
    """Glm4MoeAttention without biases and QK-norm: q/k/v/o projections
    (bitexact Linear weights; q/k/v as one qkv_projection node), RoPE on q and k, causal GQA attention per sequence
    of seq_len tokens. forward(x [B, L, H] or [T, H], positions [T])."""

    def __init__(self, hidden_size, num_heads, num_kv_heads, head_dim, seq_len,
                 partial_rotary_factor=1.0, theta=10000.0):
        super().__init__()
        self.q_proj = Linear(hidden_size, num_heads * head_dim)
        self.k_proj = Linear(hidden_size, num_kv_heads * head_dim)
        self.v_proj = Linear(hidden_size, num_kv_heads * head_dim)
        self.o_proj = Linear(num_heads * head_dim, hidden_size)
        self.rope = RotaryEmbedding(head_dim, partial_rotary_factor, theta)
        self.dims = (seq_len, num_heads, num_kv_heads, head_dim)

    def forward(self, x, positions):
        L, Hq, Hkv, D = self.dims
        q, k, v = qkv_projection(x, self.q_proj.weight, self.k_proj.weight, self.v_proj.weight,
                                 self.q_proj.num_threads)
        q, k = self.rope(q, positions), self.rope(k, positions)
        return self.o_proj(causal_attention(q, k, v, L, Hq, Hkv, D))
