# BitexactInstall.cmake — `cmake --install` / `make install PREFIX=...`:
# headers, libbitexact (.a, .so.0), the adapters, the `bitexact` command,
# pkg-config files and the CMake package (find_package(bitexact) →
# bitexact::bitexact, bitexact::mpi, bitexact::nccl). Everything installed
# is relocatable: the pkg-config files find their prefix from their own
# place (${pcfiledir}), the CMake package from its own.

set(BX_CMAKE_DIR "${CMAKE_INSTALL_LIBDIR}/cmake/bitexact")
set(BX_PC_DIR "${CMAKE_INSTALL_LIBDIR}/pkgconfig")

# DLPack: consumers include <dlpack/dlpack.h> through bitexact.h; a header
# outside the compiler's own search path is added to their flags.
set(BX_PC_DLPACK_CFLAGS "")
if(NOT BX_DLPACK_INCLUDE_DIR IN_LIST CMAKE_C_IMPLICIT_INCLUDE_DIRECTORIES)
  set(BX_PC_DLPACK_CFLAGS " -I${BX_DLPACK_INCLUDE_DIR}")
  foreach(_t bx_static bx_shared)
    if(TARGET ${_t})
      target_include_directories(${_t} INTERFACE "$<INSTALL_INTERFACE:${BX_DLPACK_INCLUDE_DIR}>")
    endif()
  endforeach()
endif()

# ---- headers, libraries, the command ---------------------------------------------
file(GLOB _train_headers "${PROJECT_SOURCE_DIR}/include/bitexact_train*.h")
set(_headers "${PROJECT_SOURCE_DIR}/include/bitexact.h" ${_train_headers})
if(BX_HAVE_CUDA)
  list(APPEND _headers "${PROJECT_SOURCE_DIR}/include/bitexact_cuda.h")
endif()
if(BX_HAVE_MPI)
  list(APPEND _headers "${PROJECT_SOURCE_DIR}/include/bitexact_mpi.h")
endif()
if(BX_HAVE_NCCL)
  list(APPEND _headers "${PROJECT_SOURCE_DIR}/include/bitexact_nccl.h")
endif()
install(FILES ${_headers} DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")

set(_core_targets bx_static)
if(TARGET bx_shared)
  list(APPEND _core_targets bx_shared)
endif()
install(TARGETS ${_core_targets} EXPORT bitexact-targets
        ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}"
        LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}" NAMELINK_COMPONENT Development
        INCLUDES DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")
install(EXPORT bitexact-targets NAMESPACE bitexact:: DESTINATION "${BX_CMAKE_DIR}")
foreach(_a mpi nccl)
  set(_ts)
  foreach(_kind static shared)
    if(TARGET bx_${_a}_${_kind})
      list(APPEND _ts bx_${_a}_${_kind})
    endif()
  endforeach()
  if(_ts)
    install(TARGETS ${_ts} EXPORT bitexact-${_a}-targets
            ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}"
            LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}")
    install(EXPORT bitexact-${_a}-targets NAMESPACE bitexact:: DESTINATION "${BX_CMAKE_DIR}")
  endif()
endforeach()
if(TARGET bx_cli)
  install(TARGETS bx_cli RUNTIME DESTINATION "${CMAKE_INSTALL_BINDIR}")
endif()

# ---- pkg-config ----------------------------------------------------------------
# prefix relative to the .pc file, so `cmake --install --prefix` anywhere works
file(RELATIVE_PATH BX_PC_TO_PREFIX "/prefix/${BX_PC_DIR}" "/prefix")
string(REGEX REPLACE "/$" "" BX_PC_TO_PREFIX "${BX_PC_TO_PREFIX}")

# Libs.private: what a static link of libbitexact.a needs on top of -lbitexact.
set(BX_PC_LIBS_PRIVATE "-lm -pthread")
if(BX_HAVE_CUDA)
  get_filename_component(_cudart_dir "${CUDA_cudart_static_LIBRARY}" DIRECTORY)
  set(BX_PC_LIBS_PRIVATE "-L${_cudart_dir} -lcudart_static -ldl -lrt -lstdc++ ${BX_PC_LIBS_PRIVATE}")
endif()

# bx_pc_flags(OUT_CFLAGS OUT_LIBS INCLUDES... LIBS ...): pkg-config words for
# the include directories and library files found by CMake.
function(bx_pc_flags _cflags _libs)
  cmake_parse_arguments(F "" "" "INCLUDES;LIBS;OPTIONS" ${ARGN})
  set(_c "")
  foreach(_d ${F_INCLUDES})
    if(NOT _d IN_LIST CMAKE_C_IMPLICIT_INCLUDE_DIRECTORIES)
      string(APPEND _c " -I${_d}")
    endif()
  endforeach()
  foreach(_o ${F_OPTIONS})
    string(APPEND _c " ${_o}")
  endforeach()
  set(_l "")
  foreach(_f ${F_LIBS})
    string(APPEND _l " ${_f}")
  endforeach()
  set(${_cflags} "${_c}" PARENT_SCOPE)
  set(${_libs} "${_l}" PARENT_SCOPE)
endfunction()

configure_file("${PROJECT_SOURCE_DIR}/cmake/bitexact.pc.in" "${PROJECT_BINARY_DIR}/pkgconfig/bitexact.pc" @ONLY)
set(_pcs "${PROJECT_BINARY_DIR}/pkgconfig/bitexact.pc")
if(BX_HAVE_MPI)
  bx_pc_flags(BX_PC_MPI_CFLAGS BX_PC_MPI_LIBS INCLUDES ${MPI_C_INCLUDE_DIRS}
              OPTIONS ${MPI_C_COMPILE_OPTIONS} LIBS ${MPI_C_LIBRARIES})
  configure_file("${PROJECT_SOURCE_DIR}/cmake/bitexact-mpi.pc.in"
                 "${PROJECT_BINARY_DIR}/pkgconfig/bitexact-mpi.pc" @ONLY)
  list(APPEND _pcs "${PROJECT_BINARY_DIR}/pkgconfig/bitexact-mpi.pc")
endif()
if(BX_HAVE_NCCL)
  bx_pc_flags(BX_PC_NCCL_CFLAGS BX_PC_NCCL_LIBS
              INCLUDES ${BX_NCCL_INCLUDE_DIR} ${CUDAToolkit_INCLUDE_DIRS} LIBS ${BX_NCCL_LIBRARY})
  configure_file("${PROJECT_SOURCE_DIR}/cmake/bitexact-nccl.pc.in"
                 "${PROJECT_BINARY_DIR}/pkgconfig/bitexact-nccl.pc" @ONLY)
  list(APPEND _pcs "${PROJECT_BINARY_DIR}/pkgconfig/bitexact-nccl.pc")
endif()
install(FILES ${_pcs} DESTINATION "${BX_PC_DIR}")

# ---- the CMake package -------------------------------------------------------------
configure_package_config_file("${PROJECT_SOURCE_DIR}/cmake/bitexactConfig.cmake.in"
  "${PROJECT_BINARY_DIR}/bitexactConfig.cmake" INSTALL_DESTINATION "${BX_CMAKE_DIR}")
# 0.x: a minor version may change the ABI, so only the same minor is compatible.
write_basic_package_version_file("${PROJECT_BINARY_DIR}/bitexactConfigVersion.cmake"
  COMPATIBILITY SameMinorVersion)
install(FILES "${PROJECT_BINARY_DIR}/bitexactConfig.cmake"
              "${PROJECT_BINARY_DIR}/bitexactConfigVersion.cmake"
        DESTINATION "${BX_CMAKE_DIR}")
