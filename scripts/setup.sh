#!/usr/bin/env bash
# setup.sh — install what building and testing bitexact needs on Debian 12.
#
# Idempotent: when every package is already installed it does nothing (no
# apt-get at all), so running it before every build costs a fraction of a
# second. Needs root (or sudo) only when something is missing.
set -euo pipefail

# gcc/make/cmake (>= 3.24; Debian 12 has 3.25): the build; pkg-config: the
# install + consumer test; clang + libclang-rt-14-dev: libFuzzer and the
# sanitizer runtimes; libdlpack-dev: <dlpack/dlpack.h>; libmpfr-dev +
# libgmp-dev: the exact reference the tests compare against.
# libopenmpi-dev + openmpi-bin: the MPI adapter and the mpirun multi-rank tests.
# libjansson-dev + libxxhash-dev: the bitexact command-line tool (safetensors
# headers, XXH3-128 hashes).
PACKAGES=(build-essential gcc make cmake pkg-config clang libclang-rt-14-dev
          libdlpack-dev libmpfr-dev libgmp-dev libopenmpi-dev openmpi-bin
          libjansson-dev libxxhash-dev)

installed() {
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'
}

if ! command -v dpkg-query >/dev/null 2>&1; then
  echo "setup.sh: not a Debian system; install by hand: ${PACKAGES[*]}" >&2
  exit 0
fi

missing=()
for p in "${PACKAGES[@]}"; do
  installed "$p" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup.sh: all build dependencies present"
  exit 0
fi

echo "setup.sh: installing ${missing[*]}"
SUDO=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO=(sudo); else
    echo "setup.sh: need root to install ${missing[*]}" >&2; exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -q
"${SUDO[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "setup.sh: done"
