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
  fuzz_train_gemm_grid)
    # layout/flags, m, n, k, then element words (the block/thread order from bytes 4..6)
    seed "$name" nt_edges '\000\101\103\021' 600
    seed "$name" tn_bf16_acc '\036\077\100\040' 600
    seed "$name" nn_k0_acc '\021\005\007\000' 64
    seed "$name" random '' 700
    ;;
  fuzz_strided)
    # dtype/p/threads, ndim/mode, 4 x (size, int8 stride), elements
    seed "$name" cols_f32 '\002\001\010\020\004\002\000\000\000\000' 512
    seed "$name" expand_bf16 '\001\001\004\000\006\001\000\000\000\000' 256
    seed "$name" neg_f16_pm1 '\034\002\005\377\003\373\002\036\000\000' 512
    seed "$name" overlap_f64 '\003\005\004\001\004\001\000\000\000\000' 256
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
  fuzz_ckpt_index)
    # INDEX "\0" SHARD-HEADER ... (the harness adds lengths and data)
    s1='{"a.w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b.w":{"dtype":"BF16","shape":[2],"data_offsets":[8,12]}}'
    s2='{"__metadata__":{"format":"pt"},"c":{"dtype":"F16","shape":[1],"data_offsets":[0,2]}}'
    seed "$name" two_shards '{"metadata":{"total_size":14},"weight_map":{"a.w":"model-00001-of-00002.safetensors","b.w":"model-00001-of-00002.safetensors","c":"model-00002-of-00002.safetensors"}}\000'"$s1"'\000'"$s2" 0
    seed "$name" wrong_shard '{"weight_map":{"a.w":"model-00002-of-00002.safetensors","b.w":"model-00001-of-00002.safetensors","c":"model-00002-of-00002.safetensors"}}\000'"$s1"'\000'"$s2" 0
    seed "$name" unlisted '{"weight_map":{"a.w":"x.safetensors"}}\000'"$s1" 0
    seed "$name" missing_file '{"weight_map":{"a.w":"a.safetensors","c":"b.safetensors"}}\000'"$s1" 0
    seed "$name" path '{"weight_map":{"a.w":"../a.safetensors"}}' 0
    seed "$name" size '2GiB' 0
    ;;
  fuzz_trace)
    # byte 0 even: one trace; odd: A "\0" B
    h='{"bitexact_trace": 1, "blocks": 16, "hash": "xxh3-64", "head": 8, "model": "M:0123", "producer": "p"}\n'
    e1='{"step": 0, "phase": "forward", "module": "a", "what": "output", "slice": 0, "dtype": "F32", "shape": [2], "hash": "0123456789abcdef", "blocks": "00000000000000011111111111111111", "head": ["0x1p+0", "-0x1.8p-1"]}\n'
    e1b='{"step": 0, "phase": "forward", "module": "a", "what": "output", "slice": 0, "dtype": "F32", "shape": [2], "hash": "0123456789abcdee", "blocks": "00000000000000011111111111111112", "head": ["0x1p+0", "-0x1.800002p-1"]}\n'
    e2='{"step": 0, "phase": "backward", "module": "a.weight", "what": "grad", "slice": null, "dtype": "BF16", "shape": [], "hash": "fedcba9876543210", "blocks": "fedcba9876543210", "head": ["nan"]}\n'
    e3='{"step": 1, "phase": "optimizer", "module": "b", "what": "param", "slice": null, "dtype": "F16", "shape": [3, 0], "hash": "2d06800538d394c2", "blocks": "", "head": []}\n'
    seed "$name" one '\000'"$h$e1$e2$e3" 0
    seed "$name" two_differ '\001'"$h$e1$e2"'\000'"$h$e1b$e3" 0
    seed "$name" two_same '\001'"$h$e1$e2"'\000'"$h$e2$e1" 0
    seed "$name" truncated '\000'"$h"'{"step": 0' 0
    ;;
  fuzz_npy)
    # bit 0 of byte 0: header text only (a v1 prefix and element bytes added)
    seed "$name" i4_whole '\000\223NUMPY\001\000\106\000{'"'"'descr'"'"': '"'"'<i4'"'"', '"'"'fortran_order'"'"': False, '"'"'shape'"'"': (2,), }          \n\001\000\000\000\002\000\000\000' 0
    seed "$name" u2_text '\011{'"'"'descr'"'"': '"'"'<u2'"'"', '"'"'fortran_order'"'"': False, '"'"'shape'"'"': (4,), }\n' 0
    seed "$name" i8_text '\021{"descr": "<i8", "fortran_order": False, "shape": (1,)}' 0
    seed "$name" random '' 128
    ;;
  fuzz_train_config)
    seed "$name" tiny '{"model_type": "glm4_moe", "vocab_size": 128, "hidden_size": 32, "intermediate_size": 64, "moe_intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 64, "n_routed_experts": 8, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1}' 0
    seed "$name" rope5 '{"head_dim": 8, "hidden_size": 32, "vocab_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "n_routed_experts": 4, "num_experts_per_tok": 1, "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0, "partial_rotary_factor": 0.5}, "rope_scaling": null}' 0
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
