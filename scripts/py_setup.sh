#!/usr/bin/env bash
# py_setup.sh — install what the Python package and its tests need, then
# build and install the package itself (`pip install .`: scikit-build-core
# builds the project's CMake description with BITEXACT_PYTHON=ON, which
# compiles the C library from source into bitexact._core, with the CUDA
# backend when nvcc is found: BITEXACT_CUDA=OFF / ON forces it off / on, see
# pyproject.toml). The build runs in a temporary directory.
#
# Idempotent: pinned Python packages already present at the pinned version
# are not touched (torch from PyPI is a multi-GB download with its CUDA
# wheels), so running it before every test run costs only the package build.
# PYTHON selects the interpreter (default python3). --pins-only: the pinned
# packages alone, no package build (tests/train/run.sh: the transformers
# reference needs no bitexact package).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"

# Pins. torch >= 2.6 has get_total_norm / clip_grads_with_norm_; 2.15.0 is
# what this project's machines run (a CUDA build from PyPI; its CPU path is
# what the tests use).
TORCH_PIN="2.15.0"
NUMPY_PIN="2.3.5"
PYTEST_PIN="8.4.2"
SKBUILD_PIN="0.11.5"  # the build backend (pyproject.toml's build-system.requires)
# The independent reference of `bitexact train` (tests/train): the newest
# release with Glm4MoeForCausalLM that runs on torch 2.15's CPU path; its
# GLM-4.5 semantics (docs/train_reference.md) change between releases
# (5.0.0 masked the non-kept groups' experts with 0.0, 5.12.0 and 5.24.0
# with -inf), so it is pinned exactly.
TRANSFORMERS_PIN="5.24.0"
# The framework bitexact.megatron replaces functions of (tests/python/
# test_megatron.py runs its code on CPU): the newest release on PyPI. Its
# dependencies (torch >= 2.6, numpy, packaging >= 24.2) are met by the pins
# above, so installing it replaces neither; it reports its version as
# megatron.core.__version__.
MEGATRON_CORE_PIN="0.16.1"
# bitexact.paddle's tests (tests/python/test_paddle.py): the CPU build from
# PyPI, the newest release for Python 3.11 (a ~195 MB wheel, ~720 MB
# installed; it adds protobuf, Pillow, httpx, opt_einsum and keeps the
# numpy and torch pins). It imports and runs next to torch in one process,
# in either import order.
PADDLE_PIN="3.3.1"
# python -m bitexact.train (docs/train_python.md): the run record's loss_hash
# (XXH3-64, the C trainer's libxxhash) and the checkpoints (safetensors'
# own reader and writer; transformers needs it too).
XXHASH_PIN="4.1.0"
SAFETENSORS_PIN="0.8.0"
# tests/train/test_init_from.py: PaddleFormers' GLM-4.5 (Glm4MoeForCausalLMDeprecated)
# writes the checkpoint `bitexact train --init-from` reads and loads what --save writes.
# Installed with --no-deps: its declared dependencies would replace the pins above
# (transformers<5.4.0 -> 5.3.0, numpy -> 1.26.4) and add ~40 packages (librosa, modelscope,
# datasets, ...) that the model's import does not use. What the import needs on CPU
# (tests/train/paddleformers_io.py stubs paddlefleet, a GPU-only package):
PADDLEFORMERS_PIN="1.2.0"
PADDLEFORMERS_DEPS=("colorlog==6.12.0" "aistudio-sdk==0.3.9" "ml_dtypes==0.7.0" "omegaconf==2.4.0"
                    "antlr4-python3-runtime==4.13.2" "PyYAML==6.0.3")
PINS_ONLY=0
[ "${1:-}" = "--pins-only" ] && PINS_ONLY=1

# System build dependencies (gcc, libdlpack-dev, ...): the C library's script.
if [ -x scripts/setup.sh ] || [ -f scripts/setup.sh ]; then
  bash scripts/setup.sh
fi

have() {  # have MODULE VERSION: importable at exactly that version (local tag ignored)
  "$PY" - "$1" "$2" <<'PYEOF' >/dev/null 2>&1
import importlib, sys
mod = importlib.import_module(sys.argv[1])
v = getattr(mod, "__version__", None) or getattr(mod, "VERSION")  # xxhash: VERSION
sys.exit(0 if v.split("+")[0] == sys.argv[2] else 1)
PYEOF
}

missing=()
have torch "$TORCH_PIN" || missing+=("torch==$TORCH_PIN")
have numpy "$NUMPY_PIN" || missing+=("numpy==$NUMPY_PIN")
have pytest "$PYTEST_PIN" || missing+=("pytest==$PYTEST_PIN")
have scikit_build_core "$SKBUILD_PIN" || missing+=("scikit-build-core==$SKBUILD_PIN")
have transformers "$TRANSFORMERS_PIN" || missing+=("transformers==$TRANSFORMERS_PIN")
have megatron.core "$MEGATRON_CORE_PIN" || missing+=("megatron-core==$MEGATRON_CORE_PIN")
have paddle "$PADDLE_PIN" || missing+=("paddlepaddle==$PADDLE_PIN")
have xxhash "$XXHASH_PIN" || missing+=("xxhash==$XXHASH_PIN")
have safetensors "$SAFETENSORS_PIN" || missing+=("safetensors==$SAFETENSORS_PIN")
if [ ${#missing[@]} -gt 0 ]; then
  echo "py_setup.sh: installing ${missing[*]}"
  "$PY" -m pip install "${missing[@]}"
fi
if ! "$PY" - "$PADDLEFORMERS_PIN" <<'PYEOF' >/dev/null 2>&1
import importlib.metadata as md, sys
for m in ("colorlog", "aistudio_sdk", "ml_dtypes", "omegaconf", "antlr4", "yaml"):
    __import__(m)
sys.exit(0 if md.version("paddleformers") == sys.argv[1] else 1)
PYEOF
then
  echo "py_setup.sh: installing paddleformers==$PADDLEFORMERS_PIN ${PADDLEFORMERS_DEPS[*]} (--no-deps)"
  "$PY" -m pip install --no-deps "paddleformers==$PADDLEFORMERS_PIN" "${PADDLEFORMERS_DEPS[@]}"
  missing+=("paddleformers")
fi
if [ ${#missing[@]} -eq 0 ]; then
  echo "py_setup.sh: torch $TORCH_PIN, numpy $NUMPY_PIN, pytest $PYTEST_PIN, scikit-build-core $SKBUILD_PIN, transformers $TRANSFORMERS_PIN, megatron-core $MEGATRON_CORE_PIN, paddlepaddle $PADDLE_PIN, xxhash $XXHASH_PIN, safetensors $SAFETENSORS_PIN, paddleformers $PADDLEFORMERS_PIN present"
fi
[ "$PINS_ONLY" = 1 ] && exit 0

# The training frameworks tests/python/clients/ run (SpecForge, torchtitan,
# DeepSpeed; --no-deps, pinned).
bash scripts/clients_setup.sh

# The package, built in this environment with the pinned scikit-build-core
# above (no isolated build: nothing fetched at build time). A failed build
# fails this script.
echo "py_setup.sh: pip install . (builds the C library into bitexact._core)"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc 2>/dev/null || echo 2)}"
log=$(mktemp)
if ! "$PY" -m pip install --no-deps --no-build-isolation . > "$log" 2>&1; then
  grep -v "Running pip as the 'root' user" "$log" >&2
  rm -f "$log"
  echo "py_setup.sh: pip install . failed" >&2
  exit 1
fi
rm -f "$log"
"$PY" - <<'PYEOF'
import bitexact
cuda = bitexact.cuda_info()
if not cuda["built"]:
    backend = "no CUDA backend (nvcc not found, or BITEXACT_CUDA=0)"
elif cuda["available"]:
    backend = "CUDA backend, device usable"
else:
    backend = "CUDA backend built, no usable device here"
print(f"py_setup.sh: bitexact {bitexact.__version__} (C library {bitexact.library_version()}, "
      f"{bitexact.isa()} kernels, {backend}) installed")
PYEOF
