# BitexactPrograms.cmake — everything built on top of the library: the
# `bitexact` command, the C suite, the MPI and GPU test runners, benchmarks,
# examples, the kernel developers' checks (dev/). Each program lands in the
# build tree where its source lies in the repository (build/tests/bx_tests,
# build/bench/bench_norm, build/examples/simple, build/bitexact, ...).

# bx_program(TARGET OUTPUT SOURCES... [LIBS libs...] [INTERNAL])
#   OUTPUT: the path under the build tree (tests/mpi/test_faults).
#   INTERNAL: the program may include the library's internal headers.
function(bx_program _target _output)
  cmake_parse_arguments(P "INTERNAL" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${_target} ${P_SOURCES})
  get_filename_component(_dir "${_output}" DIRECTORY)
  get_filename_component(_name "${_output}" NAME)
  set_target_properties(${_target} PROPERTIES OUTPUT_NAME "${_name}"
                        RUNTIME_OUTPUT_DIRECTORY "${PROJECT_BINARY_DIR}/${_dir}"
                        LINKER_LANGUAGE C)
  target_link_libraries(${_target} PRIVATE bx_flags ${P_LIBS} bx_static)
  if(P_INTERNAL)
    target_include_directories(${_target} PRIVATE ${BX_INTERNAL_INCLUDES})
  endif()
endfunction()

# bx_programs_of(DIR OUTDIR [args of bx_program]): one program per DIR/*.c
function(bx_programs_of _dir _outdir)
  file(GLOB _srcs CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/${_dir}/*.c")
  foreach(_src ${_srcs})
    get_filename_component(_name "${_src}" NAME_WE)
    string(REPLACE "/" "_" _prefix "${_outdir}")
    bx_program(${_prefix}_${_name} "${_outdir}/${_name}" SOURCES "${_src}" ${ARGN})
  endforeach()
endfunction()

# ---- optional dependencies of the programs --------------------------------
find_path(BX_JANSSON_INCLUDE_DIR jansson.h)
find_library(BX_JANSSON_LIBRARY jansson)
find_path(BX_XXHASH_INCLUDE_DIR xxhash.h)
find_library(BX_XXHASH_LIBRARY xxhash)
find_path(BX_MPFR_INCLUDE_DIR mpfr.h)
find_library(BX_MPFR_LIBRARY mpfr)
find_library(BX_GMP_LIBRARY gmp)

set(BX_HAVE_CLI OFF)
if(NOT BITEXACT_CLI STREQUAL "OFF")
  if(BX_JANSSON_INCLUDE_DIR AND BX_JANSSON_LIBRARY AND BX_XXHASH_INCLUDE_DIR AND BX_XXHASH_LIBRARY)
    set(BX_HAVE_CLI ON)
  endif()
  bx_need(CLI BX_HAVE_CLI "jansson or xxhash not found (Debian: libjansson-dev libxxhash-dev)")
endif()
set(BX_HAVE_TESTS OFF)
if(NOT BITEXACT_TESTS STREQUAL "OFF")
  if(BX_MPFR_INCLUDE_DIR AND BX_MPFR_LIBRARY AND BX_GMP_LIBRARY)
    set(BX_HAVE_TESTS ON)
  endif()
  bx_need(TESTS BX_HAVE_TESTS "MPFR or GMP not found (Debian: libmpfr-dev libgmp-dev)")
endif()

# ---- the GLM-4.5 model module (src/glm, DESIGN §10): a library of its own -------
# The model `bitexact train` trains (config, parameters, init, the blocks'
# forward and backward, the gradient protocol, expert parallelism, the
# step), on the public API (bitexact_train.h) only; the command, the
# model's own test and bench_moe link it. Not installed (internal header: train_model.h).
file(GLOB BX_GLM_SOURCES CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/src/glm/*.c")
add_library(bx_glm STATIC ${BX_GLM_SOURCES})
target_include_directories(bx_glm PUBLIC "${PROJECT_SOURCE_DIR}/src/glm")
target_link_libraries(bx_glm PRIVATE bx_flags PUBLIC bx_static m)

# ---- the `bitexact` command ---------------------------------------------------
if(BX_HAVE_CLI)
  file(GLOB BX_CLI_SOURCES CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/src/cli/*.c")
  set(_cli_libs bx_glm ${BX_JANSSON_LIBRARY} ${BX_XXHASH_LIBRARY})
  if(BX_HAVE_MPI)
    # `bitexact demo` and `bitexact train` under mpirun use real ranks
    list(PREPEND _cli_libs bx_mpi_static MPI::MPI_C)
    set_source_files_properties("${PROJECT_SOURCE_DIR}/src/cli/demo_mpi.c"
                                "${PROJECT_SOURCE_DIR}/src/cli/train_mpi.c"
                                PROPERTIES COMPILE_DEFINITIONS BX_CLI_MPI=1)
  endif()
  bx_program(bx_cli bitexact SOURCES ${BX_CLI_SOURCES} LIBS ${_cli_libs} INTERNAL)
  target_include_directories(bx_cli PRIVATE "${PROJECT_SOURCE_DIR}/src/cli"
                             ${BX_JANSSON_INCLUDE_DIR} ${BX_XXHASH_INCLUDE_DIR})
endif()

# ---- the model module, tested on its own (public API only) ----------------------
# tests/train/test_model.c: gradients against an fp64 reference, layout
# invariance, the init.
if(NOT BITEXACT_TESTS STREQUAL "OFF")
  bx_program(bx_test_model tests/train/test_model
             SOURCES "${PROJECT_SOURCE_DIR}/tests/train/test_model.c"
                     "${PROJECT_SOURCE_DIR}/tests/train/model_ref.c" LIBS bx_glm)
  add_test(NAME train_model COMMAND bx_test_model)
  # against transformers' Glm4MoeForCausalLM (skipped, 77, without torch + transformers)
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(Python3_FOUND)
    add_test(NAME train_model_transformers
             COMMAND Python3::Interpreter "${PROJECT_SOURCE_DIR}/tests/train/compare_transformers.py"
                     $<TARGET_FILE:bx_test_model>)
    set_tests_properties(train_model_transformers PROPERTIES SKIP_RETURN_CODE 77)
  endif()
endif()

# ---- examples: the public API only -------------------------------------------
bx_programs_of(examples examples)
if(NOT BX_HAVE_MPI AND TARGET examples_simple_mpi)
  set_target_properties(examples_simple_mpi PROPERTIES EXCLUDE_FROM_ALL ON)
elseif(TARGET examples_simple_mpi)
  target_link_libraries(examples_simple_mpi PRIVATE bx_mpi_static MPI::MPI_C)
endif()
# the cross-architecture bit check (scripts/cross_aarch64.sh)
bx_programs_of(tests/cross tests/cross)

# ---- benchmarks -----------------------------------------------------------------
bx_programs_of(bench bench INTERNAL)
# bench_moe times the model module's MoE block (src/glm/train_moe_block.c)
target_link_libraries(bench_bench_moe PRIVATE bx_glm)
bx_programs_of(bench/cli bench/cli)
if(BX_HAVE_MPI)
  bx_programs_of(bench/mpi bench/mpi INTERNAL LIBS bx_mpi_static MPI::MPI_C)
endif()

# ---- the C suite, the kernel checker ------------------------------------------
if(BX_HAVE_TESTS)
  file(GLOB BX_TEST_SOURCES CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/tests/*.c")
  bx_program(bx_tests tests/bx_tests SOURCES ${BX_TEST_SOURCES}
             LIBS ${BX_MPFR_LIBRARY} ${BX_GMP_LIBRARY} INTERNAL)
  target_include_directories(bx_tests PRIVATE "${PROJECT_SOURCE_DIR}/tests" ${BX_MPFR_INCLUDE_DIR}
                             "${PROJECT_SOURCE_DIR}/src/cuda/train") # train_grid.h: plain C
  if(BX_HAVE_CUDA)
    target_include_directories(bx_tests SYSTEM PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
  endif()
  add_test(NAME c_suite COMMAND bx_tests)
  if(BX_X86)
    bx_programs_of(dev dev INTERNAL)
    target_compile_options(dev_sumsq_kernels PRIVATE ${BX_AVX512_FLAGS})
    # the exhaustive math check shares the C suite's MPFR reference (tests/math_ref.h)
    target_sources(dev_math_exhaustive PRIVATE "${PROJECT_SOURCE_DIR}/tests/mpfr_ref.c")
    target_include_directories(dev_math_exhaustive PRIVATE "${PROJECT_SOURCE_DIR}/tests" ${BX_MPFR_INCLUDE_DIR})
    target_link_libraries(dev_math_exhaustive PRIVATE ${BX_MPFR_LIBRARY} ${BX_GMP_LIBRARY})
  endif()
  if(BX_HAVE_MPI)
    bx_programs_of(tests/mpi tests/mpi INTERNAL LIBS bx_mpi_static MPI::MPI_C)
  endif()
endif()

# ---- the GPU test runner and benchmark: built whenever CUDA is (no GPU needed) --
if(BX_HAVE_CUDA AND BX_HAVE_TESTS)
  file(GLOB BX_CUDA_TEST_SOURCES CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/tests/cuda/*.c")
  set(_nccl_libs)
  if(BX_HAVE_NCCL)
    set(_nccl_libs bx_nccl_static bx_nccl_dep)
  endif()
  bx_program(bx_cuda_tests tests/cuda/bx_cuda_tests SOURCES ${BX_CUDA_TEST_SOURCES}
             LIBS ${_nccl_libs} CUDA::cudart_static INTERNAL)
  target_include_directories(bx_cuda_tests PRIVATE "${PROJECT_SOURCE_DIR}/tests/cuda")
  target_include_directories(bx_cuda_tests SYSTEM PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
  if(BX_HAVE_NCCL)
    target_compile_definitions(bx_cuda_tests PRIVATE BX_TEST_NCCL=1)
  endif()
  bx_program(bx_bench_cuda bench/cuda/bench_cuda
             SOURCES "${PROJECT_SOURCE_DIR}/bench/cuda/bench_cuda.c"
                     "${PROJECT_SOURCE_DIR}/bench/cuda/baseline.cu"
             LIBS CUDA::cudart_static INTERNAL)
  target_include_directories(bx_bench_cuda PRIVATE "${PROJECT_SOURCE_DIR}/bench/cuda")
  target_include_directories(bx_bench_cuda SYSTEM PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
  # the training GEMM on the GPU against the host (scripts/gpu_train_check.sh)
  bx_program(bx_bench_train_gemm bench/cuda/bench_train_gemm
             SOURCES "${PROJECT_SOURCE_DIR}/bench/cuda/bench_train_gemm.c"
             LIBS CUDA::cudart_static INTERNAL)
  target_include_directories(bx_bench_train_gemm SYSTEM PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
endif()

# ---- the exported-symbol check (tests/abi/check_exports.py) --------------------
find_package(Python3 COMPONENTS Interpreter QUIET)
if(BITEXACT_SHARED AND Python3_FOUND)
  set(_cuda_hdr)
  if(BX_HAVE_CUDA)
    set(_cuda_hdr "${PROJECT_SOURCE_DIR}/include/bitexact_cuda.h")
  endif()
  # bitexact_train.h and the per-concern headers it includes
  file(GLOB _train_hdrs "${PROJECT_SOURCE_DIR}/include/bitexact_train*.h")
  add_test(NAME exported_symbols
           COMMAND Python3::Interpreter "${PROJECT_SOURCE_DIR}/tests/abi/check_exports.py"
                   --lib $<TARGET_FILE:bx_shared>
                   --soname libbitexact.so.${PROJECT_VERSION_MAJOR}
                   "${PROJECT_SOURCE_DIR}/include/bitexact.h" ${_train_hdrs} ${_cuda_hdr})
  foreach(_a mpi nccl)
    if(TARGET bx_${_a}_shared)
      add_test(NAME exported_symbols_${_a}
               COMMAND Python3::Interpreter "${PROJECT_SOURCE_DIR}/tests/abi/check_exports.py"
                       --lib $<TARGET_FILE:bx_${_a}_shared>
                       --soname libbitexact_${_a}.so.${PROJECT_VERSION_MAJOR}
                       "${PROJECT_SOURCE_DIR}/include/bitexact_${_a}.h")
    endif()
  endforeach()
endif()
