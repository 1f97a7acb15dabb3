"""`bitexact train --init-from` and `--save-max-shard-size` against the
libraries whose checkpoints they read and write (issue 27, DESIGN §10 "A
run users can adopt"):

- a checkpoint transformers' save_pretrained(max_shard_size=...) writes
  in bf16 (shards + index): `--init-from` widens every tensor exactly
  (the fp32 masters are transformers' own fp32 parameters of that folder,
  bit for bit) and step 0's loss equals transformers' loss on the same
  weights and tokens within 1e-5 relative (the tolerance of
  test_vs_transformers.py: bitexact's kernels round differently);
- the same for a checkpoint PaddleFormers' save_pretrained writes
  (Glm4MoeForCausalLMDeprecated, PaddleFormers 1.2.0 on CPU, run by
  paddleformers_io.py in its own process: the router in BF16, shards with
  an index, no optimizer state);
- a folder `bitexact train --save` writes (one file, and sharded) loads in
  transformers (every tensor bit for bit) and PaddleFormers with no
  warning about unexpected or missing keys; the negative control, the old
  layout (optimizer.safetensors beside a sharded model), does warn in
  PaddleFormers, which reads every *.safetensors of a sharded folder;
- the shard plan is huggingface_hub's split_torch_state_dict_into_shards's
  on the same tensors in the same order.
"""
import importlib.util
import json
import logging
import os
import re
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import ref_transformers as ref  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BITEXACT = os.environ.get("BITEXACT", os.path.join(ROOT, "build", "bitexact"))
B, L, SEED = 4, 12, 7
TOL_LOSS = 1e-5
# what a loader says about keys it did not expect or could not find
KEY_WARNING = re.compile(r"unexpected key|missing key|not used when initializing|newly initialized|"
                         r"were not initialized|not found in the checkpoint", re.I)


def run(args, what):
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True)
    assert r.returncode == 0, f"{what}: exit {r.returncode}\n{' '.join(map(str, args))}\n{r.stdout[-3000:]}{r.stderr[-3000:]}"
    return r


def need_paddleformers():
    """PaddleFormers is pinned by scripts/py_setup.sh: absent is a failure."""
    if importlib.util.find_spec("paddleformers") is None:  # not imported here (see paddleformers_io.py)
        pytest.fail("paddleformers is not installed: run scripts/py_setup.sh --pins-only")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    if not os.access(BITEXACT, os.X_OK):
        pytest.fail(f"{BITEXACT} not found: build first (make), or set BITEXACT")
    d = tmp_path_factory.mktemp("init_from")
    cfg = common.tiny_config()
    (d / "config.json").write_text(json.dumps(cfg, indent=1))
    g = torch.Generator().manual_seed(SEED)
    data = torch.randint(0, cfg["vocab_size"], (B * L + 1,), generator=g).numpy().astype(np.int32)
    np.save(d / "data.npy", data)
    common.write_checkpoint(str(d / "hub"), cfg, common.random_hub_tensors(cfg, SEED))
    ref.setup_torch()
    return {"dir": d, "cfg": cfg, "data": data}


def bx_step0(base, init_dir, tag):
    """bitexact's step-0 loss from --init-from init_dir, and the fp32 masters
    it starts from (--steps 0 --save)."""
    d = base["dir"]
    rec, s0 = d / f"{tag}.jsonl", d / f"{tag}_s0"
    common_args = [BITEXACT, "train", "--init-from", init_dir, "--data", d / "data.npy",
                   "--seq-len", L, "--global-batch", B, "--seed", SEED]
    run(common_args + ["--steps", 1, "--record", rec], "--init-from, one step")
    run(common_args + ["--steps", 0, "--save", s0], "--init-from --steps 0 --save")
    line = json.loads(rec.read_text().splitlines()[0])
    from safetensors.torch import load_file
    return float.fromhex(line["loss"]), load_file(str(s0 / "model.safetensors"))


def tf_step0(base, init_dir):
    """transformers' loss of step 0's batch from init_dir (fp32), and its
    tensors by hub name."""
    model = ref.load_model(str(init_dir))
    batch = ref.step_batch(base["data"], L, B, 0)
    loss = float(ref.loss_and_grads(model, batch))
    return loss, ref.tensors_by_name(model)


def same_bits(got, want, what):
    bad = sorted(set(got) ^ set(want))
    assert not bad, f"{what}: names differ: {bad[:6]}"
    for n in want:
        a, b = got[n].float().contiguous(), want[n].float().contiguous()
        assert a.shape == b.shape and torch.equal(a.view(torch.int32), b.view(torch.int32)), \
            f"{what}: {n} differs"


def dtypes(folder):
    from safetensors import safe_open
    out = {}
    for f in sorted(os.listdir(folder)):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(folder, f), "pt") as s:
                out.update({k: s.get_slice(k).get_dtype() for k in s.keys()})
    return out


def test_init_from_transformers_bf16_shards(base):
    from transformers import Glm4MoeForCausalLM
    out = base["dir"] / "tf_bf16"
    m = Glm4MoeForCausalLM.from_pretrained(str(base["dir"] / "hub"), dtype=torch.float32)
    m.to(torch.bfloat16).save_pretrained(str(out), max_shard_size="40KB")
    files = os.listdir(out)
    assert "model.safetensors.index.json" in files and len([f for f in files if f.startswith("model-")]) >= 2
    assert set(dtypes(out).values()) == {"BF16"}, dtypes(out)
    loss, masters = bx_step0(base, out, "tf")
    want, tensors = tf_step0(base, out)
    same_bits(masters, tensors, "--init-from masters vs transformers' fp32 parameters")
    e = abs(loss - want) / abs(want)
    assert e <= TOL_LOSS, f"step-0 loss {loss!r} vs transformers {want!r}: relative {e:.2e}"


def test_init_from_paddleformers(base):
    need_paddleformers()
    out = base["dir"] / "pf"
    r = run([sys.executable, os.path.join(HERE, "paddleformers_io.py"), "save",
             base["dir"] / "config.json", out, "40KB", 3], "PaddleFormers save_pretrained")
    assert "SAVED" in r.stdout
    files = os.listdir(out)
    assert "model.safetensors.index.json" in files and len([f for f in files if f.startswith("model-")]) >= 2
    assert not [f for f in files if "optim" in f], files
    dt = dtypes(out)
    routers = [n for n in dt if n.endswith("mlp.gate.weight")]
    assert routers and all(dt[n] == "BF16" for n in routers), dt  # PaddleFormers' BF16 router
    assert any(n.endswith("e_score_correction_bias") for n in dt)
    loss, masters = bx_step0(base, out, "pf")
    want, tensors = tf_step0(base, out)
    same_bits(masters, tensors, "--init-from masters vs transformers' fp32 parameters")
    e = abs(loss - want) / abs(want)
    assert e <= TOL_LOSS, f"step-0 loss {loss!r} vs transformers {want!r}: relative {e:.2e}"


@pytest.fixture(scope="module")
def saved(base):
    """bitexact's --save folders: one file, sharded, and the old layout
    (optimizer.safetensors beside a sharded model) as a negative control."""
    d = base["dir"]
    args = [BITEXACT, "train", "--config", d / "config.json", "--data", d / "data.npy",
            "--seq-len", L, "--global-batch", B, "--steps", 1]
    run(args + ["--save", d / "one"], "--save")
    run(args + ["--save", d / "sharded", "--save-max-shard-size", "40KB"], "--save sharded")
    run(args + ["--save", d / "old", "--save-max-shard-size", "40KB"], "--save sharded")
    os.rename(d / "old" / "optimizer" / "optimizer.safetensors", d / "old" / "optimizer.safetensors")
    os.rmdir(d / "old" / "optimizer")
    assert (d / "sharded" / "model.safetensors.index.json").exists()
    return d


@pytest.mark.parametrize("which", ["one", "sharded"])
def test_transformers_loads_saved_folder_without_warnings(saved, which):
    from transformers import Glm4MoeForCausalLM
    folder = str(saved / which)
    msgs = []

    class Keep(logging.Handler):
        def emit(self, rec):
            msgs.append(rec.getMessage())

    h = Keep(logging.DEBUG)
    lg = logging.getLogger("transformers")
    lg.addHandler(h)
    try:
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            model, info = Glm4MoeForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                             output_loading_info=True)
    finally:
        lg.removeHandler(h)
    assert not any(v for v in info.values()), info
    said = msgs + [str(x.message) for x in w]
    assert not [m for m in said if KEY_WARNING.search(m)], said
    from safetensors.torch import load_file
    files = [f for f in os.listdir(folder) if f.endswith(".safetensors")]
    saved_t = {}
    for f in files:
        saved_t.update(load_file(os.path.join(folder, f)))
    same_bits(ref.tensors_by_name(model), saved_t, f"transformers' load of {which}")


@pytest.mark.parametrize("which", ["one", "sharded", "old"])
def test_paddleformers_loads_saved_folder_without_warnings(saved, which):
    need_paddleformers()
    p = subprocess.run([sys.executable, os.path.join(HERE, "paddleformers_io.py"), "load",
                        str(saved / which)], capture_output=True, text=True)
    said = p.stdout + p.stderr
    assert p.returncode == 0 and "LOADED" in p.stdout, said[-3000:]
    warned = [ln for ln in said.splitlines() if KEY_WARNING.search(ln)]
    if which == "old":  # the negative control: the capture sees PaddleFormers' warning
        assert warned and "exp_avg" in warned[0], said[-3000:]
    else:
        assert not warned, warned[:3]


def test_shard_plan_is_huggingface_hubs(saved):
    """The shards of --save-max-shard-size 40KB hold what
    split_torch_state_dict_into_shards puts together for the same tensors
    in transformers' state_dict order (fp32, hub names)."""
    from huggingface_hub import split_torch_state_dict_into_shards
    from safetensors.torch import load_file
    folder = saved / "sharded"
    ix = json.loads((folder / "model.safetensors.index.json").read_text())
    t = {}
    for f in set(ix["weight_map"].values()):
        t.update(load_file(str(folder / f)))
    order = list(common.hub_shapes(base_cfg(saved)))
    split = split_torch_state_dict_into_shards({n: t[n] for n in order},
                                               filename_pattern="model{suffix}.safetensors",
                                               max_shard_size="40KB")
    assert split.tensor_to_filename == ix["weight_map"]
    assert split.metadata["total_size"] == ix["metadata"]["total_size"]


def base_cfg(folder):
    return json.loads((folder / "config.json").read_text())
