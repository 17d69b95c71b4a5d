package trainer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/migctl/migctl/comm"
)

// Work is a collective issued with an Async method.
type Work struct {
	name  string
	op    string // the daemon's metric name ("" for copies)
	bytes int
	ctx   context.Context
	run   func(ctx context.Context) error
	// after are events recorded on the callers' streams when the call was
	// made: the collective starts once they complete.
	after []comm.Event
	done  chan struct{}
	err   error
}

// Wait blocks until the collective has finished and returns its error, or
// returns ctx's error if ctx ends first (the collective goes on: its buffers
// stay in use until Done is closed).
func (w *Work) Wait(ctx context.Context) error {
	select {
	case <-w.done:
		return w.err
	case <-ctx.Done():
		return fmt.Errorf("waiting for %s: %w", w.name, ctx.Err())
	}
}

// Done is closed when the collective has finished.
func (w *Work) Done() <-chan struct{} { return w.done }

// Err is the collective's error once Done is closed (nil before).
func (w *Work) Err() error {
	select {
	case <-w.done:
		return w.err
	default:
		return nil
	}
}

func failed(name string, err error) *Work {
	w := &Work{name: name, done: make(chan struct{}), err: err}
	close(w.done)
	return w
}

// submit queues run as the next collective; op and bytes name it for the
// daemon's metrics ("" for copies). ctx bounds it (with the group's deadline
// on top, which does not run while the job is held). The collective is
// ordered after the work queued so far on the streams of the device buffers
// in bufs: an event is recorded on each stream here, at the call, so it
// waits for the kernels that produced its input and not for whatever the
// caller queues after the call (a backward pass goes on while its gradient
// buckets are reduced).
func (g *Group) submit(ctx context.Context, name, op string, bytes int, run func(ctx context.Context) error, bufs ...Buffer) *Work {
	w := &Work{name: name, op: op, bytes: bytes, ctx: ctx, run: run, done: make(chan struct{})}
	after, err := g.recordStreams(bufs...)
	if err != nil {
		return failed(name, fmt.Errorf("%s: %w", name, err))
	}
	w.after = after
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return failed(name, fmt.Errorf("%s: %w", name, ErrClosed))
	}
	g.queue <- w
	return w
}

// work runs the queued collectives one at a time, in order.
func (g *Group) work() {
	defer close(g.stopped)
	defer g.clock.close()
	for w := range g.queue {
		w.err = g.runWork(w)
		close(w.done)
	}
}

func (g *Group) runWork(w *Work) error {
	if err := w.ctx.Err(); err != nil {
		return fmt.Errorf("%s: %w", w.name, err)
	}
	// A held job starts nothing new: its memory is not on the GPU.
	if err := g.hold.waitReleased(w.ctx); err != nil {
		return fmt.Errorf("%s: %w", w.name, err)
	}
	ctx, stop := g.clock.begin(w.ctx, g.cfg.timeout)
	defer stop()
	for _, e := range w.after {
		if err := e.Wait(ctx); err != nil {
			return fmt.Errorf("%s on rank %d: waiting for the caller's stream: %w", w.name, g.rank, err)
		}
	}
	w.after = nil
	start := time.Now()
	err := w.run(ctx)
	if err == nil {
		if w.op != "" {
			g.daemon.count(w.op, w.bytes, time.Since(start))
		}
		return nil
	}
	if cause := context.Cause(ctx); cause != nil && errors.Is(cause, ErrTimeout) && !errors.Is(err, ErrTimeout) {
		return fmt.Errorf("%s on rank %d: %w: %w", w.name, g.rank, cause, err)
	}
	return fmt.Errorf("%s on rank %d: %w", w.name, g.rank, err)
}
