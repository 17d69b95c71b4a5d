package trainer

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// holdState tracks whether the job is held by a swap (its memory swapped
// out), for how long in all, and the callbacks to run on a change.
type holdState struct {
	mu      sync.Mutex
	held    int           // swap-outs not yet undone
	since   time.Time     // when held became > 0
	total   time.Duration // held time of finished holds
	changed chan struct{} // closed and replaced at every change of held
	outs    []func()
	ins     []func()
}

func newHoldState() *holdState { return &holdState{changed: make(chan struct{})} }

// heldTime is the time held so far, up to now.
func (h *holdState) heldTime(now time.Time) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	t := h.total
	if h.held > 0 {
		t += now.Sub(h.since)
	}
	return t
}

// Held reports whether the job is held now.
func (h *holdState) isHeld() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.held > 0
}

// out marks one more swap-out and runs the OnSwapOut callbacks when the job
// becomes held.
func (h *holdState) out() {
	h.mu.Lock()
	h.held++
	first := h.held == 1
	if first {
		h.since = time.Now()
		close(h.changed)
		h.changed = make(chan struct{})
	}
	hooks := append([]func(){}, h.outs...)
	h.mu.Unlock()
	if first {
		for _, f := range hooks {
			f()
		}
	}
}

// in undoes one out and runs the OnSwapIn callbacks when the job is no
// longer held.
func (h *holdState) in() {
	h.mu.Lock()
	if h.held == 0 {
		h.mu.Unlock()
		return
	}
	hooks := append([]func(){}, h.ins...)
	h.mu.Unlock()
	// Callbacks run before the collectives are released.
	for _, f := range hooks {
		f()
	}
	h.mu.Lock()
	h.held--
	if h.held == 0 {
		h.total += time.Since(h.since)
		close(h.changed)
		h.changed = make(chan struct{})
	}
	h.mu.Unlock()
}

// releaseAll ends every hold (the daemon went away: nobody will swap the
// job back in, and its memory was never really gone).
func (h *holdState) releaseAll() {
	for h.isHeld() {
		h.in()
	}
}

// waitReleased blocks while the job is held.
func (h *holdState) waitReleased(ctx context.Context) error {
	for {
		h.mu.Lock()
		held, ch := h.held > 0, h.changed
		h.mu.Unlock()
		if !held {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("waiting for the job to be swapped back in: %w", ctx.Err())
		}
	}
}

// callClock is the deadline of the worker's collectives, one at a time: the
// context a collective runs under ends when the collective has spent its
// timeout not held by a swap (with cause ErrTimeout), or when the caller's
// context ends. The executor needs a deadline: the caller's own, else one
// far away (only reported: the clock's timer ends the call). One context
// and one timer serve call after call while the callers pass the same
// context and no call times out (a collective then costs no allocation
// here); only the goroutine running a collective (the worker, or a
// synchronous caller running it inline, holding Group.running) calls begin
// and end.
type callClock struct {
	h *holdState

	mu      sync.Mutex
	timer   *time.Timer // runs check; reset by every begin
	running bool        // between begin and end
	start   time.Time
	held0   time.Duration // held time when the call began
	timeout time.Duration
	parent  context.Context
	ctx     context.Context
	cancel  context.CancelCauseFunc
	endFn   func()
}

func newCallClock(h *holdState) *callClock {
	c := &callClock{h: h}
	c.endFn = c.end
	return c
}

// begin starts the clock of a collective called with parent; end stops it.
func (c *callClock) begin(parent context.Context, timeout time.Duration) (context.Context, func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ctx == nil || !sameContext(c.parent, parent) || c.ctx.Err() != nil {
		if c.cancel != nil {
			c.cancel(nil) // the previous caller's: let its parent forget it
		}
		cctx, cancel := context.WithCancelCause(parent)
		c.parent, c.cancel, c.ctx = parent, cancel, cctx
		if _, ok := parent.Deadline(); !ok {
			c.ctx = farDeadline{cctx, time.Now().Add(100 * 365 * 24 * time.Hour)}
		}
	}
	c.running = true
	c.start = time.Now()
	c.held0 = c.h.heldTime(c.start)
	c.timeout = timeout
	if c.timer == nil {
		c.timer = time.AfterFunc(timeout, c.check)
	} else {
		c.timer.Reset(timeout)
	}
	return c.ctx, c.endFn
}

// sameContext reports a == b, and false where comparing them would panic (a
// caller's context type that is not comparable).
func sameContext(a, b context.Context) (same bool) {
	defer func() {
		if recover() != nil {
			same = false
		}
	}()
	return a == b
}

func (c *callClock) end() {
	c.mu.Lock()
	c.running = false
	c.timer.Stop()
	c.mu.Unlock()
}

// close releases the context (the group is closing: no collective runs).
func (c *callClock) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.timer != nil {
		c.timer.Stop()
	}
	if c.cancel != nil {
		c.cancel(nil)
	}
}

// check runs when the timer fires: it ends the call once it has spent its
// timeout not held, else sets the timer for the rest.
func (c *callClock) check() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.running {
		return // the call ended while this check waited for mu
	}
	now := time.Now()
	heldFor := c.h.heldTime(now) - c.held0
	active := now.Sub(c.start) - heldFor
	if active >= c.timeout && !c.h.isHeld() {
		cause := fmt.Errorf("%w: %v", ErrTimeout, c.timeout)
		if heldFor > 0 {
			cause = fmt.Errorf("%w: %v (not counting %v held by a swap)", ErrTimeout, c.timeout, heldFor.Round(time.Millisecond))
		}
		c.cancel(cause)
		return
	}
	next := c.timeout - active
	if c.h.isHeld() || next < 10*time.Millisecond {
		next = max(next, 100*time.Millisecond)
	}
	c.timer.Reset(next)
}

// farDeadline is a context that reports a deadline it never enforces.
type farDeadline struct {
	context.Context
	d time.Time
}

func (f farDeadline) Deadline() (time.Time, bool) { return f.d, true }

// OnSwapOut registers f to run when the job is swapped out (before the
// daemon is told the swap is done). f must not call collectives.
func (g *Group) OnSwapOut(f func()) {
	g.hold.mu.Lock()
	g.hold.outs = append(g.hold.outs, f)
	g.hold.mu.Unlock()
}

// OnSwapIn registers f to run when the job is swapped back in (before
// collectives resume). f must not call collectives.
func (g *Group) OnSwapIn(f func()) {
	g.hold.mu.Lock()
	g.hold.ins = append(g.hold.ins, f)
	g.hold.mu.Unlock()
}

// Held reports whether the job is held by a swap now.
func (g *Group) Held() bool { return g.hold.isHeld() }
