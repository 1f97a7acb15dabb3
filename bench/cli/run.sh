#!/usr/bin/env bash
# run.sh — `make bench-cli`: the command-line tool's benchmark (bench.py):
# norm and hash of a >= 2 GiB safetensors file against a plain sequential
# read, page cache warm. The file is written under $BENCH_DIR (default
# $BUILD) and deleted afterwards. Extra arguments go to bench.py.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
exec python3 bench/cli/bench.py --bin "$BUILD/bitexact" --seqread "$BUILD/bench/cli/seqread" \
  --dir "${BENCH_DIR:-$BUILD}" "$@"
