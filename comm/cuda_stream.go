package comm

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/bits"
	"runtime"
	"time"
	"unsafe"

	"github.com/migctl/migctl/internal/cuda"
)

// cudaStream is a CUDA stream of a CUDADevice. Work is queued with one
// driver call each (a copy, or one kernel launch per 8 sources); launches
// reuse the stream's parameter block, so nothing is allocated on that path.
type cudaStream struct {
	d      *CUDADevice
	s      cuda.Stream
	args   cuda.Args
	srcs   [maxKernelSrcs * 8]byte
	ptrs   [maxKernelSrcs]cuda.DevicePtr
	pad    *CUDABuffer   // scratch of SmallH2DBytes for H2DPadded, allocated on first use
	stage  *CUDABuffer   // scratch of staged reduction sources (CUDAConfig.StageReduce), grown on demand
	retire []*CUDABuffer // outgrown stage buffers, which queued kernels may still read: freed with the stream
	closed bool
	gone   bool // destroyed by the device's Close
}

func (s *cudaStream) check() error {
	if s.closed || s.gone {
		return fmt.Errorf("cuda stream: %w", ErrClosed)
	}
	return nil
}

func spanCheck(n, off, size int, what string) error {
	if off < 0 || size < 0 || off+size > n {
		return fmt.Errorf("%s [%d, %d) outside %d-byte buffer: %w", what, off, off+size, n, ErrInvalid)
	}
	return nil
}

// CopyToHost queues a device-to-host copy. With dst registered the copy is
// asynchronous DMA; otherwise the driver stages it and may block.
func (s *cudaStream) CopyToHost(dst []byte, src Buffer, srcOff int) error {
	b, err := s.d.buffer(src)
	if err != nil {
		return err
	}
	if err := spanCheck(b.n, srcOff, len(dst), "copy source"); err != nil {
		return err
	}
	if err := s.check(); err != nil || len(dst) == 0 {
		return err
	}
	if err := s.d.bind(); err != nil {
		return err
	}
	defer s.d.unbind()
	if err := s.d.api.MemcpyDtoHAsync(unsafe.Pointer(unsafe.SliceData(dst)), b.ptr+cuda.DevicePtr(srcOff), uint64(len(dst)), s.s); err != nil {
		return fmt.Errorf("queueing a %d-byte copy to host: %w", len(dst), err)
	}
	return nil
}

// CopyFromHost queues a host-to-device copy (asynchronous on registered memory).
func (s *cudaStream) CopyFromHost(dst Buffer, dstOff int, src []byte) error {
	b, err := s.d.buffer(dst)
	if err != nil {
		return err
	}
	if err := spanCheck(b.n, dstOff, len(src), "copy destination"); err != nil {
		return err
	}
	if err := s.check(); err != nil || len(src) == 0 {
		return err
	}
	if len(src) < SmallH2DBytes && s.d.smallH2D != H2DPlain {
		return s.copySmallFromHost(b.ptr+cuda.DevicePtr(dstOff), src)
	}
	if err := s.d.bind(); err != nil {
		return err
	}
	defer s.d.unbind()
	if err := s.d.api.MemcpyHtoDAsync(b.ptr+cuda.DevicePtr(dstOff), unsafe.Pointer(unsafe.SliceData(src)), uint64(len(src)), s.s); err != nil {
		return fmt.Errorf("queueing a %d-byte copy from host: %w", len(src), err)
	}
	return nil
}

// copyRows queues an n-byte host-to-device copy as 2D copies of two or more
// rows (H2D2DRows): 64-byte rows for the largest multiple of 64 (when that
// makes two rows or more), the rest with the widest width that tiles it;
// a single byte goes by cuMemcpyHtoDAsync. The caller holds the context.
func (s *cudaStream) copyRows(dst cuda.DevicePtr, p unsafe.Pointer, n uint64) error {
	if main := n &^ 63; main >= 128 {
		if err := s.d.api.Memcpy2DHtoDAsync(dst, 64, p, 64, 64, main/64, s.s); err != nil {
			return err
		}
		if main == n {
			return nil // (p+main would point past the source: invalid for checkptr)
		}
		dst, p, n = dst+cuda.DevicePtr(main), unsafe.Add(p, main), n-main
	}
	if n == 0 {
		return nil
	}
	if n == 1 {
		return s.d.api.MemcpyHtoDAsync(dst, p, n, s.s)
	}
	w := rowWidth(n)
	return s.d.api.Memcpy2DHtoDAsync(dst, w, p, w, w, n/w, s.s)
}

// rowWidth is the widest width below n that tiles n bytes (1 for a prime).
func rowWidth(n uint64) uint64 {
	for w := n / 2; w > 1; w-- {
		if n%w == 0 {
			return w
		}
	}
	return 1
}

// copySmallFromHost queues a small host-to-device copy the way
// CUDAConfig.SmallH2D asks.
func (s *cudaStream) copySmallFromHost(dst cuda.DevicePtr, src []byte) error {
	n := uint64(len(src))
	p := unsafe.Pointer(unsafe.SliceData(src))
	mode := s.d.smallH2D
	var mapped cuda.DevicePtr
	switch mode {
	case H2DFromMapped, H2DKernel:
		// Both read the source through its mapped address; an unregistered
		// one goes the way of the mode's copy-engine twin.
		var err error
		if mapped, err = s.d.mapped(src); err != nil {
			mode = H2DPlain
			if s.d.smallH2D == H2DKernel {
				mode = H2D2DRows
			}
		}
	case H2DPadded:
		if _, err := s.d.mappedRange(uintptr(p), SmallH2DBytes); err != nil {
			mode = H2DPlain
		} else if s.pad == nil {
			buf, err := s.d.Alloc(SmallH2DBytes)
			if err != nil {
				return fmt.Errorf("allocating the small-copy scratch buffer: %w", err)
			}
			s.pad = buf.(*CUDABuffer)
		}
	}
	if err := s.d.bind(); err != nil {
		return err
	}
	defer s.d.unbind()
	var err error
	switch mode {
	case H2D2D:
		err = s.d.api.Memcpy2DHtoDAsync(dst, n, p, n, n, 1, s.s)
	case H2D2DRows:
		err = s.copyRows(dst, p, n)
	case H2DFromMapped:
		err = s.d.api.MemcpyDtoDAsync(dst, mapped, n, s.s)
	case H2DKernel:
		s.args.Reset()
		s.args.Ptr(dst).Ptr(mapped).Uint64(n)
		err = s.d.api.LaunchKernel(s.d.copy, cuda.Dim3{X: s.d.grid(max(n/16, 1)), Y: 1, Z: 1},
			cuda.Dim3{X: kernelThreads, Y: 1, Z: 1}, 0, s.s, &s.args)
	case H2DPadded:
		if err = s.d.api.MemcpyHtoDAsync(s.pad.ptr, p, SmallH2DBytes, s.s); err == nil {
			err = s.d.api.MemcpyDtoDAsync(dst, s.pad.ptr, n, s.s)
		}
	default:
		err = s.d.api.MemcpyHtoDAsync(dst, p, n, s.s)
	}
	if err != nil {
		return fmt.Errorf("queueing a %d-byte copy from host (%s): %w", n, mode, err)
	}
	return nil
}

// CopyBuffer queues a device-to-device copy (also between a local buffer and
// a peer's opened through IPC).
func (s *cudaStream) CopyBuffer(dst Buffer, dstOff int, src Buffer, srcOff int, n int) error {
	db, err := s.d.buffer(dst)
	if err != nil {
		return err
	}
	sb, err := s.d.buffer(src)
	if err != nil {
		return err
	}
	if err := spanCheck(db.n, dstOff, n, "copy destination"); err != nil {
		return err
	}
	if err := spanCheck(sb.n, srcOff, n, "copy source"); err != nil {
		return err
	}
	if err := s.check(); err != nil || n == 0 {
		return err
	}
	if err := s.d.bind(); err != nil {
		return err
	}
	defer s.d.unbind()
	if err := s.d.api.MemcpyDtoDAsync(db.ptr+cuda.DevicePtr(dstOff), sb.ptr+cuda.DevicePtr(srcOff), uint64(n), s.s); err != nil {
		return fmt.Errorf("queueing a %d-byte device copy: %w", n, err)
	}
	return nil
}

// ReduceFromHost queues dst[dstOff:] = op(dst[dstOff:], srcs...) with the
// kernel reading the registered host sources directly through their mapped
// device addresses (no staging copy; CUDAConfig.StageReduce StageAll
// stages them). Avg reduces as Sum; finish with Scale. Sources and dst
// that are 16-byte aligned take the vectorised path.
func (s *cudaStream) ReduceFromHost(dst Buffer, dstOff int, srcs [][]byte, dt DType, op Op) error {
	return s.reduceFromHost(dst, dstOff, srcs, dt, op, s.d.stage == StageAll)
}

// ReduceFromHostStaged is ReduceFromHost with sources of StageReduceBytes
// and more copied into device memory by the copy engines first (unless
// CUDAConfig.StageReduce is StageNone): comm.StagingReducer.
func (s *cudaStream) ReduceFromHostStaged(dst Buffer, dstOff int, srcs [][]byte, dt DType, op Op) error {
	return s.reduceFromHost(dst, dstOff, srcs, dt, op, s.d.stage != StageNone)
}

func (s *cudaStream) reduceFromHost(dst Buffer, dstOff int, srcs [][]byte, dt DType, op Op, stage bool) error {
	if len(srcs) == 0 {
		return fmt.Errorf("reduce with no sources: %w", ErrInvalid)
	}
	n := len(srcs[0])
	b, err := s.prepare(dst, dstOff, n, dt, op)
	if err != nil {
		return err
	}
	for i, src := range srcs {
		if len(src) != n {
			return fmt.Errorf("reduce source %d has %d bytes, want %d: %w", i, len(src), n, ErrInvalid)
		}
	}
	if err := s.check(); err != nil || n == 0 {
		return err
	}
	if stage && n >= StageReduceBytes {
		return s.reduceStaged(b.ptr+cuda.DevicePtr(dstOff), srcs, n, dt, op)
	}
	if err := s.d.bind(); err != nil {
		return err
	}
	defer s.d.unbind()
	for lo := 0; lo < len(srcs); lo += maxKernelSrcs {
		batch := srcs[lo:min(lo+maxKernelSrcs, len(srcs))]
		for j, src := range batch {
			p, err := s.d.mapped(src)
			if err != nil {
				return fmt.Errorf("reduce source %d: %w", lo+j, err)
			}
			if uintptr(p)%uintptr(dt.Size()) != 0 {
				return fmt.Errorf("reduce source %d at %#x is not aligned to its %d-byte elements: %w", lo+j, uint64(p), dt.Size(), ErrInvalid)
			}
			s.ptrs[j] = p
		}
		if err := s.launchReduce(b.ptr+cuda.DevicePtr(dstOff), s.ptrs[:len(batch)], n, dt, op); err != nil {
			return err
		}
	}
	return nil
}

// reduceStaged is a staged ReduceFromHost: up to 8
// sources at a time are copied by the copy engines into the stream's
// scratch buffer (host-to-device DMA, the link's full rate) and the kernel
// reduces them from device memory, instead of reading them over the link
// itself (its reads of mapped host memory ran at about 24 GiB/s for a whole
// H200, half the copy engines' rate). The next batch's copies queue behind
// the kernel that reads the scratch, so one buffer serves every batch.
func (s *cudaStream) reduceStaged(dst cuda.DevicePtr, srcs [][]byte, n int, dt DType, op Op) error {
	stride := (n + 255) &^ 255
	need := min(len(srcs), maxKernelSrcs) * stride
	if s.stage == nil || s.stage.n < need {
		// Powers of two: a stream outgrows its buffer a few times at most.
		need = 1 << bits.Len(uint(need-1))
		if s.stage != nil {
			// Queued kernels may still read the old buffer: it goes with the
			// stream (growth is rare: the sizes follow the arena's chunk).
			s.retire = append(s.retire, s.stage)
			s.stage = nil
		}
		buf, err := s.d.Alloc(need)
		if err != nil {
			return fmt.Errorf("allocating the staging buffer of device reductions: %w", err)
		}
		s.stage = buf.(*CUDABuffer)
	}
	if err := s.d.bind(); err != nil {
		return err
	}
	defer s.d.unbind()
	for lo := 0; lo < len(srcs); lo += maxKernelSrcs {
		batch := srcs[lo:min(lo+maxKernelSrcs, len(srcs))]
		for j, src := range batch {
			p := s.stage.ptr + cuda.DevicePtr(j*stride)
			if err := s.d.api.MemcpyHtoDAsync(p, unsafe.Pointer(unsafe.SliceData(src)), uint64(n), s.s); err != nil {
				return fmt.Errorf("staging reduce source %d: %w", lo+j, err)
			}
			s.ptrs[j] = p
		}
		if err := s.launchReduce(dst, s.ptrs[:len(batch)], n, dt, op); err != nil {
			return err
		}
	}
	return nil
}

// ReduceBuffers queues dst[dstOff:dstOff+n] = op(dst[...], srcs[i] ...) over
// device buffers (local, or peers' opened with OpenPeerBuffer). n is in bytes.
func (s *cudaStream) ReduceBuffers(dst Buffer, dstOff int, srcs []BufferSpan, n int, dt DType, op Op) error {
	if len(srcs) == 0 {
		return fmt.Errorf("reduce with no sources: %w", ErrInvalid)
	}
	b, err := s.prepare(dst, dstOff, n, dt, op)
	if err != nil {
		return err
	}
	for i, sp := range srcs {
		sb, err := s.d.buffer(sp.Buf)
		if err != nil {
			return fmt.Errorf("reduce source %d: %w", i, err)
		}
		if err := spanCheck(sb.n, sp.Off, n, "reduce source"); err != nil {
			return err
		}
		if sp.Off%dt.Size() != 0 {
			return fmt.Errorf("reduce source %d offset %d is not a multiple of %d: %w", i, sp.Off, dt.Size(), ErrInvalid)
		}
	}
	if err := s.check(); err != nil || n == 0 {
		return err
	}
	if err := s.d.bind(); err != nil {
		return err
	}
	defer s.d.unbind()
	for lo := 0; lo < len(srcs); lo += maxKernelSrcs {
		batch := srcs[lo:min(lo+maxKernelSrcs, len(srcs))]
		for j, sp := range batch {
			s.ptrs[j] = sp.Buf.(*CUDABuffer).ptr + cuda.DevicePtr(sp.Off)
		}
		if err := s.launchReduce(b.ptr+cuda.DevicePtr(dstOff), s.ptrs[:len(batch)], n, dt, op); err != nil {
			return err
		}
	}
	return nil
}

// prepare validates a reduction's destination, size, dtype and op.
func (s *cudaStream) prepare(dst Buffer, dstOff, n int, dt DType, op Op) (*CUDABuffer, error) {
	if dt < 0 || dt >= numDTypes {
		return nil, fmt.Errorf("dtype %d: %w", int(dt), ErrInvalid)
	}
	if op < Sum || op > Max {
		return nil, fmt.Errorf("op %d: %w", int(op), ErrInvalid)
	}
	b, err := s.d.buffer(dst)
	if err != nil {
		return nil, err
	}
	if err := spanCheck(b.n, dstOff, n, "reduce destination"); err != nil {
		return nil, err
	}
	if n%dt.Size() != 0 || dstOff%dt.Size() != 0 {
		return nil, fmt.Errorf("reducing %d bytes at offset %d of %d-byte elements: %w", n, dstOff, dt.Size(), ErrInvalid)
	}
	return b, nil
}

// launchReduce launches one reduce kernel; the caller holds the context.
func (s *cudaStream) launchReduce(dst cuda.DevicePtr, srcs []cuda.DevicePtr, n int, dt DType, op Op) error {
	clear(s.srcs[:])
	for j, p := range srcs {
		binary.LittleEndian.PutUint64(s.srcs[8*j:], uint64(p))
	}
	elems := uint64(n / dt.Size())
	s.args.Reset()
	s.args.Ptr(dst).Bytes(s.srcs[:], 8).Int32(int32(len(srcs))).Uint64(elems)
	grid := s.d.grid(max(elems/uint64(16/dt.Size()), 1))
	if err := s.d.api.LaunchKernel(s.d.reduce[dt][reduceOp(op)], cuda.Dim3{X: grid, Y: 1, Z: 1},
		cuda.Dim3{X: kernelThreads, Y: 1, Z: 1}, 0, s.s, &s.args); err != nil {
		return fmt.Errorf("launching %s over %d elements: %w", reduceKernel(dt, reduceOp(op)), elems, err)
	}
	return nil
}

// Scale queues dst[off:off+n] /= div (n in bytes).
func (s *cudaStream) Scale(dst Buffer, off, n int, dt DType, div int) error {
	if div <= 0 {
		return fmt.Errorf("scaling by %d: %w", div, ErrInvalid)
	}
	b, err := s.prepare(dst, off, n, dt, Sum)
	if err != nil {
		return err
	}
	if err := s.check(); err != nil || n == 0 || div == 1 {
		return err
	}
	if err := s.d.bind(); err != nil {
		return err
	}
	defer s.d.unbind()
	elems := uint64(n / dt.Size())
	s.args.Reset()
	s.args.Ptr(b.ptr + cuda.DevicePtr(off)).Uint64(elems).Int64(int64(div))
	grid := s.d.grid(elems)
	if err := s.d.api.LaunchKernel(s.d.scale[dt], cuda.Dim3{X: grid, Y: 1, Z: 1},
		cuda.Dim3{X: kernelThreads, Y: 1, Z: 1}, 0, s.s, &s.args); err != nil {
		return fmt.Errorf("launching %s over %d elements: %w", scaleKernel(dt), elems, err)
	}
	return nil
}

// Record queues an event. Its handle returns to the device's pool once the
// Event is unreachable, so recording does not create driver objects in the
// steady state.
func (s *cudaStream) Record() (Event, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	if err := s.d.bind(); err != nil {
		return nil, err
	}
	defer s.d.unbind()
	e, err := s.d.event()
	if err != nil {
		return nil, err
	}
	if err := s.d.api.EventRecord(e, s.s); err != nil {
		s.d.recycle(e)
		return nil, fmt.Errorf("recording a CUDA event: %w", err)
	}
	ev := &cudaEvent{d: s.d, e: e}
	d := s.d
	runtime.AddCleanup(ev, func(e cuda.Event) { d.recycle(e) }, e)
	return ev, nil
}

// RecordEvent records ev (from NewSharedEvent, or this device's Record) on
// the stream again, e.g. to signal a peer process.
func (s *cudaStream) RecordEvent(ev Event) error {
	e, ok := ev.(*cudaEvent)
	if !ok || e.d != s.d {
		return fmt.Errorf("event %T is not this device's: %w", ev, ErrInvalid)
	}
	if err := s.check(); err != nil {
		return err
	}
	if err := s.d.bind(); err != nil {
		return err
	}
	defer s.d.unbind()
	if err := s.d.api.EventRecord(e.e, s.s); err != nil {
		return fmt.Errorf("recording a CUDA event: %w", err)
	}
	return nil
}

// WaitEvent makes work queued on the stream after it wait, on the device,
// until ev completes (ev may belong to another stream or, opened with
// OpenPeerEvent, to another process). It does not block the caller.
func (s *cudaStream) WaitEvent(ev Event) error {
	e, ok := ev.(*cudaEvent)
	if !ok || e.d != s.d {
		return fmt.Errorf("event %T is not this device's: %w", ev, ErrInvalid)
	}
	if err := s.check(); err != nil {
		return err
	}
	if err := s.d.bind(); err != nil {
		return err
	}
	defer s.d.unbind()
	if err := s.d.api.StreamWaitEvent(s.s, e.e, 0); err != nil {
		return fmt.Errorf("ordering a CUDA stream after an event: %w", err)
	}
	return nil
}

// Synchronize waits until everything queued has completed or ctx ends; it
// polls the stream (no blocking driver call), so a deadline is honoured.
func (s *cudaStream) Synchronize(ctx context.Context) error {
	if err := s.check(); err != nil {
		return err
	}
	return s.d.poll(ctx, "synchronizing a CUDA stream", func() error { return s.d.api.StreamQuery(s.s) })
}

// Close waits for queued work and destroys the stream.
func (s *cudaStream) Close() error {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	if s.closed || s.gone {
		s.closed = true
		return nil
	}
	if err := s.d.bind(); err != nil {
		return err
	}
	defer s.d.unbind()
	delete(s.d.streams, s)
	return s.destroy()
}

// destroy synchronises and destroys the stream; caller holds d.mu and the context.
func (s *cudaStream) destroy() error {
	if s.gone {
		return nil
	}
	s.gone, s.closed = true, true
	// Drain by polling, for at most streamDrainTimeout: a stream blocked on
	// a flag word nobody will write (a failed job) must not hang Close. One
	// that does not drain is destroyed all the same (the driver frees it
	// once its work is done) and keeps its scratch buffers.
	drained, serr := false, error(nil)
	for deadline := time.Now().Add(streamDrainTimeout); ; {
		err := s.d.api.StreamQuery(s.s)
		if err == nil {
			drained = true
			break
		}
		if err != cuda.ErrNotReady {
			serr = err
			break
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Microsecond)
	}
	if err := s.d.api.StreamDestroy(s.s); err != nil {
		return fmt.Errorf("destroying a CUDA stream: %w", err)
	}
	if serr != nil {
		return fmt.Errorf("draining a CUDA stream: %w", serr)
	}
	if !drained {
		// Leak what the work may still touch: the scratch buffers leave
		// the device's books (its Close would free them), and the device
		// keeps its registrations and module at Close.
		for _, b := range append(s.retire, s.stage, s.pad) {
			if b != nil {
				delete(s.d.allocs, b)
			}
		}
		s.stage, s.pad, s.retire = nil, nil, nil
		s.d.tainted = true
		return fmt.Errorf("a CUDA stream still busy after %v, destroyed: %w", streamDrainTimeout, ErrNotDrained)
	}
	// Its scratch buffers go with it (drained: nothing reads them).
	for _, b := range append(s.retire, s.stage, s.pad) {
		if b != nil {
			delete(s.d.allocs, b)
			if err := s.d.freeLocked(b); err != nil {
				return err
			}
		}
	}
	s.stage, s.pad, s.retire = nil, nil, nil
	return nil
}

// streamDrainTimeout bounds how long destroying a stream waits for its work.
const streamDrainTimeout = 10 * time.Second

// cudaEvent is a CUDA event (disable-timing).
type cudaEvent struct {
	d      *CUDADevice
	e      cuda.Event
	shared bool // created by NewSharedEvent / OpenPeerEvent: owned, not pooled
}

// Done reports whether the work before the event has completed.
func (e *cudaEvent) Done() (bool, error) {
	if err := e.d.bind(); err != nil {
		return false, err
	}
	defer e.d.unbind()
	err := e.d.api.EventQuery(e.e)
	runtime.KeepAlive(e)
	switch {
	case err == nil:
		return true, nil
	case err == cuda.ErrNotReady:
		return false, nil
	}
	return false, fmt.Errorf("querying a CUDA event: %w", err)
}

// Wait polls the event until it completes or ctx ends.
func (e *cudaEvent) Wait(ctx context.Context) error {
	err := e.d.poll(ctx, "waiting for a CUDA event", func() error { return e.d.api.EventQuery(e.e) })
	runtime.KeepAlive(e)
	return err
}
