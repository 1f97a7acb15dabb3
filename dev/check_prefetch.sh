#!/usr/bin/env bash
# dev/check_prefetch.sh — check the emitted code: every hot loop function of
# every kernel has its software prefetches (src/cpu/prefetch.h), as built.
#
#   dev/check_prefetch.sh [OBJDIR]   (default: build/CMakeFiles/bx_objects.dir,
#                                     the library objects of the CMake build; `make dev-check`)
#
# The functions checked:
#  - every function named in a micro-kernel table (const bx_*_micro ... =
#    { ... } in src/cpu/*.c), found in that file's object: a new ISA's
#    micro-kernels are checked without editing this script;
#  - the portable scalar kernels and the drivers' own streaming loops
#    (the integer bins of fp64), listed below.
# The table "avx512-pf1" (src/cpu/avx512_pf1.c: the avx512 kernel files
# built again with one prefetch a line) is checked too: each function of
# the avx512 tables in its object has `prefetcht2 0x2000(reg)` and no
# prefetcht0.
# Each must contain at least one `prefetcht2 0x4000(reg)` and one
# `prefetcht0 0x800(reg)` (16 KiB and 2 KiB ahead), as many of one as of
# the other, itself or in a function of the same object it calls
# directly (or jumps to: a tail call). GCC 12 once dropped _mm_prefetch from inlined helpers
# silently; this is what would have caught it. Exit status 1 on any miss.
set -u
objdir=${1:-build/CMakeFiles/bx_objects.dir}
cd "$(dirname "$0")/.." || exit 2
command -v objdump >/dev/null || { echo "check_prefetch: objdump not found" >&2; exit 2; }

# object:function pairs outside the tables
extra="portable:bx_sumsq_f16_scalar portable:bx_sumsq_bf16_scalar portable:bx_sumsq_f32_scalar
portable:bx_sumsq_f64_scalar portable:bx_sumabs_f16_scalar portable:bx_sumabs_bf16_scalar
portable:bx_sumabs_f32_scalar portable:bx_sumabs_f64_scalar drive_f64:f64_bins"

# the function names in the micro-kernel tables of src/cpu/NAME.c, as NAME:fn
table_functions() {
  for src in src/cpu/*.c; do
    base=$(basename "$src" .c)
    awk -v base="$base" '
      /^const bx_[a-z0-9]+_micro [a-z0-9_]+ = \{/ { intable = 1; sub(/^[^{]*\{/, "") }
      intable {
        line = $0
        gsub(/\/\*.*\*\//, "", line) # comments (one line each)
        sub(/\/\/.*/, "", line)
        done = sub(/\};.*/, "", line)
        n = split(line, w, /[^A-Za-z0-9_]+/)
        for (i = 1; i <= n; i++)
          if (w[i] ~ /^[a-z_][a-z0-9_]*$/) print base ":" w[i]
        if (done) intable = 0
      }' "$src"
  done
}

# disassembly of function $2 in object $1 (empty if absent)
disasm() {
  objdump -d --no-show-raw-insn "$1" 2>/dev/null | awk -v f="$2" '
    $0 ~ "^[0-9a-f]+ <" f ">:$" { p = 1; next }
    p && /^$/ { exit }
    p'
}

# "t2 t0" prefetch counts of a disassembly on stdin, with the right distances
count_prefetch() {
  awk '/prefetcht2[ \t]+0x4000\(%[a-z0-9]+\)/ { t2++ } /prefetcht0[ \t]+0x800\(%[a-z0-9]+\)/ { t0++ }
       END { print t2 + 0, t0 + 0 }'
}

status=0
checked=0
for pair in $(table_functions) $extra; do
  base=${pair%%:*}
  fn=${pair#*:}
  obj=$objdir/src/cpu/$base.c.o
  if [ ! -f "$obj" ]; then
    echo "check_prefetch: no $obj (build first: make lib)" >&2
    status=1
    continue
  fi
  code=$(disasm "$obj" "$fn")
  if [ -z "$code" ]; then
    echo "MISSING  $base.o: $fn not found"
    status=1
    continue
  fi
  read -r t2 t0 <<<"$(printf '%s\n' "$code" | count_prefetch)"
  via=""
  if [ "$t2" -eq 0 ] || [ "$t0" -eq 0 ]; then # in a direct callee of the same object?
    for callee in $(printf '%s\n' "$code" | sed -nE 's/.*(call|jmp).*<([A-Za-z0-9_.]+)>.*/\2/p' | sort -u); do
      read -r c2 c0 <<<"$(disasm "$obj" "$callee" | count_prefetch)"
      if [ "$c2" -gt 0 ] && [ "$c0" -gt 0 ] && [ "$c2" -eq "$c0" ]; then
        t2=$c2 t0=$c0 via=" (in $callee)"
        break
      fi
    done
  fi
  checked=$((checked + 1))
  if [ "$t2" -eq 0 ] || [ "$t0" -eq 0 ] || [ "$t2" -ne "$t0" ]; then
    echo "FAIL     $base.o: $fn: prefetcht2 x$t2, prefetcht0 x$t0$via"
    status=1
  else
    echo "ok       $base.o: $fn: prefetcht2 x$t2, prefetcht0 x$t0$via"
  fi
done
# "t2" count of the one-prefetch form (8 KiB ahead) and any prefetcht0
count_prefetch_one() {
  awk '/prefetcht2[ \t]+0x2000\(%[a-z0-9]+\)/ { t2++ } /prefetcht0/ { t0++ } END { print t2 + 0, t0 + 0 }'
}
pf1=$objdir/src/cpu/avx512_pf1.c.o
if [ ! -f "$pf1" ]; then
  echo "check_prefetch: no $pf1 (build first: make lib)" >&2
  status=1
else
  for pair in $(table_functions | grep -E '^avx512(_half|_f64)?:'); do
    fn=${pair#*:}
    code=$(disasm "$pf1" "$fn")
    if [ -z "$code" ]; then
      echo "MISSING  avx512_pf1.o: $fn not found"
      status=1
      continue
    fi
    read -r t2 t0 <<<"$(printf '%s\n' "$code" | count_prefetch_one)"
    via=""
    if [ "$t2" -eq 0 ]; then
      for callee in $(printf '%s\n' "$code" | sed -nE 's/.*(call|jmp).*<([A-Za-z0-9_.]+)>.*/\2/p' | sort -u); do
        read -r c2 c0 <<<"$(disasm "$pf1" "$callee" | count_prefetch_one)"
        if [ "$c2" -gt 0 ]; then
          t2=$c2 t0=$((t0 + c0)) via=" (in $callee)"
          break
        fi
      done
    fi
    checked=$((checked + 1))
    if [ "$t2" -eq 0 ] || [ "$t0" -ne 0 ]; then
      echo "FAIL     avx512_pf1.o: $fn: prefetcht2 (8 KiB) x$t2, prefetcht0 x$t0$via"
      status=1
    else
      echo "ok       avx512_pf1.o: $fn: prefetcht2 (8 KiB) x$t2$via"
    fi
  done
fi
[ "$checked" -gt 0 ] || { echo "check_prefetch: nothing checked" >&2; status=1; }
echo "check_prefetch: $checked functions, $([ $status -eq 0 ] && echo "all prefetch" || echo "FAILURES above")"
exit $status
