"""The reference itself (ref_transformers.py) checked without bitexact: a
random checkpoint in the hub naming, written directly (not by
save_pretrained), loaded by transformers; its fp32 loss, gradients and
AdamW step compared with a from-scratch fp64 forward (glm4moe_f64.py,
autograd) and the AdamW formula written out. These pass or fail on their
own; they are what makes test_vs_transformers.py's reference trustworthy."""
import json
import math
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

SEED = 20240917
B, L = 3, 10
LR, WD, CLIP = 1e-2, 0.1, 0.5


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("ckpt"))
    cfg = common.tiny_config()
    tensors = common.random_hub_tensors(cfg, SEED)
    common.write_checkpoint(d, cfg, tensors)
    g = torch.Generator().manual_seed(SEED + 1)
    data = torch.randint(0, cfg["vocab_size"], (B * L + 1,), generator=g).numpy().astype(np.int32)
    batch = ref.step_batch(data, L, B, 0)
    return {"dir": d, "cfg": cfg, "tensors": tensors, "data": data, "batch": batch}


@pytest.fixture(scope="module")
def result(ckpt):
    return ref.reference_step(ckpt["dir"], ckpt["batch"], LR, WD, CLIP)


@pytest.fixture(scope="module")
def f64(ckpt):
    """Loss, gradients and routing margins of the fp64 re-implementation."""
    P = {n: t.double().requires_grad_(not n.endswith("e_score_correction_bias"))
         for n, t in ckpt["tensors"].items()}
    margins = []
    loss = glm4moe_f64.forward_loss(P, ckpt["cfg"], ckpt["batch"], margins)
    loss.backward()
    grads = {n: (p.grad if p.grad is not None else torch.zeros_like(p))
             for n, p in P.items() if p.requires_grad}
    return {"loss": float(loss.detach()), "grads": grads, "margin": min(margins)}


def test_hub_naming_loads(ckpt):
    """from_pretrained of a per-expert hub checkpoint: every tensor used,
    bits unchanged; in memory the experts are fused 3-D parameters."""
    ref.setup_torch()
    model = ref.load_model(ckpt["dir"])
    names = dict(model.named_parameters())
    E, I, H = 8, ckpt["cfg"]["moe_intermediate_size"], ckpt["cfg"]["hidden_size"]
    for li in (1, 2):
        p = f"model.layers.{li}.mlp.experts."
        assert tuple(names[p + "gate_up_proj"].shape) == (E, 2 * I, H)
        assert tuple(names[p + "down_proj"].shape) == (E, H, I)
        assert p + "0.gate_proj.weight" not in names
        assert f"model.layers.{li}.mlp.gate.e_score_correction_bias" not in names  # a buffer
    back = ref.tensors_by_name(model)
    assert sorted(back) == sorted(ckpt["tensors"])
    for n, t in ckpt["tensors"].items():
        assert torch.equal(back[n].view(torch.int32), t.view(torch.int32)), n
    assert ref.fuse_names(ckpt["tensors"]).keys() == model.state_dict().keys()
    c = model.config
    assert c.head_dim == 16 and c.rope_parameters["partial_rotary_factor"] == 0.5
    assert c.rope_parameters["rope_theta"] == 10000.0
    assert model.model.rotary_emb.inv_freq.numel() == 4  # rotary_dim 8 of head_dim 16
    assert c.num_local_experts == 8
    assert model.model.layers[1].mlp.gate.e_score_correction_bias.dtype == torch.float32


def test_loss_vs_f64(result, f64):
    assert f64["margin"] > 1e-4, f"near tie in the routing ({f64['margin']:.2e}): change SEED"
    e = abs(result["loss"] - f64["loss"]) / abs(f64["loss"])
    print(f"loss fp32 {result['loss']!r} fp64 {f64['loss']!r} rel {e:.2e}")
    assert e < 1e-6


def test_grads_vs_f64(result, f64):
    assert sorted(result["grads"]) == sorted(f64["grads"])
    worst = max((common.rel_err(result["grads"][n], g), n) for n, g in f64["grads"].items())
    print(f"worst gradient relative error {worst[0]:.2e} ({worst[1]})")
    bad = common.compare_dicts(result["grads"], f64["grads"], 2e-5, "grad")
    assert not bad, "\n".join(bad)


def test_adamw_step_vs_formula(ckpt, result):
    """The step written out in fp64 from the reference's own fp32 gradients:
    one global norm over every gradient, coef = clip / (norm + 1e-6) <= 1,
    AdamW step 1 with decoupled weight decay on every parameter."""
    g = {n: t.double() for n, t in result["grads"].items()}
    norm = math.sqrt(sum(float((t * t).sum()) for t in g.values()))
    assert abs(result["grad_norm"] - norm) <= 1e-6 * norm
    coef = min(1.0, CLIP / (norm + 1e-6))
    assert coef < 1, "the test's CLIP should clip"
    assert abs(result["clip_coef"] - coef) <= 1e-6
    b1, b2, eps = 0.9, 0.999, 1e-8
    want = {}
    for n, p in ckpt["tensors"].items():
        p = p.double()
        if n not in g:  # the buffer: not a parameter
            want[n] = p
            continue
        gc = g[n] * coef
        m, v = (1 - b1) * gc, (1 - b2) * gc * gc
        denom = v.sqrt() / math.sqrt(1 - b2) + eps
        want[n] = p * (1 - LR * WD) - (LR / (1 - b1)) * m / denom
    bad = common.compare_dicts(result["params"], want, 1e-6, "param")
    assert not bad, "\n".join(bad)
    for n in want:
        if n.endswith("e_score_correction_bias"):
            assert torch.equal(result["params"][n], ckpt["tensors"][n])


def test_label_shift(ckpt, result):
    """transformers' own loss with labels shifts inside: input_ids = labels =
    the L+1 tokens gives the same B*L predictions (the last position's
    logits are dropped) as our loss over batch[:, :L] -> batch[:, 1:]."""
    ref.setup_torch()
    model = ref.load_model(ckpt["dir"])
    with torch.no_grad():
        hf = float(model(input_ids=ckpt["batch"], labels=ckpt["batch"], use_cache=False).loss)
    assert abs(hf - result["loss"]) <= 1e-6 * abs(result["loss"])


def test_grouped_mm_agrees(ckpt, result):
    """transformers' default experts implementation on CPU (grouped_mm)
    computes the same function as the eager loop the reference uses."""
    ref.setup_torch()
    model = ref.load_model(ckpt["dir"], "grouped_mm")
    assert model.config._experts_implementation == "grouped_mm"
    loss = ref.loss_and_grads(model, ckpt["batch"])
    assert abs(float(loss) - result["loss"]) <= 1e-6 * abs(result["loss"])
    bad = common.compare_dicts(ref.grads_by_name(model), result["grads"], 1e-5, "grad")
    assert not bad, "\n".join(bad)


def test_default_config_fields(tmp_path):
    """What transformers fills in when config.json leaves fields out:
    partial_rotary_factor 0.5, rope_theta 10000, head_dim = hidden/heads;
    rope_parameters wins over flat keys."""
    from transformers import Glm4MoeConfig
    cfg = common.tiny_config()
    for k in ("partial_rotary_factor", "rope_theta", "head_dim"):
        del cfg[k]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    c = Glm4MoeConfig.from_pretrained(str(tmp_path))
    assert c.rope_parameters["partial_rotary_factor"] == 0.5
    assert c.rope_parameters["rope_theta"] == 10000.0
    assert getattr(c, "head_dim", None) is None
    cfg = common.tiny_config(rope_parameters={"rope_type": "default", "rope_theta": 500.0,
                                              "partial_rotary_factor": 0.25})
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    c = Glm4MoeConfig.from_pretrained(str(tmp_path))
    assert c.rope_parameters["rope_theta"] == 500.0
    assert c.rope_parameters["partial_rotary_factor"] == 0.25


def test_step_batch_order():
    data = np.arange(2 * 5 * 4 + 3)  # 10 whole sequences of L=4 (+ 3 spare tokens)
    b = ref.step_batch(data, 4, 3, 0)
    assert b.tolist() == [[0, 1, 2, 3, 4], [4, 5, 6, 7, 8], [8, 9, 10, 11, 12]]
    b = ref.step_batch(data, 4, 3, 3)  # sequences 9, 0, 1: wraps around
    assert b[:, 0].tolist() == [36, 0, 4]
    two = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.int32)
    assert ref.step_batch(two).tolist() == two.tolist()


def test_command_line(ckpt, result, tmp_path):
    np.save(tmp_path / "data.npy", ckpt["data"])
    out = subprocess.run(
        [sys.executable, ref.__file__, "--ckpt", ckpt["dir"], "--batch", str(tmp_path / "data.npy"),
         "--seq-len", str(L), "--global-batch", str(B), "--lr", str(LR),
         "--weight-decay", str(WD), "--clip", str(CLIP), "--grads", str(tmp_path / "g.safetensors"),
         "--params", str(tmp_path / "p.safetensors"), "--json", str(tmp_path / "s.json")],
        capture_output=True, text=True, check=True)
    s = json.loads((tmp_path / "s.json").read_text())
    assert s["loss"] == result["loss"] and float.fromhex(s["loss_hex"]) == result["loss"], out.stdout
    from safetensors.torch import load_file
    g = load_file(str(tmp_path / "g.safetensors"))
    p = load_file(str(tmp_path / "p.safetensors"))
    assert all(torch.equal(g[n], result["grads"][n]) for n in result["grads"])
    assert all(torch.equal(p[n], result["params"][n]) for n in result["params"])


def run_harness(tmp_path, brk):
    """test_vs_transformers.py against fake_train.py (FAKE_TRAIN_BREAK=brk)."""
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, BITEXACT=os.path.join(here, "fake_train.py"), FAKE_TRAIN_BREAK=brk)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--rootdir", here,
         "--basetemp", str(tmp_path / "t"), os.path.join(here, "test_vs_transformers.py")],
        capture_output=True, text=True, env=env)


def test_harness_passes_a_correct_trainer(tmp_path):
    r = run_harness(tmp_path, "")
    assert r.returncode == 0 and "5 passed" in r.stdout, r.stdout[-3000:]


@pytest.mark.parametrize("brk,failing", [
    ("loss", "test_loss_and_norm"), ("clip", "test_loss_and_norm"),
    ("grad", "test_gradients"), ("decay", "test_update_of_one_step")])
def test_harness_fails_a_wrong_trainer(tmp_path, brk, failing):
    """Each deliberate mistake of the fake fails the test meant to see it."""
    r = run_harness(tmp_path, brk)
    assert r.returncode != 0 and f"test_vs_transformers.py::{failing} " in r.stdout, \
        r.stdout[-3000:]
