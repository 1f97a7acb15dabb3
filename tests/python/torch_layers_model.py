"""The tiny model of test_torch_layers.py, built from bitexact.torch's
modules and, for the negative control, from plain torch modules; the
training loop for any micro-batching / thread count / data-parallel rank;
and the gloo worker of the 2-process test (mp.spawn needs a module)."""
import os
import sys
import traceback

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bitexact.kernels as K  # noqa: E402
import bitexact.torch as bt  # noqa: E402

V, H, I, HEADS, KV_HEADS, HEAD_DIM = 48, 16, 40, 4, 2, 4
L, SEQS, STEPS = 8, 8, 3
LR = 1e-2


def data(step):
    """Token sequences of the global batch of a step: [SEQS, L + 1]."""
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randint(0, V, (SEQS, L + 1), generator=g)


class Tiny(torch.nn.Module):
    """embedding -> RMSNorm -> causal attention (+ residual) -> RMSNorm ->
    SwiGLU MLP (+ residual) -> RMSNorm -> Linear head; with native=True the
    same formulas in plain torch modules (nn.Embedding, F.rms_norm,
    nn.Linear, F.silu, torch's attention formula)."""

    def __init__(self, native=False, attention=True):
        super().__init__()
        torch.manual_seed(0)
        self.native, self.attention = native, attention
        self.embed = bt.Embedding(V, H)
        self.n1, self.n2, self.nf = bt.RMSNorm(H), bt.RMSNorm(H), bt.RMSNorm(H)
        if attention:
            self.attn = bt.CausalAttention(H, HEADS, KV_HEADS, HEAD_DIM, L)
        self.mlp = bt.SwiGLUMLP(H, I)
        self.head = bt.Linear(H, V)
        with torch.no_grad():  # a non-trivial gain
            for n in (self.n1, self.n2, self.nf):
                n.weight.uniform_(0.5, 1.5)

    def forward(self, ids, positions):
        if not self.native:
            x = self.embed(ids)
            if self.attention:
                x = x + self.attn(self.n1(x), positions)
            x = x + self.mlp(self.n2(x))
            return self.head(self.nf(x))
        x = F.embedding(ids, self.embed.weight)
        if self.attention:
            x = x + native_attention(self.attn, F.rms_norm(x, (H,), self.n1.weight, 1e-6), positions)
        xn = F.rms_norm(x, (H,), self.n2.weight, 1e-6)
        m = self.mlp
        x = x + F.linear(F.silu(F.linear(xn, m.gate_proj.weight)) * F.linear(xn, m.up_proj.weight),
                         m.down_proj.weight)
        return F.linear(F.rms_norm(x, (H,), self.nf.weight, 1e-6), self.head.weight)


def native_rope(x, positions, head_dim, theta=10000.0):
    """transformers' rotate_half RoPE in torch fp32 (the full head rotates)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    ang = positions.float()[:, None] * inv[None, :]
    emb = torch.cat((ang, ang), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    xs = x.reshape(x.shape[0], -1, head_dim)
    half = head_dim // 2
    rot = torch.cat((-xs[..., half:], xs[..., :half]), dim=-1)
    return (xs * cos[:, None, :] + rot * sin[:, None, :]).reshape(x.shape)


def native_causal(q, k, v, seq_len, hq, hkv, d):
    """eager_attention_forward: repeat_kv, q k^T * d^-0.5, causal mask,
    softmax in the dtype, @ v; tokens [T, heads*d], sequences of seq_len."""
    T = q.shape[0]
    B = T // seq_len
    q = q.reshape(B, seq_len, hq, d).transpose(1, 2)
    k = k.reshape(B, seq_len, hkv, d).transpose(1, 2).repeat_interleave(hq // hkv, dim=1)
    v = v.reshape(B, seq_len, hkv, d).transpose(1, 2).repeat_interleave(hq // hkv, dim=1)
    s = torch.matmul(q, k.transpose(2, 3)) * d ** -0.5
    mask = torch.ones(seq_len, seq_len, dtype=torch.bool).triu(1)
    s = s.masked_fill(mask, float("-inf"))
    o = torch.matmul(torch.softmax(s, dim=-1), v)
    return o.transpose(1, 2).reshape(T, hq * d)


def native_attention(attn, x, positions):
    q = native_rope(F.linear(x, attn.q_proj.weight), positions, HEAD_DIM)
    k = native_rope(F.linear(x, attn.k_proj.weight), positions, HEAD_DIM)
    o = native_causal(q, k, F.linear(x, attn.v_proj.weight), L, HEADS, KV_HEADS, HEAD_DIM)
    return F.linear(o, attn.o_proj.weight)


def batch(tokens):
    """ids, targets [T] and positions [T] of whole sequences."""
    n = tokens.shape[0]
    return (tokens[:, :-1].reshape(-1), tokens[:, 1:].reshape(-1),
            torch.arange(L, dtype=torch.int64).repeat(n))


def train_bitexact(micro_batches=1, threads=1, rank=0, world=1, comm=None, attention=True):
    """STEPS steps of the bitexact model with AdamW (bitexact.kernels.
    adamw_step, torch's AdamW bits); this rank holds sequences
    [rank*SEQS/world, (rank+1)*SEQS/world) cut into micro_batches. Returns
    the per-step losses, the last gradients and the final parameters."""
    model = Tiny(attention=attention)
    params = list(model.parameters())
    red = bt.GradReduction(model.named_parameters(), L, SEQS * L, num_threads=threads)
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    local = SEQS // world
    per = local // micro_batches
    losses = []
    for step in range(STEPS):
        tokens = data(step)[rank * local:(rank + 1) * local]
        mbs = [((rank * local + i * per) * L, per * L) for i in range(micro_batches)]

        def closure(i):
            ids, tg, pos = batch(tokens[i * per:(i + 1) * per])
            loss = bt.cross_entropy(model(ids, pos), tg)
            loss.backward()
            return loss.detach()

        red.run_two_pass(closure, mbs, comm=comm)
        losses.append(red.loss)
        with torch.no_grad():
            for p, a, b in zip(params, m, v):
                K.adamw_step(p, p.grad, a, b, step + 1, lr=LR, num_threads=threads)
    return losses, [p.grad.clone() for p in params], [p.detach().clone() for p in params]


def train_native(micro_batches=1, threads=1, attention=True):
    """The negative control: the same model and data with plain torch
    modules, torch's gradient accumulation (loss sum / global count per
    micro-batch) and torch.optim.AdamW (foreach=False)."""
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        model = Tiny(native=True, attention=attention)
        params = list(model.parameters())
        opt = torch.optim.AdamW(params, lr=LR, foreach=False)
        per = SEQS // micro_batches
        losses = []
        for step in range(STEPS):
            tokens = data(step)
            opt.zero_grad()
            total = torch.zeros(())
            for i in range(micro_batches):
                ids, tg, pos = batch(tokens[i * per:(i + 1) * per])
                loss = F.cross_entropy(model(ids, pos), tg, reduction="sum") / (SEQS * L)
                loss.backward()
                total = total + loss.detach()
            losses.append(total)
            opt.step()
        return losses, [p.grad.clone() for p in params], [p.detach().clone() for p in params]
    finally:
        torch.set_num_threads(old)


def worker(rank, world, out_dir, micro_batches):
    """One gloo rank of the data-parallel test: half the sequences each,
    gradients through GradReduction.finish(bitexact.torch.comm())."""
    import torch.distributed as dist
    res = {}
    try:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        dist.init_process_group("gloo", rank=rank, world_size=world,
                                init_method=f"file://{os.path.join(out_dir, 'rdzv')}")
        res["run"] = train_bitexact(micro_batches, 1, rank, world, bt.comm())
        # a process group is accepted as comm as well
        res["group"] = train_bitexact(1, 2, rank, world, dist.group.WORLD)
    except Exception:  # noqa: BLE001 - reported to the test
        res["exception"] = traceback.format_exc()
    finally:
        torch.save(res, os.path.join(out_dir, f"rank{rank}.pt"))
        if dist.is_initialized():
            dist.destroy_process_group()
