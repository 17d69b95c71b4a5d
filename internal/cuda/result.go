package cuda

import (
	"errors"
	"fmt"
)

// Result is a CUresult status code returned by the driver. It implements
// error; CUDA_SUCCESS (0) is never returned as an error.
type Result int

// Sentinel results. Compare with errors.Is(err, cuda.ErrNotReady).
const (
	// ErrInvalidValue: an argument is out of range.
	ErrInvalidValue Result = 1
	// ErrOutOfMemory: an allocation or registration could not be satisfied.
	ErrOutOfMemory Result = 2
	// ErrNotInitialized: Init has not been called (or failed).
	ErrNotInitialized Result = 3
	// ErrDeinitialized: the driver is shutting down.
	ErrDeinitialized Result = 4
	// ErrStubLibrary: the loaded libcuda is the toolkit's stub, not a driver.
	ErrStubLibrary Result = 34
	// ErrNoDevice: no CUDA device is visible to this process.
	ErrNoDevice Result = 100
	// ErrInvalidDevice: the ordinal does not name a visible device.
	ErrInvalidDevice Result = 101
	// ErrInvalidImage: a module image is not valid.
	ErrInvalidImage Result = 200
	// ErrInvalidContext: no (or a destroyed) context is current on this thread.
	ErrInvalidContext Result = 201
	// ErrNoBinaryForGPU: a module has no code for this GPU.
	ErrNoBinaryForGPU Result = 209
	// ErrPeerAccessUnsupported: P2P between the two devices is not possible.
	ErrPeerAccessUnsupported Result = 217
	// ErrInvalidPTX: PTX JIT compilation failed.
	ErrInvalidPTX Result = 218
	// ErrUnsupportedPTXVersion: the PTX is newer than the driver.
	ErrUnsupportedPTXVersion Result = 222
	// ErrInvalidHandle: a stream, event, module or function handle is invalid.
	ErrInvalidHandle Result = 400
	// ErrNotFound: a named symbol (kernel) does not exist.
	ErrNotFound Result = 500
	// ErrNotReady: asynchronous work has not completed yet (queries only).
	ErrNotReady Result = 600
	// ErrIllegalAddress: a kernel or copy touched an invalid address; sticky.
	ErrIllegalAddress Result = 700
	// ErrLaunchOutOfResources: a launch asked for too many resources.
	ErrLaunchOutOfResources Result = 701
	// ErrPeerAccessAlreadyEnabled: cuCtxEnablePeerAccess was already called.
	ErrPeerAccessAlreadyEnabled Result = 704
	// ErrHostMemoryAlreadyRegistered: the range is already registered.
	ErrHostMemoryAlreadyRegistered Result = 712
	// ErrHostMemoryNotRegistered: the pointer was not registered.
	ErrHostMemoryNotRegistered Result = 713
	// ErrLaunchFailed: a kernel failed while running; sticky.
	ErrLaunchFailed Result = 719
	// ErrNotPermitted: the operation is not permitted.
	ErrNotPermitted Result = 800
	// ErrNotSupported: the operation is not supported on this system or device.
	ErrNotSupported Result = 801
	// ErrStreamCaptureUnsupported: the call is not allowed while a stream
	// is being captured into a CUDA graph (it invalidates the capture).
	ErrStreamCaptureUnsupported Result = 900
	// ErrStreamCaptureInvalidated: the capture was invalidated by an
	// earlier error.
	ErrStreamCaptureInvalidated Result = 901
	// ErrUnknown: the driver reported an unknown internal error.
	ErrUnknown Result = 999
	// ErrFunctionMissing is migctl's own code (never the driver's): the loaded
	// libcuda does not export an entry point this binding needs.
	ErrFunctionMissing Result = -1
)

// ErrLibraryNotFound is returned by Open when libcuda.so.1 cannot be loaded
// (no NVIDIA driver on this machine, or a build without cgo).
var ErrLibraryNotFound = errors.New("cuda: libcuda.so.1 not loadable")

var resultNames = map[Result]struct{ name, text string }{
	0:                              {"CUDA_SUCCESS", "no error"},
	ErrInvalidValue:                {"CUDA_ERROR_INVALID_VALUE", "invalid argument"},
	ErrOutOfMemory:                 {"CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
	ErrNotInitialized:              {"CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
	ErrDeinitialized:               {"CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
	ErrStubLibrary:                 {"CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library"},
	46:                             {"CUDA_ERROR_DEVICE_UNAVAILABLE", "CUDA-capable device(s) is/are busy or unavailable"},
	ErrNoDevice:                    {"CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
	ErrInvalidDevice:               {"CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
	ErrInvalidImage:                {"CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
	ErrInvalidContext:              {"CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
	205:                            {"CUDA_ERROR_MAP_FAILED", "mapping of buffer object failed"},
	208:                            {"CUDA_ERROR_ALREADY_MAPPED", "resource already mapped"},
	ErrNoBinaryForGPU:              {"CUDA_ERROR_NO_BINARY_FOR_GPU", "no kernel image is available for execution on the device"},
	216:                            {"CUDA_ERROR_CONTEXT_ALREADY_IN_USE", "context already in use"},
	ErrPeerAccessUnsupported:       {"CUDA_ERROR_PEER_ACCESS_UNSUPPORTED", "peer access is not supported between these two devices"},
	ErrInvalidPTX:                  {"CUDA_ERROR_INVALID_PTX", "a PTX JIT compilation failed"},
	221:                            {"CUDA_ERROR_JIT_COMPILER_NOT_FOUND", "PTX JIT compiler library not found"},
	ErrUnsupportedPTXVersion:       {"CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "the provided PTX was compiled with an unsupported toolchain"},
	301:                            {"CUDA_ERROR_FILE_NOT_FOUND", "file not found"},
	303:                            {"CUDA_ERROR_SHARED_OBJECT_INIT_FAILED", "shared object initialization failed"},
	304:                            {"CUDA_ERROR_OPERATING_SYSTEM", "OS call failed or operation not supported on this OS"},
	ErrInvalidHandle:               {"CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
	401:                            {"CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state"},
	ErrNotFound:                    {"CUDA_ERROR_NOT_FOUND", "named symbol not found"},
	ErrNotReady:                    {"CUDA_ERROR_NOT_READY", "device not ready"},
	ErrIllegalAddress:              {"CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
	ErrLaunchOutOfResources:        {"CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many resources requested for launch"},
	702:                            {"CUDA_ERROR_LAUNCH_TIMEOUT", "the launch timed out and was terminated"},
	ErrPeerAccessAlreadyEnabled:    {"CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED", "peer access is already enabled"},
	705:                            {"CUDA_ERROR_PEER_ACCESS_NOT_ENABLED", "peer access has not been enabled"},
	708:                            {"CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE", "cannot set while device is active in this process"},
	709:                            {"CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"},
	710:                            {"CUDA_ERROR_ASSERT", "device-side assert triggered"},
	ErrHostMemoryAlreadyRegistered: {"CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", "part or all of the requested memory range is already mapped"},
	ErrHostMemoryNotRegistered:     {"CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED", "pointer does not correspond to a registered memory region"},
	714:                            {"CUDA_ERROR_HARDWARE_STACK_ERROR", "hardware stack error"},
	715:                            {"CUDA_ERROR_ILLEGAL_INSTRUCTION", "an illegal instruction was encountered"},
	716:                            {"CUDA_ERROR_MISALIGNED_ADDRESS", "misaligned address"},
	ErrLaunchFailed:                {"CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
	ErrNotPermitted:                {"CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
	ErrNotSupported:                {"CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
	802:                            {"CUDA_ERROR_SYSTEM_NOT_READY", "system not yet initialized"},
	803:                            {"CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", "system has unsupported display driver / cuda driver combination"},
	ErrStreamCaptureUnsupported:    {"CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "operation not permitted when stream is capturing"},
	ErrStreamCaptureInvalidated:    {"CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", "operation failed due to a previous error during capture"},
	902:                            {"CUDA_ERROR_STREAM_CAPTURE_MERGE", "operation would result in a merge of separate capture sequences"},
	903:                            {"CUDA_ERROR_STREAM_CAPTURE_UNMATCHED", "capture was not ended in the same stream as it began"},
	904:                            {"CUDA_ERROR_STREAM_CAPTURE_UNJOINED", "capturing stream has unjoined work"},
	905:                            {"CUDA_ERROR_STREAM_CAPTURE_ISOLATION", "dependency created on uncaptured work in another stream"},
	906:                            {"CUDA_ERROR_STREAM_CAPTURE_IMPLICIT", "operation would make the legacy stream depend on a capturing blocking stream"},
	907:                            {"CUDA_ERROR_CAPTURED_EVENT", "operation not permitted on an event last recorded in a capturing stream"},
	908:                            {"CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD", "attempt to terminate a thread-local capture sequence from another thread"},
	ErrUnknown:                     {"CUDA_ERROR_UNKNOWN", "unknown error"},
	ErrFunctionMissing:             {"MIGCTL_CUDA_FUNCTION_MISSING", "libcuda does not export a driver function migctl needs"},
}

// Name is the driver's symbolic name for r, e.g. "CUDA_ERROR_NOT_READY".
func (r Result) Name() string {
	if n, ok := resultNames[r]; ok {
		return n.name
	}
	return fmt.Sprintf("CUDA_ERROR_%d", int(r))
}

// Error implements error: "cuda: CUDA_ERROR_NOT_READY (600): device not ready".
func (r Result) Error() string {
	if n, ok := resultNames[r]; ok {
		return fmt.Sprintf("cuda: %s (%d): %s", n.name, int(r), n.text)
	}
	return fmt.Sprintf("cuda: unrecognised CUresult %d", int(r))
}

// boxed holds the known results already converted to error, so that
// returning one (ErrNotReady from every poll) does not allocate.
var boxed = func() map[Result]error {
	m := make(map[Result]error, len(resultNames))
	for r := range resultNames {
		m[r] = r
	}
	return m
}()

// resultError turns a CUresult into an error: nil for CUDA_SUCCESS.
func resultError(code int) error {
	if code == 0 {
		return nil
	}
	if e, ok := boxed[Result(code)]; ok {
		return e
	}
	return Result(code)
}

// IsStreamCapture reports whether err is one of the driver's results about
// stream capture (CUDA_ERROR_STREAM_CAPTURE_* and CUDA_ERROR_CAPTURED_EVENT,
// 900-908): work was asked of a stream that is being captured into a CUDA
// graph, where the call is not allowed.
func IsStreamCapture(err error) bool {
	var r Result
	return errors.As(err, &r) && r >= 900 && r <= 908
}
