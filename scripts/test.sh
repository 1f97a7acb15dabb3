#!/usr/bin/env bash
# test.sh — build everything and run every test: the C suite and the
# exported-symbol checks, the kernel checker (dev/), the GPU runner (built;
# run where a GPU is), mpirun, the command line, the demo (which checks its
# own invariance), a quick benchmark run, the C suite, MPI and CLI tests
# again under ASan+UBSan, the Python package, `bitexact train` against
# transformers (tests/train: skipped until the trainer exists), the fuzz harnesses for a
# bounded time (fuzz/run_ci.sh), the install + out-of-tree consumer test,
# and the aarch64 cross build run under qemu-user.
# Stops at the first failing stage with a non-zero exit status; a stage
# whose runner reports a failure fails even if its exit status says not.
set -euo pipefail
cd "$(dirname "$0")/.."

JOBS="$(nproc 2>/dev/null || echo 2)"
CURRENT="start"
stage() { CURRENT="$*"; printf '\n==== test.sh: [%ds] %s ====\n' "$SECONDS" "$*"; }
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
  local p f
  p=$(echo "$line" | sed -E 's/^([0-9]+) passed.*/\1/')
  f=$(echo "$line" | sed -E 's/^[0-9]+ passed, ([0-9]+) failed.*/\1/')
  TOTAL_PASS=$((TOTAL_PASS + p))
  TOTAL_FAIL=$((TOTAL_FAIL + f))
  if echo "$line" | grep -q skipped; then
    TOTAL_SKIP=$((TOTAL_SKIP + $(echo "$line" | sed -E 's/.*, ([0-9]+) skipped.*/\1/')))
  fi
  if [ "$rc" -eq 0 ] && [ "$f" -ne 0 ]; then
    echo "test.sh: '$line' from: $* (exit status 0): counted as a failure" >&2; return 1
  fi
  return "$rc"
}
# ctest_counted ARGS: ctest's own summary as "N passed, N failed"
ctest_counted() {
  local log rc
  log=$(mktemp)
  ctest --output-on-failure "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  local line t f
  line=$(grep -E 'tests passed, [0-9]+ tests? failed out of [0-9]+' "$log" | tail -n 1 || true)
  rm -f "$log"
  if [ -z "$line" ]; then echo "test.sh: no ctest summary from: ctest $*" >&2; return 1; fi
  f=$(echo "$line" | sed -E 's/.* ([0-9]+) tests? failed out of.*/\1/')
  t=$(echo "$line" | sed -E 's/.*failed out of ([0-9]+).*/\1/')
  TOTAL_PASS=$((TOTAL_PASS + t - f)); TOTAL_FAIL=$((TOTAL_FAIL + f))
  [ "$f" -eq 0 ] && return "$rc"
  return 1
}
has() { grep -qx "$1=ON" build/bitexact-features.txt; } # a feature of the main build

stage "setup (build dependencies; Python packages for the command-line tests)"
bash scripts/setup.sh
bash scripts/cli_setup.sh

stage "build (make: CMake configure + build of the library, adapters, CLI, tests, examples, benchmarks)"
make -j"$JOBS"
cat build/bitexact-features.txt

stage "C test suite (make test)"
counted make -j"$JOBS" test

stage "exported symbols and SONAMEs of the shared libraries (ctest -R exported_symbols)"
ctest_counted --test-dir build -R exported_symbols

stage "kernel checker (make dev-check: prefetches in the emitted code; every kernel of every ISA against the reference, under hostile caller MXCSRs)"
make -j"$JOBS" dev-check

stage "GPU tests: built always where nvcc is (CUDA code compiles and links, the training kernels' PTX is linted), run only where a GPU is present"
make -j"$JOBS" cuda-tests
if has cuda; then
  # the training kernels' PTX: no approximate/FTZ instruction, fma counts as
  # in src/cuda/train/fma_manifest.json; first that the lint can fail
  NVCC="$(sed -n 's/^CMAKE_CUDA_COMPILER:[A-Z]*=//p' build/CMakeCache.txt)"
  counted env NVCC="$NVCC" python3 scripts/ptx_lint.py --self-test
  counted env NVCC="$NVCC" python3 scripts/ptx_lint.py
  counted make -j"$JOBS" test-cuda
else
  echo "test.sh: the CUDA backend is not built here ($(sed -n 's/^cuda_why=//p' build/bitexact-features.txt)); GPU runner not built"
fi
# the training step's device script (scripts/gpu_train_check.sh), rehearsed on the
# host simulation of the device backend; a one-ULP error planted in the simulated
# GEMM must make it fail (the negative control)
counted env BITEXACT_TEST_DEVICE=sim OUT=build/gpu_train_rehearsal bash scripts/gpu_train_check.sh
if env BITEXACT_TEST_DEVICE=sim-plant OUT=build/gpu_train_plant bash scripts/gpu_train_check.sh >/dev/null 2>&1; then
  echo "test.sh: gpu_train_check.sh passed with a planted device error" >&2
  false
fi

stage "multi-rank tests under mpirun (make test-mpi)"
counted make -j"$JOBS" test-mpi

stage "command-line tool tests (make test-cli)"
counted make -j"$JOBS" test-cli

stage "demo (layout invariance of the norm) and the examples"
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

stage "command-line tool tests under ASan+UBSan (make SAN=1 test-cli)"
counted make -j"$JOBS" SAN=1 test-cli

stage "Python package: pip install . (scikit-build-core) and pytest against PyTorch (tests/python/run.sh)"
counted bash tests/python/run.sh

stage "bitexact train against Hugging Face transformers: the reference's own checks, then loss, gradients and one AdamW step (tests/train/run.sh)"
counted bash tests/train/run.sh

stage "fuzz harnesses, bounded time (fuzz/run_ci.sh)"
bash fuzz/run_ci.sh

stage "install + out-of-tree consumers: README lines, pkg-config and find_package, static and shared, CUDA on and off (tests/consumer/run.sh)"
counted bash tests/consumer/run.sh

stage "aarch64: cross build, the C suite under qemu-user, the same bits as x86-64 (scripts/cross_aarch64.sh)"
counted bash scripts/cross_aarch64.sh

printf '\n==== test.sh: all stages passed ====\n'
if [ "$TOTAL_SKIP" -gt 0 ]; then
  echo "$TOTAL_PASS passed, $TOTAL_FAIL failed, $TOTAL_SKIP skipped"
else
  echo "$TOTAL_PASS passed, $TOTAL_FAIL failed"
fi
