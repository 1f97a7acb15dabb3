"""The native-ops baseline of the GLM-4.5 bindings (docs/train_python.md):
Hugging Face transformers' own ``Glm4MoeForCausalLM`` (eager attention,
fp32, CPU) loaded from a `bitexact train` checkpoint, trained with torch's
gradient accumulation over micro-batches, ``torch.nn.utils.clip_grad_norm_``
and ``torch.optim.AdamW`` — what a user runs without bitexact. Used by
bench/python/bench_train.py (the step-time baseline) and by
tests/python/test_train_bindings.py (the negative control: its bits move
with the micro-batching and differ from `bitexact train`'s, while its loss
agrees to fp32 accuracy).
"""
import json
import os

import numpy as np
import torch


def load(ckpt):
    """(model, config dict) from a `bitexact train` checkpoint directory:
    the per-expert 2-D weights packed into transformers 5's 3-D
    experts.gate_up_proj [E, 2I, H] (gate rows first) and down_proj."""
    from safetensors.numpy import load_file
    from transformers import Glm4MoeConfig, Glm4MoeForCausalLM
    with open(os.path.join(ckpt, "config.json")) as f:
        cfg = json.load(f)
    c = Glm4MoeConfig(**{k: v for k, v in cfg.items() if k not in ("architectures",)})
    c._attn_implementation = "eager"
    torch.manual_seed(0)
    m = Glm4MoeForCausalLM(c).float()
    P = load_file(os.path.join(ckpt, "model.safetensors"))
    E = cfg["n_routed_experts"]
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("experts.gate_up_proj"):
                pre = name[: -len("gate_up_proj")]
                for e in range(E):
                    p[e].copy_(torch.from_numpy(np.concatenate(
                        [P[f"{pre}{e}.gate_proj.weight"], P[f"{pre}{e}.up_proj.weight"]], 0)))
            elif name.endswith("experts.down_proj"):
                pre = name[: -len("down_proj")]
                for e in range(E):
                    p[e].copy_(torch.from_numpy(P[f"{pre}{e}.down_proj.weight"]))
            else:
                p.copy_(torch.from_numpy(P[name]))
        for name, b in m.named_buffers():
            if name in P:
                b.copy_(torch.from_numpy(P[name]))
    return m, cfg


class NativeRun:
    """`bitexact train`'s loop with torch's native numerics: the same data
    order (bitexact.train._data), micro-batches summed by autograd's
    accumulation into .grad, clip_grad_norm_(max_norm=clip),
    torch.optim.AdamW(lr, weight_decay)."""

    def __init__(self, ckpt, micro_batches=1, lr=1e-3, weight_decay=0.01, clip=1.0):
        from bitexact.train import _data as _glm_data
        self.model, cfg = load(ckpt)
        with open(os.path.join(ckpt, "trainer_state.json")) as f:
            st = json.load(f)
        d = st["data"]
        self.L, self.B, self.M = d["seq_len"], d["global_batch"], micro_batches
        self.data = _glm_data.Data(cfg["vocab_size"], self.L, int(st["seed"]), None, d["shuffle"])
        self.V, self.clip = cfg["vocab_size"], clip
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=weight_decay)

    def step(self, s):
        """One step; returns (loss float32, grad norm)."""
        toks = torch.from_numpy(np.stack([self.data.tokens(self.data.sequence(s * self.B + b))
                                          for b in range(self.B)]))
        per = self.B // self.M
        self.opt.zero_grad(set_to_none=True)
        total = torch.zeros((), dtype=torch.float32)
        for i in range(self.M):
            t = toks[i * per:(i + 1) * per]
            logits = self.model(input_ids=t[:, :self.L]).logits
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, self.V), t[:, 1:].reshape(-1), reduction="sum") / (self.B * self.L)
            loss.backward()
            total += loss.detach()
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.opt.step()
        return total, float(norm)
