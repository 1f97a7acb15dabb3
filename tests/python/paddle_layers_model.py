"""The tiny model of torch_layers_model.py built in Paddle: from
bitexact.paddle's layers (the cross-framework test) and, for the negative
control, from Paddle's native ops; the same initial weights (torch's
Tiny, copied through numpy), the same data, the same training loops; and
the paddle.distributed worker of the 2-process test."""
import os
import sys
import traceback

import numpy as np
import paddle
import paddle.nn.functional as PF

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bitexact.kernels as K  # noqa: E402
import bitexact.paddle as bp  # noqa: E402
import torch_layers_model as TM  # noqa: E402
from torch_layers_model import H, HEAD_DIM, HEADS, KV_HEADS, L, LR, SEQS, STEPS, I, V  # noqa: E402


class Tiny(paddle.nn.Layer):
    """TM.Tiny in Paddle: the same structure and parameter names; weights
    copied from TM.Tiny() (torch.manual_seed(0)) through numpy."""

    def __init__(self, native=False, attention=True):
        super().__init__()
        self.native, self.attention = native, attention
        self.embed = bp.Embedding(V, H)
        self.n1, self.n2, self.nf = bp.RMSNorm(H), bp.RMSNorm(H), bp.RMSNorm(H)
        if attention:
            self.attn = bp.CausalAttention(H, HEADS, KV_HEADS, HEAD_DIM, L)
        self.mlp = bp.SwiGLUMLP(H, I)
        self.head = bp.Linear(H, V)
        src = dict(TM.Tiny(attention=attention).named_parameters())
        for name, p in self.named_parameters():
            p.set_value(src[name].detach().numpy().copy())

    def forward(self, ids, positions):
        if not self.native:
            x = self.embed(ids)
            if self.attention:
                x = x + self.attn(self.n1(x), positions)
            x = x + self.mlp(self.n2(x))
            return self.head(self.nf(x))
        x = PF.embedding(ids, self.embed.weight)
        if self.attention:
            x = x + native_attention(self.attn, _rms(x, self.n1.weight), positions)
        xn = _rms(x, self.n2.weight)
        m = self.mlp
        x = x + _lin(PF.silu(_lin(xn, m.gate_proj.weight)) * _lin(xn, m.up_proj.weight),
                     m.down_proj.weight)
        return _lin(_rms(x, self.nf.weight), self.head.weight)


def _lin(x, w):
    return paddle.matmul(x, w, transpose_y=True)  # w [out, in]


def _rms(x, w, eps=1e-6):
    """Glm4MoeRMSNorm in Paddle ops (Paddle 3.3's rms_norm op is GPU-only)."""
    return x * paddle.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def native_rope(x, positions, head_dim, theta=10000.0):
    inv = 1.0 / (theta ** (paddle.arange(0, head_dim, 2, dtype="int64").astype("float32") / head_dim))
    ang = positions.astype("float32").unsqueeze(1) * inv.unsqueeze(0)
    emb = paddle.concat([ang, ang], axis=-1)
    cos, sin = emb.cos(), emb.sin()
    xs = x.reshape([x.shape[0], -1, head_dim])
    half = head_dim // 2
    rot = paddle.concat([-xs[..., half:], xs[..., :half]], axis=-1)
    return (xs * cos.unsqueeze(1) + rot * sin.unsqueeze(1)).reshape(x.shape)


def native_causal(q, k, v, seq_len, hq, hkv, d):
    T = q.shape[0]
    B = T // seq_len
    q = q.reshape([B, seq_len, hq, d]).transpose([0, 2, 1, 3])
    k = k.reshape([B, seq_len, hkv, d]).transpose([0, 2, 1, 3]).repeat_interleave(hq // hkv, axis=1)
    v = v.reshape([B, seq_len, hkv, d]).transpose([0, 2, 1, 3]).repeat_interleave(hq // hkv, axis=1)
    s = paddle.matmul(q, k, transpose_y=True) * d ** -0.5
    mask = paddle.triu(paddle.ones([seq_len, seq_len]), 1).astype("bool")
    s = paddle.where(mask, paddle.full_like(s, float("-inf")), s)
    o = paddle.matmul(PF.softmax(s, axis=-1), v)
    return o.transpose([0, 2, 1, 3]).reshape([T, hq * d])


def native_attention(attn, x, positions):
    q = native_rope(_lin(x, attn.q_proj.weight), positions, HEAD_DIM)
    k = native_rope(_lin(x, attn.k_proj.weight), positions, HEAD_DIM)
    o = native_causal(q, k, _lin(x, attn.v_proj.weight), L, HEADS, KV_HEADS, HEAD_DIM)
    return _lin(o, attn.o_proj.weight)


def batch(tokens):
    """TM.batch of a torch [n, L + 1] token block, as Paddle int64 tensors."""
    ids, tg, pos = TM.batch(tokens)
    return tuple(paddle.to_tensor(t.numpy()) for t in (ids, tg, pos))


def _np(ts):
    return [t.numpy().copy() for t in ts]


def train_bitexact(micro_batches=1, threads=1, rank=0, world=1, comm=None, attention=True):
    """TM.train_bitexact in Paddle: the same steps, micro-batches, AdamW
    (bitexact.kernels.adamw_step on the Paddle tensors). Returns numpy
    arrays: per-step losses, the last gradients, the final parameters."""
    model = Tiny(attention=attention)
    params = list(model.parameters())
    red = bp.GradReduction(model.named_parameters(), L, SEQS * L, num_threads=threads)
    m = [paddle.zeros_like(p) for p in params]
    v = [paddle.zeros_like(p) for p in params]
    local = SEQS // world
    per = local // micro_batches
    losses = []
    for step in range(STEPS):
        tokens = TM.data(step)[rank * local:(rank + 1) * local]
        mbs = [((rank * local + i * per) * L, per * L) for i in range(micro_batches)]

        def closure(i):
            ids, tg, pos = batch(tokens[i * per:(i + 1) * per])
            loss = bp.cross_entropy(model(ids, pos), tg)
            loss.backward()
            return loss.detach()

        red.run_two_pass(closure, mbs, comm=comm)
        losses.append(red.loss.numpy().copy())
        with paddle.no_grad():
            for p, a, b in zip(params, m, v):
                K.adamw_step(p, p.grad, a, b, step + 1, lr=LR, num_threads=threads)
    return losses, _np(p.grad for p in params), _np(params)


def train_native(micro_batches=1):
    """The negative control in Paddle: native ops, Paddle's gradient
    accumulation and paddle.optimizer.AdamW (torch's defaults: betas 0.9,
    0.999, eps 1e-8, weight_decay 0.01)."""
    model = Tiny(native=True)
    params = list(model.parameters())
    opt = paddle.optimizer.AdamW(learning_rate=LR, parameters=params, beta1=0.9, beta2=0.999,
                                 epsilon=1e-8, weight_decay=0.01)
    per = SEQS // micro_batches
    losses = []
    for step in range(STEPS):
        tokens = TM.data(step)
        opt.clear_grad()
        total = 0.0
        for i in range(micro_batches):
            ids, tg, pos = batch(tokens[i * per:(i + 1) * per])
            loss = PF.cross_entropy(model(ids, pos), tg, reduction="sum") / (SEQS * L)
            loss.backward()
            total = total + loss.detach()
        losses.append(total.numpy().copy())
        grads = _np(p.grad for p in params)
        opt.step()
    return losses, grads, _np(params)


def worker(out_dir, micro_batches):
    """One paddle.distributed rank (launched by paddle.distributed.launch
    with gloo on CPU): half the sequences, gradients through
    GradReduction.finish(bitexact.paddle.comm())."""
    import paddle.distributed as dist
    rank = int(os.environ.get("PADDLE_TRAINER_ID", "0"))
    res = {}
    try:
        dist.init_parallel_env()
        rank, world = dist.get_rank(), dist.get_world_size()
        res["run"] = train_bitexact(micro_batches, 1, rank, world, bp.comm())
    except Exception:  # noqa: BLE001 - reported to the test
        res["exception"] = traceback.format_exc()
    np.save(os.path.join(out_dir, f"rank{rank}.npy"), np.array(res, dtype=object),
            allow_pickle=True)


if __name__ == "__main__":
    worker(sys.argv[1], int(sys.argv[2]))
