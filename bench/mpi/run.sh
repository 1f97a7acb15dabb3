#!/usr/bin/env bash
# run.sh — the distributed benchmark (README "Distributed" figures):
#  1. per-call cost of the collective step for P = 2, 4, 8 (oversubscribed
#     on this 2-core machine), against the local-only call in the same run;
#  2. end-to-end bx_clip_grad_norm on the GPT-2-small-like set, 1 rank x 1
#     thread, 1 rank x 2 threads and 2 ranks x 1 thread, interleaved over
#     ROUNDS rounds; the median of the per-round medians is reported.
set -eu
BUILD=${BUILD:-build}
ROUNDS=${ROUNDS:-5}
cd "$(dirname "$0")/../.."
# yield_when_idle: a rank waiting in the collective must not spin on a core
# its peer needs (2 shared cores here, and oversubscribed runs); bind-to none
# lets a 1-rank x 2-thread run use both cores.
MPIRUN=(mpirun --oversubscribe --bind-to none --mca mpi_yield_when_idle 1)
[ "$(id -u)" -eq 0 ] && MPIRUN+=(--allow-run-as-root)
B="$BUILD/bench/mpi/bench_dist"
for np in 2 4 8; do "${MPIRUN[@]}" -np "$np" "$B" collective 300; done
declare -A all
for r in $(seq "$ROUNDS"); do
  for cfg in "1 1" "1 2" "2 1"; do
    set -- $cfg
    ms=$("${MPIRUN[@]}" -np "$1" "$B" clip "$2" 5 | sed -n 's/.*median \([0-9.]*\) ms.*/\1/p')
    all["$1x$2"]+="$ms "
  done
done
med() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
one=$(echo "${all[1x1]}" | med); onet=$(echo "${all[1x2]}" | med); two=$(echo "${all[2x1]}" | med)
printf 'clip GPT-2-small (124.4M fp32, 148 tensors), median of %s rounds:\n' "$ROUNDS"
printf '  1 rank x 1 thread   %8.2f ms\n  1 rank x 2 threads  %8.2f ms\n  2 ranks x 1 thread  %8.2f ms\n' "$one" "$onet" "$two"
awk -v a="$two" -v b="$one" -v c="$onet" 'BEGIN { printf "  ratio 2 ranks / 1 rank (1 thread): %.2f   2 ranks / 1 rank (2 threads): %.2f\n", a/b, a/c }'
