# migctl — build, test and GPU-test targets. The README's two commands call these.
SHELL := /bin/bash
GO ?= go
BIN := bin
GOFLAGS_STRIP := -trimpath -ldflags='-s -w'
PKGS := ./...

.PHONY: all build shim lib test test-short lint generate gpu-test demo clean

all: build shim lib

## build: the migctl binary and the trainer SDK's example (sgd) in bin/
build:
	$(GO) build $(GOFLAGS_STRIP) -o $(BIN)/migctl ./cmd/migctl
	$(GO) build $(GOFLAGS_STRIP) -o $(BIN)/sgd ./trainer/example/sgd

## shim: libmigswap.so and the fake libcuda.so used by its tests
shim:
	$(MAKE) -C shim BIN=$(abspath $(BIN))

## lib: libmigctl.so, the C ABI of the trainer SDK (include/migctl.h), loaded by python/migctl_torch
lib:
	$(GO) build $(GOFLAGS_STRIP) -buildmode=c-shared -o $(BIN)/libmigctl.so ./cmd/libmigctl
	rm -f $(BIN)/libmigctl.h

## test: every test that runs without a GPU (what CI runs)
test: build shim lib
	$(GO) vet $(PKGS)
	MIGCTL_BIN=$(abspath $(BIN))/migctl MIGSWAP_BIN=$(abspath $(BIN)) MIGCTL_LIB=$(abspath $(BIN))/libmigctl.so \
	  $(GO) test -race -count=1 -timeout 45m $(PKGS)
	# tests the race detector cannot follow (ranks synchronised through shared memory): see trainer/ipc_test.go
	$(GO) test -count=1 -run 'IPCRingOnFakeDriver' ./trainer/

test-short:
	$(GO) test -short -count=1 $(PKGS)

## lint: formatting, vet, and the one-cgo-package rule
lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet $(PKGS)
	@n=$$($(GO) list -f '{{if .CgoFiles}}{{.ImportPath}}{{end}}' $(PKGS) | grep -c .); \
	  test $$n -le 2 || { echo "cgo in more than two packages (internal/cuda and cmd/libmigctl may use it)"; exit 1; }

## generate: PTX kernels (needs nvcc) and protobuf code (needs protoc)
generate:
	$(GO) generate $(PKGS)

## gpu-test: test binaries and tools for the GPU machine, stripped, in bin/
gpu-test: build shim lib
	@for p in $$($(GO) list -f '{{if .TestGoFiles}}{{.ImportPath}}{{end}}' $(PKGS)); do \
	  n=$$(basename $$p); $(GO) test -c $(GOFLAGS_STRIP) -o $(BIN)/$$n.test $$p || exit 1; done
	cp ../shared/bench/gloo_allreduce.py $(BIN)/ 2>/dev/null || true

## demo: the main job on this machine (simulated node + host backend without a GPU)
demo: build shim
	./scripts/demo.sh

clean:
	rm -rf $(BIN)
