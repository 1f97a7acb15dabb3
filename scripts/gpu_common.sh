# gpu_common.sh — what scripts/gpu_check.sh and scripts/gpu_train_check.sh
# share (sourced, not run): the budget clock, the summary lines, a step with
# its own timeout, the environment record and the <dlpack/dlpack.h> search.
# The sourcing script sets OUT, BUDGET, START, JOBS, PY, SUMMARY and FAILED.

left() { echo $((BUDGET - ($(date +%s) - START))); }

record() { # record STEP STATUS DETAIL
  printf '%-28s %-14s %s\n' "$1" "$2" "$3" | tee -a "$SUMMARY"
  case "$2" in
    FAIL* | TIMEOUT*) FAILED=1 STEPS_BAD=$((${STEPS_BAD:-0} + 1)) ;;
    OK) STEPS_OK=$((${STEPS_OK:-0} + 1)) ;;
  esac
}

# step NAME LOGFILE MAX_SECONDS COMMAND... — runs COMMAND with a timeout of
# min(MAX_SECONDS, time left), output to $OUT/LOGFILE; returns its status.
step() {
  local name=$1 log=$2 max=$3
  shift 3
  local rem t0 rc st dt
  rem=$(left)
  if [ "$rem" -lt 20 ]; then
    record "$name" SKIPPED "out of the ${BUDGET}s budget"
    return 99
  fi
  [ "$max" -gt "$rem" ] && max=$rem
  printf '==== %s: %s (timeout %ss, %ss left) ====\n' "${GPU_SCRIPT:-gpu}" "$name" "$max" "$rem"
  local cmd="$*"
  printf '$ %.300s\n' "${cmd//$'\n'/ }" >> "$OUT/$log"
  t0=$(date +%s)
  timeout -k 5 "$max" "$@" >> "$OUT/$log" 2>&1
  rc=$?
  dt=$(($(date +%s) - t0))
  if [ $rc -eq 0 ]; then st=OK
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then st="TIMEOUT(${max}s)"
  else st="FAIL(rc=$rc)"
  fi
  record "$name" "$st" "${dt}s, $OUT/$log"
  return $rc
}

env_info() {
  echo "date: $(date -u +%FT%TZ)"
  echo "git: $(git log -1 --format='%h %s' 2>/dev/null || echo 'not a git checkout')"
  echo "git status (short):"
  git status --short 2>/dev/null | head -40
  echo "cpus: $JOBS; memory: $(free -g 2>/dev/null | awk '/Mem:/{print $2 " GiB"}')"
  nvidia-smi 2>&1 | head -20 || echo "nvidia-smi: not found"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>&1 || true
  local nvcc
  nvcc="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
  "$nvcc" --version 2>&1 | tail -2 || echo "nvcc: not found"
  echo "gcc: $(${CC:-cc} --version | head -1)"
  grep -hE '^#define NCCL_(MAJOR|MINOR|PATCH)' /usr/local/cuda/include/nccl.h /usr/include/nccl.h 2>/dev/null || echo "nccl.h: not found"
  ls /usr/local/cuda/lib64/libnccl* /usr/lib/x86_64-linux-gnu/libnccl* 2>/dev/null || true
  "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' 2>&1 || true
}

# <dlpack/dlpack.h>: the system's, else a carried copy, else PyTorch's.
dlpack_header() {
  local d src=""
  for d in /usr/include /usr/local/include; do
    if [ -f "$d/dlpack/dlpack.h" ]; then echo "$d/dlpack/dlpack.h (system)"; return 0; fi
  done
  if [ -f .dlpack/dlpack/dlpack.h ]; then
    src=.dlpack/dlpack/dlpack.h
  else
    src=$("$PY" -c 'import os, torch; p = os.path.join(os.path.dirname(torch.__file__), "include", "ATen", "dlpack.h"); print(p if os.path.exists(p) else "")' 2>/dev/null)
  fi
  [ -n "$src" ] || return 1
  mkdir -p /tmp/bx_dlpack/dlpack && cp "$src" /tmp/bx_dlpack/dlpack/dlpack.h || return 1
  echo "$src (through CPATH)"
}

