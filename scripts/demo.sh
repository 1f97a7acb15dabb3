#!/usr/bin/env bash
# demo.sh — the main job: build bitexact and show that naive float norms
# change their bits with thread count, tensor order and partition while
# bitexact's do not. Exits non-zero if bitexact's results ever differ.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
make -j"$(nproc)" cli
exec build/bitexact demo "$@"
