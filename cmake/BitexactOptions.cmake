# BitexactOptions.cmake — options, the flags of every artefact, the
# dependencies found. Included once by the top-level CMakeLists.txt.

set(_bx_tristate AUTO ON OFF)
foreach(_opt CUDA MPI NCCL CLI TESTS)
  set(BITEXACT_${_opt} AUTO CACHE STRING "AUTO, ON or OFF")
  set_property(CACHE BITEXACT_${_opt} PROPERTY STRINGS ${_bx_tristate})
  string(TOUPPER "${BITEXACT_${_opt}}" BITEXACT_${_opt})
  if(NOT BITEXACT_${_opt} IN_LIST _bx_tristate)
    message(FATAL_ERROR "BITEXACT_${_opt} must be AUTO, ON or OFF, not '${BITEXACT_${_opt}}'")
  endif()
endforeach()
option(BITEXACT_SHARED "Build and install libbitexact.so (libbitexact.a is always built)" ON)
option(BITEXACT_SANITIZE "AddressSanitizer + UndefinedBehaviorSanitizer on every artefact" OFF)
option(BITEXACT_FUZZ "Build only the libFuzzer harnesses (needs clang as the C compiler)" OFF)
option(BITEXACT_PYTHON "Build only the Python extension bitexact._core" OFF)

# bx_need(OPT FOUND WHY): an ON option whose dependency is missing fails the
# configuration with the reason; AUTO just reports it.
macro(bx_need _opt _found _why)
  if(BITEXACT_${_opt} STREQUAL "ON" AND NOT ${_found})
    message(FATAL_ERROR "BITEXACT_${_opt}=ON but ${_why}")
  endif()
endmacro()

# ---- the target architecture -----------------------------------------------
# The per-ISA kernel files (src/cpu/avx2*.c, src/cpu/avx512*.c) exist for
# x86-64 only; elsewhere (aarch64) the portable kernels are the whole set.
if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64|x64)$")
  set(BX_X86 ON)
else()
  set(BX_X86 OFF)
endif()
set(BX_AVX2_FLAGS -mavx2 -mfma -mf16c -mbmi2)
set(BX_AVX512_FLAGS -mavx512f -mavx512dq -mavx512bw -mavx512vl -mavx2 -mfma -mf16c -mbmi2)

# ---- flags: one warning policy and one numeric policy for every C file -----
set(CMAKE_C_STANDARD 11)
set(CMAKE_C_STANDARD_REQUIRED ON)
set(CMAKE_C_EXTENSIONS OFF)
set(CMAKE_POSITION_INDEPENDENT_CODE ON)
set(THREADS_PREFER_PTHREAD_FLAG ON)
find_package(Threads REQUIRED)

set(BX_C_WARNINGS -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes)
# -ffp-contract=off: a contracted a*b+c would change bits on exact paths.
set(BX_C_NUMERICS -ffp-contract=off -fno-math-errno)

# bx_flags: every target of this project links it (not installed, not exported).
add_library(bx_flags INTERFACE)
target_compile_definitions(bx_flags INTERFACE _GNU_SOURCE)
target_compile_options(bx_flags INTERFACE
  "$<$<COMPILE_LANGUAGE:C>:${BX_C_WARNINGS};${BX_C_NUMERICS}>")
target_link_libraries(bx_flags INTERFACE Threads::Threads m)

if(BITEXACT_SANITIZE)
  set(BX_SAN_FLAGS -fsanitize=address,undefined -fno-sanitize-recover=all
                   -fno-omit-frame-pointer -g)
  target_compile_options(bx_flags INTERFACE "$<$<COMPILE_LANGUAGE:C>:${BX_SAN_FLAGS}>")
  target_link_options(bx_flags INTERFACE -fsanitize=address,undefined)
endif()

# <dlpack/dlpack.h>: Debian's libdlpack-dev (a header; scripts/setup.sh)
find_path(BX_DLPACK_INCLUDE_DIR dlpack/dlpack.h
          HINTS ENV DLPACK_HOME PATH_SUFFIXES include
          DOC "directory holding dlpack/dlpack.h")
if(NOT BX_DLPACK_INCLUDE_DIR)
  message(FATAL_ERROR "<dlpack/dlpack.h> not found: install Debian's libdlpack-dev "
                      "(scripts/setup.sh) or set -DBX_DLPACK_INCLUDE_DIR=DIR")
endif()

# ---- CUDA ------------------------------------------------------------------
# sm_90 code plus its PTX (newer GPUs JIT it), and sm_80 code of the training
# kernels (src/cuda/train), unless CMAKE_CUDA_ARCHITECTURES says otherwise; the CUDA runtime linked statically, so the library loads on
# machines without a GPU or driver and says so at the first CUDA call.
set(BX_HAVE_CUDA OFF)
set(BX_CUDA_WHY "BITEXACT_CUDA=OFF")
if(NOT BITEXACT_CUDA STREQUAL "OFF")
  if(BITEXACT_SANITIZE OR BITEXACT_FUZZ)
    set(BX_CUDA_WHY "not with the sanitizers or the fuzzers")
  else()
    include(CheckLanguage)
    check_language(CUDA)
    if(CMAKE_CUDA_COMPILER)
      set(BX_CUDA_ARCH_DEFAULT OFF)
      if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
        set(CMAKE_CUDA_ARCHITECTURES 90)
        set(BX_CUDA_ARCH_DEFAULT ON) # the training kernels add sm_80 (BitexactLibrary.cmake)
      endif()
      enable_language(CUDA)
      find_package(CUDAToolkit REQUIRED)
      set(BX_HAVE_CUDA ON)
      set(BX_CUDA_WHY "${CMAKE_CUDA_COMPILER}, sm ${CMAKE_CUDA_ARCHITECTURES}")
    else()
      set(BX_CUDA_WHY "nvcc not found: set CUDACXX or put nvcc on PATH")
    endif()
  endif()
  bx_need(CUDA BX_HAVE_CUDA "${BX_CUDA_WHY}")
endif()
if(BX_HAVE_CUDA)
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  # --fmad=false: no contraction on the device either (exact paths, scaling)
  target_compile_options(bx_flags INTERFACE
    "$<$<COMPILE_LANGUAGE:CUDA>:--fmad=false;-Werror=all-warnings;-Xcompiler=-ffp-contract=off,-Wall,-Wextra,-Werror>")
  # every C file sees BX_HAVE_CUDA: the core routes kDLCUDA tensors to the GPU
  target_compile_definitions(bx_flags INTERFACE BX_HAVE_CUDA=1)
endif()

# ---- MPI, NCCL ---------------------------------------------------------------
set(BX_HAVE_MPI OFF)
set(BX_MPI_WHY "BITEXACT_MPI=OFF")
if(NOT BITEXACT_MPI STREQUAL "OFF" AND NOT BITEXACT_PYTHON)
  find_package(MPI COMPONENTS C QUIET)
  if(MPI_C_FOUND)
    set(BX_HAVE_MPI ON)
    set(BX_MPI_WHY "MPI ${MPI_C_VERSION}")
    find_program(BX_MPIEXEC NAMES mpirun mpiexec HINTS ${MPIEXEC_EXECUTABLE})
  else()
    set(BX_MPI_WHY "no MPI found (Debian: libopenmpi-dev openmpi-bin)")
  endif()
  bx_need(MPI BX_HAVE_MPI "${BX_MPI_WHY}")
endif()

set(BX_HAVE_NCCL OFF)
set(BX_NCCL_WHY "BITEXACT_NCCL=OFF")
if(NOT BITEXACT_NCCL STREQUAL "OFF" AND NOT BITEXACT_PYTHON)
  if(BX_HAVE_CUDA)
    find_path(BX_NCCL_INCLUDE_DIR nccl.h
              HINTS ENV NCCL_HOME ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)
    find_library(BX_NCCL_LIBRARY nccl
                 HINTS ENV NCCL_HOME ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib64 lib)
    if(BX_NCCL_INCLUDE_DIR AND BX_NCCL_LIBRARY)
      set(BX_HAVE_NCCL ON)
      set(BX_NCCL_WHY "${BX_NCCL_LIBRARY}")
    else()
      set(BX_NCCL_WHY "nccl.h / libnccl not found (set NCCL_HOME)")
    endif()
  else()
    set(BX_NCCL_WHY "needs the CUDA backend")
  endif()
  bx_need(NCCL BX_HAVE_NCCL "${BX_NCCL_WHY}")
endif()
