# adtrain build. `make` builds build/adtrain and build/libadtrain.a; `make test` runs the suite.
#   SANITIZE=1   AddressSanitizer + UndefinedBehaviorSanitizer build in build/san
#   NATIVE=0     no -march=native (portable binary; `make test-portable` tests its kernels)
#   FUZZ=1       libFuzzer targets with clang (make fuzz)
SANITIZE ?= 0
NATIVE ?= 1
CC ?= cc
ifeq ($(CC),cc)
  CC := gcc
endif

ifeq ($(SANITIZE),1)
  BUILD ?= build/san
  OPT := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all
  LDSAN := -fsanitize=address,undefined
else
  BUILD ?= build
  OPT := -O3 -g
  LDSAN :=
endif
ifeq ($(NATIVE),1)
  OPT += -march=native
endif

PKGS := openblas libcjson zlib mpich sqlite3 libmicrohttpd libcurl
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS := $(shell pkg-config --libs $(PKGS) 2>/dev/null)
ifeq ($(PKG_LIBS),)
  $(error pkg-config found none of: $(PKGS). Run scripts/install-deps.sh first)
endif

CFLAGS := -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Wshadow -Wno-unused-parameter \
          -Iinclude -Isrc $(OPT) $(PKG_CFLAGS) -MMD -MP
# oneDNN (libdnnl-dev): Debian ships CMake files but no pkg-config file, so it is linked by name.
# Its CPU runtime is OpenMP (libgomp); the GEMM layer sets OpenMP's thread count, hence -lgomp.
DNNL_LIBS := -ldnnl -lgomp
ifeq ($(wildcard /usr/include/oneapi/dnnl/dnnl.h),)
  $(error oneDNN headers not found (/usr/include/oneapi/dnnl/dnnl.h). Run scripts/install-deps.sh first)
endif
LDLIBS := $(PKG_LIBS) $(DNNL_LIBS) -lm -lpthread

LIB_SRC := $(filter-out src/cli/%,$(wildcard src/*/*.c))
CLI_SRC := $(wildcard src/cli/*.c)
TEST_SRC := $(wildcard tests/test_*.c)
BENCH_SRC := $(wildcard bench/bench_*.c)

LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
CLI_OBJ := $(CLI_SRC:%.c=$(BUILD)/obj/%.o)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)

.PHONY: all test tests bench clean fixtures
all: $(BUILD)/libadtrain.a $(BUILD)/adtrain

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/libadtrain.a: $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/adtrain: $(CLI_OBJ) $(BUILD)/libadtrain.a
	$(CC) $(LDSAN) -o $@ $(CLI_OBJ) $(BUILD)/libadtrain.a $(LDLIBS)

$(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(BUILD)/libadtrain.a
	@mkdir -p $(dir $@)
	$(CC) $(LDSAN) -o $@ $< $(BUILD)/libadtrain.a $(LDLIBS)

$(BUILD)/bench/%: $(BUILD)/obj/bench/%.o $(BUILD)/libadtrain.a
	@mkdir -p $(dir $@)
	$(CC) $(LDSAN) -o $@ $< $(BUILD)/libadtrain.a $(LDLIBS)

# Programs the tests start as workers (not tests themselves): plain MPICH, never sanitized, since
# MPICH/UCX's own leaks are not ours; they sit beside the test binaries, where the tests look.
TEST_HELPERS := $(BUILD)/tests/mpi_worker $(BUILD)/tests/elastic_worker
$(BUILD)/tests/mpi_worker: tests/mpi_worker.c
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O2 -g -Wall -Wextra -Werror $(shell pkg-config --cflags mpich) -o $@ $< \
	    $(shell pkg-config --libs mpich)
# The elastic test worker links the client library's own sources, unsanitized like the above.
ELASTIC_WORKER_SRC := tests/elastic_worker.c src/elastic/client.c src/elastic/http.c src/elastic/wire.c \
                      src/base/error.c src/base/log.c src/base/rng.c src/data/sampler.c
$(BUILD)/tests/elastic_worker: $(ELASTIC_WORKER_SRC) $(wildcard include/adtrain/*.h src/elastic/*.h)
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -D_GNU_SOURCE -O2 -g -Wall -Wextra -Werror -Iinclude -Isrc \
	    $(shell pkg-config --cflags mpich libcurl libcjson) -o $@ $(ELASTIC_WORKER_SRC) \
	    $(shell pkg-config --libs mpich libcurl libcjson) -lm -lpthread

tests: $(TEST_BIN) $(TEST_HELPERS) $(BUILD)/adtrain
bench: $(BENCH_BIN) $(BUILD)/adtrain

# The runner prints one line per test program and closes with "N passed, N failed". The suite
# runs under the GEMM backend the layer picks (ADT_GEMM=auto); the programs that compare numerics
# (kernels, PyTorch parity, the executor's fusions, the layer itself) run again under each
# backend forced, so every backend is held to the same tolerances.
GEMM_TESTS := test_gemm test_kernels_nn test_kernels_cv test_models_torch test_gpt_torch test_graph
GEMM_RUNS = $(foreach b,openblas onednn onednn-matmul,ADT_GEMM=$(b) $(GEMM_TESTS:%=$(1)/tests/%))
test: tests
	@BUILD=$(BUILD) sh tests/run.sh $(TEST_BIN) $(call GEMM_RUNS,$(BUILD))

fixtures:
	/usr/bin/python3 scripts/gen_fixtures.py tests/fixtures

clean:
	rm -rf build

# libFuzzer targets: fuzz/fuzz_*.c, each linked with the library sources built by clang with
# -fsanitize=fuzzer,address,undefined. `make fuzz` builds them; `make fuzz-smoke` runs each for
# FUZZ_SECONDS (CI); scripts/fuzz.sh runs them longer.
FUZZ_SECONDS ?= 10
FUZZ_SRC := $(wildcard fuzz/fuzz_*.c)
FUZZ_BIN := $(FUZZ_SRC:fuzz/%.c=build/fuzz/%)
FUZZ_CFLAGS := -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
               -Iinclude -Isrc $(PKG_CFLAGS)
# The library is compiled once for them (instrumented, no fuzzer main) into one archive.
FUZZ_OBJ := $(LIB_SRC:%.c=build/fuzz/obj/%.o)
FUZZ_LIB := build/fuzz/libadtrain-fuzz.a
.PHONY: fuzz fuzz-smoke
fuzz: $(FUZZ_BIN)
build/fuzz/obj/%.o: %.c $(wildcard include/adtrain/*.h src/*/*.h)
	@mkdir -p $(dir $@)
	clang $(subst -fsanitize=fuzzer,-fsanitize=fuzzer-no-link,$(FUZZ_CFLAGS)) -c -o $@ $<
$(FUZZ_LIB): $(FUZZ_OBJ)
	rm -f $@ && ar rcs $@ $^
build/fuzz/%: fuzz/%.c fuzz/fuzz.h $(FUZZ_LIB)
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -o $@ $< $(FUZZ_LIB) $(LDLIBS)
fuzz-smoke: $(FUZZ_BIN)
	@for f in $(FUZZ_BIN); do n=$$(basename $$f); n=$${n#fuzz_}; \
	  mkdir -p build/fuzz/work/$$n; \
	  echo "fuzz $$n: $(FUZZ_SECONDS) s"; \
	  ASAN_OPTIONS=detect_leaks=1 $$f -max_total_time=$(FUZZ_SECONDS) -print_final_stats=0 \
	    $$( [ -f fuzz/$$n.dict ] && echo -dict=fuzz/$$n.dict ) build/fuzz/work/$$n fuzz/corpus/$$n \
	    >build/fuzz/work/$$n.log 2>&1 || { tail -n 40 build/fuzz/work/$$n.log; exit 1; }; \
	done; echo "fuzz-smoke: all targets clean"

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)

# The kernels' portable loops, what a CPU without AVX-512 (or a NATIVE=0 build) runs: the kernel
# tests built without -march=native into build/portable, against the same references.
PORTABLE_TESTS := $(addprefix build/portable/tests/,test_kernels_nn test_kernels_cv)
.PHONY: test-portable
test-portable:
	$(MAKE) NATIVE=0 BUILD=build/portable $(PORTABLE_TESTS)
	@BUILD=build/portable sh tests/run.sh $(PORTABLE_TESTS)

# CI: the suite in the optimised build and again under ASan+UBSan, the kernels' portable path,
# each fuzz target briefly (4 s; scripts/fuzz.sh runs them longer), then one closing line for the suites.
.PHONY: test-all
test-all:
	$(MAKE) tests
	$(MAKE) tests SANITIZE=1
	$(MAKE) NATIVE=0 BUILD=build/portable $(PORTABLE_TESTS)
	$(MAKE) fuzz-smoke FUZZ_SECONDS=4
	@sh tests/run.sh $(TEST_BIN) $(TEST_SRC:tests/%.c=build/san/tests/%) $(call GEMM_RUNS,build) \
	    $(call GEMM_RUNS,build/san) $(PORTABLE_TESTS)
