"""Small models and helpers shared by the FSDP1 and FSDP2 workers of the
torch port (written for these tests, modelled on the shapes upstream's
test helpers use: a transformer with a shared embedding/output weight, a
nested stack of linears, a token transformer, an MLP stack)."""
import os
import traceback

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

VOCAB = 23


class SharedTransformer(nn.Module):
    """nn.Transformer (1 encoder + 1 decoder layer, d_model 16) whose
    output projection shares the embedding's weight (a tied parameter)."""

    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(VOCAB, 16)
        self.transformer = nn.Transformer(16, 2, 1, 1, dim_feedforward=8, dropout=0.0)
        self.output = nn.Linear(16, VOCAB)
        self.output.weight = self.embed.weight

    def forward(self, src, tgt):
        return self.output(self.transformer(self.embed(src), self.embed(tgt)))

    @staticmethod
    def get_input(rank, step=0):
        g = torch.Generator().manual_seed(1 + rank + 100 * step)
        return (torch.randint(0, VOCAB, (5, 3), generator=g),
                torch.randint(0, VOCAB, (4, 3), generator=g))


def nested_linears(wrap, seed=0):
    """Linear(8,4) -> wrap(Seq(wrap(Linear(4,16)), Linear(16,16))) ->
    wrap(Linear(16,8)); wrap is FSDP(...) or the identity."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 4),
                         wrap(nn.Sequential(wrap(nn.Linear(4, 16)), nn.Linear(16, 16))),
                         wrap(nn.Linear(16, 8)))


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.wq, self.wk = nn.Linear(dim, dim, bias=False), nn.Linear(dim, dim, bias=False)
        self.wv, self.wo = nn.Linear(dim, dim, bias=False), nn.Linear(dim, dim, bias=False)
        self.norm2 = nn.LayerNorm(dim)
        self.w1, self.w2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, s, d = x.shape
        h = self.norm1(x)
        q, k, v = (w(h).view(b, s, self.heads, -1).transpose(1, 2)
                   for w in (self.wq, self.wk, self.wv))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(a.transpose(1, 2).reshape(b, s, d))
        return x + self.w2(F.gelu(self.w1(self.norm2(x))))


class TokenTransformer(nn.Module):
    """Token + position embeddings, 2 blocks, final norm, output head."""

    def __init__(self, vocab=8, dim=16, heads=4, layers=2, seq=16):
        super().__init__()
        self.vocab = vocab
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq, dim)
        self.layers = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for layer in self.layers:
            x = layer(x)
        return self.output(self.norm(x))


class MLPStack(nn.Sequential):
    """LayerNorm + 3 x (Linear(d, 4d), ReLU, Linear(4d, d)) + LayerNorm."""

    def __init__(self, dim=16, blocks=3):
        mods = [nn.LayerNorm(dim)]
        for _ in range(blocks):
            mods.append(nn.Sequential(nn.Linear(dim, 4 * dim), nn.ReLU(),
                                      nn.Linear(4 * dim, dim)))
        mods.append(nn.LayerNorm(dim))
        super().__init__(*mods)


def init_group(rank, ws, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=ws)


def guard(fn, *args):
    """A worker scenario's result, or its traceback (the test reports it)."""
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001
        return {"exception": traceback.format_exc()}


def save_and_close(res, rank, out_dir):
    """A worker's last steps: its results to <out_dir>/rank<r>.pt, then
    leave the group together."""
    torch.save(res, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gather_pieces(tensors):
    """Every rank's tensors (flattened, exact fp64 copies) on every rank,
    concatenated in rank order: the whole set for the exact reference."""
    mine = [t.detach().reshape(-1).to(torch.float64) for t in tensors]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, mine)
    return [t for part in out for t in part]
