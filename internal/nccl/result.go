package nccl

import (
	"errors"
	"fmt"
)

// Result is an ncclResult_t status code. It implements error; ncclSuccess
// (0) is never returned as an error.
type Result int

// Sentinel results. Compare with errors.Is(err, nccl.ErrRemote).
const (
	// ErrUnhandledCUDA: a CUDA call inside NCCL failed.
	ErrUnhandledCUDA Result = 1
	// ErrSystem: a system call failed (sockets, shared memory, memory).
	ErrSystem Result = 2
	// ErrInternal: an internal check of NCCL failed.
	ErrInternal Result = 3
	// ErrInvalidArgument: a bad argument (a null or misaligned pointer, a
	// rank out of range, a bad unique id).
	ErrInvalidArgument Result = 4
	// ErrInvalidUsage: a call in the wrong order or state.
	ErrInvalidUsage Result = 5
	// ErrRemote: a peer failed or went away (network error, peer crash).
	ErrRemote Result = 6
	// ErrInProgress: a non-blocking operation has not finished.
	ErrInProgress Result = 7
	// ErrFunctionMissing is migctl's own code (never NCCL's): the loaded
	// library does not export an entry point this binding needs.
	ErrFunctionMissing Result = -1
)

// ErrLibraryNotFound is returned by Open when libnccl.so.2 cannot be loaded
// (NCCL not installed or not on the library path, or a build without cgo).
var ErrLibraryNotFound = errors.New("libnccl.so.2 not found")

var resultNames = map[Result]struct{ name, text string }{
	0:                  {"ncclSuccess", "no error"},
	ErrUnhandledCUDA:   {"ncclUnhandledCudaError", "unhandled cuda error"},
	ErrSystem:          {"ncclSystemError", "unhandled system error"},
	ErrInternal:        {"ncclInternalError", "internal error"},
	ErrInvalidArgument: {"ncclInvalidArgument", "invalid argument"},
	ErrInvalidUsage:    {"ncclInvalidUsage", "invalid usage"},
	ErrRemote:          {"ncclRemoteError", "remote process exited or there was a network error"},
	ErrInProgress:      {"ncclInProgress", "NCCL operation in progress"},
	ErrFunctionMissing: {"MIGCTL_NCCL_FUNCTION_MISSING", "entry point missing from the loaded libnccl"},
}

// Name is the ncclResult_t constant's name ("ncclRemoteError").
func (r Result) Name() string {
	if n, ok := resultNames[r]; ok {
		return n.name
	}
	return fmt.Sprintf("ncclResult(%d)", int(r))
}

func (r Result) Error() string {
	if n, ok := resultNames[r]; ok {
		return fmt.Sprintf("nccl: %s (%s)", n.text, n.name)
	}
	return fmt.Sprintf("nccl: unknown error %d", int(r))
}

// resultError turns a status code into an error: nil for ncclSuccess.
func resultError(code int) error {
	if code == 0 {
		return nil
	}
	return Result(code)
}

// detailed wraps a failed call's Result with what NCCL said about it (its
// last-error string), so that errors.Is still finds the sentinel.
func detailed(call string, err error, last string) error {
	if err == nil {
		return nil
	}
	if last != "" {
		return fmt.Errorf("%s: %w: %s", call, err, last)
	}
	return fmt.Errorf("%s: %w", call, err)
}

// notFound is Open's error when the library does not load: what failed,
// and what to do about it.
func notFound(path, why string) error {
	return fmt.Errorf("%w: loading %s: %s; set LD_LIBRARY_PATH to the directory holding libnccl.so.2 "+
		"(PyTorch ships one in <site-packages>/nvidia/nccl/lib) or %s to its path, or install NCCL",
		ErrLibraryNotFound, path, why, EnvLibrary)
}
