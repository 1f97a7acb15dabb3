# bitexact — one Makefile, out-of-tree objects under $(BUILD).
#
#   make               libbitexact.a / libbitexact.so, examples, benchmarks
#   make test          build and run the C test suite
#   make SAN=1 test    the same under AddressSanitizer + UBSan (BUILD=build-san)
#   make fuzz          libFuzzer harnesses (clang), see fuzz/README.md
#
# Never -ffast-math / -Ofast / -march=native here: the shipped binary picks
# AVX-512, AVX2 or portable kernels at run time (src/core/dispatch.c).

CC      ?= cc
BUILD   ?= build
SAN     ?= 0
OPT     ?= -O2

WARN    := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes
# -ffp-contract=off: a contracted a*b+c would change bits on exact paths.
BASEFLAGS := -std=c11 -D_GNU_SOURCE -fPIC -ffp-contract=off -fno-math-errno \
             -pthread -Iinclude -Isrc/core -Isrc/common $(WARN)
ifeq ($(SAN),1)
  BUILD   := build-san
  SANFLAGS := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g
endif
CFLAGS_ALL := $(BASEFLAGS) $(OPT) $(SANFLAGS) $(EXTRA_CFLAGS)
LDLIBS  := -lm -pthread

# Per-ISA kernel files get their ISA flags and nothing else does.
AVX2_FLAGS   := -mavx2 -mfma -mf16c -mbmi2
AVX512_FLAGS := -mavx512f -mavx512dq -mavx512bw -mavx512vl -mavx2 -mfma -mf16c -mbmi2

LIB_SRC := $(wildcard src/core/*.c) $(wildcard src/cpu/*.c)
LIB_OBJ := $(patsubst %.c,$(BUILD)/%.o,$(LIB_SRC))

# CUDA backend (src/cuda): built whenever nvcc is found, unless CUDA=0; not
# under the sanitizers (ASan and the CUDA runtime do not mix). sm_90 code
# plus PTX, so newer GPUs JIT it. The CUDA runtime is linked statically: the
# library loads on machines without a GPU or driver and says so at the first
# CUDA call (bx_cuda_available).
CUDA      ?= auto
CUDA_HOME ?= $(or $(patsubst %/bin/nvcc,%,$(shell command -v nvcc 2>/dev/null)),/usr/local/cuda)
NVCC      ?= $(CUDA_HOME)/bin/nvcc
ifneq ($(CUDA),0)
ifneq ($(SAN),1)
HAVE_CUDA := $(shell test -x $(NVCC) && echo 1)
endif
endif
ifeq ($(CUDA),1)
ifneq ($(HAVE_CUDA),1)
$(error CUDA=1 but $(NVCC) was not found; set CUDA_HOME or NVCC)
endif
endif
NVCC_ARCH  ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
# --fmad=false: no contraction on the device either (exact paths, scaling)
NVCC_FLAGS := -std=c++17 -O2 --fmad=false $(NVCC_ARCH) -Iinclude -Isrc/core -Isrc/common -Isrc/cuda \
              -DBX_HAVE_CUDA=1 -Werror all-warnings \
              -Xcompiler -fPIC,-ffp-contract=off,-Wall,-Wextra,-Werror
CUDA_LDLIBS :=
ifeq ($(HAVE_CUDA),1)
  CUDA_OBJ    := $(patsubst %.cu,$(BUILD)/%.o,$(wildcard src/cuda/*.cu))
  LIB_OBJ     += $(CUDA_OBJ)
  CFLAGS_ALL  += -DBX_HAVE_CUDA=1 -I$(CUDA_HOME)/include
  CUDA_LDLIBS := -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lstdc++
  LDLIBS      += $(CUDA_LDLIBS)
endif

TEST_SRC  := $(wildcard tests/*.c)
TEST_OBJ  := $(patsubst %.c,$(BUILD)/%.o,$(TEST_SRC))
BENCH_BIN := $(patsubst bench/%.c,$(BUILD)/bench/%,$(wildcard bench/*.c))
EX_BIN    := $(patsubst examples/%.c,$(BUILD)/examples/%,$(wildcard examples/*.c))
DEV_BIN   := $(patsubst dev/%.c,$(BUILD)/dev/%,$(wildcard dev/*.c))

# MPI adapter and multi-rank tests: built when mpicc is on PATH (Open MPI
# from Debian: libopenmpi-dev openmpi-bin, installed by scripts/setup.sh).
MPICC     ?= mpicc
HAVE_MPI  := $(shell command -v $(MPICC) >/dev/null 2>&1 && echo 1)
MPI_LIBS  := $(BUILD)/libbitexact_mpi.a $(BUILD)/libbitexact_mpi.so
MPI_TESTS := $(patsubst tests/mpi/%.c,$(BUILD)/tests/mpi/%,$(wildcard tests/mpi/*.c))
MPI_BENCH := $(patsubst bench/mpi/%.c,$(BUILD)/bench/mpi/%,$(wildcard bench/mpi/*.c))

.PHONY: all lib mpi test test-mpi examples bench dev fuzz clean
all: lib examples bench $(if $(HAVE_MPI),mpi)
lib: $(BUILD)/libbitexact.a $(BUILD)/libbitexact.so
examples: $(EX_BIN)
bench: $(BENCH_BIN)
dev: $(DEV_BIN)

$(BUILD)/src/cuda/%.o: src/cuda/%.cu $(wildcard include/*.h src/core/*.h src/common/*.h src/cuda/*.h) Makefile
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -c $< -o $@

$(BUILD)/%.o: %.c $(wildcard include/*.h src/core/*.h src/common/*.h src/cpu/*.h src/cuda/*.h) Makefile
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -c $< -o $@

# src/cpu/avx2[_*].c and src/cpu/avx512[_*].c are the only files built with ISA flags.
$(BUILD)/src/cpu/avx2.o $(BUILD)/src/cpu/avx2_%.o: CFLAGS_ALL += $(AVX2_FLAGS)
$(BUILD)/src/cpu/avx512.o $(BUILD)/src/cpu/avx512_%.o: CFLAGS_ALL += $(AVX512_FLAGS)

$(BUILD)/libbitexact.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/libbitexact.so: $(LIB_OBJ)
	$(CC) -shared $(SANFLAGS) -o $@ $^ $(LDLIBS)

mpi: $(MPI_LIBS) $(MPI_TESTS) $(MPI_BENCH)

$(BUILD)/src/dist/mpi.o: src/dist/mpi.c include/bitexact.h include/bitexact_mpi.h Makefile
	@mkdir -p $(dir $@)
	$(MPICC) $(CFLAGS_ALL) -c $< -o $@

$(BUILD)/libbitexact_mpi.a: $(BUILD)/src/dist/mpi.o
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/libbitexact_mpi.so: $(BUILD)/src/dist/mpi.o $(BUILD)/libbitexact.so
	$(MPICC) -shared $(SANFLAGS) -o $@ $< -L$(BUILD) -lbitexact $(LDLIBS)

$(BUILD)/tests/mpi/%: tests/mpi/%.c $(wildcard tests/mpi/*.h) $(BUILD)/libbitexact_mpi.a $(BUILD)/libbitexact.a
	@mkdir -p $(dir $@)
	$(MPICC) $(CFLAGS_ALL) -Itests/mpi -o $@ $< $(BUILD)/libbitexact_mpi.a $(BUILD)/libbitexact.a $(LDLIBS)

$(BUILD)/bench/mpi/%: bench/mpi/%.c $(BUILD)/libbitexact_mpi.a $(BUILD)/libbitexact.a
	@mkdir -p $(dir $@)
	$(MPICC) $(CFLAGS_ALL) -o $@ $< $(BUILD)/libbitexact_mpi.a $(BUILD)/libbitexact.a $(LDLIBS)

# Multi-rank tests: tests/mpi/run.sh runs each program under mpirun with
# several rank counts (oversubscribed; --allow-run-as-root when root).
test-mpi: mpi
	BUILD=$(BUILD) bash tests/mpi/run.sh

$(BUILD)/tests/bx_tests: $(TEST_OBJ) $(BUILD)/libbitexact.a
	$(CC) $(SANFLAGS) -o $@ $(TEST_OBJ) $(BUILD)/libbitexact.a -lmpfr -lgmp $(LDLIBS)

$(BUILD)/tests/%.o: CFLAGS_ALL += -Itests

test: $(BUILD)/tests/bx_tests
	$(BUILD)/tests/bx_tests

$(BUILD)/examples/%: examples/%.c $(BUILD)/libbitexact.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -o $@ $< $(BUILD)/libbitexact.a $(LDLIBS)

# Benchmarks may compare against naive loops compiled with the ISA flags of
# the kernel they race; they never go into the library.
$(BUILD)/bench/%: bench/%.c $(wildcard bench/*.h) $(BUILD)/libbitexact.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -o $@ $< $(BUILD)/libbitexact.a $(LDLIBS)

$(BUILD)/dev/%: dev/%.c $(BUILD)/libbitexact.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(AVX512_FLAGS) -o $@ $< $(BUILD)/libbitexact.a $(LDLIBS)

# libFuzzer: clang builds the library sources together with each harness.
FUZZ_CC    ?= clang
FUZZ_FLAGS := -std=c11 -D_GNU_SOURCE -g -O1 -ffp-contract=off -pthread \
              -Iinclude -Isrc/core -Isrc/common -fsanitize=fuzzer,address,undefined
FUZZ_BIN   := $(patsubst fuzz/%.c,build-fuzz/%,$(wildcard fuzz/*.c))
fuzz: $(FUZZ_BIN)
build-fuzz/%: fuzz/%.c $(LIB_SRC) $(wildcard include/*.h src/core/*.h src/common/*.h src/cpu/*.h fuzz/*.h)
	@mkdir -p build-fuzz/obj
	@set -e; objs=""; for f in $(LIB_SRC); do \
	  o=build-fuzz/obj/$$(echo $$f | tr / _).o; extra=""; \
	  case $$f in */avx2*.c) extra="$(AVX2_FLAGS)";; */avx512*.c) extra="$(AVX512_FLAGS)";; esac; \
	  $(FUZZ_CC) $(FUZZ_FLAGS:-fsanitize=fuzzer,%=-fsanitize=fuzzer-no-link,%) $$extra -c $$f -o $$o; \
	  objs="$$objs $$o"; done; \
	  $(FUZZ_CC) $(FUZZ_FLAGS) -o $@ $< $$objs -lmpfr -lgmp -lm

# Parts with their own rules (the command-line tool, ...): mk/*.mk
-include $(wildcard mk/*.mk)

clean:
	rm -rf build build-san build-fuzz
