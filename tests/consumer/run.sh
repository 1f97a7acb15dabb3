#!/usr/bin/env bash
# tests/consumer/run.sh — use an installed bitexact as a user would, out of
# tree, and check the result:
#
#  1. the README's own build lines (between <!-- consumer-test:begin/end -->),
#     run verbatim from the repository root with HOME in a scratch directory;
#  2. for the main build ($BUILD, the CUDA backend in it when nvcc was found)
#     and a build without CUDA (build-nocuda/, the library only):
#       - cmake --install into a fresh prefix; the exported symbols and the
#         SONAME of the installed libbitexact.so (tests/abi/check_exports.py);
#       - pkg-config, shared: examples/simple.c and examples/simple_mpi.c
#         (bitexact-mpi.pc) built with -Wall -Wextra -Werror, run, the
#         library found through its SONAME;
#       - pkg-config, static: the same against a static-only copy of the
#         prefix (`pkg-config --static`, Libs.private: the CUDA runtime when
#         the archive holds CUDA objects); no libbitexact*.so needed;
#       - find_package(bitexact): tests/consumer/CMakeLists.txt, shared and
#         with BITEXACT_USE_STATIC_LIBS=ON;
#     every program's output equals the in-tree build's, and the MPI example
#     gives the same norm on 1 and 3 ranks.
# Last line: "N passed, N failed"; exit status 1 on any failure.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD=${BUILD:-build}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "[ OK ] $*"; }
bad() { fail=$((fail + 1)); echo "[FAIL] $*"; }
# check NAME CMD...: run, keep the output in $WORK/last.log
check() {
  local name=$1; shift
  if "$@" > "$WORK/last.log" 2>&1; then ok "$name"; return 0; fi
  bad "$name"; sed 's/^/    /' "$WORK/last.log" | tail -n 30; return 1
}
MPIRUN=(mpirun --oversubscribe --bind-to none --mca mpi_yield_when_idle 1)
[ "$(id -u)" -eq 0 ] && MPIRUN+=(--allow-run-as-root)
WFLAGS=(-std=c11 -Wall -Wextra -Werror -Wstrict-prototypes)

[ -x "$BUILD/examples/simple" ] || { echo "run.sh: build first (make): no $BUILD/examples/simple"; exit 1; }
want_simple=$("$BUILD/examples/simple")
have_mpi=0; grep -qx 'mpi=ON' "$BUILD/bitexact-features.txt" && have_mpi=1
want_mpi=""
if [ $have_mpi = 1 ]; then want_mpi=$("${MPIRUN[@]}" -np 1 "$BUILD/examples/simple_mpi" | sed 's/ on [0-9]* ranks$//'); fi

# same_output NAME PROGRAM: its output equals the in-tree example's
same_output() {
  local got
  got=$("$2" 2>&1) || { bad "$1: exit status $?"; echo "    $got"; return; }
  if [ "$got" = "$want_simple" ]; then ok "$1: output equals the in-tree build's"; else
    bad "$1: output '$got', in-tree '$want_simple'"; fi
}
# same_mpi NAME PROGRAM: the same norm line on 1 and 3 ranks as in-tree
same_mpi() {
  local np got
  for np in 1 3; do
    got=$("${MPIRUN[@]}" -np $np "$2" 2>&1 | sed 's/ on [0-9]* ranks$//') || true
    if [ "$got" = "$want_mpi" ]; then ok "$1: $np ranks: same norm as in-tree"; else
      bad "$1: $np ranks: '$got', in-tree '$want_mpi'"; fi
  done
}
# needs NAME PROGRAM yes|no: whether the program loads libbitexact*.so
needs() {
  if readelf -d "$2" | grep -q 'NEEDED.*libbitexact'; then local got=yes; else local got=no; fi
  if [ "$got" = "$3" ]; then ok "$1: needs libbitexact.so: $3"; else bad "$1: needs libbitexact.so: $got, expected $3"; fi
}

# ---- 1. the README's lines, verbatim ------------------------------------------------
readme_cmds=$(sed -n '/<!-- consumer-test:begin -->/,/<!-- consumer-test:end -->/p' README.md \
              | grep -v '^<!--' | grep -v '^```')
if [ -z "$readme_cmds" ]; then
  bad "README.md: no consumer-test block"
else
  mkdir -p "$WORK/home"
  if (export HOME="$WORK/home"; set -e; eval "$readme_cmds") > "$WORK/readme.log" 2>&1; then
    got=$(tail -n 1 "$WORK/readme.log")
    if [ "$got" = "$want_simple" ]; then ok "README build lines work as written"; else
      bad "README build lines: ./simple printed '$got', in-tree '$want_simple'"; fi
  else
    bad "README build lines failed:"; sed 's/^/    /' "$WORK/readme.log" | tail -n 30
  fi
  rm -f simple  # the README's ./simple, made in the repository root
fi

# ---- 2. each build, each way of linking --------------------------------------------
consume() { # LABEL BUILDDIR
  local label=$1 bdir=$2 p="$WORK/$1/prefix" ps="$WORK/$1/static-prefix" o="$WORK/$1/out"
  mkdir -p "$o"
  check "$label: cmake --install" cmake --install "$bdir" --prefix "$p" || return
  check "$label: installed libbitexact.so exports exactly the public API, SONAME libbitexact.so.0" \
    python3 tests/abi/check_exports.py --lib "$p/lib/libbitexact.so" --soname libbitexact.so.0 \
      "$p"/include/bitexact.h "$p"/include/bitexact_train*.h \
      $( [ -f "$p/include/bitexact_cuda.h" ] && echo "$p/include/bitexact_cuda.h")
  if [ -f "$p/lib/libbitexact_mpi.so" ]; then
    check "$label: installed libbitexact_mpi.so exports exactly bitexact_mpi.h" \
      python3 tests/abi/check_exports.py --lib "$p/lib/libbitexact_mpi.so" \
        --soname libbitexact_mpi.so.0 "$p/include/bitexact_mpi.h"
  fi
  # static-only copy of the prefix (what -DBITEXACT_SHARED=OFF installs)
  cp -a "$p" "$ps" && find "$ps" -name 'libbitexact*.so*' -delete

  export PKG_CONFIG_PATH="$p/lib/pkgconfig"
  check "$label: pkg-config --modversion bitexact = $(sed -n 's/^version=//p' "$bdir/bitexact-features.txt")" \
    test "$(pkg-config --modversion bitexact)" = "$(sed -n 's/^version=//p' "$bdir/bitexact-features.txt")"
  # shellcheck disable=SC2046
  if check "$label: pkg-config shared: cc simple.c" cc "${WFLAGS[@]}" -o "$o/simple_pc" examples/simple.c \
       $(pkg-config --cflags --libs bitexact) -Wl,-rpath,"$p/lib"; then
    same_output "$label: pkg-config shared" "$o/simple_pc"; needs "$label: pkg-config shared" "$o/simple_pc" yes
  fi
  if [ -f "$p/lib/pkgconfig/bitexact-mpi.pc" ]; then
    if check "$label: pkg-config shared: cc simple_mpi.c (bitexact-mpi)" cc "${WFLAGS[@]}" -o "$o/simple_mpi_pc" \
         examples/simple_mpi.c $(pkg-config --cflags --libs bitexact-mpi) -Wl,-rpath,"$p/lib"; then
      same_mpi "$label: pkg-config shared MPI" "$o/simple_mpi_pc"
    fi
  fi
  export PKG_CONFIG_PATH="$ps/lib/pkgconfig"
  if check "$label: pkg-config --static: cc simple.c" cc "${WFLAGS[@]}" -o "$o/simple_pc_static" examples/simple.c \
       $(pkg-config --static --cflags --libs bitexact); then
    same_output "$label: pkg-config static" "$o/simple_pc_static"; needs "$label: pkg-config static" "$o/simple_pc_static" no
  fi
  if [ -f "$ps/lib/pkgconfig/bitexact-mpi.pc" ]; then
    if check "$label: pkg-config --static: cc simple_mpi.c" cc "${WFLAGS[@]}" -o "$o/simple_mpi_pc_static" \
         examples/simple_mpi.c $(pkg-config --static --cflags --libs bitexact-mpi); then
      same_mpi "$label: pkg-config static MPI" "$o/simple_mpi_pc_static"
      needs "$label: pkg-config static MPI" "$o/simple_mpi_pc_static" no
    fi
  fi
  unset PKG_CONFIG_PATH

  local kind
  for kind in shared static; do
    local cb="$WORK/$label/cmake-$kind" st=OFF
    [ $kind = static ] && st=ON
    if check "$label: find_package(bitexact) $kind: configure + build" \
         sh -c "cmake -S tests/consumer -B '$cb' -DCMAKE_PREFIX_PATH='$p' -DBX_EXAMPLES='$ROOT/examples' \
                  -DBITEXACT_USE_STATIC_LIBS=$st && cmake --build '$cb' -j $JOBS"; then
      same_output "$label: find_package $kind" "$cb/simple"
      needs "$label: find_package $kind" "$cb/simple" $([ $kind = shared ] && echo yes || echo no)
      if [ -f "$p/lib/libbitexact_mpi.a" ]; then
        if [ -x "$cb/simple_mpi" ]; then same_mpi "$label: find_package $kind MPI" "$cb/simple_mpi"
        else bad "$label: find_package $kind: bitexact::mpi installed but simple_mpi not built"; fi
      fi
    fi
  done
}

consume "main-build($(sed -n 's/^cuda=/cuda=/p' "$BUILD/bitexact-features.txt"))" "$BUILD"

# the library without CUDA: configure and build only what is installed
NOCUDA=build-nocuda
if check "build without CUDA (cmake -DBITEXACT_CUDA=OFF, library and adapters)" \
     sh -c "cmake -S . -B $NOCUDA -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_LIBDIR=lib -DBITEXACT_CUDA=OFF \
              -DBITEXACT_TESTS=OFF -DBITEXACT_CLI=OFF > $NOCUDA.log 2>&1 || { cat $NOCUDA.log; exit 1; }; \
            cmake --build $NOCUDA -j $JOBS --target bx_static bx_shared \
              \$(grep -qx 'mpi=ON' $NOCUDA/bitexact-features.txt && echo bx_mpi_static bx_mpi_shared) \
              examples_simple"; then
  rm -f $NOCUDA.log
  check "build without CUDA: the archive holds no CUDA object" \
    sh -c "! nm $NOCUDA/libbitexact.a 2>/dev/null | grep -q 'cudaLaunchKernel\|__cudaRegisterFatBinary'"
  consume "no-cuda" "$NOCUDA"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
