"""Shared pieces of the tests/train tests: a tiny GLM-4.5 MoE config that
exercises every feature (head_dim != hidden/heads, GQA, partial RoPE, q/k/v
bias, QK-norm, a dense first layer, grouped top-k with k > 2, shared
experts, routed_scaling_factor != 1), hub-named checkpoints, comparisons."""
import json
import os

import torch


def tiny_config(**over):
    """A config.json dict in the hub's flat form (rope_theta and
    partial_rotary_factor at top level, as GLM-4.5's own config.json)."""
    cfg = {
        "architectures": ["Glm4MoeForCausalLM"],
        "model_type": "glm4_moe",
        "vocab_size": 96,
        "hidden_size": 32,
        "intermediate_size": 48,
        "moe_intermediate_size": 12,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "max_position_embeddings": 64,
        "attention_bias": True,
        "use_qk_norm": True,
        "partial_rotary_factor": 0.5,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-6,
        "first_k_dense_replace": 1,
        "n_routed_experts": 8,
        "num_experts_per_tok": 3,
        "n_shared_experts": 2,
        "n_group": 4,
        "topk_group": 2,
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
        "initializer_range": 0.1,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "torch_dtype": "float32",
    }
    cfg.update(over)
    return cfg


def hub_shapes(cfg):
    """{hub name: shape} of every tensor of model.safetensors (parameters
    in named_parameters() order with experts per expert, then the buffer
    right after its router's weight)."""
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or H // nh
    E, I = cfg["n_routed_experts"], cfg["moe_intermediate_size"]
    S = I * cfg["n_shared_experts"]
    out = {"model.embed_tokens.weight": (V, H)}
    for li in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{li}."
        out[p + "self_attn.q_proj.weight"] = (nh * hd, H)
        if cfg["attention_bias"]:
            out[p + "self_attn.q_proj.bias"] = (nh * hd,)
        out[p + "self_attn.k_proj.weight"] = (nkv * hd, H)
        if cfg["attention_bias"]:
            out[p + "self_attn.k_proj.bias"] = (nkv * hd,)
        out[p + "self_attn.v_proj.weight"] = (nkv * hd, H)
        if cfg["attention_bias"]:
            out[p + "self_attn.v_proj.bias"] = (nkv * hd,)
        out[p + "self_attn.o_proj.weight"] = (H, nh * hd)
        if cfg["use_qk_norm"]:
            out[p + "self_attn.q_norm.weight"] = (hd,)
            out[p + "self_attn.k_norm.weight"] = (hd,)
        if li < cfg["first_k_dense_replace"]:
            D = cfg["intermediate_size"]
            out[p + "mlp.gate_proj.weight"] = (D, H)
            out[p + "mlp.up_proj.weight"] = (D, H)
            out[p + "mlp.down_proj.weight"] = (H, D)
        else:
            for e in range(E):
                out[p + f"mlp.experts.{e}.gate_proj.weight"] = (I, H)
                out[p + f"mlp.experts.{e}.up_proj.weight"] = (I, H)
                out[p + f"mlp.experts.{e}.down_proj.weight"] = (H, I)
            out[p + "mlp.gate.weight"] = (E, H)
            out[p + "mlp.gate.e_score_correction_bias"] = (E,)
            out[p + "mlp.shared_experts.gate_proj.weight"] = (S, H)
            out[p + "mlp.shared_experts.up_proj.weight"] = (S, H)
            out[p + "mlp.shared_experts.down_proj.weight"] = (H, S)
        out[p + "input_layernorm.weight"] = (H,)
        out[p + "post_attention_layernorm.weight"] = (H,)
    out["model.norm.weight"] = (H,)
    out["lm_head.weight"] = (V, H)
    return out


def random_hub_tensors(cfg, seed):
    """Random fp32 weights: no structure the model could hide a mistake
    behind (norm gains around 1, non-zero biases, a non-zero correction
    bias, a router wide enough for clear choices)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for n, shape in hub_shapes(cfg).items():
        if n.endswith("norm.weight") or n.endswith("layernorm.weight"):
            t = 1.0 + 0.3 * torch.randn(shape, generator=g)
        elif n.endswith("e_score_correction_bias"):
            t = 0.2 * (torch.rand(shape, generator=g) - 0.5)
        elif n.endswith("gate.weight"):
            t = 0.5 * torch.randn(shape, generator=g)
        elif n.endswith(".bias"):
            t = 0.1 * torch.randn(shape, generator=g)
        else:
            t = 0.15 * torch.randn(shape, generator=g)
        out[n] = t.float().contiguous()
    return out


def write_checkpoint(d, cfg, tensors):
    """config.json + model.safetensors (hub naming) written directly, as
    `bitexact train --save` does — not through save_pretrained."""
    from safetensors.torch import save_file
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    save_file(tensors, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})


def rel_err(got, ref):
    """||got - ref|| / ||ref|| in fp64 (absolute when ref is all zero)."""
    got, ref = got.double(), ref.double()
    den = float(ref.norm())
    num = float((got - ref).norm())
    return num / den if den > 0 else num


def compare_dicts(got, ref, tol, what):
    """Failure lines for every tensor of ref missing from got, of another
    shape, or farther than tol (relative, per tensor)."""
    bad = []
    extra = sorted(set(got) - set(ref))
    if extra:
        bad.append(f"{what}: names not in the reference: {extra[:8]}")
    for n, r in ref.items():
        if n not in got:
            bad.append(f"{what}: {n} missing")
            continue
        if tuple(got[n].shape) != tuple(r.shape):
            bad.append(f"{what}: {n} shape {tuple(got[n].shape)} != {tuple(r.shape)}")
            continue
        e = rel_err(got[n], r)
        if not e <= tol:
            bad.append(f"{what}: {n} relative error {e:.3e} > {tol:g}")
    return bad
