#!/usr/bin/env bash
# test.sh — build everything and run every test: the C suite, the kernel
# checker (dev/), the GPU runner (built; run where a GPU is), mpirun, the
# command line, the demo (which checks its own invariance), a quick
# benchmark run, the C suite, MPI and CLI tests again under ASan+UBSan, the
# Python package, and the fuzz harnesses for a bounded time
# (fuzz/run_ci.sh).
# Stops at the first failing stage with a non-zero exit status.
set -euo pipefail
cd "$(dirname "$0")/.."

JOBS="$(nproc 2>/dev/null || echo 2)"
CURRENT="start"
stage() { CURRENT="$*"; printf '\n==== test.sh: %s ====\n' "$*"; }
trap 'printf "\n==== test.sh: FAILED in stage: %s ====\n" "$CURRENT" >&2' ERR

# Every test runner ends with "N passed, N failed[, N skipped]"; the totals
# over all runners are this script's last line.
TOTAL_PASS=0 TOTAL_FAIL=0 TOTAL_SKIP=0
counted() { # run a test command, keep its output, add its closing counts
  local log
  log=$(mktemp)
  "$@" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  local line
  line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1 || true)
  rm -f "$log"
  if [ -z "$line" ]; then echo "test.sh: no 'N passed, N failed' line from: $*" >&2; return 1; fi
  TOTAL_PASS=$((TOTAL_PASS + $(echo "$line" | sed -E 's/^([0-9]+) passed.*/\1/')))
  TOTAL_FAIL=$((TOTAL_FAIL + $(echo "$line" | sed -E 's/^[0-9]+ passed, ([0-9]+) failed.*/\1/')))
  if echo "$line" | grep -q skipped; then
    TOTAL_SKIP=$((TOTAL_SKIP + $(echo "$line" | sed -E 's/.*, ([0-9]+) skipped.*/\1/')))
  fi
  return "$rc"
}

stage "setup (build dependencies; Python packages for the command-line tests)"
bash scripts/setup.sh
bash scripts/cli_setup.sh

stage "build (make: library, examples, benchmarks)"
make -j"$JOBS"

stage "C test suite (make test)"
counted make -j"$JOBS" test

stage "kernel checker (make dev-check: prefetches in the emitted code; every kernel of every ISA against the reference, under hostile caller MXCSRs)"
make -j"$JOBS" dev-check

stage "GPU tests: built always (CUDA code compiles and links), run only where a GPU is present"
make -j"$JOBS" cuda-tests
counted make -j"$JOBS" test-cuda

stage "multi-rank tests under mpirun (make test-mpi)"
counted make -j"$JOBS" test-mpi

stage "command-line tool tests (make test-cli)"
counted make -j"$JOBS" test-cli

stage "demo (layout invariance of the norm)"
build/bitexact demo
build/examples/simple

stage "benchmark smoke run (bench_norm --quick)"
build/bench/bench_norm --quick > build/bench_quick.out || { cat build/bench_quick.out; exit 1; }
tail -n 1 build/bench_quick.out

stage "C test suite under ASan+UBSan (make SAN=1 test)"
counted make -j"$JOBS" SAN=1 test

stage "multi-rank tests under ASan+UBSan (make SAN=1 test-mpi)"
# Open MPI's own allocations at exit are not ours: leak checking off here only.
ASAN_OPTIONS=detect_leaks=0 counted make -j"$JOBS" SAN=1 test-mpi

if [ -f fuzz/run_ci.sh ]; then
  stage "command-line tool tests under ASan+UBSan (make SAN=1 test-cli)"
counted make -j"$JOBS" SAN=1 test-cli

stage "Python package: pip install . and pytest against PyTorch (tests/python/run.sh)"
counted bash tests/python/run.sh

stage "fuzz harnesses, bounded time (fuzz/run_ci.sh)"
  bash fuzz/run_ci.sh
else
  stage "fuzz: fuzz/run_ci.sh not present, skipped"
fi

printf '\n==== test.sh: all stages passed ====\n'
if [ "$TOTAL_SKIP" -gt 0 ]; then
  echo "$TOTAL_PASS passed, $TOTAL_FAIL failed, $TOTAL_SKIP skipped"
else
  echo "$TOTAL_PASS passed, $TOTAL_FAIL failed"
fi
