#!/usr/bin/env python3
"""ref_transformers.py — one training step of a GLM-4.5 MoE checkpoint
computed by Hugging Face transformers (the independent reference of
`bitexact train`, DESIGN §10; docs/train_reference.md lists the semantics).

Given a checkpoint DIR (config.json + model.safetensors in the hub naming
that `bitexact train --save` writes) and one step's token batch, computes
with Glm4MoeForCausalLM on the CPU in fp32 (eager attention, the eager
per-expert loop, one thread, deterministic algorithms):

  loss        token-mean cross-entropy over the B*L next-token predictions:
              the model reads batch[:, :L], predicts batch[:, 1:] (computed
              from the logits here, so no label shift is involved);
  gradients   autograd, every parameter, under the checkpoint's names (the
              fused 3-D expert gradients are split back per expert);
  grad_norm   the L2 norm of all gradients together (dense and routed
              experts as one global norm, as bx_clip_grad_norm over both
              groups), the clip coefficient max_norm / (norm + 1e-6)
              clamped to 1 (torch.nn.utils.clip_grad_norm_; --clip 0 =
              no clipping, the norm still computed: bitexact's rule);
  new params  one torch.optim.AdamW step (foreach=False, betas 0.9/0.999,
              eps 1e-8, weight decay on every parameter: one param group),
              written back in the checkpoint's names with the buffers
              (e_score_correction_bias, untouched) beside them.

The batch: an .npy of token ids, either 2-D [B, L+1] (the step's sequences)
or 1-D (a --data file: then --seq-len L and --global-batch B select step
--step's sequences by DESIGN §10's rule: sequence i is tokens
[i*L, i*L+L+1), step s uses sequences s*B ... s*B+B-1 wrapping around the
file's whole sequences).

Command line (outputs optional):
  ref_transformers.py --ckpt DIR --batch FILE.npy [--seq-len L --global-batch B
      --step S] --lr LR --weight-decay WD --clip MAX
      [--grads G.safetensors] [--params P.safetensors] [--json SUMMARY.json]
The module's functions are what tests/train/test_vs_transformers.py uses.
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch

BETAS = (0.9, 0.999)
EPS = 1e-8
CLIP_EPS = 1e-6  # torch's clip_grad_norm_ (and bitexact's default formula)


# ---- names: the hub's per-expert 2-D weights <-> transformers 5's fused 3-D ----

def expert_layout(name):
    """(prefix, kind) for a fused in-memory expert parameter
    'model.layers.N.mlp.experts.gate_up_proj' / '.down_proj', else None."""
    for kind in ("gate_up_proj", "down_proj"):
        suffix = ".mlp.experts." + kind
        if name.endswith(suffix):
            return name[: -len(kind)], kind
    return None


def unfuse(name, tensor):
    """[(hub name, 2-D tensor)] for one model tensor (parameter, gradient or
    state) under its named_parameters() name. Fused experts:
    gate_up_proj [E, 2I, H] = per expert cat(gate_proj [I, H], up_proj
    [I, H]) along dim 1; down_proj [E, H, I] = per expert down_proj."""
    lay = expert_layout(name)
    if lay is None:
        return [(name, tensor)]
    prefix, kind = lay  # prefix ends with 'mlp.experts.'
    out = []
    if kind == "gate_up_proj":
        inter = tensor.shape[1] // 2
        for e in range(tensor.shape[0]):
            out.append((f"{prefix}{e}.gate_proj.weight", tensor[e, :inter]))
            out.append((f"{prefix}{e}.up_proj.weight", tensor[e, inter:]))
    else:
        for e in range(tensor.shape[0]):
            out.append((f"{prefix}{e}.down_proj.weight", tensor[e]))
    return out


def fuse_names(tensors):
    """The inverse of unfuse over a whole {name: tensor} dict: hub-named
    experts gathered into fused 3-D tensors (for a dump written in the fused
    naming, the result is returned unchanged)."""
    import re
    pat = re.compile(r"^(.*\.mlp\.experts\.)(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
    groups, out = {}, {}
    for n, t in tensors.items():
        m = pat.match(n)
        if m is None:
            out[n] = t
        else:
            groups.setdefault(m.group(1), {})[(int(m.group(2)), m.group(3))] = t
    for prefix, d in groups.items():
        experts = sorted({e for e, _ in d})
        if experts != list(range(len(experts))):
            raise ValueError(f"{prefix}: experts {experts} are not 0..E-1")
        out[prefix + "gate_up_proj"] = torch.stack(
            [torch.cat([d[(e, "gate_proj")], d[(e, "up_proj")]], dim=0) for e in experts])
        out[prefix + "down_proj"] = torch.stack([d[(e, "down_proj")] for e in experts])
    return out


def to_hub_names(tensors):
    """{name: tensor} in the hub naming whichever naming it came in."""
    out = {}
    for n, t in tensors.items():
        out.update(unfuse(n, t))
    return out


# ---- the model ----

def setup_torch():
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)


def load_model(ckpt, experts_implementation="eager"):
    """Glm4MoeForCausalLM.from_pretrained(ckpt) in fp32 with eager attention
    and the given experts implementation, in train mode (no dropout in this
    model: attention_dropout 0). Fails if any checkpoint tensor was not used
    or any model tensor not loaded."""
    from transformers import Glm4MoeForCausalLM
    model, info = Glm4MoeForCausalLM.from_pretrained(
        ckpt, dtype=torch.float32, attn_implementation="eager",
        experts_implementation=experts_implementation, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    if bad:
        raise RuntimeError(f"{ckpt}: from_pretrained loading info not clean: {bad}")
    if model.config.tie_word_embeddings:
        raise RuntimeError(f"{ckpt}: tie_word_embeddings is set; bitexact's LM head is untied")
    for n, p in model.named_parameters():
        if p.dtype != torch.float32:
            raise RuntimeError(f"{ckpt}: {n} loaded as {p.dtype}")
    model.train()
    return model


def step_batch(data, seq_len=None, global_batch=None, step=0):
    """The [B, L+1] int64 batch of one step (see the file comment)."""
    data = np.asarray(data)
    if not np.issubdtype(data.dtype, np.integer):
        raise ValueError(f"token ids must be integers, not {data.dtype}")
    if data.ndim == 2:
        return torch.from_numpy(data.astype(np.int64))
    if data.ndim != 1 or seq_len is None or global_batch is None:
        raise ValueError("a 1-D token file needs seq_len and global_batch")
    nseq = (data.shape[0] - 1) // seq_len
    if nseq < 1:
        raise ValueError("the token file holds no whole sequence")
    rows = [((step * global_batch + b) % nseq) for b in range(global_batch)]
    return torch.from_numpy(np.stack(
        [data[i * seq_len: i * seq_len + seq_len + 1] for i in rows]).astype(np.int64))


def loss_and_grads(model, batch):
    """Loss (fp32 0-d tensor) of the batch and the gradients left in .grad."""
    model.zero_grad(set_to_none=True)
    inputs, targets = batch[:, :-1], batch[:, 1:]
    logits = model(input_ids=inputs, use_cache=False).logits
    loss = torch.nn.functional.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="mean")
    loss.backward()
    return loss.detach()


def grads_by_name(model):
    """{hub name: fp32 gradient} of every parameter (zeros where autograd
    left none: an expert no token chose)."""
    out = {}
    for n, p in model.named_parameters():
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        out.update(unfuse(n, g.detach().clone()))
    return out


def is_routed_expert(hub_name):
    return ".mlp.experts." in hub_name


def tensors_by_name(model):
    """{hub name: tensor} of the whole state (parameters and persistent
    buffers: what model.safetensors holds)."""
    out = {}
    for n, t in model.state_dict().items():
        out.update(unfuse(n, t.detach().clone()))
    return out


def reference_step(ckpt, batch, lr, weight_decay, clip, experts_implementation="eager"):
    """One training step of the checkpoint on batch [B, L+1]. Returns a dict:
    loss (float), grads {hub name: tensor}, grad_norm, group_norms {dense,
    expert} (float64 norms of the fp32 gradients, for information),
    clip_coef, params {hub name: tensor} after the AdamW step, config."""
    setup_torch()
    model = load_model(ckpt, experts_implementation)
    loss = loss_and_grads(model, batch)
    grads = grads_by_name(model)
    params = list(model.parameters())
    for p in params:  # experts no token chose: a zero gradient, as bitexact's
        if p.grad is None:
            p.grad = torch.zeros_like(p)

    def sq(names):
        return sum(float(grads[n].double().pow(2).sum()) for n in names)
    dense = sq([n for n in grads if not is_routed_expert(n)])
    expert = sq([n for n in grads if is_routed_expert(n)])
    if clip > 0:
        norm = float(torch.nn.utils.clip_grad_norm_(params, clip, foreach=False))
        coef = min(1.0, clip / (norm + CLIP_EPS))
    else:  # bitexact: max_norm 0 disables clipping (torch's would zero them)
        norm = float(torch.nn.utils.get_total_norm([p.grad for p in params], foreach=False))
        coef = 1.0
    opt = torch.optim.AdamW(params, lr=lr, betas=BETAS, eps=EPS, weight_decay=weight_decay,
                            foreach=False, fused=False)
    opt.step()
    return {
        "loss": float(loss),
        "grads": grads,
        "grad_norm": norm,
        "group_norms": {"dense": math.sqrt(dense), "expert": math.sqrt(expert)},
        "clip_coef": coef,
        "params": tensors_by_name(model),
        "config": model.config,
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--batch", required=True)
    ap.add_argument("--seq-len", type=int)
    ap.add_argument("--global-batch", type=int)
    ap.add_argument("--step", type=int, default=0)
    ap.add_argument("--lr", type=float, required=True)
    ap.add_argument("--weight-decay", type=float, required=True)
    ap.add_argument("--clip", type=float, required=True)
    ap.add_argument("--experts-implementation", default="eager")
    ap.add_argument("--grads")
    ap.add_argument("--params")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    from safetensors.torch import save_file
    batch = step_batch(np.load(a.batch), a.seq_len, a.global_batch, a.step)
    r = reference_step(a.ckpt, batch, a.lr, a.weight_decay, a.clip, a.experts_implementation)
    if a.grads:
        save_file({n: t.contiguous() for n, t in r["grads"].items()}, a.grads)
    if a.params:
        save_file({n: t.contiguous() for n, t in r["params"].items()}, a.params)
    summary = {k: r[k] for k in ("loss", "grad_norm", "group_norms", "clip_coef")}
    summary["loss_hex"] = float(r["loss"]).hex()
    text = json.dumps(summary, indent=1)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(main())
