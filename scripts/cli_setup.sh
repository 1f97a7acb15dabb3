#!/usr/bin/env bash
# cli_setup.sh — what the `bitexact` command-line tool (src/cli/) and its
# tests (tests/cli/) need on Debian 12, on top of scripts/setup.sh.
#
# Idempotent and quick when everything is there: Debian packages are checked
# with dpkg-query (no apt-get unless one is missing), Python packages with
# an import (no pip unless one is missing or at another version).
#
#   libjansson-dev   the JSON parser for safetensors headers and run records
#   libxxhash-dev    XXH3-128, the hash of `bitexact hash`
#   Python: safetensors, numpy, xxhash (independent hash reference), torch
#   (bf16 files written by torch; the tests skip those cases without it)
#
# BX_CLI_NO_TORCH=1 skips torch (a large download: ~3 GiB with its CUDA
# runtime wheels, although the tests use it on the CPU only).
set -euo pipefail

PACKAGES=(libjansson-dev libxxhash-dev)
# Pinned: the versions the tests were written and checked against.
PY_PINS=(safetensors==0.8.0 numpy==2.3.5 xxhash==4.1.0)  # numpy: the same pin as scripts/py_setup.sh
TORCH_PIN=torch==2.15.0
PYTHON=${PYTHON:-python3}

installed() {
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'
}

SUDO=()
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then SUDO=(sudo); fi

if command -v dpkg-query >/dev/null 2>&1; then
  missing=()
  for p in "${PACKAGES[@]}"; do installed "$p" || missing+=("$p"); done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "cli_setup.sh: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    "${SUDO[@]}" apt-get update -q
    "${SUDO[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
  fi
else
  echo "cli_setup.sh: not a Debian system; install by hand: ${PACKAGES[*]}" >&2
fi

# pin NAME==VERSION -> 0 when that version is importable already
have_pin() {
  "$PYTHON" - "$1" <<'EOF' 2>/dev/null
import importlib.metadata, sys
name, want = sys.argv[1].split("==")
sys.exit(0 if importlib.metadata.version(name) == want else 1)
EOF
}

py_missing=()
for pin in "${PY_PINS[@]}"; do have_pin "$pin" || py_missing+=("$pin"); done
if [ ${#py_missing[@]} -gt 0 ]; then
  echo "cli_setup.sh: pip installing ${py_missing[*]}"
  "$PYTHON" -m pip install -q "${py_missing[@]}"
fi

# torch: any working torch will do (the tests use torch.save_file on the CPU);
# download only when none imports.
if [ "${BX_CLI_NO_TORCH:-0}" != 1 ]; then
  if ! "$PYTHON" -c "import torch" >/dev/null 2>&1; then
    echo "cli_setup.sh: pip installing $TORCH_PIN (large download)"
    "$PYTHON" -m pip install -q "$TORCH_PIN" ||
      echo "cli_setup.sh: torch could not be installed; the torch cases of make test-cli will be skipped" >&2
  fi
fi
echo "cli_setup.sh: command-line tool dependencies present"
