// Package cuda is migctl's binding to the CUDA driver API, and the only
// package in migctl that uses cgo for CUDA.
//
// The binding opens libcuda.so.1 with dlopen at run time and resolves every
// entry point by its versioned ABI name (cuMemAlloc_v2, cuMemHostRegister_v2,
// ...) with dlsym. It declares its own C prototypes: building it needs neither
// the CUDA toolkit nor its headers nor a GPU, and a process that never calls
// Open never touches the driver.
//
// Interface is the set of driver calls migctl uses, named after the driver
// functions without the "cu" prefix. Open returns the implementation backed
// by the real driver; NewFake returns a faithful host-memory implementation
// for tests (streams run asynchronously, events order work, contexts must be
// current on the calling OS thread, kernels are Go functions registered by
// name).
//
// Status codes become error values of type Result at the boundary; the common
// ones have documented sentinels (ErrNotReady, ErrInvalidValue, ...) usable
// with errors.Is. CUDA_SUCCESS is never returned as an error.
//
// Contexts are per OS thread. Callers that drive a context pin their goroutine
// with runtime.LockOSThread and make the context current (CtxSetCurrent) on
// that thread before any call that needs one; the implementations do not do
// this for them. All methods are safe for concurrent use by goroutines that
// each follow that rule.
package cuda
