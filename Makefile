# cairn — one binary, build/cairn. `make test` and `make run` install missing Debian packages first.
CC      ?= cc
# SIMD=native (default) compiles the best path for this machine; SIMD=portable builds the scalar path only.
SIMD    ?= native
# GCC 12's -O2 vectorizes only loops that need no tail and no alias check (its "very cheap" cost
# model); per-token loops of the forward passes (an attention head's value sum over head_dim, the
# hyper-connection stream mixing) are neither and stayed scalar: 13 % of an Inkling prefill was
# one such loop, 4 % vectorized. The dynamic model vectorizes them. GCC never reorders a float sum
# for it (no -ffast-math), so every result is the same bit for bit. Only where CC takes the flag.
VECTORIZE := $(shell $(CC) -fvect-cost-model=dynamic -E -x c /dev/null >/dev/null 2>&1 && echo -fvect-cost-model=dynamic)
OPT     ?= -O2 $(VECTORIZE)
ARCH_native   := -march=native
ARCH_portable :=
CFLAGS  ?= $(OPT) -g
CFLAGS  += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -Werror=implicit-function-declaration \
           -pthread $(ARCH_$(SIMD))
LDLIBS  := -lcjson -lpcre2-8 -lmicrohttpd -lpthread -lm
BUILD   ?= build

# MPI=1 (make mpi: build/mpi/cairn) links OpenMPI through mpicc and runs routed experts across
# mpirun's ranks (src/core/cluster_mpi.c); the default build is one process and links no MPI.
ifeq ($(MPI),1)
CC       := mpicc
CLUSTER  := src/core/cluster_mpi.c
else
CLUSTER  := src/core/cluster_none.c
endif
SRC      := $(filter-out src/core/cluster_%.c,$(shell find src -name '*.c' | sort)) $(CLUSTER)
# The chat page (webui/, served at /) is one generated source: its files as C arrays.
WEBUI_GEN := $(BUILD)/gen/webui_assets.c
OBJ      := $(SRC:src/%.c=$(BUILD)/obj/%.o) $(BUILD)/obj/gen/webui_assets.o
LIB_OBJ  := $(filter-out $(BUILD)/obj/main.o,$(OBJ))
# tests/c/tool_*.c are helpers the pytest files run (not unit programs).
TEST_SRC := $(sort $(wildcard tests/c/test_*.c tests/c/tool_*.c))
TEST_BIN := $(TEST_SRC:tests/c/%.c=$(BUILD)/tests/%)
PYTHON   := /usr/bin/python3

# QUIET=1 (make run) prints one short line per file instead of each compiler command.
ifdef QUIET
SAY = @printf '  %-4s %s\n'
Q   = @
else
SAY = @:
Q   =
endif
NPROC := $(shell nproc 2>/dev/null || echo 2)

.PHONY: all deps test test-c run bench asan clean deepseek-v4-tiny-check fuzz fuzz-build soak mpi kernel-variants
all: $(BUILD)/cairn $(TEST_BIN)

# Plain `make` checks the C libraries first, so a missing one is named with the command that
# installs it instead of failing on a missing header. (Stamp per build dir, rechecked after clean.)
$(BUILD)/.deps-ok:
	@scripts/deps.sh --build
	@mkdir -p $(BUILD) && touch $@

$(BUILD)/cairn: $(OBJ)
	$(SAY) LD $@
	$(Q)$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/obj/%.o: src/%.c | $(BUILD)/.deps-ok
	@mkdir -p $(dir $@)
	$(SAY) CC $<
	$(Q)$(CC) $(CFLAGS) -MMD -MP -c -o $@ $<

$(BUILD)/tests/%: tests/c/%.c $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Isrc -o $@ $< $(LIB_OBJ) $(LDLIBS)

-include $(OBJ:.o=.d)

# The kernel unit test once more for each SIMD path this machine runs but the native build does
# not select, so every path's bitwise match with the scalar twin is tested where it can run:
# AVX2 (the AVX-512 kernels compiled out) and AVX-512 without GFNI and VBMI (FP8's 32-column
# decode, and the nibble formats' FMA path, as the BF16 pairs need VBMI). On a machine without
# those extensions a variant is the native path again.
KERNEL_VARIANTS := avx2 avx512-nogfni
KVAR_avx2          := -mno-avx512f
KVAR_avx512-nogfni := -mno-gfni -mno-avx512vbmi
KVAR_SRC := src/core/kernels.c src/core/kernels_avx2.c src/core/kernels_avx512.c src/core/quant.c \
            src/core/threads.c src/core/util.c
KVAR_BIN := $(KERNEL_VARIANTS:%=build/kernel-variants/%/test_kernels)

kernel-variants: $(KVAR_BIN)

build/kernel-variants/%/test_kernels: tests/c/test_kernels.c $(KVAR_SRC) $(wildcard src/core/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(KVAR_$*) -Isrc -o $@ $< $(KVAR_SRC) -lm

# URL=file pairs the page is made of; the markdown renderer and sanitizer come from npm
# (webui/package-lock.json pins them) and are vendored into the binary, never fetched at run time.
WEBUI_VENDOR := webui/node_modules/marked/lib/marked.esm.js webui/node_modules/dompurify/dist/purify.es.mjs
WEBUI_FILES  := /index.html=webui/index.html /app.js=webui/app.js /style.css=webui/style.css \
                /vendor/marked.esm.js=webui/node_modules/marked/lib/marked.esm.js \
                /vendor/purify.es.mjs=webui/node_modules/dompurify/dist/purify.es.mjs

webui/node_modules/.installed: webui/package.json webui/package-lock.json
	$(SAY) NPM webui
	$(Q)cd webui && npm ci --no-audit --no-fund --loglevel=error >/dev/null
	@touch $@

$(WEBUI_GEN): tools/embed_webui.py webui/index.html webui/app.js webui/style.css webui/node_modules/.installed
	@mkdir -p $(dir $@)
	$(SAY) GEN $@
	$(Q)$(PYTHON) tools/embed_webui.py $@ $(WEBUI_FILES)

$(BUILD)/obj/gen/webui_assets.o: $(WEBUI_GEN)
	@mkdir -p $(dir $@)
	$(SAY) CC $<
	$(Q)$(CC) $(CFLAGS) -Isrc -c -o $@ $<

deps:
	@scripts/deps.sh

# Every test — C unit programs, protocol, HTTP and node tests — runs under pytest, so the run
# ends with one summary line.
test: deps
	@$(MAKE) --no-print-directory all
	@$(MAKE) --no-print-directory BUILD=build/portable SIMD=portable all
	@$(MAKE) --no-print-directory kernel-variants
	@$(MAKE) --no-print-directory mpi
	@$(MAKE) --no-print-directory fuzz-build
	$(PYTHON) -m pytest -q tests

# The C unit programs alone, in the native and the portable build (tests/test_c_units.py runs each).
test-c: deps
	@$(MAKE) --no-print-directory all
	@$(MAKE) --no-print-directory BUILD=build/portable SIMD=portable all
	@$(MAKE) --no-print-directory kernel-variants
	$(PYTHON) -m pytest -q tests/test_c_units.py

# libFuzzer targets (tests/fuzz/fuzz_*.c): every reader of untrusted bytes, under ASan + UBSan,
# built with clang into build/fuzz. `make fuzz` runs each for FUZZ_TIME seconds (niced) from the
# committed corpus; make test runs a short smoke pass over the same binaries.
FUZZ_SAN := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
FUZZ_SRC := $(sort $(wildcard tests/fuzz/fuzz_*.c))
FUZZ_TIME ?= 60

fuzz-build:
	@$(MAKE) --no-print-directory BUILD=build/fuzz CC=clang SIMD=portable \
	    OPT="-O1 $(FUZZ_SAN) -fsanitize=fuzzer-no-link" MATCHER_COV=-fno-sanitize-coverage=trace-cmp \
	    $(FUZZ_SRC:tests/fuzz/%.c=build/fuzz/%)

# The grammar matcher compares its own node, state and hash ids, never the input's bytes, so
# libFuzzer's comparison tracing there finds nothing to splice into an input; it was 70 % of
# fuzz_grammar's time. Its edges stay instrumented (coverage) and sanitized like everything else.
$(BUILD)/obj/core/grammar_match.o: CFLAGS += $(MATCHER_COV)

$(BUILD)/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz.h $(LIB_OBJ)
	$(CC) $(CFLAGS) -fsanitize=fuzzer -Isrc -o $@ $< $(LIB_OBJ) $(LDLIBS)

fuzz: deps fuzz-build
	$(PYTHON) tests/fuzz/run.py --seconds $(FUZZ_TIME)

# The expert-parallel binary (tests/test_mpi.py runs it under mpirun -np 2).
mpi:
	@$(MAKE) --no-print-directory BUILD=build/mpi MPI=1 build/mpi/cairn

# Address/UB sanitizer build of everything (the loader's corrupt-file tests run under it).
asan:
	@$(MAKE) --no-print-directory BUILD=build/asan OPT="-O1 -fsanitize=address,undefined -fno-omit-frame-pointer" all

# Only the binary, in parallel and quietly: the demo needs no test programs.
run: deps
	@$(MAKE) --no-print-directory -j$(NPROC) QUIET=1 $(BUILD)/cairn
	@scripts/demo.sh

# Not in CI: 500 connections of mixed load + 200 slow-loris ones for SOAK_SECONDS, then leak checks.
SOAK_SECONDS ?= 600
soak: deps all
	$(PYTHON) scripts/soak.py --seconds $(SOAK_SECONDS)

bench: deps all
	@scripts/bench.sh

deepseek-v4-tiny-check: deps all
	$(PYTHON) -m pytest -q -s tests/test_deepseek_v4_tiny_check.py

clean:
	rm -rf build
