// Package nccl is migctl's binding to NCCL, the library that carries the
// inter-node stage of the trainer SDK's collectives, and the only package in
// migctl that uses cgo for NCCL: cgo lives in one package per C library
// (internal/cuda for libcuda.so.1, this one for libnccl.so.2) plus the C-ABI
// export package cmd/libmigctl, and the Makefile's lint allows exactly
// those three. NCCL is not folded into internal/cuda so that a process that
// never goes across nodes neither links nor loads anything of NCCL's.
//
// The binding opens libnccl.so.2 with dlopen at run time (or the file that
// MIGCTL_NCCL_LIB names) and resolves the few entry points it uses with
// dlsym. It declares its own C prototypes: building it needs neither NCCL
// nor its headers nor CUDA, and a process that never calls Open never loads
// NCCL. Open fails with ErrLibraryNotFound, and a message that says how to
// make the library loadable, where NCCL is not installed.
//
// Interface is the set of NCCL calls migctl uses, named after the NCCL
// functions without the "nccl" prefix. Open returns the implementation
// backed by the real library; NewFake returns one written in Go for tests:
// the communicators of a unique id meet over loopback TCP (GetUniqueID opens
// the listener, as NCCL's bootstrap does), collectives have NCCL's semantics
// (in-place variants included), a peer that goes away is an error on every
// other rank, and buffers are addresses in a Memory (host memory registered
// with a HostMemory, or a fake driver's device memory).
//
// Buffers are device addresses (uintptr) and streams CUstream handles; a
// collective is queued on the stream and returns at once (the fake runs it
// before it returns). The caller makes the device's context current on the
// calling OS thread (runtime.LockOSThread) before CommInitRank and every
// collective, as NCCL asks.
//
// Status codes become error values of type Result at the boundary, with
// sentinels (ErrSystem, ErrInvalidArgument, ErrRemote, ...) usable with
// errors.Is; ncclSuccess is never returned as an error. The methods are
// safe for concurrent use, except that one communicator must not be used by
// two goroutines at once (NCCL's rule).
package nccl
