package allreduce

import (
	"context"
	"fmt"

	"github.com/migctl/migctl/comm"
)

// Chained host-staged all-reduces.
//
// A host-staged all-reduce ends with copies back of its last chunks'
// results, which use the host-to-device direction of the link only, and
// the next one begins with copies out, which use the other direction; yet a
// call issued while the one before it still ran (DDP's gradient buckets,
// all-reduces issued back to back) used to wait for it to end on this rank.
// So a caller that runs its calls one at a time
// may start the next call from another goroutine as soon as the running one
// calls the admit function it passed in its context (WithAdmit): a
// host-staged all-reduce does once its copies out are done. The next call,
// if it is a host-staged all-reduce too and does not read the running
// call's receive buffer, then runs beside it; any other call first waits
// for it to end.
//
// Each lane still runs a rank's calls in order (a call's reduce lane starts
// once the previous call's reduce lane is done, its in lane once the
// previous in lane is), so every flag of a rank keeps growing, and a
// rank has at most two calls in progress (a call overlaps the previous one
// only once the one before that has ended). What overlapping could break,
// the slots of the previous call, is guarded by waits on its flags
// (crossWaits), which every rank takes whether or not it overlaps, as
// peers may:
//   - chunk c < Slots of the next call stages into the slot where the
//     previous call's last chunk of slot c was staged: its copy out waits
//     until every rank has reduced that chunk (their reduced flags at the
//     previous epoch);
//   - its reduction writes the result slot that slower ranks may still copy
//     back from: it waits until every rank has fetched that chunk (their
//     fetched flags at the previous epoch).
//
// Slots the previous call did not use were last used by calls that every
// rank had ended before it staged anything of this one (it began this call
// only once the call before the previous one had ended, and that one's
// results were fetched by all, its inputs reduced by all). End-of-call flags
// go up in call order: a call publishes its own only after the previous one
// has ended. Measured (H100, docs/results/shm-2026-12-06.md): all-reduces
// issued back to back 5-34% faster; DDP's steps level (its buckets seldom
// queue behind one another).

// admitKey is the context key of WithAdmit.
type admitKey struct{}

// WithAdmit returns ctx carrying admit: a host-staged all-reduce run under
// it calls admit (once, from another goroutine) when the caller may start
// the next call on the executor from a goroutine of its own, before this
// one has returned. A nil admit removes one that ctx carries.
func WithAdmit(ctx context.Context, admit func()) context.Context {
	return context.WithValue(ctx, admitKey{}, admit)
}

func admitOf(ctx context.Context) func() {
	f, _ := ctx.Value(admitKey{}).(func())
	return f
}

// readyKey is the context key of WithReady.
type readyKey struct{}

// WithReady returns ctx carrying ready: a chainable all-reduce run under it
// (one that Chains accepts) calls ready once, from a goroutine of its own,
// when its result is determined and queued on the device — every rank's
// reduction of the last chunk is done and this rank's last copy back is
// queued — with an event recorded after those copies on their stream. What
// is left of the call then is local: the copies back to complete, and its
// flags for the peers. A caller that orders its own stream after the event
// (comm.StreamOrderer) has the result in stream order without waiting for
// the call to end, as NCCL's callers do; the call still ends (Run returns)
// later, and a failure after ready fails it, and every later call, like
// any other. Without a call to ready (a call that failed before it, or one
// not chainable), the result is there when Run returns. A nil ready
// removes one that ctx carries.
func WithReady(ctx context.Context, ready func(comm.Event)) context.Context {
	return context.WithValue(ctx, readyKey{}, ready)
}

func readyOf(ctx context.Context) func(comm.Event) {
	f, _ := ctx.Value(readyKey{}).(func(comm.Event))
	return f
}

// afterKey is the context key of WithAfter.
type afterKey struct{}

// WithAfter returns ctx carrying events of the work that produces a call's
// input, as Call.After does for the calls that take one: a chainable
// all-reduce run under it orders its copies out after them on the device
// (its out lane's stream waits for them), so they start as the work ends,
// not once the CPU has seen it; any other call waits for them on the CPU.
func WithAfter(ctx context.Context, after []comm.Event) context.Context {
	return context.WithValue(ctx, afterKey{}, after)
}

// afterOf is call.After with the events ctx carries (WithAfter).
func afterOf(ctx context.Context, call Call) []comm.Event {
	evs, _ := ctx.Value(afterKey{}).([]comm.Event)
	if len(evs) == 0 {
		return call.After
	}
	return append(append([]comm.Event(nil), call.After...), evs...)
}

// chainable reports whether a call can overlap another like it: a
// host-staged all-reduce with the CPU reduction (a device share reads the
// peers' staged inputs from the in lane, which the slot waits do not cover).
func chainable(p Params) bool {
	return p.Coll == AllReduce && p.Algorithm == HostStaged && p.GPUShare == 0 && !p.SmallOnDevice && p.World > 1
}

// Chains reports whether an all-reduce of bytes per rank lets the next call
// start before it has ended (WithAdmit): whether the schedule allReduce
// builds for it is chainable (and nothing traces).
func (c *Communicator) Chains(bytes int) bool {
	if c.exec.trace != nil || bytes <= 0 || TakesSmallPath(c.alg, bytes, c.exec.opts.SmallBytes) {
		return false
	}
	p := Params{Coll: AllReduce, Algorithm: c.alg, World: c.World(), Bytes: bytes}
	if p.Algorithm == HostStaged {
		p.GPUShare = c.gpuShare
	}
	return chainable(p)
}

// chainCall is a chainable call in progress, as the call after it sees it.
type chainCall struct {
	params   Params
	recv     comm.Buffer
	laneDone [NumLanes]chan struct{} // closed when the call's lane has run (or failed)
	done     chan struct{}           // closed when the call has ended (its end-of-call flag published, or failed)
	prevDone chan struct{}           // the done of the call it overlapped (nil: none)
}

func newChainCall(p Params, recv comm.Buffer) *chainCall {
	c := &chainCall{params: p, recv: recv, done: make(chan struct{})}
	for l := range c.laneDone {
		c.laneDone[l] = make(chan struct{})
	}
	return c
}

// awaitChain returns the call in progress that a call of sched with call's
// buffers may overlap, once that one's copies out are done and the call
// before it has ended; nil when there is none or the call may not overlap
// it, after it has ended.
func (e *Executor) awaitChain(sched Schedule, call Call) *chainCall {
	e.mu.Lock()
	cur := e.chain
	e.mu.Unlock()
	if cur == nil {
		return nil
	}
	if e.trace == nil && chainable(sched.Params) && cur.params.World == sched.Params.World &&
		!comm.MayOverlap(call.Send, cur.recv) {
		<-cur.laneDone[LaneOut]
		if cur.prevDone != nil {
			<-cur.prevDone
		}
		e.overlaps.Add(1)
		return cur
	}
	<-cur.done
	return nil
}

// startChain registers a chainable call as the one in progress, unless the
// executor broke meanwhile.
func (e *Executor) startChain(c *chainCall) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.broken != nil {
		return fmt.Errorf("communicator unusable after an earlier failure: %w", e.broken)
	}
	e.chain = c
	return nil
}

// endChain marks c ended.
func (e *Executor) endChain(c *chainCall) {
	if c == nil {
		return
	}
	e.mu.Lock()
	if e.chain == c {
		e.chain = nil
	}
	e.mu.Unlock()
	close(c.done)
}

// waitChain waits until the chainable call in progress, if any, has ended.
func (e *Executor) waitChain() {
	e.mu.Lock()
	cur := e.chain
	e.mu.Unlock()
	if cur != nil {
		<-cur.done
	}
}

// brokenErr is the failure that broke the executor (nil: none).
func (e *Executor) brokenErr() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.broken
}

// setBroken records the failure that broke the executor (the first one
// stays) and reports whether a later call has started beside the failed
// call c (which then drains the streams after both have ended: they are
// not this goroutine's to use meanwhile).
func (e *Executor) setBroken(err error, c *chainCall) (successor bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.broken == nil {
		e.broken = err
	}
	return c != nil && e.chain != nil && e.chain != c
}

// crossWaits are the waits of a host-staged all-reduce next on the flags of
// the one before it, prev, at prev's epoch: per lane, per step of the lane
// (chunk c), the flags to wait for first (see the comment at the top).
// None unless both are chainable.
func crossWaits(prev, next Params) (w [NumLanes][][]Cond) {
	if !chainable(prev) || !chainable(next) || prev.World != next.World || prev.Slots != next.Slots || prev.Chunk != next.Chunk {
		return w
	}
	K, n := next.Slots, next.World
	np, nn := ceilDiv(prev.Bytes, prev.step()), ceilDiv(next.Bytes, next.step())
	m := min(K, nn, np) // chunks of next whose slot prev used
	if m <= 0 {
		return w
	}
	w[LaneOut] = make([][]Cond, m)
	w[LaneReduce] = make([][]Cond, m)
	for c := range m {
		last := c + K*((np-1-c)/K) // prev's last chunk in slot c
		w[LaneOut][c] = allRanks(n, roleB, uint64(last+1))
		w[LaneReduce][c] = allRanks(n, roleC, uint64(last+1))
	}
	return w
}

// Overlaps is how many calls started before the previous one had ended
// (chained host-staged all-reduces).
func (e *Executor) Overlaps() uint64 { return e.overlaps.Load() }
