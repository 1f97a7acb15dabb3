"""The tiny MoE model of test_torch_moe.py: bitexact.torch's modules and,
for the negative control, the same model with transformers' Glm4MoeMoE
(torch eager ops) and torch's AdamW; the training loop for any
micro-batching / thread count / data-parallel rank; the gloo worker of the
2-process test (mp.spawn needs a module)."""
import os
import sys
import traceback

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bitexact.kernels as K  # noqa: E402
import bitexact.torch as bt  # noqa: E402

# GLM-4.5's MoE in small: 8 experts in 4 groups of 2, 2 groups kept, 3
# experts per token, routed scaling 2.5, normalised weights, 1 shared expert
V, H, MI, E, TOPK, NG, KG, RSF = 48, 16, 8, 8, 3, 4, 2, 2.5
L, SEQS, STEPS = 8, 8, 3
LR = 1e-2


def hf_config():
    from transformers.models.glm4_moe import Glm4MoeConfig
    cfg = Glm4MoeConfig(hidden_size=H, moe_intermediate_size=MI, n_routed_experts=E,
                        num_experts_per_tok=TOPK, n_shared_experts=1, n_group=NG, topk_group=KG,
                        norm_topk_prob=True, routed_scaling_factor=RSF, hidden_act="silu")
    cfg._experts_implementation = "eager"  # Glm4MoeExperts.forward as written
    return cfg


def make_moe(seed=0):
    """A bitexact MoE with torch's init and a non-zero correction bias."""
    torch.manual_seed(seed)
    m = bt.MoE(H, MI, E, TOPK, 1, NG, KG, True, RSF)
    with torch.no_grad():
        m.gate.e_score_correction_bias.uniform_(-0.05, 0.05)
    return m


def hf_moe_from(m):
    """transformers' Glm4MoeMoE holding m's weights (experts stacked into
    its 3-D gate_up_proj [E, 2I, H], gate rows first, and down_proj)."""
    from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeMoE
    ref = Glm4MoeMoE(hf_config())
    with torch.no_grad():
        ref.gate.weight.copy_(m.gate.weight)
        ref.gate.e_score_correction_bias.copy_(m.gate.e_score_correction_bias)
        for e, x in enumerate(m.experts):
            ref.experts.gate_up_proj[e].copy_(torch.cat([x.gate_proj.weight, x.up_proj.weight]))
            ref.experts.down_proj[e].copy_(x.down_proj.weight)
        for n in ("gate_proj", "up_proj", "down_proj"):
            getattr(ref.shared_experts, n).weight.copy_(getattr(m.shared_experts, n).weight)
    return ref


def hf_grads(ref):
    """ref's gradients in MoE's parameter order (experts split again)."""
    out = [ref.gate.weight.grad]
    gu, dn = ref.experts.gate_up_proj.grad, ref.experts.down_proj.grad
    for e in range(E):
        out += [gu[e, :MI], gu[e, MI:], dn[e]]
    return out + [getattr(ref.shared_experts, n).weight.grad
                  for n in ("gate_proj", "up_proj", "down_proj")]


def data(step):
    g = torch.Generator().manual_seed(2000 + step)
    return torch.randint(0, V, (SEQS, L + 1), generator=g)


class Tiny(torch.nn.Module):
    """embedding -> RMSNorm -> MoE (+ residual) -> RMSNorm -> Linear head;
    native=True: the same weights in F.embedding, F.rms_norm, transformers'
    Glm4MoeMoE and F.linear."""

    def __init__(self, native=False):
        super().__init__()
        torch.manual_seed(0)
        self.native = native
        self.embed = bt.Embedding(V, H)
        self.n2, self.nf = bt.RMSNorm(H), bt.RMSNorm(H)
        self.mlp = make_moe(1)
        self.head = bt.Linear(H, V)
        with torch.no_grad():
            for n in (self.n2, self.nf):
                n.weight.uniform_(0.5, 1.5)
        if native:
            self.mlp = hf_moe_from(self.mlp)

    def forward(self, ids):
        if not self.native:
            x = self.embed(ids)
            x = x + self.mlp(self.n2(x))
            return self.head(self.nf(x))
        x = F.embedding(ids, self.embed.weight)
        x = x + self.mlp(F.rms_norm(x, (H,), self.n2.weight, 1e-6))
        return F.linear(F.rms_norm(x, (H,), self.nf.weight, 1e-6), self.head.weight)


def batch(tokens):
    return tokens[:, :-1].reshape(-1), tokens[:, 1:].reshape(-1)


def train_bitexact(micro_batches=1, threads=1, rank=0, world=1, comm=None):
    """STEPS steps with bitexact.kernels.adamw_step; this rank holds
    sequences [rank*SEQS/world, (rank+1)*SEQS/world) in micro_batches.
    Returns losses, the first and last steps' gradients, final params,
    and the expert loads of every step (int64 counts, global)."""
    model = Tiny()
    for mod in model.modules():
        if hasattr(mod, "num_threads"):
            mod.num_threads = threads
    params = list(model.parameters())
    red = bt.GradReduction(model.named_parameters(), L, SEQS * L, num_threads=threads)
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    local = SEQS // world
    per = local // micro_batches
    losses, first = [], None
    for step in range(STEPS):
        tokens = data(step)[rank * local:(rank + 1) * local]
        mbs = [((rank * local + i * per) * L, per * L) for i in range(micro_batches)]

        def closure(i):
            ids, tg = batch(tokens[i * per:(i + 1) * per])
            loss = bt.cross_entropy(model(ids), tg)
            loss.backward()
            return loss.detach()

        red.run_two_pass(closure, mbs, comm=comm)
        losses.append(red.loss)
        if first is None:
            first = [p.grad.clone() for p in params]
        with torch.no_grad():
            for p, a, b in zip(params, m, v):
                K.adamw_step(p, p.grad, a, b, step + 1, lr=LR, num_threads=threads)
    return losses, first, [p.grad.clone() for p in params], [p.detach().clone() for p in params]


def train_native(micro_batches=1, threads=1):
    """The negative control: the same model and data with torch eager ops
    (transformers' Glm4MoeMoE), torch's gradient accumulation (loss sum /
    global count per micro-batch) and torch.optim.AdamW (foreach=False).
    Parameters in Tiny()'s order (the MoE's as MoE's: experts split)."""
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        model = Tiny(native=True)
        opt = torch.optim.AdamW(model.parameters(), lr=LR, foreach=False)
        per = SEQS // micro_batches
        losses, first = [], None
        for step in range(STEPS):
            tokens = data(step)
            opt.zero_grad()
            total = torch.zeros(())
            for i in range(micro_batches):
                ids, tg = batch(tokens[i * per:(i + 1) * per])
                loss = F.cross_entropy(model(ids), tg, reduction="sum") / (SEQS * L)
                loss.backward()
                total = total + loss.detach()
            losses.append(total)
            if first is None:
                first = native_grads(model)
            opt.step()
        return losses, first, native_grads(model), native_params(model)
    finally:
        torch.set_num_threads(old)


def native_grads(model):
    m = model.mlp
    return ([model.embed.weight.grad.clone(), model.n2.weight.grad.clone(),
             model.nf.weight.grad.clone()] + [g.clone() for g in hf_grads(m)] +
            [model.head.weight.grad.clone()])


def native_params(model):
    m = model.mlp
    gu, dn = m.experts.gate_up_proj.detach(), m.experts.down_proj.detach()
    ex = []
    for e in range(E):
        ex += [gu[e, :MI].clone(), gu[e, MI:].clone(), dn[e].clone()]
    return ([model.embed.weight.detach().clone(), model.n2.weight.detach().clone(),
             model.nf.weight.detach().clone(), m.gate.weight.detach().clone()] + ex +
            [getattr(m.shared_experts, n).weight.detach().clone()
             for n in ("gate_proj", "up_proj", "down_proj")] + [model.head.weight.detach().clone()])


def worker(rank, world, out_dir, micro_batches):
    """One gloo rank of the data-parallel test."""
    import torch.distributed as dist
    res = {}
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world,
                                init_method=f"file://{os.path.join(out_dir, 'rdzv')}")
        res["run"] = train_bitexact(micro_batches, 1, rank, world, bt.comm())
        res["group"] = train_bitexact(1, 2, rank, world, dist.group.WORLD)
    except Exception:  # noqa: BLE001 - reported to the test
        res["exception"] = traceback.format_exc()
    finally:
        torch.save(res, os.path.join(out_dir, f"rank{rank}.pt"))
        if dist.is_initialized():
            dist.destroy_process_group()
