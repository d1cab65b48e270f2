# kvpool -- top-level Makefile.
#   make          release build: build/kvpool, build/libkvpool.{so,a}
#   make install  the release build, public headers, kvpool.pc, the bash
#                 completion and the systemd units into $(DESTDIR)$(PREFIX)
#                 (default /usr/local); make uninstall
#   make test     ASan+UBSan build of everything, then every C test and the Python
#                 tests (pytest); ends with "N passed, N failed, N skipped" over both
#   make python   the Python extension (kvpool._native) and the kvpool program
#                 (kvpool/_bin/kvpool, what the installed `kvpool` command runs)
#                 built into python/kvpool/ by setup.py, as `pip install .` does
#   make tsan     ThreadSanitizer build, then the threaded tests
#   make test-cluster  cross-host faults (tests/cluster): etcd, masters, storage
#                 nodes and a verifying load on hosts made of network namespaces
#                 (root); ends with "N passed, N failed, N skipped"
#   make test-gpu the device-path tests on a CUDA machine (test_gpu on the real
#                 driver, tests/gpu with torch CUDA tensors); skips without one
#   make fuzz     bounded run of every libFuzzer target (clang)
#   make bench    benchmarks against real processes; results in bench/results/,
#                 then their plots (scripts/plots) in bench/plots/
#   make plots    the plots alone, from the results in bench/results/ (gnuplot)
#   make bench-hostile  the hostile run (bench/hostile.py, HOSTILE_SECONDS per target)
#   make demo     kvpool serve + kvpool sim (2 instances x TP 2, ~30 s), then stops
#   make gpu-kernel  regenerate src/client/gpu_kernel_ptx.c from gpu_kernel.cu (nvcc)
#   make clean
CC      ?= gcc
FUZZCC  ?= clang
Q       ?= @
WARN    := -Wall -Wextra -Werror -Wstrict-prototypes -Wshadow -Wno-unused-parameter
CSTD    := -std=gnu11
INC     := -Iinclude -Isrc -Itests/support
CFLAGS_BASE := -D_GNU_SOURCE $(CSTD) $(WARN) $(INC) -g -fPIC -pthread
LDLIBS  := -ljansson -lxxhash -lcrypto -luring -lmicrohttpd -lzmq -lmsgpackc -lpthread -lm

LIB_SRCS := $(wildcard src/common/*.c src/proto/*.c src/net/*.c src/master/*.c src/node/*.c src/client/*.c src/connector/*.c src/ha/*.c)
CLI_SRCS := $(wildcard src/cli/*.c src/bench/*.c src/sim/*.c)
UNIT_SRCS := $(wildcard tests/unit/test_*.c)
INTEG_SRCS := $(wildcard tests/integration/test_*.c)
TEST_SUPPORT := $(wildcard tests/support/*.c)
FUZZ_SRCS := $(wildcard tests/fuzz/fuzz_*.c)

# ---------------------------------------------------------------- variants
# release
R := build
R_CFLAGS := $(CFLAGS_BASE) -O2 -fvisibility=hidden
# tests: AddressSanitizer + UndefinedBehaviorSanitizer
A := build/asan
A_CFLAGS := $(CFLAGS_BASE) -O1 -fno-omit-frame-pointer -fsanitize=address,undefined \
            -fno-sanitize-recover=undefined -DKVP_TESTING=1
# ThreadSanitizer
T := build/tsan
T_CFLAGS := $(CFLAGS_BASE) -O1 -fsanitize=thread -DKVP_TESTING=1

.PHONY: all deps test test-gpu test-cluster tsan fuzz bench bench-hostile plots clean unit integ demo \
        python gpu-kernel install uninstall
all: deps $(R)/kvpool $(R)/libkvpool.so $(R)/libkvpool.a

deps:
	$(Q)scripts/install-deps

# generic compile rules per variant
$(R)/obj/%.o: %.c | deps
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(R_CFLAGS) -MMD -MP -c $< -o $@
$(A)/obj/%.o: %.c | deps
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(A_CFLAGS) -MMD -MP -c $< -o $@
$(T)/obj/%.o: %.c | deps
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(T_CFLAGS) -MMD -MP -c $< -o $@

R_LIB_OBJS := $(LIB_SRCS:%.c=$(R)/obj/%.o)
A_LIB_OBJS := $(LIB_SRCS:%.c=$(A)/obj/%.o)
T_LIB_OBJS := $(LIB_SRCS:%.c=$(T)/obj/%.o)

$(R)/libkvpool.a: $(R_LIB_OBJS)
	$(Q)rm -f $@ && ar rcs $@ $^
# the shared library's soname carries the major version (include/kvpool.h);
# build/libkvpool.so.N beside it lets programs linked with -Lbuild run
VERSION := $(shell sed -n 's/^\#define KVPOOL_VERSION_STRING "\(.*\)"$$/\1/p' include/kvpool.h)
SONAME  := libkvpool.so.$(firstword $(subst ., ,$(VERSION)))
$(R)/libkvpool.so: $(R_LIB_OBJS)
	$(Q)$(CC) -shared -Wl,-soname,$(SONAME) -o $@ $^ $(LDLIBS)
	$(Q)ln -sfn libkvpool.so $(R)/$(SONAME)
$(R)/kvpool: $(CLI_SRCS:%.c=$(R)/obj/%.o) $(R)/libkvpool.a
	$(Q)$(CC) $(R_CFLAGS) -o $@ $^ $(LDLIBS)

$(A)/libkvpool.a: $(A_LIB_OBJS)
	$(Q)rm -f $@ && ar rcs $@ $^
$(A)/kvpool: $(CLI_SRCS:%.c=$(A)/obj/%.o) $(A)/libkvpool.a
	$(Q)$(CC) $(A_CFLAGS) -o $@ $^ $(LDLIBS)
$(T)/libkvpool.a: $(T_LIB_OBJS)
	$(Q)rm -f $@ && ar rcs $@ $^
$(T)/kvpool: $(CLI_SRCS:%.c=$(T)/obj/%.o) $(T)/libkvpool.a
	$(Q)$(CC) $(T_CFLAGS) -o $@ $^ $(LDLIBS)

# test binaries: one per tests/{unit,integration}/test_*.c, linked with the
# support code and the library of the same variant
A_SUPPORT := $(TEST_SUPPORT:%.c=$(A)/obj/%.o)
T_SUPPORT := $(TEST_SUPPORT:%.c=$(T)/obj/%.o)
A_TESTS := $(patsubst tests/%.c,$(A)/tests/%,$(UNIT_SRCS) $(INTEG_SRCS))
T_TESTS := $(patsubst tests/%.c,$(T)/tests/%,$(UNIT_SRCS) $(INTEG_SRCS))
$(A)/tests/%: $(A)/obj/tests/%.o $(A_SUPPORT) $(A)/libkvpool.a
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(A_CFLAGS) -o $@ $^ $(LDLIBS)
$(T)/tests/%: $(T)/obj/tests/%.o $(T_SUPPORT) $(T)/libkvpool.a
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(T_CFLAGS) -o $@ $^ $(LDLIBS)

# Python: the extension built into python/kvpool/ (make python) with the
# venv's interpreter (scripts/python-env: pytest, numpy, the Mooncake wheel)
PYVENV_PY = $(shell scripts/python-env 2>/dev/null || echo python3)

python: deps
	$(Q)PYTHONWARNINGS=ignore $(PYVENV_PY) setup.py -q build_ext --inplace

test: deps $(A)/kvpool $(A_TESTS) $(R)/kvpool $(R)/libkvpool.so $(R)/libkvpool.a python
	$(Q)KVPOOL_BIN=$(A)/kvpool tests/run.sh $(A)/tests

# UCX's memory hooks (libucm patching malloc and mmap) crash under TSan's
# interceptors: the TSan run switches them off (UCX then registers without
# its cache, which only its RDMA transports use).
tsan: deps $(T)/kvpool $(T_TESTS) python
	$(Q)KVPOOL_BIN=$(T)/kvpool KVP_TSAN=1 UCX_MEM_MMAP_HOOK_MODE=none UCX_MEM_MALLOC_HOOKS=no \
	    tests/run.sh $(T)/tests

# Cross-host faults (tests/cluster, pytest): each test makes hosts of network
# namespaces on a bridge (10.77.0.x), runs etcd, 2-3 masters, 2 storage nodes
# and a verifying client load, injects one fault and prints the recovery time
# and the published objects lost. Needs root, iproute2 and etcd (each test
# skips with the reason otherwise); ~2.5 min. CLUSTER_BIN: the kvpool it runs
# (default the release build; build/asan/kvpool works too).
CLUSTER_BIN ?= $(R)/kvpool
test-cluster: deps $(CLUSTER_BIN) python
	$(Q)KVPOOL_BIN=$(CLUSTER_BIN) tests/run.sh --pytest cluster python-env

# GPU tests (scripts/gpu-check runs them on the GPU machine): the ASan
# test_gpu with KVPOOL_GPU_BACKEND=$(GPU_BACKEND) (cuda: the real driver),
# then tests/gpu (pytest, torch CUDA tensors) under GPU_PY (default: the
# Python of make python); without CUDA every test skips with its reason.
# Ends with "N passed, N failed, N skipped".
GPU_BACKEND ?= cuda
GPU_PY ?= $(PYVENV_PY)
test-gpu: deps $(R)/kvpool $(A)/kvpool $(filter $(A)/tests/integration/test_gpu,$(A_TESTS)) python
	$(Q)KVPOOL_BIN=$(R)/kvpool KVPOOL_TEST_BIN=$(A)/kvpool GPU_BACKEND=$(GPU_BACKEND) \
	    GPU_PY="$(GPU_PY)" tests/gpu/run.sh $(A)/tests/integration/test_gpu

# fuzzing: clang libFuzzer, one binary per tests/fuzz/fuzz_*.c
F := build/fuzz
F_CFLAGS := -D_GNU_SOURCE $(CSTD) $(INC) -g -O1 -fsanitize=fuzzer,address,undefined -DKVP_TESTING=1 -DKVP_FUZZING=1
FUZZ_LIB_SRCS := $(LIB_SRCS)
FUZZ_BINS := $(patsubst tests/fuzz/%.c,$(F)/%,$(FUZZ_SRCS))
FUZZ_SECONDS ?= 20
$(F)/%: tests/fuzz/%.c $(FUZZ_LIB_SRCS) | deps
	@mkdir -p $(dir $@)
	$(Q)$(FUZZCC) $(F_CFLAGS) -o $@ $< $(FUZZ_LIB_SRCS) $(LDLIBS)
fuzz: deps $(FUZZ_BINS)
	$(Q)tests/fuzz/run.sh $(F) $(FUZZ_SECONDS)

bench: all
	$(Q)bench/run.sh $(R)
	$(Q)scripts/plots

# PNGs in bench/plots/ drawn from bench/results/*.json (gnuplot-nox)
plots: deps
	$(Q)scripts/plots

# the hostile run (bench/hostile.py): ~6 x (HOSTILE_SECONDS + 13) s, every target
HOSTILE_SECONDS ?= 60
HOSTILE_TARGETS ?= master,node,lookup,http-slow,kvev,followers
bench-hostile: all python
	$(Q)$(PYVENV_PY) bench/hostile.py --kvpool $(R)/kvpool --seconds $(HOSTILE_SECONDS) \
	    --targets $(HOSTILE_TARGETS)

demo: all
	$(Q)scripts/demo $(DEMO_ARGS)

# the gather kernel's PTX is committed: builds never need nvcc
gpu-kernel:
	$(Q)scripts/gen-gpu-kernel

# cuda mock: a stand-in libcuda.so.1 (tests/support/cuda_mock/libcuda_mock.c)
# so that the real CUDA backend (gpu_cuda.c) runs on CPU: tests/cuda_mock.sh
# runs test_gpu on it once per copy mode. `make test` runs that as the test
# $(A)/tests/test_cuda_mock (tests/run.sh counts its RESULT line); `make
# test-cuda-mock` alone. cuda.h, where installed, checks the mock's
# prototypes and gpu_cuda.c's hand-written ABI constants at compile time.
CUDA_MOCK_SRC := tests/support/cuda_mock/libcuda_mock.c
CUDA_MOCK_CFLAGS := -D_GNU_SOURCE $(CSTD) $(WARN) -O1 -g -fPIC -shared -fvisibility=hidden -pthread \
	-Wl,-soname,libcuda.so.1 $(patsubst %/cuda.h,-I%,$(firstword $(wildcard \
	$(CUDA_HOME)/include/cuda.h /usr/local/cuda/include/cuda.h)))
CUDA_MOCK_DEPS := build/cuda-mock/libcuda.so.1 build/cuda-mock-12.8/libcuda.so.1 \
	build/cuda-mock/test_multi_device $(A)/tests/integration/test_gpu $(A)/kvpool
build/cuda-mock/libcuda.so.1: $(CUDA_MOCK_SRC)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CUDA_MOCK_CFLAGS) -o $@ $<
build/cuda-mock-12.8/libcuda.so.1: $(CUDA_MOCK_SRC)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CUDA_MOCK_CFLAGS) -DKVP_CUDA_MOCK_DRIVER=12080 -o $@ $<
build/cuda-mock/test_multi_device: tests/support/cuda_mock/test_multi_device.c $(A_SUPPORT) \
	$(A)/libkvpool.a
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(A_CFLAGS) -o $@ $^ $(LDLIBS)
$(A)/tests/test_cuda_mock: tests/cuda_mock.sh $(CUDA_MOCK_DEPS)
	@mkdir -p $(dir $@)
	$(Q)printf '%s\n' '#!/bin/sh' '# generated by the Makefile: tests/cuda_mock.sh as one test of tests/run.sh' \
	    'cd "$$(dirname "$$0")/../../.." &&' \
	    'exec tests/cuda_mock.sh $(A)/tests/integration/test_gpu build/cuda-mock' >$@
	$(Q)chmod +x $@
test: $(A)/tests/test_cuda_mock
test-cuda-mock: $(CUDA_MOCK_DEPS)
	$(Q)KVPOOL_BIN=$(A)/kvpool tests/cuda_mock.sh $(A)/tests/integration/test_gpu build/cuda-mock
.PHONY: test-cuda-mock

# install: the release build under $(DESTDIR)$(PREFIX). libkvpool.so is
# installed as libkvpool.so.$(VERSION) with the soname and link-time
# symlinks; kvpool.pc gives -lkvpool (and, with --static, LDLIBS).
PREFIX     ?= /usr/local
BINDIR     ?= $(PREFIX)/bin
LIBDIR     ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
PUBLIC_HEADERS := $(wildcard include/*.h)
# bash completion and systemd units (deploy/); the units' ExecStart names
# $(BINDIR)/kvpool, the installed program
COMPLETIONDIR ?= $(PREFIX)/share/bash-completion/completions
SYSTEMDUNITDIR ?= $(PREFIX)/lib/systemd/system
UNITS := $(notdir $(wildcard deploy/systemd/*.service))
$(R)/kvpool.pc: FORCE
	@mkdir -p $(dir $@)
	$(Q)printf '%s\n' 'prefix=$(PREFIX)' 'libdir=$(LIBDIR)' 'includedir=$(INCLUDEDIR)' '' \
	    'Name: kvpool' 'Description: KV-cache pool for LLM serving: client library and engine connector' \
	    'Version: $(VERSION)' 'Cflags: -I$${includedir}' 'Libs: -L$${libdir} -lkvpool' \
	    'Libs.private: $(LDLIBS)' >$@
install: all $(R)/kvpool.pc
	install -D -m 0755 $(R)/kvpool $(DESTDIR)$(BINDIR)/kvpool
	install -D -m 0755 $(R)/libkvpool.so $(DESTDIR)$(LIBDIR)/libkvpool.so.$(VERSION)
	ln -sfn libkvpool.so.$(VERSION) $(DESTDIR)$(LIBDIR)/$(SONAME)
	ln -sfn $(SONAME) $(DESTDIR)$(LIBDIR)/libkvpool.so
	install -D -m 0644 $(R)/libkvpool.a $(DESTDIR)$(LIBDIR)/libkvpool.a
	$(foreach h,$(PUBLIC_HEADERS),install -D -m 0644 $(h) $(DESTDIR)$(INCLUDEDIR)/$(notdir $(h)) &&) true
	install -D -m 0644 $(R)/kvpool.pc $(DESTDIR)$(PKGCONFIGDIR)/kvpool.pc
	install -D -m 0644 deploy/completion/kvpool.bash $(DESTDIR)$(COMPLETIONDIR)/kvpool
	$(foreach u,$(UNITS),mkdir -p $(DESTDIR)$(SYSTEMDUNITDIR) && \
	    sed 's|/usr/local/bin/kvpool|$(BINDIR)/kvpool|g' deploy/systemd/$(u) \
	    >$(DESTDIR)$(SYSTEMDUNITDIR)/$(u) && chmod 0644 $(DESTDIR)$(SYSTEMDUNITDIR)/$(u) &&) true
uninstall:
	rm -f $(DESTDIR)$(BINDIR)/kvpool $(DESTDIR)$(LIBDIR)/libkvpool.so.$(VERSION) \
	    $(DESTDIR)$(LIBDIR)/$(SONAME) $(DESTDIR)$(LIBDIR)/libkvpool.so $(DESTDIR)$(LIBDIR)/libkvpool.a \
	    $(foreach h,$(PUBLIC_HEADERS),$(DESTDIR)$(INCLUDEDIR)/$(notdir $(h))) \
	    $(DESTDIR)$(PKGCONFIGDIR)/kvpool.pc $(DESTDIR)$(COMPLETIONDIR)/kvpool \
	    $(foreach u,$(UNITS),$(DESTDIR)$(SYSTEMDUNITDIR)/$(u))
FORCE:
.PHONY: FORCE

clean:
	rm -rf build

-include $(shell find build -name '*.d' 2>/dev/null)
.SECONDARY:
