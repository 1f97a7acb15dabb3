# mk/cli.mk — the `bitexact` command-line tool (src/cli/), included by the
# root Makefile.
#
#   make cli            $(BUILD)/bitexact (also part of `make` / `all`)
#   make test-cli       tests/cli/test_cli.py against real safetensors files
#                       (needs scripts/cli_setup.sh: jansson, xxhash, Python
#                       safetensors/numpy/xxhash, torch for the bf16 cases)
#   make bench-cli      bench/cli/run.sh: norm and hash of a >= 2 GiB file vs a
#                       plain sequential read (writes and deletes the file)
#   make fuzz           also builds build-fuzz/fuzz_safetensors (the parser)
#
# With MPI (HAVE_MPI, from the root Makefile) the binary is linked by mpicc
# with libbitexact_mpi.a, and `bitexact demo` under mpirun uses real ranks.

CLI_SRC  := $(wildcard src/cli/*.c)
CLI_OBJ  := $(patsubst %.c,$(BUILD)/%.o,$(CLI_SRC))
CLI_HDRS := $(wildcard src/cli/*.h include/*.h src/core/*.h src/common/*.h)
CLI_LIBS := -ljansson -lxxhash
CLI_CC   := $(CC)
CLI_DEFS :=

ifeq ($(HAVE_MPI),1)
CLI_LD      := $(MPICC)
CLI_MPI_LIB := $(BUILD)/libbitexact_mpi.a
$(BUILD)/src/cli/demo_mpi.o: CLI_CC = $(MPICC)
$(BUILD)/src/cli/demo_mpi.o: CLI_DEFS = -DBX_CLI_MPI=1
else
CLI_LD      := $(CC)
CLI_MPI_LIB :=
endif

.PHONY: cli test-cli bench-cli fuzz-cli
all: $(BUILD)/bitexact
cli: $(BUILD)/bitexact

# More specific than the root Makefile's $(BUILD)/%.o, so this one is used.
$(BUILD)/src/cli/%.o: src/cli/%.c $(CLI_HDRS) mk/cli.mk
	@mkdir -p $(dir $@)
	$(CLI_CC) $(CFLAGS_ALL) $(CLI_DEFS) -Isrc/cli -c $< -o $@

$(BUILD)/bitexact: $(CLI_OBJ) $(CLI_MPI_LIB) $(BUILD)/libbitexact.a
	$(CLI_LD) $(SANFLAGS) -o $@ $(CLI_OBJ) $(CLI_MPI_LIB) $(BUILD)/libbitexact.a $(CLI_LIBS) $(LDLIBS)

test-cli: $(BUILD)/bitexact
	python3 tests/cli/test_cli.py --bin $(BUILD)/bitexact $(if $(HAVE_MPI),--mpi)

bench-cli: $(BUILD)/bitexact $(BUILD)/bench/cli/seqread
	BUILD=$(BUILD) bash bench/cli/run.sh

# The parser's fuzzer needs jansson and src/cli/safetensors.c, not the
# library: an explicit rule, which make prefers to the root build-fuzz/% one.
build-fuzz/fuzz_safetensors: fuzz/fuzz_safetensors.c src/cli/safetensors.c src/cli/safetensors.h
	@mkdir -p build-fuzz
	$(FUZZ_CC) $(FUZZ_FLAGS) -Isrc/cli -o $@ fuzz/fuzz_safetensors.c src/cli/safetensors.c -ljansson

fuzz-cli: build-fuzz/fuzz_safetensors
