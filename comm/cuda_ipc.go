package comm

import (
	"encoding/binary"
	"fmt"

	"github.com/migctl/migctl/internal/cuda"
)

// Optional abilities of a Device and its Streams, found by type assertion:
//
//	if ipc, ok := dev.(comm.IPCDevice); ok && !topo.MIG { ... }
//	if r, ok := stream.(comm.BufferReducer); ok { ... }
//
// The GPU backend (CUDADevice) implements all of them; the host backend none.

// IPCDevice shares device buffers and events with other processes through
// CUDA IPC. It works between processes on the same GPU, or on GPUs with CUDA
// P2P between them, and never between MIG instances (check
// TopologyDevice.Topology().MIG on both sides first). Handles are opaque
// bytes, to be sent to the peer (e.g. through rendezvous).
// Methods are safe for concurrent use.
type IPCDevice interface {
	Device
	// ExportBuffer returns a handle for a buffer from Alloc (whole buffers
	// only). The buffer must outlive every peer's use of it.
	ExportBuffer(b Buffer) ([]byte, error)
	// OpenPeerBuffer maps a peer's exported buffer into this process. A
	// process cannot open its own handle. Release with ClosePeerBuffer (or
	// the device's Close). The result works with CopyBuffer and ReduceBuffers.
	OpenPeerBuffer(handle []byte) (Buffer, error)
	ClosePeerBuffer(b Buffer) error
	// NewSharedEvent creates an event that can be exported; record it with
	// EventStream.RecordEvent. It lives until the device's Close.
	NewSharedEvent() (Event, error)
	// ExportEvent returns a handle for an event from NewSharedEvent.
	ExportEvent(e Event) ([]byte, error)
	// OpenPeerEvent opens a peer's exported event: Done/Wait observe the
	// peer's recordings, and EventStream.WaitEvent orders local work after them.
	OpenPeerEvent(handle []byte) (Event, error)
}

// BufferSpan is a byte offset into a device Buffer.
type BufferSpan struct {
	Buf Buffer
	Off int
}

// BufferReducer is a Stream that reduces between device buffers (local, or
// peers' opened with IPCDevice.OpenPeerBuffer) without touching host memory.
type BufferReducer interface {
	// ReduceBuffers queues dst[dstOff:dstOff+n] = op(dst[dstOff:dstOff+n],
	// srcs[i].Buf[srcs[i].Off:+n]...) elementwise; n is in bytes. Avg reduces
	// as Sum (finish with Scale), as ReduceFromHost does.
	ReduceBuffers(dst Buffer, dstOff int, srcs []BufferSpan, n int, dt DType, op Op) error
}

// EventStream is a Stream that records existing events and orders its work
// after events of other streams or processes, without blocking the caller.
type EventStream interface {
	// RecordEvent records e (the same device's) at the current end of the stream.
	RecordEvent(e Event) error
	// WaitEvent makes work queued after it wait until e completes.
	WaitEvent(e Event) error
}

// TopologyDevice reports which GPU a Device is, so that ranks can tell
// whether they share a physical GPU (same PCIBusID: use the host-staged
// algorithm) and whether CUDA IPC is possible (neither side MIG).
type TopologyDevice interface {
	Topology() GPUTopology
}

// ipcHandleSize is an exported buffer handle: CUDA's 64 bytes and the length.
const ipcHandleSize = 64 + 8

// ExportBuffer implements IPCDevice.
func (d *CUDADevice) ExportBuffer(buf Buffer) ([]byte, error) {
	b, err := d.buffer(buf)
	if err != nil {
		return nil, err
	}
	if b.peer {
		return nil, fmt.Errorf("exporting a peer's buffer: %w", ErrInvalid)
	}
	if err := d.bind(); err != nil {
		return nil, err
	}
	defer d.unbind()
	h, err := d.api.IPCGetMemHandle(b.ptr)
	if err != nil {
		return nil, fmt.Errorf("exporting a %d-byte device buffer: %w", b.n, err)
	}
	out := make([]byte, ipcHandleSize)
	copy(out, h[:])
	binary.LittleEndian.PutUint64(out[64:], uint64(b.n))
	return out, nil
}

// OpenPeerBuffer implements IPCDevice.
func (d *CUDADevice) OpenPeerBuffer(handle []byte) (Buffer, error) {
	if len(handle) != ipcHandleSize {
		return nil, fmt.Errorf("opening a peer buffer: handle of %d bytes, want %d: %w", len(handle), ipcHandleSize, ErrInvalid)
	}
	var h cuda.IPCMemHandle
	copy(h[:], handle)
	n := binary.LittleEndian.Uint64(handle[64:])
	if err := d.enter(); err != nil {
		return nil, err
	}
	defer d.leave()
	p, err := d.api.IPCOpenMemHandle(h, cuda.IPCMemLazyEnablePeerAccess)
	if err != nil {
		return nil, fmt.Errorf("opening a peer's %d-byte buffer: %w", n, err)
	}
	b := &CUDABuffer{ptr: p, n: int(n), peer: true}
	d.allocs[b] = struct{}{}
	return b, nil
}

// ClosePeerBuffer implements IPCDevice.
func (d *CUDADevice) ClosePeerBuffer(buf Buffer) error {
	b, err := d.buffer(buf)
	if err != nil {
		return err
	}
	if !b.peer {
		return fmt.Errorf("closing a local buffer as a peer's: %w", ErrInvalid)
	}
	return d.Free(b)
}

// NewSharedEvent implements IPCDevice.
func (d *CUDADevice) NewSharedEvent() (Event, error) {
	if err := d.enter(); err != nil {
		return nil, err
	}
	defer d.leave()
	e, err := d.api.EventCreate(cuda.EventDisableTiming | cuda.EventInterprocess)
	if err != nil {
		return nil, fmt.Errorf("creating an interprocess CUDA event: %w", err)
	}
	d.events[e] = struct{}{}
	return &cudaEvent{d: d, e: e, shared: true}, nil
}

// ExportEvent implements IPCDevice.
func (d *CUDADevice) ExportEvent(ev Event) ([]byte, error) {
	e, ok := ev.(*cudaEvent)
	if !ok || e.d != d || !e.shared {
		return nil, fmt.Errorf("exporting an event not from NewSharedEvent: %w", ErrInvalid)
	}
	if err := d.bind(); err != nil {
		return nil, err
	}
	defer d.unbind()
	h, err := d.api.IPCGetEventHandle(e.e)
	if err != nil {
		return nil, fmt.Errorf("exporting a CUDA event: %w", err)
	}
	return append([]byte(nil), h[:]...), nil
}

// OpenPeerEvent implements IPCDevice.
func (d *CUDADevice) OpenPeerEvent(handle []byte) (Event, error) {
	if len(handle) != len(cuda.IPCEventHandle{}) {
		return nil, fmt.Errorf("opening a peer event: handle of %d bytes: %w", len(handle), ErrInvalid)
	}
	var h cuda.IPCEventHandle
	copy(h[:], handle)
	if err := d.enter(); err != nil {
		return nil, err
	}
	defer d.leave()
	e, err := d.api.IPCOpenEventHandle(h)
	if err != nil {
		return nil, fmt.Errorf("opening a peer's CUDA event: %w", err)
	}
	d.events[e] = struct{}{}
	return &cudaEvent{d: d, e: e, shared: true}, nil
}
