#!/bin/sh
# run_ci.sh — build the libFuzzer harnesses and run each for a bounded time.
#
#   fuzz/run_ci.sh                 every harness, 30 s each
#   FUZZ_SECONDS=300 fuzz/run_ci.sh
#   fuzz/run_ci.sh fuzz_scale      one harness
#
# Each run starts from a small seed corpus made here on the fly (plus
# anything already in fuzz/corpus/NAME/). A crash, a sanitizer report or a
# bit mismatch (the harnesses __builtin_trap()) leaves its input in
# build-fuzz/artifacts/ and makes this script exit non-zero.
set -u
cd "$(dirname "$0")/.." || exit 2
SECONDS_EACH=${FUZZ_SECONDS:-30}

make fuzz || { echo "run_ci.sh: make fuzz failed" >&2; exit 2; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p build-fuzz/artifacts

# seed NAME FILE HEADER-PRINTF-STRING RANDOM-BYTES
seed() {
  printf "$3" > "$work/$1/$2"
  [ "$4" -gt 0 ] && head -c "$4" /dev/urandom >> "$work/$1/$2"
  return 0
}

make_seeds() {
  name=$1
  mkdir -p "$work/$name"
  case $name in
  fuzz_sumsq|fuzz_sumabs|fuzz_cuda_window)
    # dtype, misalignment, tiling in byte 0; then element bytes
    for b in '\000' '\001' '\002' '\003' '\066' '\147' '\162' '\377'; do
      seed "$name" "rand_$(printf "$b" | od -An -tx1 | tr -d ' ')" "$b" 509
    done
    seed "$name" f32_max '\002\377\377\177\177\377\377\177\177\001\000\000\000' 0
    seed "$name" f64_max '\003\377\377\377\377\377\377\357\177\001\000\000\000\000\000\000\000' 0
    seed "$name" f16_sub '\000\001\000\377\003\001\200\000\174\000\176' 0
    seed "$name" tiled '\163' 64
    ;;
  fuzz_scale)
    # byte 0 (dtype, mode, threads, misalignment), 8 bytes coef, elements
    seed "$name" half_torch_f32 '\002\000\000\000\000\000\000\340\077' 256
    seed "$name" half_exact_f16 '\004\000\000\000\000\000\000\340\077' 256
    seed "$name" tenth_exact_bf16 '\005\232\231\231\231\231\231\271\077' 256
    seed "$name" tiny_exact_f64 '\007\000\000\000\000\000\000\020\000' 256
    seed "$name" third_threads '\036\125\125\125\125\125\125\325\077' 512
    seed "$name" nan_coef '\002\000\000\000\000\000\000\370\177' 64
    seed "$name" random '' 300
    ;;
  fuzz_safetensors)
    sh fuzz/fuzz_safetensors_seeds.sh "$work/$name"
    ;;
  *)
    seed "$name" random '' 256
    seed "$name" low '\000' 64
    seed "$name" high '\177' 64
    ;;
  esac
  if [ -d "fuzz/corpus/$name" ]; then cp "fuzz/corpus/$name"/* "$work/$name"/ 2>/dev/null; fi
  return 0
}

status=0
if [ $# -gt 0 ]; then names="$*"; else names=$(cd build-fuzz && ls fuzz_* 2>/dev/null); fi
for name in $names; do
  bin=build-fuzz/$name
  [ -x "$bin" ] || { echo "run_ci.sh: no $bin" >&2; status=1; continue; }
  make_seeds "$name"
  echo "== $name: ${SECONDS_EACH}s"
  if "$bin" -max_total_time="$SECONDS_EACH" -timeout=30 -rss_limit_mb=4096 -max_len=8192 \
       -print_final_stats=1 -artifact_prefix="build-fuzz/artifacts/$name-" \
       "$work/$name" > "$work/$name.log" 2>&1; then
    grep -E "^stat::number_of_executed_units|^#[0-9]+.*DONE" "$work/$name.log" | tail -2
    echo "== $name: ok"
  else
    tail -40 "$work/$name.log"
    echo "== $name: FAILED (input saved under build-fuzz/artifacts/$name-*)"
    status=1
  fi
done
exit $status
