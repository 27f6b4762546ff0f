# kiln - one Makefile for everything. `make` builds the four binaries under build/bin;
# `make test` installs what a fresh Debian 12 machine lacks, builds and runs every test;
# `make demo` runs a real training job through kilnd and an agent. `make SAN=1 test` builds
# into build-san/ with AddressSanitizer and UndefinedBehaviorSanitizer. `make fuzz` builds the
# libFuzzer targets of fuzz/ with clang into build-fuzz/ and runs each for FUZZ_SECONDS.

SAN ?= 0
FUZZ ?= 0
ifeq ($(FUZZ),1)
# The fuzz build (`make fuzz` sets FUZZ=1): every module a fuzz target links is compiled by clang
# (FUZZ_CC, whatever CC says) for libFuzzer with ASan and UBSan, into its own directory.
FUZZ_CC ?= clang-14
override CC := $(FUZZ_CC)
BUILD ?= build-fuzz
SANFLAGS := -fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
OPT := -O1
else ifeq ($(SAN),1)
BUILD ?= build-san
SANFLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
OPT := -O1
else
BUILD ?= build
SANFLAGS :=
OPT := -O2
endif

CC ?= gcc
BLASDIR := /usr/lib/x86_64-linux-gnu/openblas-openmp
PKGS := libpq jansson libmicrohttpd gnutls libprotobuf-c libfabric libcurl libsodium libpcre2-8 libsystemd libarchive
CFLAGS_COMMON := -std=c11 -Wall -Wextra -g -D_GNU_SOURCE -I. -I$(BUILD)/gen -MMD -MP -pthread $(SANFLAGS) \
	$(shell pkg-config --cflags $(PKGS) 2>/dev/null)
# Warnings are errors in CI (CI=true in its environment) and with WERROR=1.
WERROR ?= $(if $(filter true 1,$(CI)),1,0)
ifeq ($(WERROR),1)
CFLAGS_COMMON += -Werror
endif
CFLAGS := $(CFLAGS_COMMON) $(OPT)
# The engine's kernels want the machine's vector units and OpenMP (shared with OpenBLAS's
# OpenMP build, so there is one thread pool in the process). -fno-math-errno: nothing in the
# engine reads errno after a math function, and with errno to set GCC cannot vectorize a loop
# holding sqrtf (AdamW ran scalar: 180 ms a step for GPT-2 124M's parameters, 49 ms vectorized;
# the same bits either way, sqrt being correctly rounded). MARCH is the one flag an image sets
# (deploy/Dockerfile's KILN_MARCH: a binary built for this machine may die with SIGILL on
# another); an image builds with these flags otherwise (tests/deploy compares them).
MARCH ?= native
ENGINE_CFLAGS := $(CFLAGS_COMMON) -O3 -march=$(MARCH) -fopenmp -fno-math-errno

LDLIBS := -Wl,--as-needed -L$(BLASDIR) -Wl,-rpath,$(BLASDIR) \
	$(shell pkg-config --libs $(PKGS) 2>/dev/null) -lgrpc -lgpr \
	-ldnnl -lopenblas -lm -ldl -fopenmp -pthread $(SANFLAGS)

# ---- sources, by module -------------------------------------------------------------------
PROTO_C   := $(BUILD)/gen/proto/kiln.pb-c.c
PROTO_H   := $(BUILD)/gen/proto/kiln.pb-c.h
# kiln.proto uses protobuf's well-known wrapper types (explicit presence for zero values); their
# .proto comes with libprotobuf-dev and their C code is generated beside kiln's.
PROTO_INC := /usr/include
WRAPPERS_C := $(BUILD)/gen/google/protobuf/wrappers.pb-c.c
BASE_SRC  := $(wildcard base/*.c)
RANK_SRC  := $(wildcard rank/*.c)
CODE_SRC  := $(wildcard code/*.c)
SPEC_SRC  := $(wildcard spec/*.c)
QUERY_SRC := $(wildcard query/*.c)
STORE_SRC := $(wildcard store/*.c)
SVC_SRC   := $(wildcard service/*.c)
API_SRC   := $(wildcard api/*.c)
AGENT_SRC:= $(wildcard agent/*.c)
ENGINE_SRC:= $(shell find engine -name '*.c' -not -path 'engine/cuda/*' 2>/dev/null | sort)
CLI_SRC   := $(wildcard cli/*.c)
HTTPC_SRC := $(wildcard httpc/*.c)
CUDA_SRC  := $(wildcard engine/cuda/*.cu)

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))

LIB_BASE   := $(BUILD)/lib/libkbase.a
LIB_RANK   := $(BUILD)/lib/libkrank.a
LIB_CODE   := $(BUILD)/lib/libkcode.a
LIB_PROTO  := $(BUILD)/lib/libkproto.a
LIB_SPEC   := $(BUILD)/lib/libkspec.a
LIB_QUERY  := $(BUILD)/lib/libkquery.a
LIB_STORE  := $(BUILD)/lib/libkstore.a
LIB_SVC    := $(BUILD)/lib/libkservice.a
LIB_API    := $(BUILD)/lib/libkapi.a
LIB_AGENT := $(BUILD)/lib/libkagent.a
LIB_ENGINE := $(BUILD)/lib/libkengine.a
LIB_CLI    := $(BUILD)/lib/libkcli.a
LIB_HTTPC  := $(BUILD)/lib/libkhttpc.a
# Link order: dependents before what they depend on.
ALL_LIBS := $(LIB_CLI) $(LIB_HTTPC) $(LIB_API) $(LIB_SVC) $(LIB_STORE) $(LIB_QUERY) $(LIB_AGENT) $(LIB_ENGINE) $(LIB_SPEC) $(LIB_PROTO) $(LIB_CODE) $(LIB_RANK) $(LIB_BASE)

BINS := $(BUILD)/bin/kilnd $(BUILD)/bin/kiln-agent $(BUILD)/bin/kiln-train $(BUILD)/bin/kiln

# CUDA backend: a separate shared library the engine loads at run time when a GPU is present,
# so the binaries start on machines without the CUDA runtime.
NVCC := $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA_HOME ?= /usr/local/cuda
ifneq ($(NVCC),)
ifneq ($(CUDA_SRC),)
CUDA_LIB := $(BUILD)/lib/libkiln_cuda.so
endif
endif

.PHONY: all test test-san demo deps bench clean proto tests fuzz fuzz-build print-engine-flags settings-doc print-faults FORCE
all: $(BINS) $(CUDA_LIB)

deps:
	@bash scripts/install-deps.sh

# ---- fault-injection knobs ----------------------------------------------------------------------
# The settings that inject faults (marked test_only in a program's table: a pause in every upload
# chunk, a rank whose parameters diverge, a communication thread that stalls) are compiled only
# into test builds: `make tests` (and so `make test`, `make test-san`) builds with KILN_FAULTS=1,
# anything else (`make all`, the images) with 0. The value lives in a generated header rewritten
# only when it changes, so switching rebuilds just the mains that read it.
ifneq ($(filter test test-san tests,$(MAKECMDGOALS)),)
KILN_FAULTS ?= 1
endif
KILN_FAULTS ?= 0
FAULTS_H := $(BUILD)/gen/cmd/faults.h
$(FAULTS_H): FORCE
	@mkdir -p $(dir $@)
	@echo '#define KILN_FAULTS $(KILN_FAULTS) /* generated by the Makefile: 1 in test builds */' > $@.tmp
	@cmp -s $@.tmp $@ && rm -f $@.tmp || mv $@.tmp $@
$(BUILD)/obj/cmd/kiln_agent.o $(BUILD)/obj/cmd/kiln_train.o: $(FAULTS_H)
FORCE:
# What this invocation builds with (tests/cmd checks that a plain make builds without the knobs).
print-faults:
	@echo 'KILN_FAULTS=$(KILN_FAULTS)'


# ---- settings in the README ---------------------------------------------------------------------
# README.md's settings tables are generated from the programs' own tables (--print-settings);
# tests/cmd fails when they are stale.
settings-doc: $(BINS)
	@bash scripts/settings-doc.sh $(BUILD)/bin README.md

# ---- generated protobuf code ----------------------------------------------------------------
$(PROTO_C) $(PROTO_H) $(WRAPPERS_C): proto/kiln.proto
	@mkdir -p $(BUILD)/gen
	protoc-c -I. -I$(PROTO_INC) --c_out=$(BUILD)/gen proto/kiln.proto
	protoc-c -I$(PROTO_INC) --c_out=$(BUILD)/gen $(PROTO_INC)/google/protobuf/wrappers.proto

$(BUILD)/obj/gen/proto/kiln.pb-c.o: $(PROTO_C)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_COMMON) $(OPT) -w -c $< -o $@

$(BUILD)/obj/gen/google/protobuf/wrappers.pb-c.o: $(WRAPPERS_C)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_COMMON) $(OPT) -w -c $< -o $@

# Everything may include the generated header; make sure it exists before any compile.
$(BUILD)/obj/%.o: %.c | $(PROTO_H)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/obj/engine/%.o: engine/%.c | $(PROTO_H)
	@mkdir -p $(dir $@)
	$(CC) $(ENGINE_CFLAGS) -c $< -o $@

$(BUILD)/obj/tests/engine/%.o: tests/engine/%.c | $(PROTO_H)
	@mkdir -p $(dir $@)
	$(CC) $(ENGINE_CFLAGS) -c $< -o $@

$(BUILD)/obj/bench/%.o: bench/%.c | $(PROTO_H)
	@mkdir -p $(dir $@)
	$(CC) $(ENGINE_CFLAGS) -c $< -o $@

# ---- migrations/*.sql embedded into the store module (migrations/embed.sh) --------------------
MIGRATIONS_SQL := $(sort $(wildcard migrations/*.sql))
MIGRATIONS_C := $(BUILD)/gen/store/migrations_embed.c
MIGRATIONS_O := $(BUILD)/obj/gen/store/migrations_embed.o
$(MIGRATIONS_C): $(MIGRATIONS_SQL) migrations/embed.sh
	@mkdir -p $(dir $@)
	bash migrations/embed.sh $(MIGRATIONS_SQL) > $@.tmp && mv $@.tmp $@
$(MIGRATIONS_O): $(MIGRATIONS_C) | $(PROTO_H)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

# ---- the web UI (ui/): npm ci from the committed lockfile, tsc, esbuild (ui/build.mjs), embedded
# into kilnd as C arrays (api/http_ui.c serves them). npm's install scripts are not run.
UI_SRC := $(shell find ui/src -name '*.ts' -o -name '*.css' 2>/dev/null) ui/index.html ui/build.mjs ui/tsconfig.json
UI_DEPS := ui/node_modules/.kiln-installed
UI_C := $(BUILD)/gen/api/ui_assets.c
UI_O := $(BUILD)/obj/gen/api/ui_assets.o
$(UI_DEPS): ui/package.json ui/package-lock.json
	cd ui && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
	@touch $@
$(UI_C): $(UI_SRC) $(UI_DEPS)
	cd ui && node_modules/.bin/tsc --noEmit -p .
	node ui/build.mjs --out $(BUILD)/ui --c $@
$(UI_O): $(UI_C) | $(PROTO_H)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

# ---- module archives ------------------------------------------------------------------------
define archive
$(1): $(2)
	@mkdir -p $$(dir $$@)
	@rm -f $$@
	ar rcs $$@ $$^
endef
$(eval $(call archive,$(LIB_BASE),$(call obj,$(BASE_SRC))))
$(eval $(call archive,$(LIB_RANK),$(call obj,$(RANK_SRC))))
$(eval $(call archive,$(LIB_CODE),$(call obj,$(CODE_SRC))))
$(eval $(call archive,$(LIB_SPEC),$(call obj,$(SPEC_SRC))))
$(eval $(call archive,$(LIB_QUERY),$(call obj,$(QUERY_SRC))))
$(eval $(call archive,$(LIB_PROTO),$(BUILD)/obj/gen/proto/kiln.pb-c.o $(BUILD)/obj/gen/google/protobuf/wrappers.pb-c.o))
$(eval $(call archive,$(LIB_STORE),$(call obj,$(STORE_SRC)) $(MIGRATIONS_O)))
$(eval $(call archive,$(LIB_SVC),$(call obj,$(SVC_SRC))))
$(eval $(call archive,$(LIB_API),$(call obj,$(API_SRC)) $(UI_O)))
$(eval $(call archive,$(LIB_AGENT),$(call obj,$(AGENT_SRC))))
$(eval $(call archive,$(LIB_ENGINE),$(call obj,$(ENGINE_SRC))))
$(eval $(call archive,$(LIB_CLI),$(call obj,$(CLI_SRC))))
$(eval $(call archive,$(LIB_HTTPC),$(call obj,$(HTTPC_SRC))))

# ---- binaries -------------------------------------------------------------------------------
# Each binary links only the modules it uses (dependents first). rank/ is the contract between
# the agent and its ranks (and tells kilnd what a rank's exit means); it depends on base only.
# code/ reads, writes and checks code archives for kilnd, the agent and the CLI (base and
# libarchive only).
KILND_LIBS := $(LIB_API) $(LIB_SVC) $(LIB_STORE) $(LIB_QUERY) $(LIB_SPEC) $(LIB_PROTO) $(LIB_CODE) $(LIB_RANK) $(LIB_BASE)
AGENT_LIBS := $(LIB_AGENT) $(LIB_PROTO) $(LIB_CODE) $(LIB_RANK) $(LIB_BASE)
TRAIN_LIBS := $(LIB_ENGINE) $(LIB_SPEC) $(LIB_RANK) $(LIB_BASE)
CLI_LIBS   := $(LIB_CLI) $(LIB_HTTPC) $(LIB_CODE) $(LIB_BASE)

# kilnd and kiln-agent share cmd/daemon.c: the --health probe (over httpc/, the CLI's HTTP
# client) and systemd notifications.
DAEMON_O := $(BUILD)/obj/cmd/daemon.o $(LIB_HTTPC)
$(BUILD)/bin/kilnd: $(BUILD)/obj/cmd/kilnd.o $(DAEMON_O) $(KILND_LIBS)
	@mkdir -p $(dir $@)
	$(CC) -o $@ $< $(DAEMON_O) $(KILND_LIBS) $(LDLIBS)

$(BUILD)/bin/kiln-agent: $(BUILD)/obj/cmd/kiln_agent.o $(DAEMON_O) $(AGENT_LIBS)
	@mkdir -p $(dir $@)
	$(CC) -o $@ $< $(DAEMON_O) $(AGENT_LIBS) $(LDLIBS)

$(BUILD)/bin/kiln-train: $(BUILD)/obj/cmd/kiln_train.o $(TRAIN_LIBS)
	@mkdir -p $(dir $@)
	$(CC) -o $@ $< $(TRAIN_LIBS) $(LDLIBS)

$(BUILD)/bin/kiln: $(BUILD)/obj/cmd/kiln.o $(CLI_LIBS)
	@mkdir -p $(dir $@)
	$(CC) -o $@ $< $(CLI_LIBS) $(LDLIBS)

$(BUILD)/obj/cmd/kiln_train.o: cmd/kiln_train.c | $(PROTO_H)
	@mkdir -p $(dir $@)
	$(CC) $(ENGINE_CFLAGS) -c $< -o $@

# ---- CUDA -------------------------------------------------------------------------------------
# Machine code for H100/H200 (sm_90) and A100 (sm_80), plus compute_90 PTX for newer GPUs.
# Override NVCC_GENCODE for a quicker single-architecture build while developing.
NVCC_GENCODE ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90 \
	-gencode arch=compute_80,code=sm_80
NVCCFLAGS := -O3 -std=c++17 $(NVCC_GENCODE) -Xcompiler -fPIC,-Wall,-Wextra -I. -lineinfo
ifeq ($(WERROR),1)
NVCCFLAGS += -Werror all-warnings -Xcompiler -Werror
endif
$(BUILD)/obj/engine/cuda/%.o: engine/cuda/%.cu $(wildcard engine/cuda/*.h engine/cuda/*.cuh) engine/backend.h base/base.h
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

# --no-undefined: the library must not lean on symbols of the executable that loads it.
$(BUILD)/lib/libkiln_cuda.so: $(patsubst %.cu,$(BUILD)/obj/%.o,$(CUDA_SRC))
	@mkdir -p $(dir $@)
	$(NVCC) -shared -o $@ $^ -Xlinker --no-undefined -L$(CUDA_HOME)/lib64 -Xlinker -rpath,$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lnccl -lcudart

# ---- tests ------------------------------------------------------------------------------------
# tests/<module>/*.c become one Criterion binary per module: build/tests/test_<module>.
# tests/common/*.c (harness: throwaway databases, process helpers) is linked into each of them.
TEST_DIRS := $(filter-out common,$(notdir $(patsubst %/,%,$(sort $(dir $(wildcard tests/*/*.c))))))
TEST_COMMON := $(call obj,$(wildcard tests/common/*.c))
TEST_BINS := $(patsubst %,$(BUILD)/tests/test_%,$(TEST_DIRS))
# Modules each suite links (default: base only); the e2e suite drives the built binaries.
TEST_LIBS_base    := $(LIB_BASE)
TEST_LIBS_rank    := $(LIB_RANK) $(LIB_BASE)
TEST_LIBS_code    := $(LIB_CODE) $(LIB_BASE)
TEST_LIBS_store   := $(LIB_STORE) $(LIB_QUERY) $(LIB_SPEC) $(LIB_PROTO) $(LIB_BASE)
TEST_LIBS_service := $(LIB_SVC) $(LIB_STORE) $(LIB_QUERY) $(LIB_SPEC) $(LIB_PROTO) $(LIB_CODE) $(LIB_RANK) $(LIB_BASE)
TEST_LIBS_spec    := $(LIB_SPEC) $(LIB_BASE)
TEST_LIBS_query   := $(LIB_QUERY) $(LIB_SPEC) $(LIB_BASE)
TEST_LIBS_api     := $(KILND_LIBS)
TEST_LIBS_agent   := $(AGENT_LIBS)
TEST_LIBS_engine  := $(TRAIN_LIBS)
TEST_LIBS_cli     := $(CLI_LIBS)
TEST_LIBS_e2e     := $(LIB_BASE)
TEST_LIBS_comm    := $(TRAIN_LIBS)
TEST_LIBS_pipe    := $(TRAIN_LIBS)
TEST_LIBS_cuda    := $(TRAIN_LIBS)
TEST_LIBS_grpc    := $(LIB_AGENT) $(KILND_LIBS)
TEST_LIBS_dp      := $(TRAIN_LIBS)
TEST_LIBS_httpc   := $(LIB_HTTPC) $(LIB_BASE)

define testbin
$(BUILD)/tests/test_$(1): $(call obj,$(wildcard tests/$(1)/*.c)) $(TEST_COMMON) $(or $(TEST_LIBS_$(1)),$(LIB_BASE))
	@mkdir -p $$(dir $$@)
	$$(CC) -o $$@ $(call obj,$(wildcard tests/$(1)/*.c)) $(TEST_COMMON) $(or $(TEST_LIBS_$(1)),$(LIB_BASE)) -lcriterion $$(LDLIBS)
endef
$(foreach d,$(TEST_DIRS),$(eval $(call testbin,$(d))))

tests: $(BINS) $(CUDA_LIB) $(TEST_BINS)

test: deps
	@$(MAKE) --no-print-directory -j$(shell nproc) tests
	@BUILD=$(BUILD) bash tests/run.sh

test-san: deps
	@$(MAKE) --no-print-directory -j$(shell nproc) SAN=1 tests
	@BUILD=build-san KILN_SAN=1 bash tests/run.sh

# The engine's compiler flags with this invocation's variables (tests/deploy runs it with the
# variables of each Dockerfile's make).
print-engine-flags:
	@echo 'ENGINE_CFLAGS=$(ENGINE_CFLAGS)'
	@echo 'NVCCFLAGS=$(NVCCFLAGS)'

demo: deps
	@$(MAKE) --no-print-directory all
	@bash scripts/demo.sh

# ---- benchmarks ---------------------------------------------------------------------------------
BENCH_SRC := $(wildcard bench/*.c)
BENCH_BINS := $(patsubst bench/%.c,$(BUILD)/bench/%,$(BENCH_SRC))
$(BUILD)/bench/%: $(BUILD)/obj/bench/%.o $(ALL_LIBS)
	@mkdir -p $(dir $@)
	$(CC) -o $@ $< $(ALL_LIBS) $(LDLIBS) -lssl -lcrypto
bench: $(BINS) $(BENCH_BINS)

# ---- fuzzing (fuzz/README.md) -------------------------------------------------------------------
# fuzz/<target>.c defines LLVMFuzzerTestOneInput; it links what its FUZZ_LIBS_<target> line names
# (archives or objects of the modules, dependents first; default: base), each compiled by clang
# with -fsanitize=fuzzer-no-link,address,undefined into build-fuzz/. `make fuzz` builds every
# target (or those of FUZZ_TARGETS) and runs each FUZZ_SECONDS with its corpus and dictionary
# (fuzz/run.sh); any crash, leak, UBSan report or timeout fails it.
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?= $(patsubst fuzz/%.c,%,$(sort $(wildcard fuzz/*.c)))
FUZZ_LIBS_spec_json      := $(LIB_SPEC) $(LIB_BASE)
FUZZ_LIBS_spec_tuning    := $(LIB_SPEC) $(LIB_BASE)
FUZZ_LIBS_spec_grpc      := $(call obj,api/grpc_codec.c service/check.c) $(LIB_SPEC) $(LIB_PROTO) $(LIB_BASE)
FUZZ_LIBS_grpc_request   := $(call obj,api/grpc_codec.c service/check.c) $(LIB_PROTO) $(LIB_BASE)
FUZZ_LIBS_query          := $(LIB_QUERY) $(LIB_SPEC) $(LIB_BASE)
FUZZ_LIBS_metric_record  := $(call obj,agent/metrics.c agent/lines.c) $(LIB_PROTO) $(LIB_RANK) $(LIB_BASE)
FUZZ_LIBS_log_lines      := $(call obj,agent/lines.c) $(LIB_BASE)
FUZZ_LIBS_http_range     := $(call obj,api/http_range.c) $(LIB_BASE)
FUZZ_LIBS_http_frame     := $(call obj,api/http_frame.c) $(LIB_BASE)
FUZZ_LIBS_code_archive   := $(LIB_CODE) $(LIB_BASE)
FUZZ_LIBS_page_token     := $(call obj,service/page_token.c store/search_cursor.c store/pool.c) $(LIB_QUERY) $(LIB_SPEC) $(LIB_BASE)
FUZZ_LDLIBS := -Wl,--as-needed $(shell pkg-config --libs $(PKGS) 2>/dev/null) -lz -lm -ldl -pthread

define fuzzbin
$(BUILD)/fuzz/$(1): $(BUILD)/obj/fuzz/$(1).o $(or $(FUZZ_LIBS_$(1)),$(LIB_BASE))
	@mkdir -p $$(dir $$@)
	$$(CC) -fsanitize=fuzzer,address,undefined -o $$@ $$^ $(FUZZ_LDLIBS)
endef
ifeq ($(FUZZ),1)
$(foreach t,$(FUZZ_TARGETS),$(eval $(call fuzzbin,$(t))))
fuzz-build: $(patsubst %,$(BUILD)/fuzz/%,$(FUZZ_TARGETS))
else
fuzz-build:
	@$(MAKE) --no-print-directory FUZZ=1 BUILD=build-fuzz fuzz-build
endif

fuzz: deps
	@$(MAKE) --no-print-directory -j$(shell nproc) FUZZ=1 BUILD=build-fuzz fuzz-build
	@BUILD=build-fuzz FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_ARGS="$(FUZZ_ARGS)" bash fuzz/run.sh $(FUZZ_TARGETS)

clean:
	rm -rf build build-san build-fuzz

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
