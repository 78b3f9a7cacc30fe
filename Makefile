# residency — build, test, demo, benchmarks, fuzzing and soak runs.
# Go modules come through the module proxy; `make test` also installs two
# Debian packages with apt when it runs as root (chromium for the browser
# test of `demo serve`, etcd-server for the multi-process cluster tests;
# see their targets below). No GPU, no external server.

GO        ?= go
FUZZTIME  ?= 60s
BENCHTIME ?= 1s
PKGS      := ./...

.PHONY: all build test test-short demo bench fuzz soak vet lint fmt tidy proto cuda-sdk cuda-check gpu-check chromium etcd

all: build

build:
	$(GO) build $(PKGS)

# The full suite with the race detector on every package but the
# multi-node cluster tests, which run without it in a second line:
# protoactor's cluster code itself reports data races (docs/cluster.md).
CLUSTER_PKGS := ./tests/cluster/ ./tests/clusterproc/

test: chromium etcd
	$(GO) mod download
	$(GO) vet $(PKGS)
	$(MAKE) --no-print-directory lint
	$(GO) test -race -count=1 -timeout 12m $$($(GO) list $(PKGS) | grep -v -e '/tests/cluster$$' -e '/tests/clusterproc$$')
	$(GO) test -count=1 -timeout 3m $(CLUSTER_PKGS)

# Debian's chromium, for the browser tests of `demo serve` and system/liveview
# (cmd/demo/serve_browser_test.go), installed with apt when absent: silent
# when it is there. Without root it cannot install: outside CI the test then
# skips; with CI=true this target fails (and so would the test).
chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	if [ "$$(id -u)" = 0 ]; then \
		echo "make: installing Debian's chromium for the browser test of demo serve"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	elif [ "$$CI" = true ]; then \
		echo "make: chromium is missing and only root can install it (apt-get install -y chromium)" >&2; exit 1; \
	else \
		echo "make: chromium is missing (not root, not installed): the browser test of demo serve will skip"; \
	fi

# Debian's etcd-server (/usr/bin/etcd, 3.4.x), for the multi-process
# cluster tests (tests/clusterproc) and `demo cluster-demo`, installed with
# apt when absent: silent when it is there. Without root it cannot install:
# outside CI the etcd tests then skip (the automanaged ones still run); with
# CI=true this target fails.
etcd:
	@command -v etcd >/dev/null 2>&1 || [ -x /usr/bin/etcd ] || \
	if [ "$$(id -u)" = 0 ]; then \
		echo "make: installing Debian's etcd-server for the multi-process cluster tests"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends etcd-server >/dev/null; \
	elif [ "$$CI" = true ]; then \
		echo "make: etcd is missing and only root can install it (apt-get install -y etcd-server)" >&2; exit 1; \
	else \
		echo "make: etcd is missing (not root, not installed): the etcd cluster tests will skip"; \
	fi

test-short:
	$(GO) test -count=1 -short $(PKGS)

# The embedded demo on the soft (simulated) device backend: no GPU, no server.
demo:
	$(GO) run ./cmd/demo

bench:
	$(GO) test -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) ./budget/ ./system/

# Native Go fuzzing of every parser of outside input, and of the ledger
# against a naive reference model: each target for FUZZTIME, one after
# another (go test fuzzes one target per run). PKG:NAME pairs.
FUZZ_TARGETS := \
	budget:FuzzLedger \
	system/replay:FuzzReplayScript \
	internal/jsonline:FuzzByteSize \
	internal/nodeproc:FuzzNodeCommand \
	internal/offload:FuzzOffloadTrace \
	system/replay:FuzzStagingScript \
	system/diagnose:FuzzEvidence \
	internal/kvtrace:FuzzReadTrace \
	internal/nodeproc:FuzzDurationFields \
	staging:FuzzAppendStage

fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=./$${t%%:*}/; name=$${t##*:}; \
		echo "make fuzz: $$name in $$pkg for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 200x $$pkg; \
	done

# The randomized model-based checkers for SOAKTIME each instead of their
# bounded run in `make test`, all at once, race detector on (PKG:TEST
# pairs; each reads RESIDENCY_SOAK, a Go duration). A checker with
# subtests runs each subtest for SOAKTIME. Output goes to SOAK_DIR, one log
# per checker; the target fails if any checker failed.
SOAKTIME     ?= 60m
SOAK_TIMEOUT ?= 3h
SOAK_DIR     ?= soak-logs
SOAK_TESTS := \
	staging:TestPipelineModelChecker \
	tests:TestCacheChecker \
	tests:TestCacheSpillChecker \
	system/replay:TestNamesChecker \
	system:TestWaitingAdmissionChecker \
	tests:TestSyscheck \
	tests:TestCloseChecker

soak:
	@mkdir -p $(SOAK_DIR); pids=""; \
	for t in $(SOAK_TESTS); do \
		pkg=./$${t%%:*}/; name=$${t##*:}; \
		echo "make soak: $$name in $$pkg for $(SOAKTIME) (log: $(SOAK_DIR)/$$name.log)"; \
		RESIDENCY_SOAK=$(SOAKTIME) $(GO) test -race -count=1 -v -run "^$$name\$$" -timeout $(SOAK_TIMEOUT) $$pkg > $(SOAK_DIR)/$$name.log 2>&1 & pids="$$pids $$!"; \
	done; \
	fail=0; for p in $$pids; do wait $$p || fail=1; done; \
	for t in $(SOAK_TESTS); do name=$${t##*:}; tail -n 3 $(SOAK_DIR)/$$name.log; done; \
	exit $$fail

vet:
	$(GO) vet $(PKGS)

# staticcheck (honnef.co/go/tools) at a pinned version, installed with `go
# install` into LINT_BIN (outside the repository) on first use; `make
# test` runs it and fails on any finding. A deliberate exception is a
# `//lint:ignore CHECK reason` comment on the line above it.
STATICCHECK_VERSION ?= v0.8.2
LINT_BIN ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/residency-lint/$(STATICCHECK_VERSION)

lint:
	@[ -x "$(LINT_BIN)/staticcheck" ] || GOBIN="$(LINT_BIN)" $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	"$(LINT_BIN)/staticcheck" $(PKGS)

fmt:
	gofmt -l -w .

tidy:
	$(GO) mod tidy

# Regenerate the protobuf code of the messages that cross cluster nodes
# (messages/clusterpb/cluster.proto → messages/clusterpb/cluster.pb.go,
# committed) and its stamp (messages/clusterpb/cluster_proto_stamp.go, which
# a test checks without protoc).
# protoc comes from Debian's protobuf-compiler, installed with apt when
# absent (root only); protoc-gen-go is installed with `go install` into
# PROTO_BIN at the version of google.golang.org/protobuf in go.mod. CI does
# not run this target: the generated code is committed.
PROTO_BIN ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/residency-proto/bin
PROTOBUF_VERSION = $(shell $(GO) list -m -f '{{.Version}}' google.golang.org/protobuf)

proto:
	@command -v protoc >/dev/null 2>&1 || \
	if [ "$$(id -u)" = 0 ]; then \
		echo "make: installing Debian's protobuf-compiler"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq protobuf-compiler >/dev/null; \
	else \
		echo "make: protoc is missing and only root can install it (apt-get install -y protobuf-compiler)" >&2; exit 1; \
	fi
	GOBIN="$(PROTO_BIN)" $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOBUF_VERSION)
	PATH="$(PROTO_BIN):$$PATH" protoc -I . --go_out=. --go_opt=module=github.com/residency-go/residency messages/clusterpb/cluster.proto
	messages/clusterpb/stamp.sh

# The CUDA backend (build tag `cuda`, package cuda/cu) without a GPU: cuda.h
# and the driver's link-time stub come from Debian's nvidia-cuda-dev (CUDA
# 11.8 on Debian 12), fetched with a private apt configuration and cached in
# CUDA_SDK, outside the repository (NVIDIA's license forbids committing
# them). The first run downloads and extracts (about a minute); later runs
# reuse the cache. Then: vet everything with the tag, build the backend's
# test binary and the GPU benchmark, and run what can run without a GPU:
# the driver probe against the stub, the GPU-gated test (which skips), and
# the backend's own tests against a fake driver of ours (not a GPU: it
# checks the backend's contexts, ordering and memory lifetimes).
CUDA_SDK      ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/residency-cuda
CUDA_ENV       = CGO_CFLAGS="-I$(CUDA_SDK)/include -Wno-deprecated-declarations" CGO_LDFLAGS="-L$(CUDA_SDK)/stubs"
GPU_CHECK_DIR ?= bin/gpu-check

cuda-sdk:
	@cuda/cu/fetch-sdk.sh "$(CUDA_SDK)"

cuda-check: cuda-sdk
	$(CUDA_ENV) $(GO) vet -tags cuda $(PKGS)
	$(CUDA_ENV) $(GO) vet -tags cuda,gpu ./cuda/cu/
	$(CUDA_ENV) $(GO) test -tags cuda,gpu -race -c -o "$(CUDA_SDK)/check/cu.test" ./cuda/cu/
	$(CUDA_ENV) $(GO) build -tags cuda -o "$(CUDA_SDK)/check/gpubench" ./cmd/gpubench
	$(CUDA_ENV) RESIDENCY_CUDA_STUB="$(CUDA_SDK)/stubs/libcuda.so" $(GO) test -tags cuda -count=1 ./cuda/driverprobe/ ./cuda/conformance/
	@cuda/cu/fakedriver/build.sh "$(CUDA_SDK)" "$(CUDA_SDK)/fakedriver"
	@echo "cuda-check: the cu backend's tests against the fake driver (cuda/cu/fakedriver: host memory and threads, not a GPU)"
	cd cuda/cu && LD_LIBRARY_PATH="$(CUDA_SDK)/fakedriver" "$(CUDA_SDK)/check/cu.test" -test.count=1

# Binaries for a GPU machine without a Go toolchain, in GPU_CHECK_DIR: the cu
# backend's test binary (race detector on), the GPU-gated test that runs it,
# the benchmark and a run script. Copy the folder there and run ./run.
gpu-check: cuda-sdk
	mkdir -p $(GPU_CHECK_DIR)
	$(CUDA_ENV) $(GO) test -tags cuda,gpu -race -c -o $(GPU_CHECK_DIR)/cu.test ./cuda/cu/
	$(CUDA_ENV) $(GO) test -tags cuda -c -o $(GPU_CHECK_DIR)/gate.test ./cuda/conformance/
	$(CUDA_ENV) $(GO) build -tags cuda -o $(GPU_CHECK_DIR)/gpubench ./cmd/gpubench
	cp cuda/cu/gpu-check.sh $(GPU_CHECK_DIR)/run
	@echo "gpu-check: $(GPU_CHECK_DIR) is ready: copy it to a machine with an NVIDIA GPU and run ./run there"
