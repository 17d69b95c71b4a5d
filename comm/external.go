package comm

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"github.com/migctl/migctl/internal/cuda"
)

// ExternalDevice is a Device that runs collectives on memory it did not
// allocate: a caller's device allocation in the same (primary) context,
// ordered after the work the caller queued on its own stream. The CUDA
// device implements it; the trainer SDK finds it by type assertion.
type ExternalDevice interface {
	Device
	// WrapPointer returns a Buffer over n bytes of device memory at ptr.
	// The device does not own it: Free refuses it and Close leaves it.
	WrapPointer(ptr uintptr, n int) (Buffer, error)
	// RecordStream records an event on the caller's stream now and returns
	// it: work queued later on that stream is not waited for. When nothing
	// is queued on the stream (it has finished its work) the event is
	// complete already and records nothing: waiting for it needs no trip
	// through the GPU. Safe to call from any goroutine, and from a thread
	// that is not Go's (a cgo callback): the thread's current CUDA context
	// is the same afterwards.
	RecordStream(stream uintptr) (Event, error)
}

// StreamOrderer is an ExternalDevice that can make a caller's stream wait
// for one of its events on the device (a collective that completes in
// stream order: allreduce.Communicator.AllReduceOrdered).
type StreamOrderer interface {
	// OrderStream makes the work queued on the caller's stream from now on
	// wait until ev has completed, without blocking the calling thread.
	// Same threading rules as RecordStream.
	OrderStream(stream uintptr, ev Event) error
}

var (
	_ ExternalDevice = (*CUDADevice)(nil)
	_ StreamOrderer  = (*CUDADevice)(nil)
)

// WrapHostBytes returns a host-device Buffer over b without copying: the
// collective reads and writes b itself. b must stay valid while it is used.
func WrapHostBytes(b []byte) *HostBuffer { return &HostBuffer{b: b} }

// HostAligned reports whether b's first byte is aligned to align bytes (what
// the host backend's reductions need of a buffer of elements that size).
func HostAligned(b []byte, align int) bool {
	return len(b) == 0 || uintptr(unsafe.Pointer(unsafe.SliceData(b)))%uintptr(align) == 0
}

// WrapPointer implements ExternalDevice.
func (d *CUDADevice) WrapPointer(ptr uintptr, n int) (Buffer, error) {
	if ptr == 0 || n < 0 {
		return nil, fmt.Errorf("wrapping device pointer %#x of %d bytes: %w", ptr, n, ErrInvalid)
	}
	// peer marks it not ours; it never enters d.allocs, so Free and Close
	// leave it alone.
	return &CUDABuffer{ptr: cuda.DevicePtr(ptr), n: n, peer: true}, nil
}

// RecordStream implements ExternalDevice.
func (d *CUDADevice) RecordStream(stream uintptr) (Event, error) {
	d.mu.Lock()
	closed := d.closed
	d.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("cuda device: %w", ErrClosed)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	restore, err := d.callerContext()
	if err != nil {
		return nil, err
	}
	defer restore()
	// A stream with nothing queued needs no event (an 8 KiB collective
	// issued after its input is ready would otherwise poll one through the
	// GPU: tens of microseconds with several processes on it).
	if err := d.api.StreamQuery(cuda.Stream(stream)); err == nil {
		return completeEvent{}, nil
	} else if !errors.Is(err, cuda.ErrNotReady) {
		return nil, fmt.Errorf("querying the caller's stream: %w", err)
	}
	e, err := d.event()
	if err != nil {
		return nil, err
	}
	if err := d.api.EventRecord(e, cuda.Stream(stream)); err != nil {
		d.recycle(e)
		return nil, fmt.Errorf("recording an event on the caller's stream: %w", err)
	}
	ev := &cudaEvent{d: d, e: e}
	runtime.AddCleanup(ev, func(e cuda.Event) { d.recycle(e) }, e)
	return ev, nil
}

// OrderStream implements StreamOrderer.
func (d *CUDADevice) OrderStream(stream uintptr, ev Event) error {
	e, ok := ev.(*cudaEvent)
	if !ok || e.d != d {
		return fmt.Errorf("event %T is not this device's: %w", ev, ErrInvalid)
	}
	d.mu.Lock()
	closed := d.closed
	d.mu.Unlock()
	if closed {
		return fmt.Errorf("cuda device: %w", ErrClosed)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	restore, err := d.callerContext()
	if err != nil {
		return err
	}
	defer restore()
	if err := d.api.StreamWaitEvent(cuda.Stream(stream), e.e, 0); err != nil {
		return fmt.Errorf("ordering the caller's stream after the collective: %w", err)
	}
	return nil
}

// callerContext makes the device's context current on the calling (locked)
// thread and returns what puts the thread's previous one back.
func (d *CUDADevice) callerContext() (func(), error) {
	prev, perr := d.api.CtxGetCurrent()
	if perr == nil && prev == d.ctx {
		return func() {}, nil
	}
	if err := d.api.CtxSetCurrent(d.ctx); err != nil {
		return nil, fmt.Errorf("making the CUDA context current: %w", err)
	}
	if perr == nil && prev != 0 {
		return func() { _ = d.api.CtxSetCurrent(prev) }, nil
	}
	return func() {}, nil
}

// KeepThreadContext notes the CUDA context current on the calling thread
// and returns what makes it current there again: for work that runs on a
// caller's goroutine, whose driver calls make the device's context current
// (bind). The thread is locked only while the context is read or set, not
// in between: a locked goroutine's every yield in the polling loops would
// hand its P away and back (cmd/libmigctl/doc.go). A caller that locked its
// thread stays on it, so its context comes back where it was read; on an
// unlocked goroutine the current context means nothing to the caller, and
// setting it on whichever thread the goroutine ends on harms nobody (every
// driver call of this package makes its own context current first).
func (d *CUDADevice) KeepThreadContext() func() {
	runtime.LockOSThread()
	prev, err := d.api.CtxGetCurrent()
	runtime.UnlockOSThread()
	if err != nil {
		return func() {}
	}
	return func() {
		runtime.LockOSThread()
		if cur, err := d.api.CtxGetCurrent(); err == nil && cur != prev {
			_ = d.api.CtxSetCurrent(prev)
		}
		runtime.UnlockOSThread()
	}
}

// Idle reports whether ev is RecordStream's answer for a stream that had
// nothing queued: nothing to wait for, known without a driver call (an
// Event's Done may make the device's context current on the calling thread).
func Idle(ev Event) bool {
	_, ok := ev.(completeEvent)
	return ok
}

// completeEvent is an Event that has completed (RecordStream on an idle stream).
type completeEvent struct{}

func (completeEvent) Done() (bool, error)        { return true, nil }
func (completeEvent) Wait(context.Context) error { return nil }

// MayOverlap reports whether buffers a and b may share memory: false only
// where both are nil or buffers of this package's devices (host memory, or
// device memory, compared by address) and their ranges are apart. A nil
// buffer overlaps nothing.
func MayOverlap(a, b Buffer) bool {
	span := func(x Buffer) (start, end uintptr, kind int, ok bool) {
		switch v := x.(type) {
		case *HostBuffer:
			return uintptr(unsafe.Pointer(unsafe.SliceData(v.b))), uintptr(unsafe.Pointer(unsafe.SliceData(v.b))) + uintptr(len(v.b)), 1, true
		case *CUDABuffer:
			return uintptr(v.ptr), uintptr(v.ptr) + uintptr(v.n), 2, true
		}
		return 0, 0, 0, false
	}
	if a == nil || b == nil || isNilBuffer(a) || isNilBuffer(b) {
		return false
	}
	as, ae, ak, aok := span(a)
	bs, be, bk, bok := span(b)
	if !aok || !bok {
		return true
	}
	if ak != bk || as == ae || bs == be {
		return false // host and device memory, or an empty buffer
	}
	return as < be && bs < ae
}

// isNilBuffer reports a typed nil pointer in a Buffer.
func isNilBuffer(b Buffer) bool {
	switch v := b.(type) {
	case *HostBuffer:
		return v == nil
	case *CUDABuffer:
		return v == nil
	}
	return false
}
