#!/usr/bin/env python3
"""compare_transformers.py -- the model of `bitexact train` against Hugging Face
transformers' Glm4MoeForCausalLM (eager attention, fp32, CPU) on the grad test's
small config: the same parameters (the hub's per-expert gate/up/down weights
packed into transformers' 3-D experts.gate_up_proj / down_proj), the same
tokens; the loss and every gradient must agree to fp32 accuracy (not bits:
torch's kernels sum in other orders).

    python3 tests/train/compare_transformers.py build/tests/train/test_model

Exit 0 on agreement, 1 on a difference, 77 (ctest's skip) without transformers.
"""
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
    from transformers import Glm4MoeConfig, Glm4MoeForCausalLM
except Exception as e:  # pragma: no cover
    print(f"skipped: {e}")
    sys.exit(77)


def main():
    exe = sys.argv[1] if len(sys.argv) > 1 else "build/tests/train/test_model"
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([exe, "dump", d], check=True)
        index = [l.split() for l in open(os.path.join(d, "index.txt"))]
        params = np.fromfile(os.path.join(d, "params.bin"), dtype="<f4")
        grads = np.fromfile(os.path.join(d, "grads.bin"), dtype="<f4")
        tokens = np.fromfile(os.path.join(d, "tokens.bin"), dtype="<i4")
        loss_c, nseq, L = open(os.path.join(d, "loss.txt")).read().split()
    nseq, L, loss_c = int(nseq), int(L), float(loss_c)
    P, G, po, go = {}, {}, 0, 0
    for name, numel, has_grad in index:
        numel = int(numel)
        P[name] = params[po:po + numel]
        po += numel
        if has_grad == "1":
            G[name] = grads[go:go + numel]
            go += numel
    # small_config() of test_model.c
    c = Glm4MoeConfig(vocab_size=48, hidden_size=24, intermediate_size=40, moe_intermediate_size=12,
                      num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                      use_qk_norm=True, n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1,
                      routed_scaling_factor=2.5, first_k_dense_replace=1, n_shared_experts=1,
                      attention_bias=True, partial_rotary_factor=0.5, rope_theta=10000.0, rms_norm_eps=1e-5,
                      tie_word_embeddings=False, norm_topk_prob=True, max_position_embeddings=4096)
    c._attn_implementation = "eager"
    torch.manual_seed(0)
    m = Glm4MoeForCausalLM(c).float()
    E, I, H = 8, 12, 24
    sd = {}
    for name, p in m.named_parameters():
        sd[name] = p
    with torch.no_grad():
        for name, p in sd.items():
            if name.endswith("experts.gate_up_proj"):
                pre = name[: -len("gate_up_proj")]
                for e in range(E):
                    g = P[f"{pre}{e}.gate_proj.weight"].reshape(I, H)
                    u = P[f"{pre}{e}.up_proj.weight"].reshape(I, H)
                    p[e].copy_(torch.from_numpy(np.concatenate([g, u], 0)))
            elif name.endswith("experts.down_proj"):
                pre = name[: -len("down_proj")]
                for e in range(E):
                    p[e].copy_(torch.from_numpy(P[f"{pre}{e}.down_proj.weight"].reshape(H, I)))
            else:
                p.copy_(torch.from_numpy(P[name].reshape(p.shape)))
        for name, b in m.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.from_numpy(P[name]))
    tok = torch.from_numpy(tokens.astype(np.int64)).reshape(nseq, L + 1)
    logits = m(input_ids=tok[:, :L]).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, c.vocab_size).float(), tok[:, 1:].reshape(-1))
    loss.backward()
    bad = 0
    rel = abs(loss.item() - loss_c) / loss.item()
    print(f"loss: bitexact {loss_c:.9g}, transformers {loss.item():.9g} (rel {rel:.2e})")
    bad += rel > 1e-5
    worst = (0.0, "")
    for name, p in sd.items():
        if name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
            pre = name[: name.rindex(".") + 1]
            parts = []
            for e in range(E):
                if name.endswith("gate_up_proj"):
                    parts.append(np.concatenate([G[f"{pre}{e}.gate_proj.weight"].reshape(I, H),
                                                 G[f"{pre}{e}.up_proj.weight"].reshape(I, H)], 0))
                else:
                    parts.append(G[f"{pre}{e}.down_proj.weight"].reshape(H, I))
            mine = np.stack(parts)
        else:
            mine = G[name].reshape(p.shape)
        ref = p.grad.detach().numpy()
        scale = max(float(np.abs(ref).max()), 1e-30)
        err = float(np.abs(mine - ref).max()) / scale
        if err > worst[0]:
            worst = (err, name)
        if err > 1e-4:
            bad += 1
            print(f"  {name}: max |diff| / max |grad| = {err:.2e}")
    print(f"gradients: {len(sd)} tensors, worst max|diff|/max|grad| {worst[0]:.2e} ({worst[1]})")
    print("agree" if not bad else f"{bad} differences")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
