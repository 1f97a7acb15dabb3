# mk/cuda_tests.mk — the GPU test runner, the GPU benchmark and the NCCL
# adapter (src/dist/nccl.c), included by the root Makefile. All need nvcc
# (HAVE_CUDA, from mk/cuda.mk) but no GPU to build; without a GPU the
# runner says "GPU tests NOT RUN" and counts every test as skipped.
#
#   make cuda-tests    build $(BUILD)/tests/cuda/bx_cuda_tests,
#                      $(BUILD)/bench/cuda/bench_cuda and, when NCCL is
#                      found, $(BUILD)/libbitexact_nccl.a / .so
#   make test-cuda     build and run bx_cuda_tests
#   make bench-cuda    build and run bench_cuda (python3 bench/cuda/bench_torch.py
#                      for the PyTorch comparison)
#   make nccl          the NCCL adapter libraries only
#
# NCCL: nccl.h and libnccl.so under $(NCCL_HOME) (default $(CUDA_HOME)) or
# the system directories; the runner is then built with its NCCL tests
# (-DBX_TEST_NCCL=1) and an rpath to libnccl.

# Defaults for when mk/cuda.mk (which owns these) is absent or read later.
CUDA      ?= 1
CUDA_HOME ?= /usr/local/cuda
ifndef NVCC
NVCC := $(firstword $(shell command -v nvcc 2>/dev/null) $(wildcard $(CUDA_HOME)/bin/nvcc))
endif
ifndef HAVE_CUDA
HAVE_CUDA := $(if $(and $(NVCC),$(filter-out 0,$(CUDA)),$(filter-out 1,$(SAN))),1)
endif
CUDA_LDLIBS ?= -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lstdc++
NVCC_FLAGS  ?= -std=c++17 -O2 --fmad=false -gencode arch=compute_90,code=sm_90 \
               -gencode arch=compute_90,code=compute_90 -Iinclude -Isrc/core -Isrc/common \
               -Xcompiler -fPIC,-ffp-contract=off

NCCL_HOME   ?= $(CUDA_HOME)
NCCL_INC    := $(patsubst %/,%,$(dir $(firstword $(wildcard $(NCCL_HOME)/include/nccl.h /usr/include/nccl.h))))
NCCL_LIBDIR := $(patsubst %/,%,$(dir $(firstword $(wildcard $(NCCL_HOME)/lib64/libnccl.so \
                 $(NCCL_HOME)/lib/libnccl.so /usr/lib/x86_64-linux-gnu/libnccl.so \
                 /usr/lib/aarch64-linux-gnu/libnccl.so /usr/lib64/libnccl.so))))
HAVE_NCCL   := $(if $(and $(NCCL_INC),$(NCCL_LIBDIR)),1)

# The tests' count, for the "not run" line of a build without CUDA.
CUDA_TEST_COUNT := $(shell grep -c '^    {"' tests/cuda/main.c 2>/dev/null || echo 1)

.PHONY: cuda-tests test-cuda bench-cuda nccl

ifeq ($(HAVE_CUDA),1)

# C files that include CUDA/NCCL headers: -isystem keeps their old-style
# prototypes out of -Werror (nccl.h declares `ncclGroupStart()`).
CUDA_ISYS := -isystem $(CUDA_HOME)/include $(if $(filter-out /usr/include,$(NCCL_INC)),-isystem $(NCCL_INC))
CUDA_C_FLAGS := $(CFLAGS_ALL) $(CUDA_ISYS)
ifeq ($(HAVE_NCCL),1)
NCCL_LINK := -L$(NCCL_LIBDIR) -Wl,-rpath,$(NCCL_LIBDIR) -lnccl
NCCL_LIBS := $(BUILD)/libbitexact_nccl.a $(BUILD)/libbitexact_nccl.so
endif

CUDA_TEST_SRC := $(wildcard tests/cuda/*.c)
CUDA_TEST_OBJ := $(patsubst %.c,$(BUILD)/%.o,$(CUDA_TEST_SRC))
CUDA_TEST_BIN := $(BUILD)/tests/cuda/bx_cuda_tests
CUDA_BENCH_BIN := $(BUILD)/bench/cuda/bench_cuda
CUDA_BENCH_OBJ := $(BUILD)/bench/cuda/bench_cuda.o $(BUILD)/bench/cuda/baseline.o

cuda-tests: $(CUDA_TEST_BIN) $(CUDA_BENCH_BIN) $(NCCL_LIBS)
nccl: $(NCCL_LIBS)

test-cuda: $(CUDA_TEST_BIN)
	$(CUDA_TEST_BIN)

bench-cuda: $(CUDA_BENCH_BIN)
	$(CUDA_BENCH_BIN)

# ---- the NCCL adapter: plain C11, its own library (links -lnccl) ------------
$(BUILD)/src/dist/nccl.o: src/dist/nccl.c include/bitexact.h include/bitexact_nccl.h mk/cuda_tests.mk
	@mkdir -p $(dir $@)
	$(CC) $(CUDA_C_FLAGS) -c $< -o $@

$(BUILD)/libbitexact_nccl.a: $(BUILD)/src/dist/nccl.o
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/libbitexact_nccl.so: $(BUILD)/src/dist/nccl.o $(BUILD)/libbitexact.so
	$(CC) -shared -o $@ $< -L$(BUILD) -lbitexact $(NCCL_LINK) $(CUDA_LDLIBS) $(LDLIBS)

# ---- the GPU test runner -------------------------------------------------
$(BUILD)/tests/cuda/%.o: tests/cuda/%.c $(wildcard tests/cuda/*.h include/*.h) mk/cuda_tests.mk
	@mkdir -p $(dir $@)
	$(CC) $(CUDA_C_FLAGS) $(if $(HAVE_NCCL),-DBX_TEST_NCCL=1) -Itests/cuda -c $< -o $@

$(CUDA_TEST_BIN): $(CUDA_TEST_OBJ) $(BUILD)/libbitexact.a $(if $(HAVE_NCCL),$(BUILD)/libbitexact_nccl.a)
	$(CC) -o $@ $(CUDA_TEST_OBJ) $(if $(HAVE_NCCL),$(BUILD)/libbitexact_nccl.a) \
	  $(BUILD)/libbitexact.a $(NCCL_LINK) $(CUDA_LDLIBS) $(LDLIBS)

# ---- the GPU benchmark: host code in C, baseline kernels in CUDA ----------
$(BUILD)/bench/cuda/%.o: bench/cuda/%.c $(wildcard bench/cuda/*.h include/*.h) mk/cuda_tests.mk
	@mkdir -p $(dir $@)
	$(CC) $(CUDA_C_FLAGS) -Ibench/cuda -c $< -o $@

$(BUILD)/bench/cuda/%.o: bench/cuda/%.cu $(wildcard bench/cuda/*.h) mk/cuda_tests.mk
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -Ibench/cuda -c $< -o $@

$(CUDA_BENCH_BIN): $(CUDA_BENCH_OBJ) $(BUILD)/libbitexact.a
	$(CC) -o $@ $(CUDA_BENCH_OBJ) $(BUILD)/libbitexact.a $(CUDA_LDLIBS) $(LDLIBS)

else # no CUDA: say so, count the tests as skipped, succeed

CUDA_OFF_WHY := $(if $(filter 1,$(SAN)),SAN=1,$(if $(filter 0,$(CUDA)),CUDA=0,nvcc not found))

cuda-tests nccl:
	@echo "$@: the CUDA backend is not built here ($(CUDA_OFF_WHY)); nothing to build"

test-cuda:
	@echo "GPU tests NOT RUN: the CUDA backend is not built here ($(CUDA_OFF_WHY))"
	@echo "0 passed, 0 failed, $(CUDA_TEST_COUNT) skipped"

bench-cuda:
	@echo "bench-cuda: no GPU: not run (the CUDA backend is not built here: $(CUDA_OFF_WHY))"

endif
