"""`bitexact train` against Hugging Face transformers (issue 14: correctness
against an independent implementation; DESIGN §10).

The trainer saves its initial model (--steps 0 --save DIR0), then runs one
step on the same seed and tokens (--dump-grads, --record, --save DIR1).
ref_transformers.py recomputes that step from DIR0 with
Glm4MoeForCausalLM (fp32, eager, CPU) and torch.optim.AdamW; compared:
  the record's loss                   within 1e-5 relative
  its grad_norm and clip_coef         within 1e-4 relative
  every dumped gradient tensor        within 1e-4: ||got - ref|| / ||ref||
  every tensor of DIR1 after the step within 1e-4 the same way, and
  the step's update DIR1 - DIR0 within 1e-3 per tensor
The tolerances are not exactness claims: bitexact's kernels round
differently from torch's (correctly rounded exp/sigmoid, exact sums), so
the fp32 results differ in the last bits; 1e-4 per tensor leaves two orders
of magnitude over the ~1e-6 seen between transformers and an fp64
re-implementation (test_reference.py) and is far below any semantic
mistake (a wrong routing rule, RoPE pairing or scale moves tensors by
>1e-2). A routing decision that flips on a near tie would be legitimate
and is reported with the smallest routing margin of the batch.

Assumptions about the trainer's interface (DESIGN §10), to be kept in step
with it: --data takes a 1-D int32 .npy; --dump-grads holds the step's
gradients before clipping under the checkpoint's (hub) names (the fused
transformers-5 names are accepted too); weight decay applies to every
parameter (torch's one param group); --clip is one global norm over the
dense and routed-expert groups together; the record's floats are
hex-float strings (numbers accepted too).
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import glm4moe_f64  # noqa: E402
import ref_transformers as ref  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BITEXACT = os.environ.get("BITEXACT", os.path.join(ROOT, "build", "bitexact"))
B, L, SEED = 4, 12, 7
LR, WD, CLIP = 1e-3, 0.1, 0.5
TOL_LOSS, TOL = 1e-5, 1e-4


def trainer_or_skip():
    """The path of a bitexact with a train command. A missing binary is a
    failure (build first); a binary without `train` is a skip.
    TEMPORARY: this skip exists only until `bitexact train` lands; CI must
    not count a skip here as a pass (the run.sh summary shows it as
    skipped). The lead removes the skip when the trainer is merged."""
    if not os.access(BITEXACT, os.X_OK):
        pytest.fail(f"{BITEXACT} not found: build first (make), or set BITEXACT")
    r = subprocess.run([BITEXACT, "train", "--help"], capture_output=True, text=True)
    if "unknown command 'train'" in r.stderr:
        pytest.skip(f"{BITEXACT} has no train command yet (issue 14): the comparison with "
                    "transformers did not run")
    return BITEXACT


def run(args, what):
    r = subprocess.run(args, capture_output=True, text=True)
    assert r.returncode == 0, f"{what}: exit {r.returncode}\n{' '.join(args)}\n{r.stderr}"
    return r


def as_float(v):
    return float.fromhex(v) if isinstance(v, str) else float(v)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    exe = trainer_or_skip()
    d = tmp_path_factory.mktemp("vs_transformers")
    cfg = common.tiny_config()
    (d / "config.json").write_text(json.dumps(cfg, indent=1))
    g = torch.Generator().manual_seed(SEED)
    data = torch.randint(0, cfg["vocab_size"], (B * L + 1,), generator=g).numpy().astype(np.int32)
    np.save(d / "data.npy", data)
    common_args = [exe, "train", "--config", str(d / "config.json"), "--data", str(d / "data.npy"),
                   "--seed", str(SEED), "--seq-len", str(L), "--global-batch", str(B),
                   "--lr", repr(LR), "--weight-decay", repr(WD), "--clip", repr(CLIP)]
    run(common_args + ["--steps", "0", "--save", str(d / "dir0")], "--steps 0 --save")
    run(common_args + ["--steps", "1", "--dump-grads", str(d / "grads.safetensors"),
                       "--record", str(d / "record.jsonl"), "--save", str(d / "dir1")],
        "one step")
    batch = ref.step_batch(data, L, B, 0)
    r = ref.reference_step(str(d / "dir0"), batch, LR, WD, CLIP)
    return {"dir": d, "cfg": cfg, "batch": batch, "ref": r}


def routing_margin(runs):
    """The smallest gap between a chosen and a not-chosen expert (or group)
    score in the batch, from DIR0's weights in fp64: below ~1e-6 the two
    implementations may legitimately choose differently."""
    from safetensors.torch import load_file
    P = {n: t.double() for n, t in load_file(str(runs["dir"] / "dir0" / "model.safetensors")).items()}
    margins = []
    with torch.no_grad():
        glm4moe_f64.forward_loss(P, runs["cfg"], runs["batch"], margins)
    return min(margins) if margins else float("inf")


def test_saved_config_is_the_given_one(runs):
    """DIR0's config.json, read by transformers, is the model we asked for
    (a field the trainer writes under another name, or not at all, would
    silently give transformers another model)."""
    c = runs["ref"]["config"]
    want = runs["cfg"]
    for k, v in want.items():
        if k in ("architectures", "model_type", "torch_dtype", "rope_theta", "partial_rotary_factor"):
            continue
        assert getattr(c, k) == v, f"config {k}: transformers reads {getattr(c, k)!r}, given {v!r}"
    assert c.rope_parameters["rope_theta"] == want["rope_theta"]
    assert c.rope_parameters["partial_rotary_factor"] == want["partial_rotary_factor"]


def test_loss_and_norm(runs):
    lines = [json.loads(s) for s in (runs["dir"] / "record.jsonl").read_text().splitlines() if s.strip()]
    assert len(lines) == 1, f"one step, {len(lines)} record lines"
    rec, r = lines[0], runs["ref"]
    loss = as_float(rec["loss"])
    e = abs(loss - r["loss"]) / abs(r["loss"])
    assert e <= TOL_LOSS, (f"loss {loss!r} vs transformers {r['loss']!r}: relative {e:.2e} "
                           f"(smallest routing margin {routing_margin(runs):.2e})")
    norm = as_float(rec["grad_norm"])
    assert abs(norm - r["grad_norm"]) <= TOL * r["grad_norm"], (norm, r["grad_norm"])
    coef = as_float(rec["clip_coef"])
    assert abs(coef - r["clip_coef"]) <= TOL * r["clip_coef"], (coef, r["clip_coef"])
    assert as_float(rec["lr"]) == LR


def test_gradients(runs):
    from safetensors.torch import load_file
    got = ref.to_hub_names(load_file(str(runs["dir"] / "grads.safetensors")))
    bad = common.compare_dicts(got, runs["ref"]["grads"], TOL, "gradient")
    assert not bad, "\n".join(bad + [f"smallest routing margin {routing_margin(runs):.2e}"])


def test_parameters_after_one_step(runs):
    from safetensors.torch import load_file
    got = ref.to_hub_names(load_file(str(runs["dir"] / "dir1" / "model.safetensors")))
    bad = common.compare_dicts(got, runs["ref"]["params"], TOL, "parameter")
    assert not bad, "\n".join(bad + [f"smallest routing margin {routing_margin(runs):.2e}"])


def test_update_of_one_step(runs):
    """The step's update alone, p1 - p0, within 1e-3 per tensor: the
    parameter comparison above dilutes it by the weights' own norm (an
    update is ~1% of a weight here, and weight decay's share of it ~1.5%,
    which 1e-4 on the weights could not see)."""
    from safetensors.torch import load_file
    p0 = load_file(str(runs["dir"] / "dir0" / "model.safetensors"))
    got = ref.to_hub_names(load_file(str(runs["dir"] / "dir1" / "model.safetensors")))
    want = runs["ref"]["params"]
    missing = sorted(set(want) - set(got) | set(want) - set(p0))
    assert not missing, f"tensors missing from DIR0 or DIR1: {missing[:8]}"
    bad = common.compare_dicts({n: got[n].double() - p0[n].double() for n in want},
                               {n: want[n].double() - p0[n].double() for n in want},
                               1e-3, "update")
    assert not bad, "\n".join(bad + [f"smallest routing margin {routing_margin(runs):.2e}"])
