#!/bin/sh
# fuzz_safetensors_seeds.sh DIR — writes a seed corpus for
# build-fuzz/fuzz_safetensors into DIR: small valid safetensors files in the
# harness's two input forms (byte 0 odd: "HEADER\0DATA", the harness adds
# the length; even: a whole file), so the fuzzer starts from the format's
# structure rather than from random bytes. Called by fuzz/run_ci.sh.
set -eu
dir=${1:?usage: fuzz_safetensors_seeds.sh DIR}
mkdir -p "$dir"

# seed NAME HEADER-JSON DATA-BYTES: the odd form, DATA-BYTES bytes of data
seed() {
  { printf '\001%s\000' "$2"; head -c "$3" /dev/zero | tr '\000' '\077'; } > "$dir/$1"
}
seed f32 '{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}' 8
seed mixed '{"__metadata__":{"format":"pt"},"a.weight":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]},"b":{"dtype":"F64","shape":[1],"data_offsets":[16,24]},"c":{"dtype":"F16","shape":[],"data_offsets":[24,26]}}' 32
seed empty '{"e":{"dtype":"F32","shape":[0,4],"data_offsets":[0,0]},"s":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}}' 8
seed dtypes '{"a":{"dtype":"BOOL","shape":[1],"data_offsets":[0,1]},"b":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[1,2]},"c":{"dtype":"F4","shape":[2],"data_offsets":[2,3]},"d":{"dtype":"F6_E2M3","shape":[4],"data_offsets":[3,6]},"e":{"dtype":"C64","shape":[1],"data_offsets":[8,16]},"f":{"dtype":"U16","shape":[1],"data_offsets":[16,18]}}' 24
seed overlap '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}' 12
seed dup '{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}' 8
seed big '{"a":{"dtype":"F64","shape":[4611686018427387904,8],"data_offsets":[0,8]}}' 8
seed empty_header '{}' 0
# the even form: a whole file, length prefix 0x35 = 53 bytes of header
{ printf '\000\065\000\000\000\000\000\000\000'
  printf '{"x":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}'
  printf 'abcd'; } > "$dir/whole_file"
