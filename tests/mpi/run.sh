#!/usr/bin/env bash
# run.sh — the multi-rank tests under real mpirun: each program with 1, 2,
# 3, 4 and 8 ranks (test_megatron: 8 only), oversubscribed on this 2-core
# machine, --allow-run-as-root when root (CI runs as root), each run
# bounded by a timeout so a hang fails instead of stalling CI.
# Last line: "N passed, N failed" over the runs; exit 1 on any failure.
set -u
BUILD=${BUILD:-build}
cd "$(dirname "$0")/../.."
# yield_when_idle: a rank waiting in the collective must not spin on a core
# its peer needs (2 shared cores here, and oversubscribed runs); bind-to none
# lets a 1-rank x 2-thread run use both cores.
MPIRUN=(mpirun --oversubscribe --bind-to none --mca mpi_yield_when_idle 1)
[ "$(id -u)" -eq 0 ] && MPIRUN+=(--allow-run-as-root)
export OMPI_MCA_rmaps_base_oversubscribe=1
pass=0 fail=0
run() { # NAME NP [ARGS...]
  local name=$1 np=$2; shift 2
  local out
  if out=$(timeout 300 "${MPIRUN[@]}" -np "$np" "$BUILD/tests/mpi/$name" "$@" 2>&1); then
    pass=$((pass + 1)); printf '[ OK ] %-16s np=%d  %s\n' "$name" "$np" "$(echo "$out" | tail -n 1)"
  else
    fail=$((fail + 1)); printf '[FAIL] %-16s np=%d\n%s\n' "$name" "$np" "$out"
  fi
}
for np in 1 2 3 4 8; do
  run test_partition "$np"
  run test_faults "$np"
done
run test_megatron 8
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
