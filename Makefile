# migctl — build, test and GPU-test targets. The README's two commands call these.
SHELL := /bin/bash
GO ?= go
BIN := bin
# The go command runs cgo through scripts/cc-go.sh: the C compiler ($CC if
# given, else gcc) with go-nvml's deprecation warnings silenced for that
# package only (pages of them on a fresh build); our own cgo keeps its warnings.
REAL_CC := $(if $(filter environment% command%,$(origin CC)),$(CC),gcc)
GOC = CC=$(abspath scripts/cc-go.sh) MIGCTL_REAL_CC='$(REAL_CC)' $(GO)
# The packages allowed to use cgo (DESIGN.md): the CUDA and NCCL bindings and the C-ABI
# export package of libmigctl.so (go-nvml, a dependency, aside).
CGO_ALLOWED := github.com/migctl/migctl/internal/cuda github.com/migctl/migctl/internal/nccl github.com/migctl/migctl/cmd/libmigctl
GOFLAGS_STRIP := -trimpath -ldflags='-s -w'
PKGS := ./...

.PHONY: all build shim lib test test-short lint generate gpu-test demo clean

all: build shim lib

## build: the migctl binary and the trainer SDK's example (sgd) in bin/
build:
	$(GOC) build $(GOFLAGS_STRIP) -o $(BIN)/migctl ./cmd/migctl
	$(GOC) build $(GOFLAGS_STRIP) -o $(BIN)/sgd ./trainer/example/sgd

## shim: libmigswap.so and the fake libcuda.so used by its tests
shim:
	$(MAKE) -C shim BIN=$(abspath $(BIN))

## lib: libmigctl.so, the C ABI of the trainer SDK (include/migctl.h), loaded by python/migctl_torch
lib:
	$(GOC) build $(GOFLAGS_STRIP) -buildmode=c-shared -o $(BIN)/libmigctl.so ./cmd/libmigctl
	rm -f $(BIN)/libmigctl.h

## test: lint, then every test that runs without a GPU (what CI runs)
test: lint build shim lib
	MIGCTL_BIN=$(abspath $(BIN))/migctl MIGSWAP_BIN=$(abspath $(BIN)) MIGCTL_LIB=$(abspath $(BIN))/libmigctl.so \
	  $(GOC) test -race -count=1 -timeout 45m $(PKGS)
	# tests the race detector cannot follow (ranks synchronised through shared memory): see trainer/ipc_test.go;
	# failures whose released kernels read what a peer writes: allreduce/device_lane_norace_test.go;
	# synchronous and asynchronous calls mixed in place: trainer/inline_norace_test.go, chain_norace_test.go
	$(GOC) test -count=1 -run 'IPCRingOnFakeDriver|AcrossNodesMatchesOneNodeLarge|RunChecksInPlace|SyncAndAsyncMixedKeepOrder|AsyncAllReducesChainInPlace|SmallOnDeviceCloseAfterFailure|SmallOnDeviceReleaseOverwritten|MismatchedCallsSmallOnDevice|MismatchedBroadcastsOnDevice' ./trainer/ ./internal/benchrank/ ./allreduce/

test-short:
	$(GOC) test -short -count=1 $(PKGS)

## lint: formatting, vet, and the cgo rule (only the packages in CGO_ALLOWED use cgo)
lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt -w these files:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GOC) vet $(PKGS)
	@bad=$$($(GOC) list -f '{{if .CgoFiles}}{{.ImportPath}}{{end}}' $(PKGS) | grep -vxF $(addprefix -e ,$(CGO_ALLOWED))); \
	  test -z "$$bad" || { echo "cgo outside $(CGO_ALLOWED): $$bad (see DESIGN.md)"; exit 1; }

## generate: PTX kernels (needs nvcc) and protobuf code (needs protoc)
generate:
	$(GOC) generate $(PKGS)

## gpu-test: test binaries and tools for the GPU machine, stripped, in bin/
gpu-test: build shim lib
	@for p in $$($(GOC) list -f '{{if .TestGoFiles}}{{.ImportPath}}{{end}}' $(PKGS)); do \
	  n=$$(basename $$p); $(GOC) test -c $(GOFLAGS_STRIP) -o $(BIN)/$$n.test $$p || exit 1; done
	cp ../shared/bench/gloo_allreduce.py $(BIN)/ 2>/dev/null || true

## demo: the main job on this machine (simulated node + host backend without a GPU)
demo: build shim
	./scripts/demo.sh

clean:
	rm -rf $(BIN)
