# cmake/toolchains/aarch64-linux-gnu.cmake — cross-compile bitexact for
# 64-bit Arm Linux on Debian/Ubuntu x86-64 (portable kernels; the AVX files
# are built on x86-64 only), and run its tests under qemu-user.
#
#   cmake -S . -B build-aarch64 \
#     -DCMAKE_TOOLCHAIN_FILE=cmake/toolchains/aarch64-linux-gnu.cmake \
#     -DBITEXACT_CUDA=OFF -DBITEXACT_MPI=OFF -DCMAKE_BUILD_TYPE=Release
#
# Needs: gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user, and the
# arm64 multiarch libraries (dpkg --add-architecture arm64; libmpfr-dev:arm64
# libgmp-dev:arm64 libjansson-dev:arm64 libxxhash-dev:arm64):
# scripts/cross_aarch64.sh installs them.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(BITEXACT_CROSS_TRIPLE aarch64-linux-gnu)
set(CMAKE_C_COMPILER ${BITEXACT_CROSS_TRIPLE}-gcc)
find_program(BITEXACT_CROSS_CXX ${BITEXACT_CROSS_TRIPLE}-g++)
if(BITEXACT_CROSS_CXX)
  set(CMAKE_CXX_COMPILER ${BITEXACT_CROSS_CXX})
endif()
find_program(BITEXACT_CROSS_AR ${BITEXACT_CROSS_TRIPLE}-ar)
if(BITEXACT_CROSS_AR)
  set(CMAKE_AR ${BITEXACT_CROSS_AR} CACHE FILEPATH "archiver")
endif()

# Tests run under qemu-user. "-L /": the guest's ld.so and libc are the
# multiarch libc6:arm64 in /lib/aarch64-linux-gnu that the arm64 -dev
# packages above pull in. Not "-L /usr/aarch64-linux-gnu": that prefix's
# ld.so (libc6-arm64-cross) then loads the multiarch libc.so.6 of another
# Debian revision, and the first pthread_create spins forever.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64;-L;/)

# Libraries and headers: the cross sysroot first, then the arm64 multiarch
# directories (/usr/lib/aarch64-linux-gnu, /usr/include; Debian's cross gcc
# searches them too). Programs (python3, ...) come from the host.
set(CMAKE_FIND_ROOT_PATH /usr/${BITEXACT_CROSS_TRIPLE} /)
set(CMAKE_LIBRARY_ARCHITECTURE ${BITEXACT_CROSS_TRIPLE})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
# pkg-config: the arm64 .pc files, not the host's
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/${BITEXACT_CROSS_TRIPLE}/pkgconfig:/usr/share/pkgconfig)
set(ENV{PKG_CONFIG_SYSROOT_DIR} /)
