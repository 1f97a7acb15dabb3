#!/usr/bin/env bash
# bench/train/run_34m.sh — the adoption run of issue 27: the "34M" GLM config
# (bench/configs/glm-34m.json) for 300 steps of 8 x 256 tokens on a corpus
# made from this machine's Python standard library (make_corpus.py), with
# warmup + cosine decay, periodic saves, an exact eval loss, a plot, and the
# wall time. Writes into OUT (default build/run34m): run.jsonl, ckpt/,
# loss.svg, summary.json, time.txt.
#   bash bench/train/run_34m.sh [OUT]      (STEPS=300 THREADS=2 NP=1 override)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-build/run34m}
STEPS=${STEPS:-300}
THREADS=${THREADS:-2}
NP=${NP:-1}
BX=build/bitexact
[ -x "$BX" ] || make -j"$(nproc)" cli
mkdir -p "$OUT"
[ -f "$OUT/corpus/train.bin" ] || python3 bench/train/make_corpus.py --out "$OUT/corpus" >/dev/null
args=(train --config bench/configs/glm-34m.json --data "$OUT/corpus/train.bin" --seq-len 256
      --global-batch 8 --steps "$STEPS" --lr 1e-3 --lr-scheduler cosine --warmup-steps 30
      --min-lr 1e-4 --weight-decay 0.1 --adam-beta2 0.95 --clip 1.0 --threads "$THREADS"
      --eval-data "$OUT/corpus/eval.bin" --eval-every 25 --eval-batches 8
      --save "$OUT/ckpt" --save-every 50 --record "$OUT/run.jsonl" --json)
rm -rf "$OUT/ckpt"
t0=$(date +%s.%N)
if [ "$NP" -gt 1 ]; then
  mpirun --oversubscribe $([ "$(id -u)" -eq 0 ] && echo --allow-run-as-root) -np "$NP" "$BX" "${args[@]}" >"$OUT/summary.json"
else
  "$BX" "${args[@]}" >"$OUT/summary.json"
fi
t1=$(date +%s.%N)
"$BX" plot --label "34M, cosine 1e-3 -> 1e-4, warmup 30" \
    --title "GLM 34M config, $STEPS steps of 8 x 256 tokens (Python stdlib BPE corpus)" \
    -o "$OUT/loss.svg" "$OUT/run.jsonl" >/dev/null
python3 - "$OUT" "$t0" "$t1" <<'PY'
import json, sys
out, t0, t1 = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
rows = [json.loads(l) for l in open(out + "/run.jsonl")]
ev = [(r["step"], float.fromhex(r["eval_loss"])) for r in rows if "eval_loss" in r]
s = json.load(open(out + "/summary.json"))
st = json.load(open(out + "/ckpt/trainer_state.json"))
msg = (f"wall {t1 - t0:.1f} s for {len(rows)} steps ({(t1 - t0) / len(rows):.2f} s/step; "
       f"in-process step {s['step_seconds']:.3f} s); loss {float.fromhex(rows[0]['loss']):.4f} -> "
       f"{float.fromhex(rows[-1]['loss']):.4f}; eval loss "
       + ", ".join(f"{e:.4f} (step {k})" for k, e in ev[:1] + ev[-3:])
       + f"; checkpoint step {st['step']}; passes 2 on {sum(r['passes'] == 2 for r in rows)} steps")
print(msg)
open(out + "/time.txt", "w").write(msg + "\n")
PY
