# BitexactLibrary.cmake — the library: one list of sources compiled once
# into bx_objects, then libbitexact.a and libbitexact.so (SONAME
# libbitexact.so.0, only the BX_API functions exported); the MPI and NCCL
# adapters as libbitexact_mpi and libbitexact_nccl.

# The sources. A new kernel file is picked up by the glob; src/cpu/avx2*.c
# and src/cpu/avx512*.c are the only files built with ISA flags, and only
# on x86-64 (dispatch.c refers to them there only).
file(GLOB BX_CORE_SOURCES CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/src/core/*.c")
file(GLOB BX_CPU_SOURCES CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/src/cpu/*.c")
# the training kernels (bitexact_train.h): ISA-neutral drivers; their
# per-ISA micro-kernels live in src/cpu/ with the others
file(GLOB BX_TRAIN_SOURCES CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/src/train/*.c")
# the host simulation of their device backend (tests' BITEXACT_TEST_DEVICE=sim)
file(GLOB BX_HOSTSIM_SOURCES CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/src/hostsim/*.c")
file(GLOB BX_AVX2_SOURCES CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/src/cpu/avx2.c"
     "${PROJECT_SOURCE_DIR}/src/cpu/avx2_*.c")
file(GLOB BX_AVX512_SOURCES CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/src/cpu/avx512.c"
     "${PROJECT_SOURCE_DIR}/src/cpu/avx512_*.c")
list(REMOVE_ITEM BX_CPU_SOURCES ${BX_AVX2_SOURCES} ${BX_AVX512_SOURCES})
set(BX_LIB_SOURCES ${BX_CORE_SOURCES} ${BX_CPU_SOURCES} ${BX_TRAIN_SOURCES} ${BX_HOSTSIM_SOURCES})
if(BX_X86)
  list(APPEND BX_LIB_SOURCES ${BX_AVX2_SOURCES} ${BX_AVX512_SOURCES})
  set_source_files_properties(${BX_AVX2_SOURCES} PROPERTIES COMPILE_OPTIONS "${BX_AVX2_FLAGS}")
  set_source_files_properties(${BX_AVX512_SOURCES} PROPERTIES COMPILE_OPTIONS "${BX_AVX512_FLAGS}")
endif()
if(BX_HAVE_CUDA)
  file(GLOB BX_CUDA_SOURCES CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/src/cuda/*.cu")
  # the training kernels (issue 30): also sm_80 machine code unless the
  # caller chose the architectures (scripts/ptx_lint.py lints their PTX)
  file(GLOB BX_CUDA_TRAIN_SOURCES CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/src/cuda/train/*.cu")
  if(BX_CUDA_ARCH_DEFAULT)
    set_source_files_properties(${BX_CUDA_TRAIN_SOURCES} PROPERTIES
                                COMPILE_OPTIONS "--generate-code=arch=compute_80,code=sm_80")
  endif()
  list(APPEND BX_LIB_SOURCES ${BX_CUDA_SOURCES} ${BX_CUDA_TRAIN_SOURCES})
endif()

# Include directories of code inside this project: the public headers, the
# core's and the shared host/device headers.
set(BX_PUBLIC_INCLUDE "${PROJECT_SOURCE_DIR}/include")
set(BX_INTERNAL_INCLUDES "${PROJECT_SOURCE_DIR}/src/core" "${PROJECT_SOURCE_DIR}/src/common"
    "${PROJECT_SOURCE_DIR}/src/train")
# src/hostsim runs the CUDA launchers' thread bodies (plain C: src/cuda/train/train_grid.h)
set_source_files_properties(${BX_HOSTSIM_SOURCES} PROPERTIES
                            INCLUDE_DIRECTORIES "${PROJECT_SOURCE_DIR}/src/cuda/train")

if(BITEXACT_FUZZ)
  return()  # cmake/BitexactFuzz.cmake compiles the sources its own way
endif()

# bx_public: what a consumer of the public headers needs (DLPack, include/).
add_library(bx_public INTERFACE)
target_include_directories(bx_public INTERFACE "$<BUILD_INTERFACE:${BX_PUBLIC_INCLUDE}>"
                           "$<BUILD_INTERFACE:${BX_DLPACK_INCLUDE_DIR}>")

add_library(bx_objects OBJECT ${BX_LIB_SOURCES})
target_link_libraries(bx_objects PRIVATE bx_flags bx_public)
target_include_directories(bx_objects PRIVATE ${BX_INTERNAL_INCLUDES}
                           "${PROJECT_SOURCE_DIR}/src/cuda")
# Only the BX_API functions leave the shared object.
set_target_properties(bx_objects PROPERTIES C_VISIBILITY_PRESET hidden
                      CUDA_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
if(BX_HAVE_CUDA)
  target_include_directories(bx_objects SYSTEM PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
  set_target_properties(bx_objects PROPERTIES CUDA_SEPARABLE_COMPILATION OFF
                        CUDA_RUNTIME_LIBRARY Static)
  # What a static link of an archive holding the CUDA objects needs (also
  # the pkg-config Libs.private): the static runtime, dl, rt, libstdc++.
  set(BX_CUDA_LINK CUDA::cudart_static stdc++)
endif()

if(BITEXACT_PYTHON)
  return()  # the extension links bx_objects itself (cmake/BitexactPython.cmake)
endif()

# The static archive and the shared object, both named libbitexact.
add_library(bx_static STATIC $<TARGET_OBJECTS:bx_objects>)
target_link_libraries(bx_static PUBLIC "$<BUILD_INTERFACE:bx_public>" Threads::Threads m
                      PRIVATE "$<BUILD_INTERFACE:bx_flags>" ${BX_CUDA_LINK})
set_target_properties(bx_static PROPERTIES OUTPUT_NAME bitexact EXPORT_NAME bitexact_static
                      ARCHIVE_OUTPUT_DIRECTORY "${PROJECT_BINARY_DIR}")
target_include_directories(bx_static INTERFACE "$<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>")

if(BITEXACT_SHARED)
  add_library(bx_shared SHARED $<TARGET_OBJECTS:bx_objects>)
  target_link_libraries(bx_shared PUBLIC "$<BUILD_INTERFACE:bx_public>"
                        PRIVATE "$<BUILD_INTERFACE:bx_flags>" ${BX_CUDA_LINK})
  target_include_directories(bx_shared INTERFACE "$<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>")
  # The version script keeps everything but bx_* local (the static CUDA
  # runtime's symbols above all); --exclude-libs hides static archives' ones.
  target_link_options(bx_shared PRIVATE
    "LINKER:--version-script=${PROJECT_SOURCE_DIR}/cmake/bitexact.map"
    "LINKER:--exclude-libs,ALL" "LINKER:--no-undefined")
  set_target_properties(bx_shared PROPERTIES OUTPUT_NAME bitexact EXPORT_NAME bitexact_shared
                        VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR}
                        LIBRARY_OUTPUT_DIRECTORY "${PROJECT_BINARY_DIR}"
                        LINKER_LANGUAGE C
                        LINK_DEPENDS "${PROJECT_SOURCE_DIR}/cmake/bitexact.map")
endif()
set_target_properties(bx_static PROPERTIES LINKER_LANGUAGE C)

# bx_adapter(NAME SOURCE LIBS...): libbitexact_NAME.a / .so from one source
# file of src/dist/, linked against libbitexact and LIBS.
function(bx_adapter _name _src)
  add_library(bx_${_name}_static STATIC "${PROJECT_SOURCE_DIR}/src/dist/${_src}")
  set(_shared_too ${BITEXACT_SHARED})
  if(_shared_too)
    add_library(bx_${_name}_shared SHARED "${PROJECT_SOURCE_DIR}/src/dist/${_src}")
  endif()
  foreach(_kind static shared)
    set(_t bx_${_name}_${_kind})
    if(NOT TARGET ${_t})
      continue()
    endif()
    target_link_libraries(${_t} PUBLIC bx_${_kind} ${ARGN} PRIVATE "$<BUILD_INTERFACE:bx_flags>")
    set_target_properties(${_t} PROPERTIES OUTPUT_NAME bitexact_${_name}
                          EXPORT_NAME ${_name}_${_kind} C_VISIBILITY_PRESET hidden
                          ARCHIVE_OUTPUT_DIRECTORY "${PROJECT_BINARY_DIR}"
                          LIBRARY_OUTPUT_DIRECTORY "${PROJECT_BINARY_DIR}")
  endforeach()
  if(_shared_too)
    set_target_properties(bx_${_name}_shared PROPERTIES VERSION ${PROJECT_VERSION}
                          SOVERSION ${PROJECT_VERSION_MAJOR} INSTALL_RPATH "$ORIGIN"
                          LINK_DEPENDS "${PROJECT_SOURCE_DIR}/cmake/bitexact.map")
    target_link_options(bx_${_name}_shared PRIVATE
      "LINKER:--version-script=${PROJECT_SOURCE_DIR}/cmake/bitexact.map"
      "LINKER:--exclude-libs,ALL")
  endif()
endfunction()

if(BX_HAVE_MPI)
  bx_adapter(mpi mpi.c MPI::MPI_C)
endif()
if(BX_HAVE_NCCL)
  # nccl.h and the CUDA headers as system headers: nccl.h declares
  # old-style prototypes (`ncclGroupStart()`) that -Werror would refuse.
  add_library(bx_nccl_dep INTERFACE)
  target_include_directories(bx_nccl_dep SYSTEM INTERFACE
    "$<BUILD_INTERFACE:${BX_NCCL_INCLUDE_DIR};${CUDAToolkit_INCLUDE_DIRS}>")
  target_link_libraries(bx_nccl_dep INTERFACE "$<BUILD_INTERFACE:${BX_NCCL_LIBRARY}>"
                        "$<BUILD_INTERFACE:CUDA::cudart_static>")
  bx_adapter(nccl nccl.c "$<BUILD_INTERFACE:bx_nccl_dep>"
             "$<INSTALL_INTERFACE:${BX_NCCL_LIBRARY};CUDA::cudart_static>")
  foreach(_kind static shared)
    if(TARGET bx_nccl_${_kind})
      target_include_directories(bx_nccl_${_kind} SYSTEM INTERFACE
                                 "$<INSTALL_INTERFACE:${BX_NCCL_INCLUDE_DIR}>")
    endif()
  endforeach()
endif()
