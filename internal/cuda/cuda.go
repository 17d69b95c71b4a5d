package cuda

import (
	"encoding/binary"
	"fmt"
	"math"
	"unsafe"
)

// Opaque driver handles. They are plain integers so that they can be stored
// anywhere (also in memory shared with C) without the Go garbage collector
// caring; zero is never a valid handle except the default Stream.
type (
	// Device is a CUdevice: an ordinal among the devices visible to the process.
	Device int32
	// Context is a CUcontext.
	Context uintptr
	// Stream is a CUstream; 0 is the legacy default stream.
	Stream uintptr
	// Event is a CUevent.
	Event uintptr
	// Module is a CUmodule.
	Module uintptr
	// Function is a CUfunction (a kernel in a Module).
	Function uintptr
	// DevicePtr is a CUdeviceptr: an address in the device's (unified) address space.
	DevicePtr uint64
)

// IPCMemHandle is a CUipcMemHandle: an opaque token another process opens
// with IPCOpenMemHandle.
type IPCMemHandle [64]byte

// IPCEventHandle is a CUipcEventHandle: an opaque token another process opens
// with IPCOpenEventHandle.
type IPCEventHandle [64]byte

// UUID is a CUuuid: 16 bytes identifying a GPU or a MIG compute instance.
type UUID [16]byte

// String formats u the way nvidia-smi does, with the given prefix ("GPU" or
// "MIG"): "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx".
func (u UUID) String(prefix string) string {
	return fmt.Sprintf("%s-%x-%x-%x-%x-%x", prefix, u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

// Dim3 is a grid or block shape.
type Dim3 struct{ X, Y, Z uint32 }

// DeviceAttribute is a CUdevice_attribute.
type DeviceAttribute int32

// Device attributes migctl reads.
const (
	AttrMaxThreadsPerBlock             DeviceAttribute = 1
	AttrMultiprocessorCount            DeviceAttribute = 16
	AttrPCIBusID                       DeviceAttribute = 33
	AttrPCIDeviceID                    DeviceAttribute = 34
	AttrUnifiedAddressing              DeviceAttribute = 41
	AttrPCIDomainID                    DeviceAttribute = 50
	AttrComputeCapabilityMajor         DeviceAttribute = 75
	AttrComputeCapabilityMinor         DeviceAttribute = 76
	AttrCanUseHostPointerForRegistered DeviceAttribute = 91
)

// Flags for MemHostRegister (CU_MEMHOSTREGISTER_*).
const (
	HostRegisterPortable  uint32 = 0x01
	HostRegisterDeviceMap uint32 = 0x02
	HostRegisterIOMemory  uint32 = 0x04
	HostRegisterReadOnly  uint32 = 0x08
)

// Flags for StreamCreate (CU_STREAM_*).
const (
	StreamDefault     uint32 = 0x0
	StreamNonBlocking uint32 = 0x1
)

// Flags for StreamWaitValue64 (CU_STREAM_WAIT_VALUE_*) and StreamWriteValue64
// (CU_STREAM_WRITE_VALUE_*).
const (
	StreamWaitValueGEQ      uint32 = 0x0
	StreamWaitValueEQ       uint32 = 0x1
	StreamWriteValueDefault uint32 = 0x0
)

// Flags for EventCreate (CU_EVENT_*).
const (
	EventDefault       uint32 = 0x0
	EventBlockingSync  uint32 = 0x1
	EventDisableTiming uint32 = 0x2
	EventInterprocess  uint32 = 0x4
)

// IPCMemLazyEnablePeerAccess is CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS.
const IPCMemLazyEnablePeerAccess uint32 = 0x1

// Interface is the part of the CUDA driver API migctl uses. Method names are
// the driver's without the "cu" prefix; sizes are in bytes. Every method
// except Init, DriverGetVersion and the Device* queries needs a context
// current on the calling OS thread (see the package documentation).
//
// Host pointers passed to asynchronous copies must stay valid (and, for true
// asynchrony, registered) until the copy has completed on its stream.
type Interface interface {
	// Init initialises the driver; flags must be 0.
	Init(flags uint32) error
	// DriverGetVersion is the CUDA version the driver supports, e.g. 13000.
	DriverGetVersion() (int, error)

	DeviceGetCount() (int, error)
	DeviceGet(ordinal int) (Device, error)
	DeviceGetName(d Device) (string, error)
	// DeviceGetUUID is cuDeviceGetUuid_v2: for a MIG device, the UUID of the
	// MIG compute instance.
	DeviceGetUUID(d Device) (UUID, error)
	// DeviceGetUUIDv1 is cuDeviceGetUuid: on drivers where it differs from
	// DeviceGetUUID for a MIG device, the parent GPU's UUID.
	DeviceGetUUIDv1(d Device) (UUID, error)
	// DeviceGetPCIBusID is "dddd:bb:dd.f" of the (parent) GPU.
	DeviceGetPCIBusID(d Device) (string, error)
	DeviceGetAttribute(attr DeviceAttribute, d Device) (int, error)
	DeviceTotalMem(d Device) (uint64, error)
	DeviceCanAccessPeer(d, peer Device) (bool, error)

	DevicePrimaryCtxRetain(d Device) (Context, error)
	DevicePrimaryCtxRelease(d Device) error
	// CtxSetCurrent binds c to the calling OS thread.
	CtxSetCurrent(c Context) error
	CtxGetCurrent() (Context, error)
	CtxSynchronize() error

	MemAlloc(n uint64) (DevicePtr, error)
	MemFree(p DevicePtr) error
	MemGetInfo() (free, total uint64, err error)
	MemsetD8(p DevicePtr, v uint8, n uint64) error
	MemsetD8Async(p DevicePtr, v uint8, n uint64, s Stream) error
	// MemHostRegister page-locks [p, p+n) (cuMemHostRegister_v2).
	MemHostRegister(p unsafe.Pointer, n uint64, flags uint32) error
	MemHostUnregister(p unsafe.Pointer) error
	// MemHostGetDevicePointer is the device address of registered (mapped) host memory; flags must be 0.
	MemHostGetDevicePointer(p unsafe.Pointer, flags uint32) (DevicePtr, error)
	MemcpyHtoD(dst DevicePtr, src unsafe.Pointer, n uint64) error
	MemcpyDtoH(dst unsafe.Pointer, src DevicePtr, n uint64) error
	MemcpyHtoDAsync(dst DevicePtr, src unsafe.Pointer, n uint64, s Stream) error
	MemcpyDtoHAsync(dst unsafe.Pointer, src DevicePtr, n uint64, s Stream) error
	MemcpyDtoDAsync(dst, src DevicePtr, n uint64, s Stream) error
	// Memcpy2DHtoDAsync queues a 2D copy (cuMemcpy2DAsync_v2) of height rows
	// of width bytes from host memory (rows spitch apart) to device memory
	// (rows dpitch apart).
	Memcpy2DHtoDAsync(dst DevicePtr, dpitch uint64, src unsafe.Pointer, spitch, width, height uint64, s Stream) error

	StreamCreate(flags uint32) (Stream, error)
	StreamDestroy(s Stream) error
	// StreamQuery returns nil when all work on s has completed, ErrNotReady if not.
	StreamQuery(s Stream) error
	StreamSynchronize(s Stream) error
	// StreamWaitEvent makes future work on s wait for e's current recording.
	StreamWaitEvent(s Stream, e Event, flags uint32) error
	// StreamWaitValue64 makes future work on s wait until the 64-bit word
	// at addr (device memory, or registered host memory through its device
	// address) satisfies flags' test against v: StreamWaitValueGEQ, *addr ≥ v
	// (cuStreamWaitValue64_v2). The device, not the CPU, waits.
	StreamWaitValue64(s Stream, addr DevicePtr, v uint64, flags uint32) error
	// StreamWriteValue64 queues *addr = v on s, after the work queued before
	// it; StreamWriteValueDefault orders it after that work's memory writes
	// as seen from anywhere in the system (cuStreamWriteValue64_v2).
	StreamWriteValue64(s Stream, addr DevicePtr, v uint64, flags uint32) error

	EventCreate(flags uint32) (Event, error)
	EventDestroy(e Event) error
	EventRecord(e Event, s Stream) error
	// EventQuery returns nil when e has completed, ErrNotReady if not.
	EventQuery(e Event) error
	EventSynchronize(e Event) error

	IPCGetMemHandle(p DevicePtr) (IPCMemHandle, error)
	IPCOpenMemHandle(h IPCMemHandle, flags uint32) (DevicePtr, error)
	IPCCloseMemHandle(p DevicePtr) error
	// IPCGetEventHandle needs an event created with EventInterprocess|EventDisableTiming.
	IPCGetEventHandle(e Event) (IPCEventHandle, error)
	IPCOpenEventHandle(h IPCEventHandle) (Event, error)

	// ModuleLoadData loads a module from PTX (or a cubin); PTX need not be
	// NUL-terminated, the implementation takes care of it.
	ModuleLoadData(image []byte) (Module, error)
	ModuleUnload(m Module) error
	ModuleGetFunction(m Module, name string) (Function, error)
	// LaunchKernel queues f on s with the parameters packed in args.
	LaunchKernel(f Function, grid, block Dim3, sharedMem uint32, s Stream, args *Args) error
}

// Limits of Args.
const (
	MaxArgs     = 32
	MaxArgBytes = 1024
)

// Args packs kernel parameters in declaration order, each at its natural
// alignment, without allocating. The zero value is empty and ready to use;
// Reset empties it for reuse. An Args is not safe for concurrent use.
type Args struct {
	buf  [MaxArgBytes]byte
	off  [MaxArgs]uint16
	size [MaxArgs]uint16
	n    int
	end  int
	bad  bool
}

// Reset empties a.
func (a *Args) Reset() { a.n, a.end, a.bad = 0, 0, false }

// Len is the number of parameters.
func (a *Args) Len() int { return a.n }

// Overflow reports whether more than MaxArgs parameters or MaxArgBytes bytes
// were added; LaunchKernel refuses such an Args.
func (a *Args) Overflow() bool { return a.bad }

// Param returns the bytes of parameter i (little endian).
func (a *Args) Param(i int) []byte {
	return a.buf[a.off[i] : int(a.off[i])+int(a.size[i])]
}

func (a *Args) slot(size, align int) []byte {
	start := (a.end + align - 1) &^ (align - 1)
	if a.bad || a.n == MaxArgs || start+size > MaxArgBytes {
		a.bad = true
		return nil
	}
	a.off[a.n], a.size[a.n] = uint16(start), uint16(size)
	a.n++
	a.end = start + size
	return a.buf[start : start+size]
}

// Ptr adds a device pointer parameter.
func (a *Args) Ptr(p DevicePtr) *Args { return a.Uint64(uint64(p)) }

// Uint64 adds a 64-bit parameter (unsigned long long, size_t).
func (a *Args) Uint64(v uint64) *Args {
	if b := a.slot(8, 8); b != nil {
		binary.LittleEndian.PutUint64(b, v)
	}
	return a
}

// Int64 adds a long long parameter.
func (a *Args) Int64(v int64) *Args { return a.Uint64(uint64(v)) }

// Uint32 adds a 32-bit parameter (unsigned int).
func (a *Args) Uint32(v uint32) *Args {
	if b := a.slot(4, 4); b != nil {
		binary.LittleEndian.PutUint32(b, v)
	}
	return a
}

// Int32 adds an int parameter.
func (a *Args) Int32(v int32) *Args { return a.Uint32(uint32(v)) }

// Float32 adds a float parameter.
func (a *Args) Float32(v float32) *Args { return a.Uint32(math.Float32bits(v)) }

// Float64 adds a double parameter.
func (a *Args) Float64(v float64) *Args { return a.Uint64(math.Float64bits(v)) }

// Bytes adds a by-value struct parameter with the given alignment (its
// largest member's), e.g. a struct of 8 pointers: 64 bytes aligned to 8.
func (a *Args) Bytes(v []byte, align int) *Args {
	if b := a.slot(len(v), align); b != nil {
		copy(b, v)
	}
	return a
}
