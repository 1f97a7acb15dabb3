#!/usr/bin/env python3
"""bench_moe_torch.py — one GLM-4.5 MoE layer, forward + backward, in torch eager.

The baseline of bench_moe (bench/bench_moe.c): the layer as transformers'
Glm4MoeMoE computes it (router linear in fp32, sigmoid, e_score_correction_bias
for the choice, group-limited top-k, gather, normalisation, routed scaling;
Glm4MoeNaiveMoe's loop over the experts hit, gate_up linear, silu(gate) * up,
down linear, times the weight, index_add_; plus the shared expert), written
out here because transformers is not a dependency of the benchmarks. The
backward is autograd's for loss = sum(out * dout).

    python3 bench/bench_moe_torch.py --tokens 2048 --hidden 256 --experts 8 \
        --topk 2 --groups 2 --topk-groups 1 --inter 256 --shared 1 --threads 1 --iters 5

prints one line "torch_moe SECONDS_PER_STEP" (the median of --iters steps,
after one warm-up step). Weights are normal(0, 0.02) as transformers
initialises them; inputs normal(0, 1).
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F


class MoeLayer(torch.nn.Module):
    def __init__(self, a, g):
        super().__init__()
        h, e, i = a.hidden, a.experts, a.inter
        std = 0.02
        self.router = torch.nn.Parameter(torch.randn(e, h, generator=g) * std)
        self.bias = torch.zeros(e)
        self.gate_up = torch.nn.Parameter(torch.randn(e, 2 * i, h, generator=g) * std)
        self.down = torch.nn.Parameter(torch.randn(e, h, i, generator=g) * std)
        si = i * a.shared
        self.sh_gate = torch.nn.Parameter(torch.randn(si, h, generator=g) * std)
        self.sh_up = torch.nn.Parameter(torch.randn(si, h, generator=g) * std)
        self.sh_down = torch.nn.Parameter(torch.randn(h, si, generator=g) * std)
        self.a = a

    def route(self, logits):
        a = self.a
        s = logits.sigmoid()
        choice = s + self.bias
        gs = choice.view(-1, a.groups, a.experts // a.groups).topk(2, dim=-1)[0].sum(dim=-1)
        gi = torch.topk(gs, k=a.topk_groups, dim=-1, sorted=False)[1]
        gm = torch.zeros_like(gs)
        gm.scatter_(1, gi, 1)
        sm = gm.unsqueeze(-1).expand(-1, a.groups, a.experts // a.groups).reshape(-1, a.experts)
        sc = choice.masked_fill(~sm.bool(), float("-inf"))
        idx = torch.topk(sc, k=a.topk, dim=-1, sorted=False)[1]
        w = s.gather(1, idx)
        w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
        return idx, w * 2.5

    def forward(self, x):
        logits = F.linear(x, self.router)
        idx, w = self.route(logits)
        out = torch.zeros_like(x)
        with torch.no_grad():
            mask = F.one_hot(idx, num_classes=self.a.experts).permute(2, 1, 0)
            hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
        for e in hit:
            e = e[0]
            pos, tok = torch.where(mask[e])
            cur = x[tok]
            gate, up = F.linear(cur, self.gate_up[e]).chunk(2, dim=-1)
            y = F.linear(F.silu(gate) * up, self.down[e]) * w[tok, pos, None]
            out = out.index_add(0, tok, y)
        shared = F.linear(F.silu(F.linear(x, self.sh_gate)) * F.linear(x, self.sh_up), self.sh_down)
        return out + shared


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--topk", type=int, default=2)
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--topk-groups", type=int, default=1)
    ap.add_argument("--inter", type=int, default=256)
    ap.add_argument("--shared", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--iters", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(1)
    layer = MoeLayer(a, g)
    x = torch.randn(a.tokens, a.hidden, generator=g).requires_grad_(True)
    dout = torch.randn(a.tokens, a.hidden, generator=g)

    def step():
        layer.zero_grad(set_to_none=True)
        x.grad = None
        out = layer(x)
        out.backward(dout)

    step()
    times = []
    for _ in range(a.iters):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    print(f"torch_moe {statistics.median(times):.6f}", flush=True)


if __name__ == "__main__":
    main()
