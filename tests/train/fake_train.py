#!/usr/bin/env python3
"""fake_train.py — a stand-in for `bitexact train` (the flags
test_vs_transformers.py uses) built on ref_transformers.py, so that the
comparison harness itself can be tested before and apart from the C
trainer: test_reference.py runs test_vs_transformers.py against it and
expects a pass, and with FAKE_TRAIN_BREAK=loss|grad|decay|clip (one
deliberate mistake) expects a failure.

  fake_train.py train --config F --data F.npy --seed S --seq-len L
      --global-batch B --lr X --weight-decay X --clip X --steps 0|1
      [--save DIR] [--dump-grads F] [--record F]
Initialisation as bitexact's (DESIGN §10): normal(0, initializer_range)
matrices and embeddings, ones for RMSNorm gains, zeros for biases and
e_score_correction_bias (not its counter-based generator: any weights do).
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import ref_transformers as ref  # noqa: E402


def init_tensors(cfg, seed):
    g = torch.Generator().manual_seed(seed)
    std = cfg.get("initializer_range", 0.02)
    out = {}
    for n, shape in common.hub_shapes(cfg).items():
        if n.endswith("norm.weight") or n.endswith("layernorm.weight"):
            out[n] = torch.ones(shape)
        elif n.endswith(".bias"):
            out[n] = torch.zeros(shape)
        else:
            out[n] = (std * torch.randn(shape, generator=g)).float()
    return out


def main(argv):
    if len(argv) < 1 or argv[0] != "train":
        print(f"fake_train.py: unknown command '{argv[0] if argv else ''}'", file=sys.stderr)
        return 2
    ap = argparse.ArgumentParser(prog="fake_train.py train")
    for f in ("--config", "--data", "--save", "--dump-grads", "--record"):
        ap.add_argument(f)
    for f in ("--seed", "--seq-len", "--global-batch", "--steps"):
        ap.add_argument(f, type=int)
    for f in ("--lr", "--weight-decay", "--clip"):
        ap.add_argument(f, type=float)
    a = ap.parse_args(argv[1:])
    brk = os.environ.get("FAKE_TRAIN_BREAK", "")
    with open(a.config) as f:
        cfg = json.load(f)
    tensors = init_tensors(cfg, a.seed)
    if a.steps == 0:
        common.write_checkpoint(a.save, cfg, tensors)
        shutil.copy(a.config, os.path.join(a.save, "config.json"))
        return 0
    assert a.steps == 1, "the fake trains one step at most"
    with tempfile.TemporaryDirectory() as tmp:
        common.write_checkpoint(tmp, cfg, tensors)
        batch = ref.step_batch(np.load(a.data), a.seq_len, a.global_batch, 0)
        wd = 0.0 if brk == "decay" else a.weight_decay
        clip = 0.0 if brk == "clip" else a.clip
        r = ref.reference_step(tmp, batch, a.lr, wd, clip)
    grads, loss = r["grads"], r["loss"]
    if brk == "loss":
        loss *= 1 + 1e-4
    if brk == "grad":  # one expert's gradient slightly off
        n = next(n for n in grads if ".mlp.experts.3.up_proj" in n)
        grads[n] = grads[n] * (1 + 1e-3)
    from safetensors.torch import save_file
    save_file({n: t.contiguous() for n, t in grads.items()}, a.dump_grads)
    common.write_checkpoint(a.save, cfg, {n: t.contiguous() for n, t in r["params"].items()})
    rec = {"step": 0, "loss": float(loss).hex(), "grad_norm": float(r["grad_norm"]).hex(),
           "lr": float(a.lr).hex(), "clip_coef": float(r["clip_coef"]).hex()}
    with open(a.record, "w") as f:
        f.write(json.dumps(rec) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
