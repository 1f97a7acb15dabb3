# BitexactFuzz.cmake — BITEXACT_FUZZ=ON: only the libFuzzer harnesses
# (fuzz/*.c), each linked with the library's sources compiled once more with
# -fsanitize=fuzzer-no-link,address,undefined (clang as the C compiler:
# `make fuzz` configures build-fuzz/ with CC=clang). fuzz/run_ci.sh runs them.
if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "BITEXACT_FUZZ=ON needs clang as the C compiler (libFuzzer): "
                      "cmake -DCMAKE_C_COMPILER=clang ...")
endif()
set(BX_FUZZ_FLAGS -g -O1 -fno-omit-frame-pointer)
add_library(bx_fuzz_objects OBJECT ${BX_LIB_SOURCES})
target_link_libraries(bx_fuzz_objects PRIVATE bx_flags)
target_include_directories(bx_fuzz_objects PRIVATE "${PROJECT_SOURCE_DIR}/include"
                           ${BX_DLPACK_INCLUDE_DIR} ${BX_INTERNAL_INCLUDES})
target_compile_options(bx_fuzz_objects PRIVATE ${BX_FUZZ_FLAGS}
                       -fsanitize=fuzzer-no-link,address,undefined)

find_path(BX_MPFR_INCLUDE_DIR mpfr.h)
find_library(BX_MPFR_LIBRARY mpfr REQUIRED)
find_library(BX_GMP_LIBRARY gmp REQUIRED)
find_library(BX_JANSSON_LIBRARY jansson REQUIRED)

file(GLOB _harnesses CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/fuzz/*.c")
foreach(_src ${_harnesses})
  get_filename_component(_name "${_src}" NAME_WE)
  if(_name STREQUAL "fuzz_safetensors")
    # the safetensors parser of the command line, not the library
    add_executable(${_name} "${_src}" "${PROJECT_SOURCE_DIR}/src/cli/safetensors.c")
    target_include_directories(${_name} PRIVATE "${PROJECT_SOURCE_DIR}/src/cli"
                               "${PROJECT_SOURCE_DIR}/src/glm")
    target_link_libraries(${_name} PRIVATE ${BX_JANSSON_LIBRARY})
  elseif(_name STREQUAL "fuzz_ckpt_index")
    # the sharded checkpoint reader of `bitexact train` (index + shards)
    add_executable(${_name} "${_src}" "${PROJECT_SOURCE_DIR}/src/cli/ckpt_model.c"
                   "${PROJECT_SOURCE_DIR}/src/cli/safetensors.c")
    target_include_directories(${_name} PRIVATE "${PROJECT_SOURCE_DIR}/src/cli"
                               "${PROJECT_SOURCE_DIR}/src/glm")
    target_link_libraries(${_name} PRIVATE ${BX_JANSSON_LIBRARY})
  elseif(_name STREQUAL "fuzz_npy")
    # the .npy reader of `bitexact train --data`
    add_executable(${_name} "${_src}" "${PROJECT_SOURCE_DIR}/src/cli/train_data.c"
                   "${PROJECT_SOURCE_DIR}/src/glm/glm_data.c")
    target_link_libraries(${_name} PRIVATE m)
    target_include_directories(${_name} PRIVATE "${PROJECT_SOURCE_DIR}/src/cli"
                               "${PROJECT_SOURCE_DIR}/src/glm")
  elseif(_name STREQUAL "fuzz_train_config")
    # the config.json reader of `bitexact train --config`, with the model
    # module's checks
    add_executable(${_name} "${_src}" "${PROJECT_SOURCE_DIR}/src/cli/train_config.c"
                   "${PROJECT_SOURCE_DIR}/src/glm/glm_config.c")
    target_include_directories(${_name} PRIVATE "${PROJECT_SOURCE_DIR}/src/cli"
                               "${PROJECT_SOURCE_DIR}/src/glm")
    target_link_libraries(${_name} PRIVATE m)
    target_link_libraries(${_name} PRIVATE ${BX_JANSSON_LIBRARY})
  elseif(_name STREQUAL "fuzz_trace")
    # the trace reader and comparison of `bitexact diff --trace`
    find_library(BX_FUZZ_XXHASH_LIBRARY xxhash REQUIRED)
    add_executable(${_name} "${_src}" "${PROJECT_SOURCE_DIR}/src/cli/trace_read.c"
                   "${PROJECT_SOURCE_DIR}/src/cli/elements.c" "${PROJECT_SOURCE_DIR}/src/cli/safetensors.c")
    target_include_directories(${_name} PRIVATE "${PROJECT_SOURCE_DIR}/src/cli"
                               "${PROJECT_SOURCE_DIR}/src/glm")
    target_link_libraries(${_name} PRIVATE ${BX_JANSSON_LIBRARY} ${BX_FUZZ_XXHASH_LIBRARY} m)
  else()
    add_executable(${_name} "${_src}" $<TARGET_OBJECTS:bx_fuzz_objects>)
    target_link_libraries(${_name} PRIVATE ${BX_MPFR_LIBRARY} ${BX_GMP_LIBRARY})
  endif()
  target_link_libraries(${_name} PRIVATE bx_flags)
  target_include_directories(${_name} PRIVATE "${PROJECT_SOURCE_DIR}/include"
                             ${BX_DLPACK_INCLUDE_DIR} ${BX_INTERNAL_INCLUDES}
                             "${PROJECT_SOURCE_DIR}/fuzz" "${PROJECT_SOURCE_DIR}/tests")
  target_compile_options(${_name} PRIVATE ${BX_FUZZ_FLAGS} -fsanitize=fuzzer,address,undefined)
  target_link_options(${_name} PRIVATE -fsanitize=fuzzer,address,undefined)
  set_target_properties(${_name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY "${PROJECT_BINARY_DIR}")
endforeach()
