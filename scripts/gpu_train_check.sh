#!/usr/bin/env bash
# gpu_train_check.sh — the training step on the GPU against the CPU, in one
# prepared run (issue 30, S4; docs/cuda.md). From the repository root of a
# checkout on a machine with a GPU it:
#
#   1. records the environment (unless scripts/gpu_check.sh calls it);
#   2. builds everything with the CUDA backend (make all CUDA=1; a carried
#      or earlier build/ is reused, make only redoes what changed);
#   3. sweeps every training call that has a CUDA kernel, device against
#      host over the same bytes, bit for bit (bx_tests train_device_sweep:
#      random shapes with every kind of special value; on a mismatch the
#      inputs and both outputs go to $OUT/sweep/ for replay on the CPU);
#   4. trains the tiny GLM config for 3 steps on the CPU and on the GPU
#      (`bitexact train --device cuda`: the model in managed memory, every
#      call with a CUDA kernel run there) and compares the records, the
#      checkpoints (`bitexact hash`) and the first-divergence traces; on a
#      difference `bitexact diff --trace` names the first divergent tensor
#      and both runs dump it (--dump) into $OUT for replay;
#   5. device invariance: the GPU run again with 2 micro-batches, with
#      every grid-stride kernel capped at one block
#      (BITEXACT_TEST_CUDA_BLOCKS=1), and with one host thread: each must
#      equal the CPU run's record and trace (CUDA graphs: none yet);
#   6. speed: the training GEMM on the GLM shapes against the host
#      (bench_train_gemm), and one step of the "34M" config on the CPU and
#      on the GPU (step seconds from --json; their records must be equal).
#
# Budget: 540 s by default (GPU_TRAIN_BUDGET), every step its own timeout.
# Output in $OUT (default ./gpu_train_out): summary.txt and one log per step.
# Exit status 0 only if every step that ran succeeded. Rehearsed without a
# GPU: BITEXACT_TEST_DEVICE=sim (or sim-plant, the negative control: a one-ULP
# error planted in the simulated GEMM must be found) runs steps 3-5 on the host simulation of
# the device backend (the summary then says "SIMULATED"; CI runs the same
# comparisons in tests/cli/cases_device.py).
#
#   bash scripts/gpu_train_check.sh
#   OUT=/tmp/x GPU_TRAIN_BUDGET=300 bash scripts/gpu_train_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."

OUT="${OUT:-./gpu_train_out}"
mkdir -p "$OUT"
BUDGET="${GPU_TRAIN_BUDGET:-540}"
START=$(date +%s)
JOBS="$(nproc 2>/dev/null || echo 16)"
PY="${PYTHON:-python3}"
SUMMARY="$OUT/summary.txt"
FAILED=0
GPU_SCRIPT=gpu_train_check
: > "$SUMMARY"
rm -rf "$OUT"/{env,build,sweep,train,invariance,speed}.log "$OUT/sweep" "$OUT/runs"
mkdir -p "$OUT/sweep" "$OUT/runs"
# shellcheck source=scripts/gpu_common.sh
source scripts/gpu_common.sh

BX=build/bitexact
SIM=""
case "${BITEXACT_TEST_DEVICE:-}" in sim*) SIM=" (SIMULATED on the host: BITEXACT_TEST_DEVICE=$BITEXACT_TEST_DEVICE)" ;; esac
echo "gpu_train_check: budget ${BUDGET}s, $JOBS jobs, output in $OUT$SIM"

if [ -z "${GPU_TRAIN_FROM_CHECK:-}" ]; then
  step "environment" env.log 30 bash -c "$(declare -f env_info); JOBS=$JOBS PY=$PY env_info"
  if where=$(dlpack_header); then
    case "$where" in *CPATH*)
      export CPATH="/tmp/bx_dlpack${CPATH:+:$CPATH}" CMAKE_ARGS="-DBX_DLPACK_INCLUDE_DIR=/tmp/bx_dlpack" ;;
    esac
  fi
fi

cuda_flag=1
[ -n "$SIM" ] && cuda_flag=auto
if ! step "build (make all)" build.log 300 make -j"$JOBS" CUDA=$cuda_flag all; then
  record "training checks" SKIPPED "the build failed (see build.log)"
  exit 1
fi
if [ -z "$SIM" ] && ! grep -qx 'cuda=ON' build/bitexact-features.txt 2>/dev/null; then
  record "  CUDA backend built" "FAIL(no)" "nvcc not found? see build.log"
fi

# ---- 3. the kernel sweep ------------------------------------------------------------
step "kernel sweep (device = host)" sweep.log 120 \
  env BX_SWEEP_OUT="$OUT/sweep" build/tests/bx_tests train_device_sweep
record "  sweep" "" "$(grep -E '^  note: [0-9]+ cases' "$OUT/sweep.log" | sed 's/^  note: //'); $(grep -E 'passed, [0-9]+ failed' "$OUT/sweep.log" | tail -1)"
if [ -z "$SIM" ] && grep -q 'host simulation' "$OUT/sweep.log"; then
  record "  sweep device" "FAIL(no GPU)" "the sweep ran on the host simulation: no usable GPU"
fi

# ---- 4. tiny GLM, 3 steps, CPU against GPU ----------------------------------------------
R="$OUT/runs"
# train TAG DEVICE ARGS...: 3 steps of the tiny config with record, checkpoint and trace
train() {
  local tag=$1 dev=$2
  shift 2
  rm -rf "$R/$tag.ck" "$R/$tag.jsonl" "$R/$tag.trace"
  "$BX" train --steps 3 --record "$R/$tag.jsonl" --save "$R/$tag.ck" --trace "$R/$tag.trace" \
    --device "$dev" --json "$@" > "$R/$tag.json"
}
# same A B: the records, traces and checkpoints of two runs are equal bytes
same() {
  cmp "$R/$1.jsonl" "$R/$2.jsonl" && cmp "$R/$1.trace" "$R/$2.trace" &&
    cmp "$R/$1.ck/model.safetensors" "$R/$2.ck/model.safetensors" &&
    cmp "$R/$1.ck/optimizer/optimizer.safetensors" "$R/$2.ck/optimizer/optimizer.safetensors"
}
# divergence A B: the first divergent trace entry, dumped by both runs for replay
divergence() {
  local key
  "$BX" diff --trace --json "$R/$1.trace" "$R/$2.trace" > "$R/$1-$2.diff.json"
  key=$("$PY" -c 'import json,sys; f=json.load(open(sys.argv[1])).get("first") or {}; print(f.get("dump_key",""))' \
        "$R/$1-$2.diff.json" 2>/dev/null)
  echo "first divergence: $("$PY" -c 'import json,sys; f=json.load(open(sys.argv[1])).get("first") or {}; print("step %s %s %s %s[%s]: cpu %s, gpu %s (%s ulp)" % tuple(f.get(k) for k in ("step","phase","module","what","element","a","b","ulp")))' "$R/$1-$2.diff.json" 2>&1)"
  if [ -n "$key" ]; then
    train "$1.dump" cpu --dump "$key" && train "$2.dump" cuda --dump "$key"
    echo "dumped $key: $R/$1.dump.trace.dump.safetensors, $R/$2.dump.trace.dump.safetensors"
  fi
}
step34() { # step34 TAG DEVICE: 2 steps of the 34M config, 8 x 256 tokens
  "$BX" train --config bench/configs/glm-34m.json --seq-len 256 --global-batch 8 --steps 2 \
    --device "$2" --record "$R/34m_$1.jsonl" --json > "$R/34m_$1.json"
}
# the functions above for a step's own shell (timeout runs programs, not functions)
DEFS="$(declare -f train same divergence step34); BX='$BX' R='$R' PY='$PY'"
if step "tiny GLM 3 steps on the CPU" train.log 90 bash -c "$DEFS; train cpu cpu" &&
   step "tiny GLM 3 steps on the GPU" train.log 180 bash -c "$DEFS; train gpu cuda"; then
  if step "  CPU = GPU (record, trace, checkpoint)" train.log 10 bash -c "$DEFS; same cpu gpu"; then
    record "  checkpoint hashes" "" "$("$BX" hash "$R/cpu.ck/model.safetensors" | tail -1) | $("$BX" hash "$R/gpu.ck/model.safetensors" | tail -1)"
  else
    step "  first divergence" train.log 120 bash -c "$DEFS; divergence cpu gpu"
    grep -E '^first divergence|^dumped' "$OUT/train.log" | tail -2 | while read -r l; do record "  " "" "$l"; done
  fi
fi

# ---- 5. device invariance ----------------------------------------------------------------
if [ -f "$R/cpu.jsonl" ]; then
  for v in "mb2:--micro-batches 2" "blocks1:" "threads1:--threads 1"; do
    tag=${v%%:*} args=${v#*:}
    envs=()
    [ "$tag" = blocks1 ] && envs=(env BITEXACT_TEST_CUDA_BLOCKS=1)
    # shellcheck disable=SC2086
    if step "GPU run, $tag" invariance.log 120 "${envs[@]}" bash -c "$DEFS; train gpu_$tag cuda $args"; then
      step "  = CPU run ($tag)" invariance.log 10 bash -c "$DEFS; same cpu gpu_$tag"
    fi
  done
  record "CUDA graphs on/off" SKIPPED "no CUDA graphs in the training step yet (docs/cuda.md)"
fi

# ---- 6. speed --------------------------------------------------------------------------------
if [ -x build/bench/cuda/bench_train_gemm ]; then
  step "GEMM speed (bench_train_gemm)" speed.log 120 build/bench/cuda/bench_train_gemm --reps 5
  [ -z "$SIM" ] && grep -q 'no GPU: not run' "$OUT/speed.log" &&
    record "  GEMM speed" "FAIL(no GPU)" "$(grep 'no GPU' "$OUT/speed.log" | head -1)"
else
  record "GEMM speed" SKIPPED "bench_train_gemm not built (no CUDA backend)"
fi
if [ -n "$SIM" ]; then
  record "34M step speed" SKIPPED "no speed on the host simulation"
elif step "34M config, 2 steps on the CPU" speed.log 150 bash -c "$DEFS; step34 cpu cpu" &&
   step "34M config, 2 steps on the GPU" speed.log 150 bash -c "$DEFS; step34 gpu cuda"; then
  step "  34M CPU = GPU (records)" speed.log 10 cmp "$R/34m_cpu.jsonl" "$R/34m_gpu.jsonl"
  record "  34M step seconds" "" "$("$PY" -c 'import json,sys; c,g=(json.load(open(f)) for f in sys.argv[1:]); print("cpu %.3f s (first %.3f), gpu %.3f s (first %.3f), cpu/gpu %.2f" % (c["step_seconds"], c["first_step_seconds"], g["step_seconds"], g["first_step_seconds"], c["step_seconds"]/g["step_seconds"]))' "$R/34m_cpu.json" "$R/34m_gpu.json" 2>&1)"
fi

total=$(($(date +%s) - START))
{
  echo
  echo "total: ${total}s of a ${BUDGET}s budget; overall: $([ $FAILED -eq 0 ] && echo PASS || echo FAIL)$SIM"
  if [ -f "$OUT/sweep.log" ]; then
    echo
    echo "---- kernel sweep: failures ----"
    grep -E '^\[FAIL\]|^  FAIL' "$OUT/sweep.log" | head -20
  fi
  if [ -f "$OUT/speed.log" ]; then
    echo
    echo "---- bench_train_gemm ----"
    grep -v '^\$ ' "$OUT/speed.log" | grep -vE '^====' | head -20
  fi
} > "$OUT/details.tmp"
cat "$OUT/details.tmp" >> "$SUMMARY"
echo
echo "==== gpu_train_check summary ($OUT/summary.txt) ===="
cat "$SUMMARY"
rm -f "$OUT/details.tmp"
# the steps' counts, as the test runners print them (scripts/test.sh reads the line)
echo "${STEPS_OK:-0} passed, ${STEPS_BAD:-0} failed (steps of gpu_train_check.sh)"
exit $FAILED
