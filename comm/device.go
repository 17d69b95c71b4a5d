package comm

import (
	"context"
	"fmt"
)

// DType is the element type of a collective's buffer.
type DType int

// Element types. Every op is defined for every type; avg on integers truncates.
const (
	Float32 DType = iota
	Float16
	BFloat16
	Float64
	Int32
	Int64
	Uint8
)

// Size is the size of one element in bytes.
func (d DType) Size() int {
	switch d {
	case Float16, BFloat16:
		return 2
	case Float32, Int32:
		return 4
	case Float64, Int64:
		return 8
	case Uint8:
		return 1
	}
	panic(fmt.Sprintf("comm: unknown dtype %d", int(d)))
}

// Op is a reduction operator.
type Op int

// Reduction operators.
const (
	Sum Op = iota
	Avg
	Min
	Max
)

// Buffer is a collective's user buffer: host memory for the host backend,
// device memory for the GPU backend. Offsets and lengths are in bytes.
type Buffer interface {
	Len() int
}

// Device is the memory a collective runs on, as seen from one rank's process.
// The host backend implements it with plain memory and CPU loops; the GPU
// backend with CUDA streams, events and reduction kernels.
//
// A Device is used by one goroutine at a time unless its documentation says
// otherwise; host memory passed to a Stream must stay valid until the event
// recorded after the operation has completed.
type Device interface {
	// Register makes host memory (typically a shared-memory arena mapped by
	// every rank) usable for fast asynchronous copies and for reductions that
	// read it directly. Unregister undoes it.
	Register(mem []byte) error
	Unregister(mem []byte) error
	// Alloc returns a scratch buffer of n bytes on the device.
	Alloc(n int) (Buffer, error)
	// NewStream returns an in-order queue of work.
	NewStream() (Stream, error)
	Close() error
}

// Stream is an in-order queue of copies and reductions. Enqueue methods return
// once the work is queued, not done; Record returns an Event that completes
// when everything queued before it has.
type Stream interface {
	// CopyToHost queues dst = src[srcOff : srcOff+len(dst)].
	CopyToHost(dst []byte, src Buffer, srcOff int) error
	// CopyFromHost queues dst[dstOff : dstOff+len(src)] = src.
	CopyFromHost(dst Buffer, dstOff int, src []byte) error
	// CopyBuffer queues dst[dstOff:dstOff+n] = src[srcOff:srcOff+n] on the device.
	CopyBuffer(dst Buffer, dstOff int, src Buffer, srcOff int, n int) error
	// ReduceFromHost queues dst[dstOff:] = op(dst[dstOff:], srcs...) elementwise
	// over len(srcs[i]) bytes; every src is registered host memory of equal length.
	// With Avg, the caller divides once at the end with Scale. The stream
	// keeps no reference to the srcs list itself (the caller may reuse it),
	// only to the memory it names.
	ReduceFromHost(dst Buffer, dstOff int, srcs [][]byte, dt DType, op Op) error
	// Scale queues dst[off:off+n] /= div (used to finish an Avg).
	Scale(dst Buffer, off, n int, dt DType, div int) error
	Record() (Event, error)
	Synchronize(ctx context.Context) error
	Close() error
}

// StagingReducer is a Stream whose device can reduce host memory faster by
// copying it into device memory first (the copy engines) than by reading
// it from a kernel: schedules that reduce large blocks read once (the
// ring's) ask for it, and a stream without it reduces as ReduceFromHost.
type StagingReducer interface {
	// ReduceFromHostStaged is ReduceFromHost, its sources staged in device
	// memory where the device is configured to (CUDAConfig.StageReduce).
	ReduceFromHostStaged(dst Buffer, dstOff int, srcs [][]byte, dt DType, op Op) error
}

// WordStream is a Stream that orders work on 64-bit words of registered
// host memory itself, with no CPU in between: the GPU backend's streams
// (cuStreamWriteValue64 / cuStreamWaitValue64) on a device whose
// StreamWords reports support. word is 8 bytes, 8-byte aligned, of memory
// registered with the stream's Device.
type WordStream interface {
	// WriteWord queues word = v after the work queued before it; the store
	// is seen, by the CPU and by other devices, only after that work's
	// writes.
	WriteWord(word []byte, v uint64) error
	// WaitWord makes the work queued after it wait until word ≥ v.
	WaitWord(word []byte, v uint64) error
}

// WordDevice is a Device whose streams may be WordStreams: StreamWords
// returns nil where they work (probed once per device), else why not.
type WordDevice interface {
	StreamWords() error
}

// Event marks a point in a Stream.
type Event interface {
	// Done reports whether the work before the event has completed.
	Done() (bool, error)
	// Wait blocks until the event completes or ctx ends.
	Wait(ctx context.Context) error
}
