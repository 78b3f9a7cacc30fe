# residency — build, test, demo, benchmarks and fuzzing.
# Everything a fresh machine needs is fetched by `go` itself (module proxy);
# no GPU, no external server.

GO        ?= go
FUZZTIME  ?= 60s
BENCHTIME ?= 1s
PKGS      := ./...

.PHONY: all build test test-short demo bench fuzz vet fmt tidy

all: build

build:
	$(GO) build $(PKGS)

# The full suite with the race detector on every package.
test:
	$(GO) mod download
	$(GO) vet $(PKGS)
	$(GO) test -race -count=1 -timeout 12m $(PKGS)

test-short:
	$(GO) test -count=1 -short $(PKGS)

# The embedded demo on the soft (simulated) device backend: no GPU, no server.
demo:
	$(GO) run ./cmd/demo

bench:
	$(GO) test -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) ./budget/ ./system/

# Bounded native Go fuzzing of the ledger against a naive reference model.
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzLedger$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 200x ./budget/

vet:
	$(GO) vet $(PKGS)

fmt:
	gofmt -l -w .

tidy:
	$(GO) mod tidy
