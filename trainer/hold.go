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

// deadline derives from ctx the context one collective runs under: it ends
// when the collective has spent timeout not held by a swap (with cause
// ErrTimeout), or when ctx ends. The executor needs a deadline: ctx's own,
// else one far away. stop releases it.
func (h *holdState) deadline(ctx context.Context, timeout time.Duration) (context.Context, func()) {
	cctx, cancel := context.WithCancelCause(ctx)
	start := time.Now()
	held0 := h.heldTime(start)
	var mu sync.Mutex
	var t *time.Timer
	stopped := false
	check := func() {
		now := time.Now()
		heldFor := h.heldTime(now) - held0
		active := now.Sub(start) - heldFor
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return // the collective ended while this check was waiting for mu
		}
		if active >= timeout && !h.isHeld() {
			cause := fmt.Errorf("%w: %v", ErrTimeout, timeout)
			if heldFor > 0 {
				cause = fmt.Errorf("%w: %v (not counting %v held by a swap)", ErrTimeout, timeout, heldFor.Round(time.Millisecond))
			}
			cancel(cause)
			return
		}
		next := timeout - active
		if h.isHeld() || next < 10*time.Millisecond {
			next = max(next, 100*time.Millisecond)
		}
		t.Reset(next)
	}
	mu.Lock()
	t = time.AfterFunc(timeout, check)
	mu.Unlock()
	dctx := context.Context(cctx)
	if _, ok := ctx.Deadline(); !ok {
		// Only reported: the timer above ends the call, so a context.WithDeadline
		// (and its own timer, set and stopped every call) is not needed.
		dctx = farDeadline{cctx, start.Add(100 * 365 * 24 * time.Hour)}
	}
	return dctx, func() {
		mu.Lock()
		stopped = true
		t.Stop()
		mu.Unlock()
		cancel(nil)
	}
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
