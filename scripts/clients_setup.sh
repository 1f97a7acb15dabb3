#!/usr/bin/env bash
# clients_setup.sh — the real training frameworks whose own code the tests
# in tests/python/clients/ run with bitexact's clip: SpecForge, torchtitan
# and DeepSpeed, from PyPI, pinned. Each is installed with --no-deps (their
# declared dependencies would replace the torch pin or pull CUDA builds)
# plus the few packages their imported modules need, also pinned.
# Idempotent: a package present at its pin is not downloaded again.
# Called by scripts/py_setup.sh after the core pins.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"

# have_dist NAME VERSION: the distribution NAME is installed at VERSION
have_dist() {
  "$PY" - "$1" "$2" <<'PYEOF' >/dev/null 2>&1
import importlib.metadata as md, sys
sys.exit(0 if md.version(sys.argv[1]).split("+")[0] == sys.argv[2] else 1)
PYEOF
}

nodeps=()   # installed with --no-deps
withdeps=() # small pure-Python helpers, installed normally (pinned)

# ---- SpecForge ---------------------------------------------------------
# tests/python/clients/test_specforge.py imports specforge.optimizer,
# .training.{backend,controller,strategies.base}, .algorithms.eagle3.model,
# .modeling.auto, .core.loss, .runtime.contracts: they need nothing beyond
# the core pins (torch, with the triton its wheel depends on; transformers
# 5.24.0 and its tokenizers; numpy; safetensors). SpecForge's declared
# dependencies (sglang, yunchang, wandb, datasets, accelerate, ...) are not
# imported by those modules and are left out.
SPECFORGE_PIN="0.2.0"
have_dist specforge "$SPECFORGE_PIN" || nodeps+=("specforge==$SPECFORGE_PIN")
# ---- end SpecForge -----------------------------------------------------

# ---- torchtitan --------------------------------------------------------
TORCHTITAN_PIN="0.3.0"
have_dist torchtitan "$TORCHTITAN_PIN" || nodeps+=("torchtitan==$TORCHTITAN_PIN")
# what `import torchtitan.trainer` needs (tests/python/clients/torchtitan_worker.py
# runs Trainer.train_step), all --no-deps: spmd_types (meshes), tyro and its
# two helpers (config), torchdata (StatefulDataLoader), tensorboard and
# absl-py (torch.utils.tensorboard in components.metrics), and datasets with
# its import-time closure (components.validate imports hf_datasets at module
# level; no dataset is loaded). numpy, protobuf, fsspec, tokenizers,
# safetensors, xxhash, huggingface_hub are core pins already.
for pin in spmd_types==0.2.3 tyro==1.0.17 docstring-parser==0.18.0 typeguard==4.6.1 \
           torchdata==0.11.0 tensorboard==2.21.0 absl-py==2.5.1 datasets==4.7.0 \
           pyarrow==26.0.1 pandas==3.1.1 dill==0.4.1 multiprocess==0.70.19; do
  have_dist "${pin%%==*}" "${pin##*==}" || nodeps+=("$pin")
done
# ---- end torchtitan ----------------------------------------------------

# ---- DeepSpeed ---------------------------------------------------------
DEEPSPEED_PIN="0.19.8"
have_dist deepspeed "$DEEPSPEED_PIN" || nodeps+=("deepspeed==$DEEPSPEED_PIN")
# What `import deepspeed` and an engine on the CPU accelerator import
# (psutil: accelerator, timers; py-cpuinfo: op_builder; hjson: config;
# msgpack: pipe; einops: sequence parallel, flops profiler), pure Python
# or small wheels, pinned; pydantic, tqdm, packaging and numpy come with
# the core pins' packages.
for pin in psutil==7.2.2 py-cpuinfo==9.0.0 hjson==3.1.0 msgpack==1.2.4 einops==0.8.2; do
  have_dist "${pin%%==*}" "${pin##*==}" || withdeps+=("$pin")
done
# ---- end DeepSpeed -----------------------------------------------------

if [ ${#withdeps[@]} -gt 0 ]; then
  echo "clients_setup.sh: installing ${withdeps[*]}"
  "$PY" -m pip install "${withdeps[@]}"
fi
if [ ${#nodeps[@]} -gt 0 ]; then
  echo "clients_setup.sh: installing (--no-deps) ${nodeps[*]}"
  DS_BUILD_OPS=0 "$PY" -m pip install --no-deps "${nodeps[@]}"
fi
echo "clients_setup.sh: specforge $SPECFORGE_PIN, torchtitan $TORCHTITAN_PIN, deepspeed $DEEPSPEED_PIN present"
