package comm

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// HostOptions configure the host-memory Device.
type HostOptions struct {
	// ReduceWorkers bounds the goroutines one reduction uses; 0 means
	// GOMAXPROCS.
	ReduceWorkers int
}

// hostDevice is the Device on plain host memory with CPU reductions: what CI
// and machines without a GPU run.
type hostDevice struct {
	opts HostOptions
	mu   sync.Mutex
	done bool
}

var (
	_ Device        = (*hostDevice)(nil)
	_ Stream        = (*hostStream)(nil)
	_ BufferReducer = (*hostStream)(nil)
	_ Event         = (*hostEvent)(nil)
	_ Buffer        = (*HostBuffer)(nil)
)

// NewHostDevice returns a Device whose buffers are Go memory and whose
// streams run their work in order on one goroutine each. It is safe for
// concurrent use.
func NewHostDevice(opts HostOptions) Device {
	return &hostDevice{opts: opts}
}

// ReadsByDMA is whether dev's copies read registered host memory with copy
// engines (a CUDA device, real or the fake driver) rather than the CPU (the
// host device).
func ReadsByDMA(dev Device) bool {
	_, host := dev.(*hostDevice)
	return !host
}

// HostBuffer is a host Device's buffer; Bytes exposes its memory.
type HostBuffer struct{ b []byte }

// Len is the buffer's size in bytes.
func (b *HostBuffer) Len() int { return len(b.b) }

// Bytes is the buffer's memory (owned by the buffer; valid while it lives).
func (b *HostBuffer) Bytes() []byte { return b.b }

// Register is a no-op: host memory needs no pinning.
func (d *hostDevice) Register([]byte) error { return d.check() }

// Unregister is a no-op.
func (d *hostDevice) Unregister([]byte) error { return nil }

func (d *hostDevice) check() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.done {
		return fmt.Errorf("host device: %w", ErrClosed)
	}
	return nil
}

// Alloc returns a zeroed buffer of n bytes, 64-byte aligned.
func (d *hostDevice) Alloc(n int) (Buffer, error) {
	if err := d.check(); err != nil {
		return nil, err
	}
	if n < 0 {
		return nil, fmt.Errorf("allocating %d bytes: %w", n, ErrInvalid)
	}
	// Back with uint64s so that every element type is aligned.
	raw := make([]uint64, (n+63)/8)
	b := asBytes(raw)
	return &HostBuffer{b: b[:n:n]}, nil
}

// NewStream starts a stream goroutine; Close stops it.
func (d *hostDevice) NewStream() (Stream, error) {
	if err := d.check(); err != nil {
		return nil, err
	}
	s := &hostStream{dev: d, work: make(chan hostWork, 1024), quit: make(chan struct{})}
	go s.loop()
	return s, nil
}

func (d *hostDevice) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.done = true
	return nil
}

// hostStream runs queued work in order on its own goroutine. The first error
// sticks: later work is skipped and Record/Synchronize report it.
type hostStream struct {
	dev  *hostDevice
	work chan hostWork
	quit chan struct{}

	mu      sync.Mutex
	err     error
	closed  bool
	pending int        // work queued or running (mu)
	running sync.Mutex // held while a piece of work runs: the loop's, or an inline one's
}

func (s *hostStream) loop() {
	for {
		select {
		case w := <-s.work:
			s.run(w)
		case <-s.quit:
			return
		}
	}
}

// hostWork is a piece of a stream's work; always: it runs after a failure
// too (Close's marker).
type hostWork struct {
	f      func() error
	always bool
}

// run runs w unless an earlier piece failed, keeping its error.
func (s *hostStream) run(w hostWork) {
	s.running.Lock()
	s.mu.Lock()
	failed := s.err != nil && !w.always
	s.mu.Unlock()
	var err error
	if !failed {
		err = w.f()
	}
	s.running.Unlock()
	s.mu.Lock()
	if err != nil {
		s.err = err
	}
	s.pending--
	s.mu.Unlock()
}

// enqueue queues f behind the stream's work. Under HoldYields (a collective
// on a thread locked to its goroutine, which must not wait for another
// goroutine) f runs at once on the caller's goroutine when nothing is
// queued or running: the same order, without the hand-off to the loop.
func (s *hostStream) enqueue(f func() error) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return fmt.Errorf("host stream: %w", ErrClosed)
	}
	if err := s.err; err != nil {
		s.mu.Unlock()
		return err
	}
	s.pending++
	inline := s.pending == 1 && held.Load() > 0
	s.mu.Unlock()
	if inline {
		s.run(hostWork{f: f})
		return nil
	}
	s.work <- hostWork{f: f}
	return nil
}

func hostBytes(b Buffer) ([]byte, error) {
	hb, ok := b.(*HostBuffer)
	if !ok {
		return nil, fmt.Errorf("buffer %T is not a host buffer: %w", b, ErrInvalid)
	}
	return hb.b, nil
}

func span(b []byte, off, n int, what string) ([]byte, error) {
	if off < 0 || n < 0 || off+n > len(b) {
		return nil, fmt.Errorf("%s [%d, %d) outside %d-byte buffer: %w", what, off, off+n, len(b), ErrInvalid)
	}
	return b[off : off+n], nil
}

func (s *hostStream) CopyToHost(dst []byte, src Buffer, srcOff int) error {
	sb, err := hostBytes(src)
	if err != nil {
		return err
	}
	from, err := span(sb, srcOff, len(dst), "copy source")
	if err != nil {
		return err
	}
	return s.enqueue(func() error { copy(dst, from); return nil })
}

func (s *hostStream) CopyFromHost(dst Buffer, dstOff int, src []byte) error {
	db, err := hostBytes(dst)
	if err != nil {
		return err
	}
	to, err := span(db, dstOff, len(src), "copy destination")
	if err != nil {
		return err
	}
	return s.enqueue(func() error { copy(to, src); return nil })
}

func (s *hostStream) CopyBuffer(dst Buffer, dstOff int, src Buffer, srcOff int, n int) error {
	db, err := hostBytes(dst)
	if err != nil {
		return err
	}
	sb, err := hostBytes(src)
	if err != nil {
		return err
	}
	to, err := span(db, dstOff, n, "copy destination")
	if err != nil {
		return err
	}
	from, err := span(sb, srcOff, n, "copy source")
	if err != nil {
		return err
	}
	return s.enqueue(func() error { copy(to, from); return nil })
}

func (s *hostStream) ReduceFromHost(dst Buffer, dstOff int, srcs [][]byte, dt DType, op Op) error {
	if len(srcs) == 0 {
		return fmt.Errorf("reduce with no sources: %w", ErrInvalid)
	}
	db, err := hostBytes(dst)
	if err != nil {
		return err
	}
	to, err := span(db, dstOff, len(srcs[0]), "reduce destination")
	if err != nil {
		return err
	}
	if op == Avg {
		op = Sum // the caller finishes with Scale
	}
	all := make([][]byte, 0, len(srcs)+1)
	all = append(all, to)
	all = append(all, srcs...)
	workers := s.dev.opts.ReduceWorkers
	return s.enqueue(func() error { return ReduceHost(to, all, dt, op, workers) })
}

// ReduceBuffers implements BufferReducer for host buffers (in one process,
// another rank's HostBuffer stands in for a buffer opened through IPC).
func (s *hostStream) ReduceBuffers(dst Buffer, dstOff int, srcs []BufferSpan, n int, dt DType, op Op) error {
	db, err := hostBytes(dst)
	if err != nil {
		return err
	}
	to, err := span(db, dstOff, n, "reduce destination")
	if err != nil {
		return err
	}
	all := [][]byte{to}
	for i, sp := range srcs {
		sb, err := hostBytes(sp.Buf)
		if err != nil {
			return err
		}
		from, err := span(sb, sp.Off, n, fmt.Sprintf("reduce source %d", i))
		if err != nil {
			return err
		}
		all = append(all, from)
	}
	if op == Avg {
		op = Sum
	}
	workers := s.dev.opts.ReduceWorkers
	return s.enqueue(func() error { return ReduceHost(to, all, dt, op, workers) })
}

func (s *hostStream) Scale(dst Buffer, off, n int, dt DType, div int) error {
	db, err := hostBytes(dst)
	if err != nil {
		return err
	}
	to, err := span(db, off, n, "scale range")
	if err != nil {
		return err
	}
	return s.enqueue(func() error { return ScaleHost(to, dt, div) })
}

func (s *hostStream) Record() (Event, error) {
	ev := &hostEvent{ch: make(chan struct{}), s: s}
	if err := s.enqueue(func() error { close(ev.ch); return nil }); err != nil {
		return nil, err
	}
	return ev, nil
}

func (s *hostStream) Synchronize(ctx context.Context) error {
	ev, err := s.Record()
	if err != nil {
		return err
	}
	return ev.Wait(ctx)
}

// Close stops the stream goroutine once queued work has run.
func (s *hostStream) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.pending++
	s.mu.Unlock()
	done := make(chan struct{})
	s.work <- hostWork{f: func() error { close(done); return nil }, always: true}
	<-done
	close(s.quit)
	return nil
}

// hostEvent completes when its stream reaches it. If work before it failed,
// the event never closes its channel; Done and Wait report the stream error.
type hostEvent struct {
	ch chan struct{}
	s  *hostStream
}

func (e *hostEvent) streamErr() error {
	e.s.mu.Lock()
	defer e.s.mu.Unlock()
	return e.s.err
}

// Ready is closed when the stream reaches the event: host events can be
// waited for in a select, without polling.
func (e *hostEvent) Ready() <-chan struct{} { return e.ch }

func (e *hostEvent) Done() (bool, error) {
	select {
	case <-e.ch:
		return true, nil
	default:
		return false, e.streamErr()
	}
}

func (e *hostEvent) Wait(ctx context.Context) error {
	for {
		select {
		case <-e.ch:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("waiting for host event: %w", ctx.Err())
		case <-time.After(time.Millisecond):
			if err := e.streamErr(); err != nil {
				return err
			}
		}
	}
}
