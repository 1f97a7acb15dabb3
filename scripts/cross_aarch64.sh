#!/usr/bin/env bash
# cross_aarch64.sh — build bitexact for aarch64 (portable kernels) on an
# x86-64 Debian 12 host, run the C suite and the CLI under qemu-user, and
# check that tests/cross/fixed_bits prints the same bytes on aarch64 as
# natively with every kernel table this CPU runs (BX_ISA=avx512, avx2,
# portable).
#
#   scripts/cross_aarch64.sh              everything (the C suite takes a
#                                         while under qemu: see below)
#   BX_CROSS_SUITE=FILTER scripts/...     only the C suite's tests whose name
#                                         contains FILTER (bx_tests FILTER)
#   BX_CROSS_SUITE=none scripts/...       no C suite (counted as skipped)
#   BUILD_AARCH64=dir BUILD_NATIVE=dir    build trees (build-aarch64, build)
#
# Installs what is missing first (the arm64 architecture, the cross
# compiler, qemu-user, the arm64 -dev packages; nothing when all are
# present, like scripts/setup.sh). Last line: "N passed, N failed" (",
# N skipped"): the C suite's tests plus this script's own checks (build,
# CLI, each fixed_bits comparison).
set -uo pipefail
cd "$(dirname "$0")/.."

B=${BUILD_AARCH64:-build-aarch64}
N=${BUILD_NATIVE:-build}
SUITE=${BX_CROSS_SUITE:-all}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}
# -L /: the guest's ld.so and libc are the multiarch libc6:arm64 (pulled in
# by the arm64 -dev packages). With -L /usr/aarch64-linux-gnu that prefix's
# ld.so loads the multiarch libc.so.6 of another Debian revision and the
# first pthread_create spins forever. Same as the toolchain file's emulator.
QEMU=(qemu-aarch64 -L /)

passed=0 failed=0 skipped=0
pass() { passed=$((passed + 1)); echo "cross_aarch64: PASS $*"; }
fail() { failed=$((failed + 1)); echo "cross_aarch64: FAIL $*"; }
skip() { skipped=$((skipped + 1)); echo "cross_aarch64: SKIP $*"; }
summary() {
  if [ "$skipped" -gt 0 ]; then echo "$passed passed, $failed failed, $skipped skipped"
  else echo "$passed passed, $failed failed"; fi
}
die() { echo "cross_aarch64: $*" >&2; fail "$*"; summary; exit 1; }

# ---- what is needed ------------------------------------------------------
HOST_PKGS=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user cmake libdlpack-dev)
ARM_PKGS=(libmpfr-dev:arm64 libgmp-dev:arm64 libjansson-dev:arm64 libxxhash-dev:arm64)

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }

if ! command -v dpkg-query >/dev/null 2>&1; then
  echo "cross_aarch64: not a Debian system; install by hand: ${HOST_PKGS[*]} ${ARM_PKGS[*]}" >&2
else
  missing=()
  for p in "${HOST_PKGS[@]}" "${ARM_PKGS[@]}"; do installed "$p" || missing+=("$p"); done
  have_arm64=0
  dpkg --print-foreign-architectures | grep -qx arm64 && have_arm64=1
  if [ ${#missing[@]} -gt 0 ] || [ $have_arm64 -eq 0 ]; then
    SUDO=()
    if [ "$(id -u)" -ne 0 ]; then
      if command -v sudo >/dev/null 2>&1; then SUDO=(sudo); else
        die "need root to install ${missing[*]}"
      fi
    fi
    export DEBIAN_FRONTEND=noninteractive
    if [ $have_arm64 -eq 0 ]; then
      echo "cross_aarch64: adding the arm64 architecture"
      "${SUDO[@]}" dpkg --add-architecture arm64 || die "dpkg --add-architecture arm64 failed"
    fi
    echo "cross_aarch64: installing ${missing[*]}"
    "${SUDO[@]}" apt-get update -q || die "apt-get update failed"
    "${SUDO[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" || die "apt-get install failed"
  else
    echo "cross_aarch64: all cross-build dependencies present"
  fi
fi

# ---- build: aarch64, and natively for the reference output ---------------
CMAKE_ARGS=(-DBITEXACT_CUDA=OFF -DBITEXACT_MPI=OFF -DCMAKE_BUILD_TYPE=Release)
t0=$(date +%s)
TOOLCHAIN=()
# the toolchain file is read by the first configure only (CMake warns it is
# unused on later ones); the ELF check below catches a build tree of another
# architecture
[ -f "$B/CMakeCache.txt" ] || TOOLCHAIN=(-DCMAKE_TOOLCHAIN_FILE=cmake/toolchains/aarch64-linux-gnu.cmake)
if cmake -S . -B "$B" "${TOOLCHAIN[@]}" "${CMAKE_ARGS[@]}" &&
   cmake --build "$B" -j "$JOBS"; then
  pass "aarch64 build ($B, $(( $(date +%s) - t0 ))s)"
else
  die "aarch64 build failed"
fi
if [ ! -f "$N/CMakeCache.txt" ]; then
  cmake -S . -B "$N" "${CMAKE_ARGS[@]}" || die "native configure failed"
fi
cmake --build "$N" -j "$JOBS" --target tests_cross_fixed_bits || die "native build of fixed_bits failed"

for f in "$B/tests/bx_tests" "$B/bitexact" "$B/tests/cross/fixed_bits"; do
  # ELF e_machine (2 bytes at offset 18): 183 = EM_AARCH64
  [ "$(od -An -tu2 -j18 -N2 "$f" 2>/dev/null | tr -d ' ')" = 183 ] || die "$f is not an aarch64 executable"
done

# ---- the C suite under qemu ----------------------------------------------
if [ "$SUITE" = none ]; then
  skip "C suite (BX_CROSS_SUITE=none)"
else
  args=()
  [ "$SUITE" != all ] && args=("$SUITE")
  log=$(mktemp)
  t0=$(date +%s)
  # fork_after_threads: qemu-user 7.2 (Debian 12) itself aborts in a forked
  # child that starts a thread ("qemu_plugin_vcpu_init_hook: assertion
  # failed", then "cpu_exec: assertion failed: (cpu == current_cpu)"), a
  # bug of the emulator, not of the library: counted as skipped here.
  BX_TEST_SKIP=${BX_TEST_SKIP-fork_after_threads} "${QEMU[@]}" "$B/tests/bx_tests" "${args[@]}" | tee "$log"
  rc=${PIPESTATUS[0]}
  secs=$(( $(date +%s) - t0 ))
  last=$(tail -n 1 "$log")
  rm -f "$log"
  # the suite's own counts go into this script's total
  if echo "$last" | grep -qE '^[0-9]+ passed, [0-9]+ failed'; then
    sp=$(echo "$last" | sed -E 's/^([0-9]+) passed.*/\1/')
    sf=$(echo "$last" | sed -E 's/^[0-9]+ passed, ([0-9]+) failed.*/\1/')
    ss=0
    echo "$last" | grep -q skipped && ss=$(echo "$last" | sed -E 's/.*, ([0-9]+) skipped.*/\1/')
    passed=$((passed + sp)) failed=$((failed + sf)) skipped=$((skipped + ss))
    echo "cross_aarch64: C suite under qemu ${args[*]:+(filter ${args[*]}) }in ${secs}s: $last (exit $rc)"
    [ "$rc" -ne 0 ] && [ "$sf" -eq 0 ] && fail "C suite exit status $rc with no failed test"
  else
    fail "C suite under qemu (exit $rc) in ${secs}s: no closing counts; last line: $last"
  fi
fi

# ---- the CLI under qemu --------------------------------------------------
if "${QEMU[@]}" "$B/bitexact" --version >/dev/null 2>&1; then
  a=$("${QEMU[@]}" "$B/bitexact" demo --json 2>&1)
  if [ -n "$N" ] && [ -x "$N/bitexact" ]; then
    n=$("$N/bitexact" demo --json 2>&1)
    if [ "$a" = "$n" ]; then pass "bitexact demo --json: aarch64 == native"
    else fail "bitexact demo --json differs:"; diff <(echo "$n") <(echo "$a") | head -20; fi
  elif [ -n "$a" ]; then
    pass "bitexact demo --json runs (no native CLI to compare)"
  else
    fail "bitexact demo --json printed nothing"
  fi
else
  fail "bitexact --version under qemu"
fi

# ---- the same bits: fixed_bits, aarch64 vs native with every table -------
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if "${QEMU[@]}" "$B/tests/cross/fixed_bits" > "$work/aarch64.txt"; then
  pass "fixed_bits under qemu ($(wc -l < "$work/aarch64.txt") lines)"
else
  fail "fixed_bits under qemu exited non-zero"
fi
for isa in avx512 avx2 portable; do
  if ! BX_ISA=$isa "$N/tests/cross/fixed_bits" > "$work/native_$isa.txt" 2> "$work/native_$isa.err"; then
    fail "native fixed_bits (BX_ISA=$isa) exited non-zero"
    continue
  fi
  # BX_ISA names a table the CPU cannot run: the library ignores it
  if ! grep -q "kernels $isa\$" "$work/native_$isa.err"; then
    skip "native fixed_bits with $isa kernels: not supported by this CPU"
    continue
  fi
  if cmp -s "$work/native_$isa.txt" "$work/aarch64.txt"; then
    pass "fixed_bits: native $isa == aarch64, byte for byte ($(wc -l < "$work/aarch64.txt") lines)"
  else
    fail "fixed_bits: native $isa differs from aarch64:"
    diff "$work/native_$isa.txt" "$work/aarch64.txt" | head -40
  fi
done

summary
[ "$failed" -eq 0 ]
