package allreduce

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/migctl/migctl/comm"
)

// Stream-ordered calls (RunOrdered): a small all-reduce on the devices whose
// streams wait for the flags themselves needs no CPU once it is queued, so
// RunOrdered returns as soon as it is, with the event that completes with
// it; the caller orders its own stream after that event (as NCCL's callers
// do) instead of waiting. The executor settles such calls later, in order:
// before any other call, when more than maxPending are outstanding, and at
// Close — settling waits for the event with the transport's checks and then
// publishes the end-of-call flag. Meanwhile a watchdog goroutine polls the
// outstanding calls and, when one cannot finish (the abort flag, a dead
// peer, its deadline), raises the abort flag and releases the device waits
// of every outstanding call, so that no stream (the caller's included)
// waits forever; the next call then fails.

// maxPending bounds the stream-ordered calls outstanding: the next one
// first settles the oldest.
const maxPending = 8

// watchEvery is how often the watchdog looks at outstanding calls.
const watchEvery = 2 * time.Millisecond

// pendingCall is a stream-ordered call queued and not yet settled.
type pendingCall struct {
	ev       comm.Event
	epoch    uint64
	sched    Schedule
	deadline time.Time
}

// orderedState is the executor's part for stream-ordered calls.
type orderedState struct {
	mu      sync.Mutex
	pending []pendingCall
	// released are calls released after a failure (releaseWaits) whose
	// events have not completed: the watchdog releases them again every
	// tick, without a time limit, until they have (a peer's stream may
	// write its own flag after a release and lower it).
	released []pendingCall
	watching bool
	kick     chan struct{} // a call was queued: the watchdog wakes (it sleeps while none is outstanding)
	stop     chan struct{} // closed by Close: the watchdog ends
	stopped  chan struct{} // closed by the watchdog when it ends
}

// CanOrder reports whether RunOrdered would queue sched and return rather
// than run it to the end: a small all-reduce or a one-chunk broadcast with
// its flags on the devices (Params.SmallOnDevice), on streams that wait for
// the flags themselves, without tracing.
func (e *Executor) CanOrder(sched Schedule) bool {
	p := sched.Params
	small := p.Algorithm == HostStagedSmall && p.Coll == AllReduce
	bcast := p.Algorithm == HostStaged && p.Coll == Broadcast
	return e.words != nil && e.trace == nil && p.SmallOnDevice && (small || bcast) &&
		p.World == e.tr.World() && len(e.lanesOf(sched.Steps[e.tr.Rank()])[LaneIn]) == len(sched.Steps[e.tr.Rank()])
}

// RunOrdered is Run for a caller that orders its own stream after the
// returned event: for a schedule CanOrder accepts it queues the call and
// returns its completion event (the receive buffer holds the result once
// the event has completed); for any other it runs Run and returns a nil
// event. ctx's deadline bounds the call also after RunOrdered returned
// (the watchdog enforces it).
func (e *Executor) RunOrdered(ctx context.Context, sched Schedule, call Call) (comm.Event, error) {
	// A broadcast that needs the fence waits for it here, on the CPU, and is
	// queued after it (its own outstanding calls settled first: the fence
	// waits for this rank's end-of-call flag too); an all-reduce that needs
	// it runs to the end.
	fence := e.calls > 0 && needsFenceAfter(e.prev, e.fenced, sched.Params)
	if !e.CanOrder(sched) || fence && sched.Params.Coll != Broadcast {
		return nil, e.Run(ctx, sched, call) // a large all-reduce may chain there
	}
	e.waitChain() // a chained all-reduce still running ends first (chain.go)
	if err := e.precheck(ctx, sched, true); err != nil {
		return nil, err
	}
	// The caller's marks first, before anything is published: a mark the
	// lane cannot wait for on the device is waited for here, on the CPU,
	// rather than failing the job after its signature went out.
	if err := e.orderAfter(ctx, e.streams[LaneIn], afterOf(ctx, call)); err != nil {
		return nil, err
	}
	call.After = nil
	e.ord.mu.Lock()
	full := len(e.ord.pending) >= maxPending
	e.ord.mu.Unlock()
	settle := 0
	switch {
	case fence:
		settle = -1
	case full:
		settle = 1
	}
	if settle != 0 {
		if err := e.settle(ctx, settle); err != nil {
			return nil, err
		}
	}
	e.calls++
	epoch := epochOf(e.calls)
	e.maxEpoch.Store(epoch)
	if fence {
		if err := e.fence(ctx, epoch); err != nil {
			return nil, e.fail(sched, err)
		}
	}
	if err := e.publishSignature(epoch, signatureOf(sched.Params, call)); err != nil {
		return nil, e.fail(sched, err)
	}
	e.prev, e.fenced = sched.Params, fence || e.calls == 1
	r := e.tr.Rank()
	// A new event, not a reused one: the caller's stream waits for it and
	// the watchdog polls it until it is settled.
	ev, err := e.queueDeviceLane(LaneIn, e.lanesOf(sched.Steps[r])[LaneIn], call, epoch, sched.Params.World, false)
	if err != nil {
		return nil, e.fail(sched, err)
	}
	deadline, _ := ctx.Deadline()
	e.ord.mu.Lock()
	e.ord.pending = append(e.ord.pending, pendingCall{ev: ev, epoch: epoch, sched: sched, deadline: deadline})
	e.wakeWatchLocked()
	e.ord.mu.Unlock()
	return ev, nil
}

// queuedName names a stream-ordered call in errors: a small all-reduce or
// a broadcast (the two that RunOrdered queues).
func queuedName(c Coll) string {
	if c == Broadcast {
		return "a broadcast"
	}
	return "a small all-reduce"
}

// orderAfter makes work queued on s from now on wait for the caller's
// events: on the device where s can (comm.EventStream), on the CPU for an
// event it cannot take (another device's, or not a device event at all)
// and for every event when s is nil;
// an event that has completed (comm.Idle: the caller's stream was idle)
// needs neither.
func (e *Executor) orderAfter(ctx context.Context, s comm.Stream, after []comm.Event) error {
	es, _ := s.(comm.EventStream)
	for _, ev := range after {
		if comm.Idle(ev) {
			continue
		}
		if es != nil {
			err := es.WaitEvent(ev)
			if err == nil {
				continue
			}
			if !errors.Is(err, comm.ErrInvalid) {
				return fmt.Errorf("ordering the call after the caller's stream: %w", err)
			}
		}
		if err := ev.Wait(ctx); err != nil {
			return fmt.Errorf("waiting for the work that produces the input: %w", err)
		}
	}
	return nil
}

// wakeWatchLocked starts the watchdog if it is not running and wakes it.
// The caller holds e.ord.mu.
func (e *Executor) wakeWatchLocked() {
	if !e.ord.watching {
		e.ord.watching = true
		e.ord.kick, e.ord.stop, e.ord.stopped = make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
		go e.watch(e.ord.kick, e.ord.stop, e.ord.stopped)
	}
	select {
	case e.ord.kick <- struct{}{}:
	default:
	}
}

// addReleased releases the device waits of calls and hands them to the
// watchdog, which releases them again until their events completed (each
// call once: by epoch).
func (e *Executor) addReleased(calls ...pendingCall) {
	for _, p := range calls {
		e.releaseWaits(p.sched)
	}
	e.ord.mu.Lock()
	defer e.ord.mu.Unlock()
next:
	for _, p := range calls {
		for _, q := range e.ord.released {
			if q.epoch == p.epoch {
				continue next
			}
		}
		e.ord.released = append(e.ord.released, p)
	}
	if len(e.ord.released) > 0 {
		e.wakeWatchLocked()
	}
}

// precheck is what every call checks first. drain: whether the streams are
// this goroutine's to drain on a failure (not while an earlier call runs
// beside this one: chain.go).
func (e *Executor) precheck(ctx context.Context, sched Schedule, drain bool) error {
	if err := e.brokenErr(); err != nil {
		return fmt.Errorf("communicator unusable after an earlier failure: %w", err)
	}
	if err := e.tr.Aborted(); err != nil {
		e.setBroken(err, nil)
		if drain {
			e.drain(e.releasePending()...)
		}
		return err
	}
	if sched.Params.World != e.tr.World() {
		return fmt.Errorf("schedule for %d ranks on a %d-rank transport: %w", sched.Params.World, e.tr.World(), comm.ErrInvalid)
	}
	if _, ok := ctx.Deadline(); !ok {
		return fmt.Errorf("collective without a deadline: %w", comm.ErrInvalid)
	}
	return nil
}

// settle waits for the oldest n outstanding stream-ordered calls (n < 0:
// all) in order and publishes each one's end-of-call flag.
func (e *Executor) settle(ctx context.Context, n int) error {
	for i := 0; n < 0 || i < n; i++ {
		e.ord.mu.Lock()
		if len(e.ord.pending) == 0 {
			e.ord.mu.Unlock()
			return nil
		}
		p := e.ord.pending[0]
		e.ord.mu.Unlock()
		err := e.waitDevice(ctx, p.ev)
		if err == nil {
			err = e.tr.Aborted() // a failed rank released the device waits
		}
		if err != nil {
			return e.fail(p.sched, fmt.Errorf("%s queued before this call: %w", queuedName(p.sched.Params.Coll), err))
		}
		e.tr.Set(FlagOf(e.tr.Rank(), RoleFin), p.epoch|1)
		e.ord.mu.Lock()
		e.ord.pending = e.ord.pending[1:]
		e.ord.mu.Unlock()
	}
	return nil
}

// fail marks the executor broken by err after raising the abort flag,
// releases the device waits of sched and of every outstanding call — for as
// long as their work has not finished (the watchdog goes on after drain) —
// and returns err.
func (e *Executor) fail(sched Schedule, err error) error {
	return e.failCall(nil, sched, err)
}

// failCall is fail for a call that may be chained (c, nil: not): when a
// later call has started beside it, that one drains the streams once it
// has failed too (the abort flag sees to it).
func (e *Executor) failCall(c *chainCall, sched Schedule, err error) error {
	e.tr.Abort()
	if e.setBroken(err, c) {
		return err
	}
	scheds := e.releasePending()
	if e.words != nil && sched.Params.SmallOnDevice {
		// The failed call's own waits: followed until its lane has drained.
		if ev, rerr := e.streams[LaneIn].Record(); rerr == nil {
			e.addReleased(pendingCall{ev: ev, epoch: epochOf(e.calls), sched: sched})
		}
	}
	e.drain(append(scheds, sched)...)
	return err
}

// releasePending hands every outstanding stream-ordered call to the
// watchdog as released (after a failure), forgets them as outstanding and
// returns their schedules.
func (e *Executor) releasePending() []Schedule {
	e.ord.mu.Lock()
	pending := e.ord.pending
	e.ord.pending = nil
	e.ord.mu.Unlock()
	e.addReleased(pending...)
	scheds := make([]Schedule, 0, len(pending)+1)
	for _, p := range pending {
		scheds = append(scheds, p.sched)
	}
	return scheds
}

// watch is the watchdog of the outstanding stream-ordered calls: every
// watchEvery while one is unfinished or released calls are left, asleep
// otherwise (until woken). When an outstanding call cannot finish it raises
// the abort flag and hands every outstanding call to the released list,
// whose device waits it releases again every tick until their events
// completed: a peer's stream may write its own flag after a release and
// lower it again.
func (e *Executor) watch(kick, stop <-chan struct{}, stopped chan<- struct{}) {
	defer close(stopped)
	chk := e.tr.(checker)
	tick := time.NewTimer(watchEvery)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		left := e.rerelease()
		e.ord.mu.Lock()
		pending := append([]pendingCall(nil), e.ord.pending...)
		e.ord.mu.Unlock()
		var err error
		unfinished := false
		for _, p := range pending {
			var done bool
			if done, err = p.ev.Done(); err != nil || done {
				if err != nil {
					break
				}
				continue
			}
			unfinished = true
			ctx, cancel := context.WithDeadline(context.Background(), p.deadline)
			err = chk.Check(ctx, "waiting for "+queuedName(p.sched.Params.Coll)+" queued on the device")
			cancel()
			break // the oldest unfinished call speaks for the rest
		}
		if err != nil {
			e.tr.Abort()
			e.addReleased(pending...) // the executor's list stays: its next call finds the abort
			left = true
		}
		if !unfinished && !left {
			select { // nothing to watch until woken
			case <-stop:
				return
			case <-kick:
			}
		}
		tick.Reset(watchEvery)
	}
}

// rerelease releases again the device waits of the released calls whose
// events have not completed, forgets the others, and reports whether any
// is left.
func (e *Executor) rerelease() bool {
	e.ord.mu.Lock()
	released := append([]pendingCall(nil), e.ord.released...)
	e.ord.mu.Unlock()
	if len(released) == 0 {
		return false
	}
	finished := map[uint64]bool{}
	for _, p := range released {
		if done, err := p.ev.Done(); err != nil || done {
			finished[p.epoch] = true // an error: nothing will run any more
			continue
		}
		e.releaseWaits(p.sched)
	}
	e.ord.mu.Lock()
	defer e.ord.mu.Unlock()
	left := e.ord.released[:0]
	for _, p := range e.ord.released {
		if !finished[p.epoch] {
			left = append(left, p)
		}
	}
	e.ord.released = left
	return len(left) > 0
}

// closeOrdered settles what is outstanding (within the calls' own
// deadlines) and stops the watchdog; Close calls it first.
func (e *Executor) closeOrdered() error {
	var err error
	e.ord.mu.Lock()
	var deadline time.Time
	for _, p := range e.ord.pending {
		if p.deadline.After(deadline) {
			deadline = p.deadline
		}
	}
	outstanding := len(e.ord.pending) > 0
	e.ord.mu.Unlock()
	if outstanding && e.brokenErr() == nil {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		err = e.settle(ctx, -1)
		cancel()
	}
	e.drain(e.releasePending()...)
	// Released work still running: keep releasing a while before the
	// streams are destroyed (which waits no longer than it has to).
	for deadline := time.Now().Add(10 * time.Second); e.rerelease() && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	e.ord.mu.Lock()
	stop, stopped, watching := e.ord.stop, e.ord.stopped, e.ord.watching
	e.ord.watching = false
	e.ord.mu.Unlock()
	if watching {
		close(stop)
		<-stopped
	}
	if err != nil && !errors.Is(err, comm.ErrAborted) {
		return fmt.Errorf("settling the calls queued on the device: %w", err)
	}
	return nil
}
