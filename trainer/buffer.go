package trainer

import (
	"fmt"
	"unsafe"

	"github.com/migctl/migctl/comm"
)

// DType is an element type; Op a reduction operator (package comm's).
type (
	DType = comm.DType
	Op    = comm.Op
)

// Element types.
const (
	Float32  = comm.Float32
	Float16  = comm.Float16
	BFloat16 = comm.BFloat16
	Float64  = comm.Float64
	Int32    = comm.Int32
	Int64    = comm.Int64
	Uint8    = comm.Uint8
)

// Reduction operators (Avg on integers truncates).
const (
	Sum = comm.Sum
	Avg = comm.Avg
	Min = comm.Min
	Max = comm.Max
)

// Number is a Go element type with a DType of its own.
type Number interface {
	float32 | float64 | int32 | int64 | uint8
}

// Buffer is a collective's operand: count elements of one DType in host
// memory (a Go slice) or in device memory (a CUDA pointer and the stream its
// contents are produced on). The zero Buffer is empty. A Buffer does not own
// its memory.
type Buffer struct {
	host   []byte
	ptr    uintptr
	count  int
	dtype  DType
	stream uintptr
	own    comm.Buffer // set by Group.Alloc: the device buffer behind it
	tail   int         // HostBytes: bytes past the last whole element (an error)
	// ordered: DeviceBufferAfter, ready once after completes (nil: now);
	// no event is recorded on stream.
	ordered bool
	after   comm.Event
	// streamDone: DeviceBufferOrdered, whose collective may complete in
	// stream order on stream.
	streamDone bool
}

// HostSlice is a Buffer over s (no copy: the collective reads and writes s).
func HostSlice[T Number](s []T) Buffer {
	var zero T
	var dt DType
	switch any(zero).(type) {
	case float32:
		dt = Float32
	case float64:
		dt = Float64
	case int32:
		dt = Int32
	case int64:
		dt = Int64
	default:
		dt = Uint8
	}
	n := len(s) * int(unsafe.Sizeof(zero))
	var b []byte
	if n > 0 {
		b = unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), n)
	}
	return Buffer{host: b, count: len(s), dtype: dt}
}

// HostBytes is a Buffer over b holding elements of dt (Float16 and BFloat16
// as their 2-byte encodings). len(b) must be a multiple of dt's size; the
// collective reports it otherwise.
func HostBytes(b []byte, dt DType) Buffer {
	return Buffer{host: b, count: len(b) / dt.Size(), dtype: dt, tail: len(b) % dt.Size()}
}

// DeviceBuffer is a Buffer over count elements of dt at ptr, CUDA device
// memory of the group's device in its primary context (what PyTorch
// allocates). stream is the CUstream the contents were produced on (0: the
// legacy default stream): a collective first waits for the work queued on it.
func DeviceBuffer(ptr uintptr, count int, dt DType, stream uintptr) Buffer {
	return Buffer{ptr: ptr, count: count, dtype: dt, stream: stream}
}

// DeviceBufferAfter is DeviceBuffer for memory whose contents are ready
// once after has completed (nil: ready now): an event from
// Group.RecordStream, taken when the caller made its call. A collective on
// it waits for after instead of recording an event on a stream when it is
// issued: for a binding that issues the collective later than its caller's
// call (libmigctl's dispatcher does).
func DeviceBufferAfter(ptr uintptr, count int, dt DType, after comm.Event) Buffer {
	return Buffer{ptr: ptr, count: count, dtype: dt, ordered: true, after: after}
}

// Count is the number of elements.
func (b Buffer) Count() int { return b.count }

// DType is the element type.
func (b Buffer) DType() DType { return b.dtype }

// Bytes is the size in bytes.
func (b Buffer) Bytes() int { return b.count * b.dtype.Size() }

// OnDevice reports whether b is device memory.
func (b Buffer) OnDevice() bool { return b.ptr != 0 || b.own != nil }

// Host is b's memory when it is host memory (nil otherwise).
func (b Buffer) Host() []byte {
	if b.OnDevice() {
		return nil
	}
	return b.host
}

func (b Buffer) check(what string) error {
	if b.tail != 0 {
		return fmt.Errorf("%s buffer: %d bytes is not a whole number of %d-byte elements: %w",
			what, len(b.host), b.dtype.Size(), comm.ErrInvalid)
	}
	if b.count < 0 {
		return fmt.Errorf("%s buffer: negative count %d: %w", what, b.count, comm.ErrInvalid)
	}
	if b.host == nil && b.ptr == 0 && b.own == nil && b.count > 0 {
		return fmt.Errorf("%s buffer: %d elements but no memory: %w", what, b.count, comm.ErrInvalid)
	}
	return nil
}

// same reports whether a and b are the same memory (in place).
func same(a, b Buffer) bool {
	if a.OnDevice() != b.OnDevice() {
		return false
	}
	if a.OnDevice() {
		if a.ptr == 0 || b.ptr == 0 { // own buffers without an address (never on CUDA)
			return a.own == b.own
		}
		return a.ptr == b.ptr
	}
	if len(a.host) == 0 || len(b.host) == 0 {
		return len(a.host) == 0 && len(b.host) == 0
	}
	return unsafe.SliceData(a.host) == unsafe.SliceData(b.host)
}

// Slice is the first n elements of b (n <= Count).
func (b Buffer) Slice(n int) Buffer {
	n = min(max(n, 0), b.count)
	s := b
	s.count = n
	if b.host != nil {
		s.host = b.host[:n*b.dtype.Size()]
	}
	return s
}

// Offset is b from element off on (off <= Count).
func (b Buffer) Offset(off int) Buffer {
	off = min(max(off, 0), b.count)
	s := b
	s.count = b.count - off
	switch {
	case b.host != nil:
		s.host = b.host[off*b.dtype.Size():]
	case off > 0:
		s.ptr = b.ptr + uintptr(off*b.dtype.Size())
		s.own = nil // a pointer into the allocation, no longer the allocation itself
	}
	return s
}
