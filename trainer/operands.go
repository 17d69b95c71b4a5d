package trainer

import (
	"context"
	"errors"
	"fmt"

	"github.com/migctl/migctl/comm"
	"github.com/migctl/migctl/internal/cuda"
)

// withOperands resolves send and recv to buffers of the group's device
// (wrapping the caller's memory where the device can use it, staging
// through scratch buffers where not), runs f, and copies a staged result
// back. sendN and recvN are the elements the collective reads and writes.
func (g *Group) withOperands(ctx context.Context, send, recv Buffer, sendN, recvN int, f func(s, r comm.Buffer) error) error {
	inPlace := same(send, recv)
	es := send.dtype.Size()
	n := max(sendN, recvN)
	if !inPlace {
		n = sendN
	}
	s, sStaged, err := g.operand(ctx, "send", send, n*es, true)
	if err != nil {
		return err
	}
	r := s
	rStaged := sStaged
	if !inPlace {
		if r, rStaged, err = g.operand(ctx, "recv", recv, recvN*es, false); err != nil {
			return err
		}
	}
	if err := f(s, r); err != nil {
		return err
	}
	back := recvN * es
	if inPlace {
		// In place, the result is somewhere in the whole buffer (reduce-
		// scatter: at this rank's block).
		back = n * es
	}
	if !rStaged || back == 0 {
		return nil
	}
	// The result goes back to the caller's host memory.
	if err := g.stream.CopyToHost(recv.host[:back], r, 0); err != nil {
		return fmt.Errorf("copying the result back: %w", err)
	}
	return g.stream.Synchronize(ctx)
}

// recordStreams records an event on each distinct stream of the device
// buffers in bufs (buffers from Alloc on the group's own stream excepted;
// those of DeviceBufferAfter bring theirs): the collective issued now waits
// for them (see submit).
func (g *Group) recordStreams(bufs ...Buffer) ([]comm.Event, error) {
	var (
		events  []comm.Event
		waited  []uintptr
		ext     comm.ExternalDevice
		checked bool
	)
	for _, b := range bufs {
		if !b.OnDevice() || b.own != nil && b.stream == 0 {
			continue
		}
		if b.ordered {
			if b.after != nil && (len(events) == 0 || events[len(events)-1] != b.after) {
				events = append(events, b.after)
			}
			continue
		}
		dup := false
		for _, s := range waited {
			dup = dup || s == b.stream
		}
		if dup {
			continue
		}
		if !checked {
			var ok bool
			if ext, ok = g.dev.(comm.ExternalDevice); !ok {
				return nil, fmt.Errorf("device buffers need the gpu backend (this group runs on %s): %w", g.cfg.backend, ErrUnsupported)
			}
			checked = true
		}
		e, err := ext.RecordStream(b.stream)
		if err != nil {
			return nil, streamError(err)
		}
		events = append(events, e)
		waited = append(waited, b.stream)
	}
	return events, nil
}

// RecordStream marks the work queued so far on the caller's CUDA stream
// (0: the legacy default stream) of the group's device: the event completes
// when that work has, and is complete already when nothing is queued there.
// Pass it to DeviceBufferAfter. Safe for concurrent use, from any thread
// (the calling thread's current CUDA context is left as it was); it fails
// with ErrUnsupported on the host backend.
func (g *Group) RecordStream(stream uintptr) (comm.Event, error) {
	ext, ok := g.dev.(comm.ExternalDevice)
	if !ok {
		return nil, fmt.Errorf("device buffers need the gpu backend (this group runs on %s): %w", g.cfg.backend, ErrUnsupported)
	}
	e, err := ext.RecordStream(stream)
	if err != nil {
		return nil, streamError(err)
	}
	return e, nil
}

// streamError is a failure to mark the caller's stream, which says so
// plainly when the stream is being captured into a CUDA graph.
func streamError(err error) error {
	if cuda.IsStreamCapture(err) {
		return fmt.Errorf("the caller's stream is being captured into a CUDA graph, and a collective cannot be "+
			"(its copies and flags are driven from the host): run it outside the capture (capture the model "+
			"without it): %w: %w", ErrUnsupported, err)
	}
	return fmt.Errorf("ordering after the caller's stream: %w", err)
}

// staged reports whether operand copies b through the group's scratch
// memory: host memory on the gpu backend, or misaligned host memory.
func (g *Group) staged(b Buffer) bool {
	return b.own == nil && !b.OnDevice() && !(g.cfg.backend == BackendHost && comm.HostAligned(b.host, b.dtype.Size()))
}

// operand returns b as a buffer of the group's device of at least n bytes,
// and whether it is a staged copy (load: copy the caller's contents in).
func (g *Group) operand(ctx context.Context, role string, b Buffer, n int, load bool) (comm.Buffer, bool, error) {
	switch {
	case b.own != nil:
		return b.own, false, nil
	case b.OnDevice():
		ext, ok := g.dev.(comm.ExternalDevice)
		if !ok {
			return nil, false, fmt.Errorf("device buffers need the gpu backend (this group runs on %s): %w", g.cfg.backend, ErrUnsupported)
		}
		buf, err := ext.WrapPointer(b.ptr, b.Bytes())
		return buf, false, err
	case !g.staged(b):
		return comm.WrapHostBytes(b.host), false, nil
	}
	s, err := g.scratchBuf(role, n)
	if err != nil {
		return nil, false, err
	}
	if load && n > 0 {
		if err := g.stream.CopyFromHost(s, 0, b.host[:n]); err != nil {
			return nil, false, fmt.Errorf("staging the %s buffer: %w", role, err)
		}
		if err := g.stream.Synchronize(ctx); err != nil {
			return nil, false, fmt.Errorf("staging the %s buffer: %w", role, err)
		}
	}
	return s, true, nil
}

// scratchBuf returns the group's scratch buffer for role with at least n
// bytes (grown by doubling). Worker goroutine only.
func (g *Group) scratchBuf(role string, n int) (comm.Buffer, error) {
	if b := g.scratch[role]; b != nil && b.Len() >= n {
		return b, nil
	}
	size := 1 << 20
	for size < n {
		size *= 2
	}
	if old := g.scratch[role]; old != nil {
		if err := g.free(old); err != nil {
			return nil, err
		}
		delete(g.scratch, role)
	}
	b, err := g.dev.Alloc(size)
	if err != nil {
		return nil, fmt.Errorf("allocating %d bytes of scratch: %w", size, err)
	}
	g.scratch[role] = b
	return b, nil
}

// freer is a Device that frees single buffers (the CUDA device; the host
// device's buffers are garbage collected).
type freer interface{ Free(comm.Buffer) error }

func (g *Group) free(b comm.Buffer) error {
	if f, ok := g.dev.(freer); ok {
		return f.Free(b)
	}
	return nil
}

// Alloc returns a buffer of count elements of dt on the group's device
// (device memory on the gpu backend, host memory on the host backend),
// zeroed on the host backend, not initialised on the gpu backend. Free
// releases it; Close releases it too.
func (g *Group) Alloc(count int, dt DType) (Buffer, error) {
	if count < 0 {
		return Buffer{}, fmt.Errorf("allocating %d elements: %w", count, comm.ErrInvalid)
	}
	b, err := g.dev.Alloc(max(count*dt.Size(), 1))
	if err != nil {
		return Buffer{}, err
	}
	if hb, ok := b.(*comm.HostBuffer); ok {
		return Buffer{host: hb.Bytes()[:count*dt.Size()], count: count, dtype: dt}, nil
	}
	var ptr uintptr
	if cb, ok := b.(*comm.CUDABuffer); ok {
		ptr = uintptr(cb.Ptr())
	}
	return Buffer{own: b, ptr: ptr, count: count, dtype: dt}, nil
}

// Free releases a buffer from Alloc.
func (g *Group) Free(b Buffer) error {
	if b.own == nil {
		return nil
	}
	return g.free(b.own)
}

// Write copies src into dst (a buffer from Alloc, or any Buffer) in order
// with the group's collectives.
func (g *Group) Write(ctx context.Context, dst Buffer, src []byte) error {
	if len(src) > dst.Bytes() {
		return fmt.Errorf("writing %d bytes into a %d-byte buffer: %w", len(src), dst.Bytes(), comm.ErrInvalid)
	}
	return g.wait(g.issue(ctx, true, "write", "", 0, func(ctx context.Context) error {
		if !dst.OnDevice() {
			copy(dst.host, src)
			return nil
		}
		b, _, err := g.operand(ctx, "write", dst, dst.Bytes(), false)
		if err != nil {
			return err
		}
		if err := g.stream.CopyFromHost(b, 0, src); err != nil {
			return err
		}
		return g.stream.Synchronize(ctx)
	}, dst))
}

// Read copies src into dst in order with the group's collectives.
func (g *Group) Read(ctx context.Context, dst []byte, src Buffer) error {
	if len(dst) > src.Bytes() {
		return fmt.Errorf("reading %d bytes from a %d-byte buffer: %w", len(dst), src.Bytes(), comm.ErrInvalid)
	}
	return g.wait(g.issue(ctx, true, "read", "", 0, func(ctx context.Context) error {
		if !src.OnDevice() {
			copy(dst, src.host)
			return nil
		}
		b, _, err := g.operand(ctx, "read", src, src.Bytes(), false)
		if err != nil {
			return err
		}
		if err := g.stream.CopyToHost(dst, b, 0); err != nil {
			return err
		}
		return g.stream.Synchronize(ctx)
	}, src))
}

// ipcState is the IPC ring's scratch: this rank's send and receive buffers,
// exported once, and the previous rank's, opened once (regrown together on
// every rank, since every rank sees the same counts).
type ipcState struct {
	send, recv comm.Buffer
	peers      *comm.PeerBuffers
	epoch      int
}

// RegisterIPC exports send and recv (buffers from Alloc) to the IPC ring's
// peers once, so that all-reduces from send into recv run straight on them
// instead of through the group's scratch (two device-to-device copies
// fewer). A collective: every rank registers its buffers of the same calls,
// in the same order. A no-op unless the group's transport is ipc.
func (g *Group) RegisterIPC(ctx context.Context, send, recv Buffer) error {
	if g.transport != TransportIPC {
		return nil
	}
	if send.own == nil || recv.own == nil {
		return fmt.Errorf("registering buffers for IPC: only buffers from Alloc can be exported: %w", comm.ErrInvalid)
	}
	return g.wait(g.issue(ctx, true, "register", "", 0, func(ctx context.Context) error {
		ipcDev, ok := g.dev.(comm.IPCDevice)
		if !ok {
			return fmt.Errorf("transport ipc on a device without CUDA IPC: %w", ErrUnsupported)
		}
		tag := fmt.Sprintf("trainer/reg/%d", len(g.registered))
		bufs := []comm.Buffer{send.own}
		if !same(send, recv) {
			bufs = append(bufs, recv.own)
		}
		peers, err := comm.ExchangeIPC(ctx, g.kv, ipcDev, g.rank, g.size, tag, bufs...)
		if err != nil {
			return err
		}
		if g.registered == nil {
			g.registered = map[[2]uintptr]*comm.PeerBuffers{}
		}
		g.registered[[2]uintptr{send.ptr, recv.ptr}] = peers
		return nil
	}))
}

// allReduceIPC runs an all-reduce over the IPC ring: on registered buffers
// directly, else with the caller's data copied device to device into
// scratch buffers the ring's peers have opened.
func (g *Group) allReduceIPC(ctx context.Context, send, recv Buffer, op Op) error {
	if p, ok := g.registered[[2]uintptr{send.ptr, recv.ptr}]; ok && send.own != nil && recv.own != nil {
		prevRecv := p.Bufs[len(p.Bufs)-1]
		return g.cm.AllReduceIPC(ctx, send.own, recv.own, p.Bufs[0], prevRecv, send.count, send.dtype, op)
	}
	es := send.dtype.Size()
	n := send.count * es
	if err := g.growIPC(ctx, n); err != nil {
		return err
	}
	st := g.ipc
	src, staged, err := g.operand(ctx, "send", send, n, true)
	if err != nil {
		return err
	}
	if err := g.stream.CopyBuffer(st.send, 0, src, 0, n); err != nil {
		return err
	}
	if err := g.stream.Synchronize(ctx); err != nil {
		return err
	}
	if err := g.cm.AllReduceIPC(ctx, st.send, st.recv, st.peers.Bufs[0], st.peers.Bufs[1], send.count, send.dtype, op); err != nil {
		return err
	}
	dst := src
	if !staged || !same(send, recv) {
		if dst, staged, err = g.operand(ctx, "recv", recv, n, false); err != nil {
			return err
		}
	}
	if err := g.stream.CopyBuffer(dst, 0, st.recv, 0, n); err != nil {
		return err
	}
	if staged {
		if err := g.stream.CopyToHost(recv.host[:n], dst, 0); err != nil {
			return err
		}
	}
	return g.stream.Synchronize(ctx)
}

// growIPC makes the IPC scratch hold n bytes (a collective step: every
// rank grows at the same call).
func (g *Group) growIPC(ctx context.Context, n int) error {
	if g.ipc != nil && g.ipc.send.Len() >= n {
		return nil
	}
	size := 1 << 20
	for size < n {
		size *= 2
	}
	epoch := 0
	if g.ipc != nil {
		epoch = g.ipc.epoch + 1
		// Every rank has stopped using the old buffers before any frees them.
		if err := g.kv.Barrier(ctx, fmt.Sprintf("trainer/ipc/%d/release", g.ipc.epoch)); err != nil {
			return err
		}
		g.freeIPC()
	}
	ipcDev, ok := g.dev.(comm.IPCDevice)
	if !ok {
		return fmt.Errorf("transport ipc on a device without CUDA IPC: %w", ErrUnsupported)
	}
	st := &ipcState{epoch: epoch}
	var err error
	if st.send, err = g.dev.Alloc(size); err != nil {
		return err
	}
	if st.recv, err = g.dev.Alloc(size); err != nil {
		return errors.Join(err, g.free(st.send))
	}
	if st.peers, err = comm.ExchangeIPC(ctx, g.kv, ipcDev, g.rank, g.size, fmt.Sprintf("trainer/ipc/%d", epoch), st.send, st.recv); err != nil {
		return errors.Join(err, g.free(st.send), g.free(st.recv))
	}
	g.ipc = st
	return nil
}

func (g *Group) freeIPC() {
	for k, p := range g.registered {
		_ = p.Close()
		delete(g.registered, k)
	}
	if g.ipc == nil {
		return
	}
	_ = g.ipc.peers.Close()
	_ = g.free(g.ipc.send)
	_ = g.free(g.ipc.recv)
	g.ipc = nil
}
