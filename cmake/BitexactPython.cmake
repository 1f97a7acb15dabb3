# BitexactPython.cmake — BITEXACT_PYTHON=ON (set by scikit-build-core from
# pyproject.toml): only the extension bitexact._core, the binding
# (python/csrc/*.c) and the model module (src/glm/*.c) linked with the
# library's objects (bx_objects: the same sources and flags as
# libbitexact), installed into the package. The
# Python files come from pyproject.toml's wheel.packages.
find_package(Python COMPONENTS Interpreter Development.Module REQUIRED)
file(GLOB BX_PY_SOURCES CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/python/csrc/*.c")
# the model module's sources (src/glm: public API only), which the
# bindings call instead of copying (docs/architecture.md rules 8, 10)
file(GLOB BX_PY_GLM_SOURCES CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/src/glm/*.c")
python_add_library(_core MODULE WITH_SOABI ${BX_PY_SOURCES} ${BX_PY_GLM_SOURCES}
                   $<TARGET_OBJECTS:bx_objects>)
target_include_directories(_core PRIVATE "${PROJECT_SOURCE_DIR}/src/glm")
target_link_libraries(_core PRIVATE bx_flags bx_public)
# the binding shares the core's error frames and dtype helpers (src/core, src/common)
target_include_directories(_core PRIVATE ${BX_INTERNAL_INCLUDES})
if(BX_HAVE_CUDA)
  target_include_directories(_core SYSTEM PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
  target_link_libraries(_core PRIVATE CUDA::cudart_static stdc++)
endif()
# Only PyInit__core leaves the module (the static CUDA runtime's symbols
# stay inside: torch brings its own).
set_target_properties(_core PROPERTIES C_VISIBILITY_PRESET hidden LINKER_LANGUAGE C)
target_link_options(_core PRIVATE "LINKER:--exclude-libs,ALL")
install(TARGETS _core LIBRARY DESTINATION bitexact)
message(STATUS "bitexact ${PROJECT_VERSION}: Python extension, CUDA ${BX_HAVE_CUDA} (${BX_CUDA_WHY})")
