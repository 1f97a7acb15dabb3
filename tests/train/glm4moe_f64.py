"""glm4moe_f64.py — a from-scratch fp64 GLM-4.5 MoE forward (plain torch ops
on a {hub name: tensor} dict, no transformers code), written from the
semantics in docs/train_reference.md. test_reference.py checks transformers'
fp32 loss and gradients against it (autograd through this forward), which
is what shows that the reference computes the model the documentation says.
"""
import math

import torch


def rope_of(cfg):
    """(theta, rotary_dim) from a config.json dict the way transformers 5
    reads it: rope_parameters wins over the flat keys; partial_rotary_factor
    defaults to 0.5 (Glm4MoeConfig), rope_theta to 10000."""
    rp = cfg.get("rope_parameters") or {}
    theta = rp.get("rope_theta", cfg.get("rope_theta", 10000.0))
    pfr = rp.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.5))
    hd = head_dim_of(cfg)
    return float(theta), int(hd * pfr)


def head_dim_of(cfg):
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def rms(x, w, eps):
    return w * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps))


def rotate(x, pos, theta, rd):
    """Rotary embedding on the first rd features of the last dim, in
    'half' pairing (feature i with i + rd/2), the rest passed through."""
    half = rd // 2
    inv = theta ** (-torch.arange(half, dtype=torch.float64) * 2.0 / rd)
    ang = pos[:, None].double() * inv[None, :]          # [L, rd/2]
    cos, sin = torch.cos(ang), torch.sin(ang)
    x1, x2, rest = x[..., :half], x[..., half:rd], x[..., rd:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)


def swiglu(x, wg, wu, wd):
    g = x @ wg.T
    return (g * torch.sigmoid(g) * (x @ wu.T)) @ wd.T


def route(h, wr, bias, cfg, margins):
    """[T, k] expert ids and weights. The choice: sigmoid scores plus the
    correction bias; a group's score is the sum of its two largest; the
    topk_group best groups kept, the other experts excluded; the k largest
    chosen. The weights: the chosen unbiased scores, divided by their sum
    (+1e-20) if norm_topk_prob, times routed_scaling_factor."""
    E, k = cfg["n_routed_experts"], cfg["num_experts_per_tok"]
    G, kg = cfg["n_group"], cfg["topk_group"]
    s = torch.sigmoid(h @ wr.T)                          # [T, E]
    c = (s + bias).detach()
    gs = c.view(-1, G, E // G).topk(2, dim=-1).values.sum(-1)   # [T, G]
    gsort = gs.sort(dim=-1, descending=True).values
    if kg < G:
        margins.append(float((gsort[:, kg - 1] - gsort[:, kg]).min()))
    keep = gs.topk(kg, dim=-1).indices
    gmask = torch.zeros_like(gs, dtype=torch.bool).scatter_(1, keep, True)
    cm = c.masked_fill(~gmask.repeat_interleave(E // G, dim=1), -math.inf)
    csort = cm.sort(dim=-1, descending=True).values
    margins.append(float((csort[:, k - 1] - csort[:, k]).min()))
    ids = cm.topk(k, dim=-1).indices.sort(dim=-1).values   # ascending id
    w = s.gather(1, ids)
    if cfg.get("norm_topk_prob", True):
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    return ids, w * cfg.get("routed_scaling_factor", 1.0)


def forward_loss(P, cfg, batch, margins=None):
    """Mean cross-entropy of batch [B, L+1] (the model reads [:, :L],
    predicts [:, 1:]) for the fp64 parameters P {hub name: tensor}."""
    margins = [] if margins is None else margins
    eps = cfg.get("rms_norm_eps", 1e-5)
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = head_dim_of(cfg)
    theta, rd = rope_of(cfg)
    inputs, targets = batch[:, :-1], batch[:, 1:]
    B, L = inputs.shape
    pos = torch.arange(L)
    x = P["model.embed_tokens.weight"][inputs]           # [B, L, H]
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    for li in range(cfg["num_hidden_layers"]):
        pre = f"model.layers.{li}."
        h = rms(x, P[pre + "input_layernorm.weight"], eps)

        def proj(name, heads):
            y = h @ P[pre + f"self_attn.{name}.weight"].T
            b = P.get(pre + f"self_attn.{name}.bias")
            if b is not None:
                y = y + b
            return y.view(B, L, heads, hd)
        q, k, v = proj("q_proj", nh), proj("k_proj", nkv), proj("v_proj", nkv)
        if cfg.get("use_qk_norm", False):
            q = rms(q, P[pre + "self_attn.q_norm.weight"], eps)
            k = rms(k, P[pre + "self_attn.k_norm.weight"], eps)
        q = rotate(q.transpose(1, 2), pos, theta, rd)    # [B, nh, L, hd]
        k = rotate(k.transpose(1, 2), pos, theta, rd)
        v = v.transpose(1, 2)
        kv_of_head = torch.arange(nh) // (nh // nkv)
        sc = (q @ k[:, kv_of_head].transpose(-1, -2)) / math.sqrt(hd)
        sc = sc.masked_fill(~causal, -math.inf)
        o = (torch.softmax(sc, dim=-1) @ v[:, kv_of_head]).transpose(1, 2).reshape(B, L, nh * hd)
        x = x + o @ P[pre + "self_attn.o_proj.weight"].T

        h = rms(x, P[pre + "post_attention_layernorm.weight"], eps)
        m = pre + "mlp."
        if li < cfg.get("first_k_dense_replace", 1):
            y = swiglu(h, P[m + "gate_proj.weight"], P[m + "up_proj.weight"],
                       P[m + "down_proj.weight"])
        else:
            t = h.reshape(B * L, -1)
            ids, w = route(t, P[m + "gate.weight"], P[m + "gate.e_score_correction_bias"], cfg,
                           margins)
            y = swiglu(t, P[m + "shared_experts.gate_proj.weight"],
                       P[m + "shared_experts.up_proj.weight"],
                       P[m + "shared_experts.down_proj.weight"])
            for e in range(cfg["n_routed_experts"]):
                tok, slot = (ids == e).nonzero(as_tuple=True)
                if tok.numel() == 0:
                    continue
                ye = swiglu(t[tok], P[m + f"experts.{e}.gate_proj.weight"],
                            P[m + f"experts.{e}.up_proj.weight"],
                            P[m + f"experts.{e}.down_proj.weight"])
                y = y.index_add(0, tok, ye * w[tok, slot, None])
            y = y.view(B, L, -1)
        x = x + y
    x = rms(x, P["model.norm.weight"], eps)
    logits = x @ P["lm_head.weight"].T
    return torch.nn.functional.cross_entropy(logits.reshape(B * L, -1), targets.reshape(-1))
