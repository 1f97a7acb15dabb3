#!/usr/bin/env bash
# gpu_check.sh — the one prepared run for a machine with a GPU (an H200:
# 16 cores, nvcc and NCCL under /usr/local/cuda, no network). From the
# repository root of a fresh checkout it:
#
#   1. records the environment (GPU, driver, nvcc, NCCL, torch);
#   2. builds the library with the CUDA backend (make lib);
#   3. builds the GPU tests, the GPU benchmark and the NCCL adapter
#      (make cuda-tests);
#   4. runs the GPU test runner (build/tests/cuda/bx_cuda_tests);
#   5. runs the GPU benchmark (build/bench/cuda/bench_cuda);
#   6. if torch with CUDA is importable: installs the Python package
#      (pip install --no-build-isolation --no-deps --no-index .) and runs
#      bench/cuda/bench_torch.py and tests/python/test_cuda.py (pytest);
#      skipped with a message otherwise.
#
#   7. (after 4) runs scripts/gpu_train_check.sh, the training step on the
#      GPU against the CPU (issue 30), on the same build, into $OUT/train.
#
# Every step has its own timeout and the whole run a budget (default 540 s,
# GPU_CHECK_BUDGET to change): a step that would start with too little time
# left is skipped. Nine files and a folder go to $OUT (default ./gpu_out):
# summary.txt (the summary, the test failures and the benchmark tables, also
# printed at the end), env.log, build.log, gpu_tests.log, train_check.log,
# bench_cuda.log, pip_install.log, bench_torch.log, pytest_cuda.log, and
# train/ (gpu_train_check.sh's summary, logs and runs). Exit status 0 only if
# every step that ran succeeded.
#
# <dlpack/dlpack.h> (Debian's libdlpack-dev) may be missing on a bare CUDA
# image with no network: the script then uses a copy at
# .dlpack/dlpack/dlpack.h in the checkout (to send one along: mkdir -p
# .dlpack/dlpack && cp /usr/include/dlpack/dlpack.h .dlpack/dlpack/ before
# the run; untracked files travel), else the one PyTorch ships
# (torch/include/ATen/dlpack.h), through CPATH and BITEXACT_DLPACK_INCLUDE.
#
#   bash scripts/gpu_check.sh            # OUT=./gpu_out
#   OUT=/tmp/x GPU_CHECK_BUDGET=600 bash scripts/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."

OUT="${OUT:-./gpu_out}"
mkdir -p "$OUT"
BUDGET="${GPU_CHECK_BUDGET:-540}"
START=$(date +%s)
JOBS="$(nproc 2>/dev/null || echo 16)"
PY="${PYTHON:-python3}"
SUMMARY="$OUT/summary.txt"
FAILED=0
: > "$SUMMARY"
rm -f "$OUT"/{env,build,gpu_tests,train_check,bench_cuda,pip_install,bench_torch,pytest_cuda}.log

GPU_SCRIPT=gpu_check
# shellcheck source=scripts/gpu_common.sh
source scripts/gpu_common.sh

echo "gpu_check: budget ${BUDGET}s, $JOBS jobs, output in $OUT"
step "environment" env.log 30 bash -c "$(declare -f env_info); JOBS=$JOBS PY=$PY env_info"
grep -v '^\$ ' "$OUT/env.log" | grep -E 'NVIDIA|Driver|release|^torch|NCCL_' | head -12
if where=$(dlpack_header); then
  record "  <dlpack/dlpack.h>" found "$where"
  case "$where" in *CPATH*)
    # the CMake build finds it through BX_DLPACK_INCLUDE_DIR (make and pip)
    export CPATH="/tmp/bx_dlpack${CPATH:+:$CPATH}" CMAKE_ARGS="-DBX_DLPACK_INCLUDE_DIR=/tmp/bx_dlpack"
    export SKBUILD_CMAKE_ARGS="-DBX_DLPACK_INCLUDE_DIR=/tmp/bx_dlpack" ;;
  esac
else
  record "  <dlpack/dlpack.h>" "FAIL(missing)" "no libdlpack-dev, no .dlpack/ copy, no torch header"
fi

record "  cmake" "$(cmake --version 2>/dev/null | head -n 1 || echo 'FAIL(missing)')" "the build needs CMake >= 3.24"
if step "build library (make lib: CMake configure + build)" build.log 240 make -j"$JOBS" CUDA=1 lib; then
  if grep -qx 'cuda=ON' build/bitexact-features.txt 2>/dev/null; then
    record "  CUDA backend built" yes ""
  else
    record "  CUDA backend built" "FAIL(no)" "nvcc not found? see build.log"
  fi
  step "build GPU tests (cuda-tests)" build.log 150 make -j"$JOBS" cuda-tests
  if [ -x build/tests/cuda/bx_cuda_tests ]; then
    step "GPU test runner" gpu_tests.log 240 build/tests/cuda/bx_cuda_tests
    record "  tests" "" "$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$OUT/gpu_tests.log" | tail -1)"
    grep -q '^GPU tests NOT RUN' "$OUT/gpu_tests.log" && record "  tests" "FAIL(not run)" \
      "$(grep '^GPU tests NOT RUN' "$OUT/gpu_tests.log")"
  else
    record "GPU test runner" SKIPPED "not built"
  fi
  # the training step on the GPU against the CPU (issue 30): its own script on this
  # build, with what is left but 100 s for the benchmarks below
  tb=$(($(left) - 100))
  if [ "$tb" -ge 60 ]; then
    step "training step on the GPU (gpu_train_check.sh)" train_check.log "$tb" \
      env GPU_TRAIN_FROM_CHECK=1 GPU_TRAIN_BUDGET="$tb" OUT="$OUT/train" bash scripts/gpu_train_check.sh
    [ -f "$OUT/train/summary.txt" ] && sed 's/^/  | /' "$OUT/train/summary.txt" | head -60 | tee -a "$SUMMARY"
  else
    record "training step on the GPU" SKIPPED "out of the ${BUDGET}s budget"
  fi
  if [ -x build/bench/cuda/bench_cuda ]; then
    step "GPU benchmark (bench_cuda)" bench_cuda.log 120 build/bench/cuda/bench_cuda
    # the other scheme for the squares (same bits, maybe another speed)
    step "GPU benchmark, integer windows" bench_cuda.log 60 \
      env BX_CUDA_SQUARES=int build/bench/cuda/bench_cuda --quick
  else
    record "GPU benchmark (bench_cuda)" SKIPPED "not built"
  fi
else
  record "GPU tests and benchmark" SKIPPED "the library did not build"
fi

if "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
  if step "pip install . (Python package)" pip_install.log 180 \
      env BITEXACT_CUDA=ON "$PY" -m pip install --no-build-isolation --no-deps --no-index --no-cache-dir . ; then
    # run from outside the checkout so that the installed package is imported
    step "PyTorch comparison (bench_torch.py)" bench_torch.log 150 \
      bash -c "cd /tmp && '$PY' '$PWD/bench/cuda/bench_torch.py'"
    if "$PY" -c 'import pytest' >/dev/null 2>&1 && [ -f tests/python/test_cuda.py ]; then
      step "Python CUDA tests (pytest)" pytest_cuda.log 150 \
        "$PY" -m pytest -p no:cacheprovider -q -rs --rootdir tests/python tests/python/test_cuda.py
      record "  pytest" "" "$(grep -E '(passed|failed|error|skipped).* in [0-9.]+s' "$OUT/pytest_cuda.log" | tail -1)"
    else
      record "Python CUDA tests (pytest)" SKIPPED "pytest or tests/python/test_cuda.py missing"
    fi
  else
    record "PyTorch comparison (bench_torch.py)" SKIPPED "pip install failed (see pip_install.log)"
  fi
else
  record "PyTorch comparison" SKIPPED "torch with CUDA is not importable by $PY"
fi

total=$(($(date +%s) - START))
{
  echo
  echo "total: ${total}s of a ${BUDGET}s budget; overall: $([ $FAILED -eq 0 ] && echo PASS || echo FAIL)"
} | tee -a "$SUMMARY"

# The details worth reading in the tool's output tail, also kept in $OUT.
{
  if [ -f "$OUT/gpu_tests.log" ]; then
    echo
    echo "---- GPU tests: failures, notes and counts ----"
    grep -E '^\[FAIL\]|^  FAIL|^  note|^  skip|^\[SKIP\]|NOT RUN|passed, [0-9]+ failed|^bx_cuda_tests:' \
      "$OUT/gpu_tests.log" | head -80
  fi
  if [ -f "$OUT/bench_cuda.log" ]; then
    echo
    echo "---- bench_cuda ----"
    grep -v '^\$ ' "$OUT/bench_cuda.log" | tail -40
  fi
  if [ -f "$OUT/pytest_cuda.log" ]; then
    echo
    echo "---- pytest tests/python/test_cuda.py (failures) ----"
    grep -E '^(FAILED|ERROR)|Error|assert' "$OUT/pytest_cuda.log" | head -20
  fi
  if [ -f "$OUT/bench_torch.log" ]; then
    echo
    echo "---- bench_torch.py ----"
    grep -v '^\$ ' "$OUT/bench_torch.log" | tail -30
  fi
} > "$OUT/details.tmp"
cat "$OUT/details.tmp"
echo
echo "==== gpu_check summary ($OUT/summary.txt) ===="
cat "$SUMMARY"
cat "$OUT/details.tmp" >> "$SUMMARY"
rm -f "$OUT/details.tmp"
exit $FAILED
