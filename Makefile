# bitexact — a thin wrapper over the CMake build (CMakeLists.txt, cmake/),
# so that the usual commands stay short. Everything is built by CMake.
#
#   make                  configure $(BUILD) (default build/) and build everything
#   make test             the C suite                    make test-mpi   mpirun tests
#   make test-cli         the command-line tests         make dev-check  kernel checker
#   make cuda-tests       GPU runner + benchmark (build) make test-cuda  run them
#   make install PREFIX=DIR   headers, libraries, bitexact, pkg-config, CMake package
#   make SAN=1 test       the same under ASan + UBSan (BUILD=build-san)
#   make fuzz             libFuzzer harnesses with clang (build-fuzz/)
#   make CUDA=0 ...       without the CUDA backend (CUDA=1: fail without nvcc)
#
# CMAKE_ARGS adds -D options (e.g. CMAKE_ARGS=-DBITEXACT_MPI=OFF); a change
# of the options reconfigures. JOBS: parallel jobs (default: the CPU count).

BUILD  ?= build
SAN    ?= 0
CUDA   ?= auto
PREFIX ?= /usr/local
JOBS   ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE  ?= cmake

ifeq ($(SAN),1)
  BUILD := build-san
  BX_ARGS := -DBITEXACT_SANITIZE=ON
endif
BX_CUDA := $(if $(filter 0 off OFF,$(CUDA)),OFF,$(if $(filter 1 on ON,$(CUDA)),ON,AUTO))
BX_ARGS += -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_LIBDIR=lib -DBITEXACT_CUDA=$(BX_CUDA) $(CMAKE_ARGS)

# configure when there is no cache yet or the options changed
CONFIGURE = @args='$(strip $(BX_ARGS))'; \
  if [ ! -f $(BUILD)/CMakeCache.txt ] || [ "$$(cat $(BUILD)/bx-configure-args 2>/dev/null)" != "$$args" ]; then \
    $(CMAKE) -S . -B $(BUILD) $$args && echo "$$args" > $(BUILD)/bx-configure-args; fi
BUILD_TARGETS = $(CMAKE) --build $(BUILD) -j $(JOBS) --target
# feature NAME: true when the configured build has it (bitexact-features.txt)
FEATURE = grep -qx '$(1)=ON' $(BUILD)/bitexact-features.txt

.PHONY: all configure lib cli examples bench test test-mpi test-cli bench-cli \
        dev-check cuda-tests test-cuda bench-cuda install fuzz clean
all: configure
	$(CMAKE) --build $(BUILD) -j $(JOBS)
configure:
	$(CONFIGURE)
lib: configure
	$(BUILD_TARGETS) bx_static $$($(call FEATURE,shared) && echo bx_shared)
cli: configure
	$(BUILD_TARGETS) bx_cli
examples bench: all

test: configure
	$(BUILD_TARGETS) bx_tests
	$(BUILD)/tests/bx_tests

test-mpi: all
	@$(call FEATURE,mpi) || { echo "test-mpi: no MPI in $(BUILD) (Debian: libopenmpi-dev openmpi-bin)"; exit 1; }
	BUILD=$(BUILD) bash tests/mpi/run.sh

test-cli: cli
	python3 tests/cli/test_cli.py --bin $(BUILD)/bitexact $$($(call FEATURE,mpi) && echo --mpi)

bench-cli: all
	BUILD=$(BUILD) bash bench/cli/run.sh

# the emitted code of every hot kernel loop has its prefetches, and every
# kernel of every ISA this CPU runs equals the reference bit for bit
dev-check: all
	bash dev/check_prefetch.sh $(BUILD)/CMakeFiles/bx_objects.dir
	$(BUILD)/dev/sumsq_kernels quick

# The GPU runner and benchmark: built whenever the CUDA backend is (no GPU
# needed to build; without one the runner reports its tests as skipped).
cuda-tests: all
	@$(call FEATURE,cuda) || echo "cuda-tests: the CUDA backend is not built in $(BUILD) ($$(sed -n 's/^cuda_why=//p' $(BUILD)/bitexact-features.txt))"
test-cuda: cuda-tests
	@if $(call FEATURE,cuda); then $(BUILD)/tests/cuda/bx_cuda_tests; else \
	  echo "GPU tests NOT RUN: the CUDA backend is not built in $(BUILD)"; fi
bench-cuda: cuda-tests
	@if $(call FEATURE,cuda); then $(BUILD)/bench/cuda/bench_cuda; else \
	  echo "bench-cuda: not run: the CUDA backend is not built in $(BUILD)"; fi

install: all
	$(CMAKE) --install $(BUILD) --prefix "$(PREFIX)"

fuzz:
	@if [ ! -f build-fuzz/CMakeCache.txt ]; then \
	  $(CMAKE) -S . -B build-fuzz -DCMAKE_C_COMPILER=$${FUZZ_CC:-clang} -DBITEXACT_FUZZ=ON; fi
	$(CMAKE) --build build-fuzz -j $(JOBS)

clean:
	rm -rf build build-san build-fuzz build-nocuda build-aarch64
