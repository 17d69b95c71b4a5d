package trainer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/migctl/migctl/allreduce"
	"github.com/migctl/migctl/comm"
)

// Work is a collective issued with an Async method.
type Work struct {
	name  string
	op    string // the daemon's metric name ("" for copies)
	bytes int
	ctx   context.Context
	run   func(ctx context.Context) error
	// chains: the collective may let the next one start before it has
	// ended (a host-staged all-reduce on buffers used in place, see work).
	chains bool
	// after are events recorded on the callers' streams when the call was
	// made: the collective starts once they complete.
	after []comm.Event
	done  chan struct{}
	err   error

	mu       sync.Mutex
	finished bool             // finish ran (under mu)
	then     func(error)      // OnDone's, called by finish
	onReady  func(comm.Event) // OnReady's, called by setReady
	readyEv  comm.Event       // what setReady got (nil: not yet, or never)
}

// setReady is the executor's call (allreduce.WithReady): w's result is
// queued on the device behind ev.
func (w *Work) setReady(ev comm.Event) {
	w.mu.Lock()
	w.readyEv = ev
	f := w.onReady
	w.onReady = nil
	w.mu.Unlock()
	if f != nil {
		f(ev)
	}
}

// OnReady has f called, once, when the collective's result is determined
// and queued on the device before the collective has finished: with an
// event that completes once the result is in the receive buffer. Then only
// this rank's copies back remain (no peer is waited for any more), and a
// caller that orders its stream after the event (Group.OrderStream) may go
// on without waiting for Done, as NCCL's callers do; a failure after that
// still fails the Work, and every later collective of the group. Only an
// asynchronous all-reduce that chains (Group.Chains) on a group that orders
// streams (device buffers, no swap daemon) readies early, and only with
// Tuning.CompleteOnDevice; for any other collective, or one that failed first,
// f is never called and Done says when the result is there. f runs on the
// collective's goroutine, or at once on the caller's if the result is
// queued already; it must not block. One function per Work.
func (w *Work) OnReady(f func(ev comm.Event)) {
	w.mu.Lock()
	ev := w.readyEv
	if ev == nil && !w.finished {
		w.onReady = f
	}
	w.mu.Unlock()
	if ev != nil {
		f(ev)
	}
}

// finish records err as w's result, closes Done and calls the function
// OnDone registered, if any, on the calling goroutine.
func (w *Work) finish(err error) {
	w.err = err
	close(w.done)
	w.mu.Lock()
	w.finished = true
	f := w.then
	w.then = nil
	w.mu.Unlock()
	if f != nil {
		f(err)
	}
}

// OnDone has f called with the collective's error once it has finished:
// by the goroutine that finishes it, right then (no goroutine of the
// caller's waits for Done), or at once, on the calling goroutine, if it has
// finished already. f must not block; one function per Work (a second
// replaces the first if the work is still running).
func (w *Work) OnDone(f func(error)) {
	w.mu.Lock()
	if !w.finished && w.done != doneChan {
		w.then = f
		w.mu.Unlock()
		return
	}
	w.mu.Unlock()
	<-w.done
	f(w.err)
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
	w := &Work{name: name, done: make(chan struct{})}
	w.finish(err)
	return w
}

// issue makes run the next collective; op and bytes name it for the
// daemon's metrics ("" for copies). ctx bounds it (with the group's deadline
// on top, which does not run while the job is held). The collective is
// ordered after the work queued so far on the streams of the device buffers
// in bufs: an event is recorded on each stream here, at the call, so it
// waits for the kernels that produced its input and not for whatever the
// caller queues after the call (a backward pass goes on while its gradient
// buckets are reduced).
//
// Asynchronous calls (inline false) are queued for the worker goroutine.
// A synchronous call (inline: its caller waits for it anyway) runs on the
// caller's goroutine when nothing is queued or running, and returns done:
// no hand-off to the worker and no wake-up back, two goroutine switches
// per call that cost microseconds each on a busy host. Otherwise it is
// queued like the others, so collectives keep the order of their calls.
func (g *Group) issue(ctx context.Context, inline bool, name, op string, bytes int, run func(ctx context.Context) error, bufs ...Buffer) *Work {
	return g.submit(inline, &Work{name: name, op: op, bytes: bytes, ctx: ctx, run: run}, bufs...)
}

// submit is issue for a Work made by the caller.
func (g *Group) submit(inline bool, w *Work, bufs ...Buffer) *Work {
	name := w.name
	after, err := g.recordStreams(bufs...)
	if err != nil {
		return failed(name, fmt.Errorf("%s: %w", name, err))
	}
	w.after = after
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return failed(name, fmt.Errorf("%s: %w", name, ErrClosed))
	}
	if inline && g.pending.CompareAndSwap(0, 1) {
		// Nothing queued or running: this call is next in order, and
		// whatever is issued while it runs queues behind it (the worker
		// waits for running).
		g.inlined.Add(1)
		// Taken before g.mu is let go, so that nothing issued after this
		// call runs before it (the worker is idle: it let running go
		// before it counted its last collective out of pending).
		g.running.Lock()
		g.mu.Unlock()
		g.runInline(w)
		return w
	}
	w.done = make(chan struct{})
	g.pending.Add(1)
	g.queue <- w
	g.mu.Unlock()
	return w
}

// runInline runs w on the calling goroutine (issue claimed the order for
// it: pending and inlined counted it, and it holds running). The CUDA
// context current on the caller's thread is as it was before
// (comm.CUDADevice.KeepThreadContext): a caller that locked its thread to
// work in a context of its own finds that one again.
func (g *Group) runInline(w *Work) {
	defer g.inlined.Done()
	defer g.pending.Add(-1)
	defer g.running.Unlock()
	if d, ok := g.dev.(*comm.CUDADevice); ok {
		defer d.KeepThreadContext()()
	}
	w.err = g.runWork(w, g.clock, nil)
	w.done = doneChan
}

// doneChan is the Done of work that finished before its call returned.
var doneChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// work runs the queued collectives in order, one at a time, except that a
// collective that chains (Work.chains: a host-staged all-reduce) runs on a
// goroutine of its own, and the next one starts once it admits it (its
// copies out are done: allreduce.WithAdmit) rather than once it has ended.
// At most two run at once, each under a call clock of its own (g.clock and
// g.clock2); they finish (Done, OnDone) in the order of their calls. A
// collective that does not chain starts once every earlier one has ended.
func (g *Group) work() {
	defer close(g.stopped)
	var inflight []chan struct{} // closed as each chained collective running has finished, oldest first
	drain := func(keep int) {
		for len(inflight) > keep {
			<-inflight[0]
			inflight = inflight[1:]
		}
	}
	turn := 0
	for w := range g.queue {
		g.running.Lock()
		if !w.chains {
			drain(0)
			err := g.runWork(w, g.clock, nil)
			g.running.Unlock()
			g.pending.Add(-1) // before done: the caller's next call may run inline
			w.finish(err)
			continue
		}
		drain(1) // the clock this one takes is free, and the executor lets it overlap only the last one
		if g.clock2 == nil {
			g.clock2 = newCallClock(g.hold)
		}
		clock := [2]*callClock{g.clock, g.clock2}[turn]
		turn ^= 1
		admitted := make(chan struct{})
		var once sync.Once
		admit := func() { once.Do(func() { close(admitted) }) }
		finished := make(chan struct{})
		var prev chan struct{}
		if len(inflight) > 0 {
			prev = inflight[0]
		}
		go func() {
			err := g.runWork(w, clock, admit)
			admit()
			if prev != nil {
				<-prev // finish in call order
			}
			g.pending.Add(-1)
			w.finish(err)
			close(finished)
		}()
		<-admitted
		g.running.Unlock()
		inflight = append(inflight, finished)
	}
	drain(0)
}

// runWork runs w under clock; admit, when not nil, goes to the executor
// with the call (allreduce.WithAdmit).
func (g *Group) runWork(w *Work, clock *callClock, admit func()) error {
	if err := w.ctx.Err(); err != nil {
		return fmt.Errorf("%s: %w", w.name, err)
	}
	// A held job starts nothing new: its memory is not on the GPU.
	if err := g.hold.waitReleased(w.ctx); err != nil {
		return fmt.Errorf("%s: %w", w.name, err)
	}
	ctx, stop := clock.begin(w.ctx, g.Timeout())
	defer stop()
	if admit != nil {
		ctx = allreduce.WithAdmit(ctx, admit)
	}
	if w.chains {
		// The executor orders a chainable all-reduce's copies out after the
		// caller's stream on the device (allreduce.WithAfter), so they
		// start as its work ends, not once this thread has seen it.
		ctx = allreduce.WithAfter(ctx, w.after)
	} else {
		for _, e := range w.after {
			if err := e.Wait(ctx); err != nil {
				return fmt.Errorf("%s on rank %d: waiting for the caller's stream: %w", w.name, g.rank, err)
			}
		}
	}
	w.after = nil
	if w.chains && g.CompletesEarly() {
		ctx = allreduce.WithReady(ctx, w.setReady)
	}
	start := time.Now()
	err := w.run(ctx)
	if err == nil {
		if w.op != "" {
			g.daemon.count(w.op, w.bytes, time.Since(start))
		}
		return nil
	}
	g.reportFault(err)
	if cause := context.Cause(ctx); cause != nil && errors.Is(cause, ErrTimeout) && !errors.Is(err, ErrTimeout) {
		return fmt.Errorf("%s on rank %d: %w: %w", w.name, g.rank, cause, err)
	}
	return fmt.Errorf("%s on rank %d: %w", w.name, g.rank, err)
}

// faultReporter is the rendezvous client's AbortWith: an abort naming the
// rank an error blames (its FaultRank).
type faultReporter interface {
	AbortWith(ctx context.Context, err error) error
}

// reportFault tells the job's rendezvous, once, about a peer this rank found
// dead or stalled (err matches comm.ErrPeerDead and names another rank), so
// that the launcher's summary blames that rank and not this witness: a
// stopped (SIGSTOP) or hung process keeps its rendezvous connection open,
// and only its peers' liveness checks see it. Only the job's own group on
// one node reports: a group of some ranks, or the node stage of a group
// across nodes, names ranks of its own numbering.
func (g *Group) reportFault(err error) {
	if g.parent != nil || g.node != nil || !errors.Is(err, comm.ErrPeerDead) {
		return
	}
	var fr interface{ FaultRank() int }
	if !errors.As(err, &fr) || fr.FaultRank() == g.rank || fr.FaultRank() < 0 {
		return
	}
	r, ok := g.kv.(faultReporter)
	if !ok || !g.faultReported.CompareAndSwap(false, true) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = r.AbortWith(ctx, err)
}
