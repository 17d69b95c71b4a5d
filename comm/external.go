package comm

import (
	"context"
	"fmt"
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
	// WaitStream blocks until the work queued so far on the caller's
	// stream (a CUstream of this device's primary context; 0 is the legacy
	// default stream) has completed: an event recorded there and waited
	// for, never a device-wide synchronisation.
	WaitStream(ctx context.Context, stream uintptr) error
}

var _ ExternalDevice = (*CUDADevice)(nil)

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

// WaitStream implements ExternalDevice.
func (d *CUDADevice) WaitStream(ctx context.Context, stream uintptr) error {
	if err := d.bind(); err != nil {
		return err
	}
	e, err := d.event()
	if err != nil {
		d.unbind()
		return err
	}
	err = d.api.EventRecord(e, cuda.Stream(stream))
	d.unbind()
	if err != nil {
		d.recycle(e)
		return fmt.Errorf("recording an event on the caller's stream: %w", err)
	}
	defer d.recycle(e)
	return (&cudaEvent{d: d, e: e}).Wait(ctx)
}
