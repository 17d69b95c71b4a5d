// Package shimtest tests libmigswap.so, the LD_PRELOAD memory-swap shim in
// shim/, without a GPU.
//
// The tests build the shim, the fake host-memory libcuda.so.1 and the C test
// program with `make -C shim` into a temporary directory (or use
// $MIGSWAP_BIN when it is set, as `make test` does), then run the C program
// under LD_PRELOAD with a fake daemon written in Go that speaks
// shim/PROTOCOL.md over a Unix socket. They skip only when gcc is missing and
// $MIGSWAP_BIN is unset. The package has no non-test code.
package shimtest
