#!/usr/bin/env bash
# demo.sh — the main job: build bitexact, then
#  1. `bitexact demo`: naive float norms change their bits with thread
#     count, tensor order and partition while bitexact's do not;
#  2. the training demo: the same short `bitexact train` run (built-in tiny
#     GLM-4.5 MoE config, synthetic corpus) on several layouts (threads,
#     micro-batches, MPI ranks) in --mode invariant and --mode ordinary; the
#     records are compared with `bitexact diff` and the checkpoints with
#     `bitexact hash`; then one longer run shows the loss going down toward
#     the corpus's entropy rate. Two pictures (bitexact plot, SVG) go to
#     $BX_DEMO_OUT (default build/demo): drift.svg, how far each layout's
#     loss is from the reference per step (ordinary drifts, invariant stays
#     at 0 ULP), and loss.svg, the long run's curves.
# Exits non-zero if bitexact's results ever differ (the norm demo, or any
# invariant-mode record or checkpoint). Arguments go to `bitexact demo`.
# BX_DEMO_NO_TRAIN=1 skips part 2; BX_DEMO_LONG_STEPS=0 skips the long run.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
make -j"$(nproc)" cli
build/bitexact demo "$@"
[ "${BX_DEMO_NO_TRAIN:-0}" = 1 ] && exit 0

BX=build/bitexact
export LC_NUMERIC=C   # printf of hex floats
STEPS=6            # the short run, on every layout
BATCH=8            # sequences per step: divides ranks x micro-batches below
SEQ=64
LONG_STEPS=${BX_DEMO_LONG_STEPS:-100}
LONG_LR=3e-3
T0=$SECONDS
WORK=$(mktemp -d "${TMPDIR:-/tmp}/bitexact-demo.XXXXXX")
OUT=${BX_DEMO_OUT:-build/demo}
mkdir -p "$OUT"
trap 'rm -rf "$WORK"' EXIT

# ---- the layouts: "ranks threads micro-batches ep" -------------------------
# The first row is the reference every other row is compared against.
LAYOUTS=(
  "1 1 1 1"
  "1 2 1 1"
  "1 1 2 1"
  "1 2 2 1"
  "1 1 4 1"
  "1 2 4 1"
  "2 1 1 1"
  "2 1 2 1"
  "4 1 1 1"
  "4 1 2 1"
  # ---- expert parallelism (--ep E): experts over E ranks, tokens exchanged
  # with MPI all-to-all (a build without it skips these rows with a note)
  "2 1 1 2"
  "4 1 1 2"
  "4 1 1 4"
)

MPI=0
MPIRUN=()
if grep -qx 'mpi=ON' build/bitexact-features.txt 2>/dev/null && command -v mpirun >/dev/null; then
  MPI=1
  MPIRUN=(mpirun --oversubscribe)          # 2 cores run 4 ranks
  [ "$(id -u)" -eq 0 ] && MPIRUN+=(--allow-run-as-root)
fi

hexloss() { sed -n 's/.*"loss": "\([^"]*\)".*/\1/p' "$1" | tail -n 1; }
ckhash() { "$BX" hash "$1/model.safetensors" "$1/optimizer/optimizer.safetensors" | tail -n 1 | cut -d' ' -f1; }

echo
echo "== training demo: bitexact train, $STEPS steps of $BATCH x $SEQ tokens, built-in tiny config, synthetic corpus"
printf '%-28s %-10s %-16s %-18s %s\n' layout mode "final loss" "record identical" "checkpoint hash equal"
bad=0; ordinary_diverged=0; notes=(); ep_skip=0; plot_args=(); inv_ref=""
for mode in invariant ordinary; do
  ref_rec=""; ref_hash=""
  for row in "${LAYOUTS[@]}"; do
    read -r np th mb ep <<<"$row"
    name="np$np-t$th-mb$mb-ep$ep"
    label="ranks $np threads $th mb $mb"; [ "$ep" -gt 1 ] && label="$label ep $ep"
    rec="$WORK/$mode-$name.jsonl"; ck="$WORK/$mode-$name.ckpt"
    args=(train --steps "$STEPS" --global-batch "$BATCH" --seq-len "$SEQ" --threads "$th"
          --micro-batches "$mb" --mode "$mode" --record "$rec" --save "$ck" -q)
    [ "$ep" -gt 1 ] && args+=(--ep "$ep")
    if [ "$np" -gt 1 ] && [ "$MPI" -eq 0 ]; then
      [ "$mode" = invariant ] && notes+=("$label: skipped (built without MPI or no mpirun)")
      continue
    fi
    [ "$ep" -gt 1 ] && [ "$ep_skip" -eq 1 ] && continue
    if [ "$np" -gt 1 ]; then cmd=("${MPIRUN[@]}" -np "$np" "$BX" "${args[@]}"); else cmd=("$BX" "${args[@]}"); fi
    if ! "${cmd[@]}" >"$WORK/out" 2>"$WORK/err"; then
      if [ "$ep" -gt 1 ] && grep -q 'not yet supported' "$WORK/err"; then
        notes+=("--ep rows skipped: $(grep -m1 'not yet supported' "$WORK/err")")
        ep_skip=1; continue
      fi
      echo "demo.sh: $label, $mode: bitexact train failed:" >&2; cat "$WORK/err" >&2; exit 2
    fi
    h=$(ckhash "$ck")
    # the drift picture: every ordinary layout, and the invariant ones but the reference
    if [ "$mode" = ordinary ] || [ -n "$ref_rec" ]; then
      plot_args+=(--label "$mode $name" "$rec")
    fi
    if [ -z "$ref_rec" ]; then
      ref_rec=$rec; ref_hash=$h; same_rec="(reference)"; same_ck="(reference)"
    else
      if "$BX" diff "$ref_rec" "$rec" >/dev/null; then same_rec=yes; else same_rec=NO; fi
      if [ "$h" = "$ref_hash" ]; then same_ck=yes; else same_ck=NO; fi
      if [ "$same_rec" = NO ] || [ "$same_ck" = NO ]; then
        if [ "$mode" = invariant ]; then bad=1; else ordinary_diverged=1; fi
      fi
    fi
    printf '%-28s %-10s %-16s %-18s %s\n' "$label" "$mode" "$(hexloss "$rec")" "$same_rec" "$same_ck"
  done
done
for n in "${notes[@]}"; do echo "note: $n"; done
[ "$MPI" -eq 0 ] && echo "note: without MPI only the 1-process layouts ran"
echo "checkpoint hash: bitexact hash of model.safetensors + optimizer/optimizer.safetensors"
if [ "$bad" -ne 0 ]; then
  echo "FAIL: invariant mode gave different bits on different layouts" >&2; exit 1
fi
echo "invariant: every record and checkpoint identical to the reference's."
if [ "$ordinary_diverged" -eq 1 ]; then
  echo "ordinary (float sums in layout order, as frameworks do): the bits change with the layout."
else
  echo "note: ordinary mode happened to give the same bits on every layout that ran."
fi
# the picture: per step, the loss's ULPs from the invariant reference (at most 16 curves)
inv_ref="$WORK/invariant-np1-t1-mb1-ep1.jsonl"
n_plot=$(( ${#plot_args[@]} / 3 )); keep=()
if [ "$n_plot" -gt 16 ]; then  # every ordinary layout, then the invariant ones up to 16
  for ((i = 0; i < ${#plot_args[@]}; i += 3)); do
    case "${plot_args[i+1]}" in ordinary*) keep+=("${plot_args[@]:i:3}") ;; esac
  done
  for ((i = 0; i < ${#plot_args[@]} && ${#keep[@]} < 48; i += 3)); do
    case "${plot_args[i+1]}" in invariant*) keep+=("${plot_args[@]:i:3}") ;; esac
  done
  plot_args=("${keep[@]}")
fi
"$BX" plot --drift "$inv_ref" --title "loss: fp32 ULPs from the invariant 1-process run, per step" \
    "${plot_args[@]}" -o "$OUT/drift.svg"
echo "(short runs: $((SECONDS - T0)) s)"

if [ "$LONG_STEPS" -gt 0 ]; then
  T1=$SECONDS
  echo
  echo "== the loss going down: $LONG_STEPS steps, lr $LONG_LR, one process, invariant"
  "$BX" train --steps "$LONG_STEPS" --global-batch "$BATCH" --seq-len "$SEQ" --lr "$LONG_LR" \
      --record "$WORK/long.jsonl" -q >"$WORK/out"
  printf '%6s  %10s  %s\n' step loss hex
  every=$(( LONG_STEPS >= 10 ? LONG_STEPS / 10 : 1 ))
  while IFS= read -r line; do
    s=$(sed -n 's/.*"step": \([0-9]*\).*/\1/p' <<<"$line")
    l=$(sed -n 's/.*"loss": "\([^"]*\)".*/\1/p' <<<"$line")
    if [ $((s % every)) -eq 0 ] || [ "$s" -eq $((LONG_STEPS - 1)) ]; then
      printf '%6d  %10.6f  %s\n' "$s" "$l" "$l"
    fi
  done <"$WORK/long.jsonl"
  grep 'entropy rate' "$WORK/out" || true
  "$BX" plot --label "invariant, lr $LONG_LR" --title "loss, $LONG_STEPS steps (tiny config, synthetic corpus)" \
      "$WORK/long.jsonl" -o "$OUT/loss.svg"
  echo "(ln 1024 = 6.931 nats at initialisation; $((SECONDS - T1)) s)"
fi
echo "(training demo: $((SECONDS - T0)) s)"
