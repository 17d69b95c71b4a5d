package comm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/migctl/migctl/comm/shm"
)

// ShmOptions tune a ShmTransport; zero values pick defaults.
type ShmOptions struct {
	// Heartbeat is how often this rank bumps its heartbeat (default 10ms).
	Heartbeat time.Duration
	// PeerTimeout is how long a peer's heartbeat may stand still before it
	// is declared dead (default 5s). A peer whose process is gone is dead at
	// once.
	PeerTimeout time.Duration
	// Spin is how long a wait polls before it sleeps on a futex (default 20µs).
	Spin time.Duration
}

// ShmTransport is one rank's view of a job's shared control block: sequence
// flags, the arena, liveness of every rank and the abort flag. Its methods
// are safe for concurrent use.
type ShmTransport struct {
	ctl   *shm.Control
	rank  int
	world int
	opts  ShmOptions

	stop     chan struct{}
	stopped  chan struct{}
	stopOnce sync.Once

	sleeps, timeouts atomic.Uint64 // futex sleeps in Wait, and those that ran out their 1ms

	mu        sync.Mutex
	lastCheck time.Time
	beat      []uint64
	moved     []time.Time
}

// NewShmTransport attaches rank to ctl: it records the process id and starts
// the heartbeat. Close stops it.
func NewShmTransport(ctl *shm.Control, rank int, opts ShmOptions) (*ShmTransport, error) {
	w := ctl.Layout().World
	if rank < 0 || rank >= w {
		return nil, fmt.Errorf("rank %d of %d: %w", rank, w, ErrInvalid)
	}
	if opts.Heartbeat <= 0 {
		opts.Heartbeat = 10 * time.Millisecond
	}
	if opts.PeerTimeout <= 0 {
		opts.PeerTimeout = 5 * time.Second
	}
	if opts.Spin <= 0 {
		opts.Spin = 20 * time.Microsecond
	}
	t := &ShmTransport{ctl: ctl, rank: rank, world: w, opts: opts, stop: make(chan struct{}), stopped: make(chan struct{}),
		beat: make([]uint64, w), moved: make([]time.Time, w)}
	ctl.PID(rank).Store(uint64(os.Getpid()))
	ctl.Heartbeat(rank).Add(1)
	now := time.Now()
	for q := range t.moved {
		t.moved[q] = now
	}
	go t.heartbeat()
	return t, nil
}

func (t *ShmTransport) heartbeat() {
	defer close(t.stopped)
	tk := time.NewTicker(t.opts.Heartbeat)
	defer tk.Stop()
	for {
		select {
		case <-tk.C:
			t.ctl.Heartbeat(t.rank).Add(1)
		case <-t.stop:
			return
		}
	}
}

// Rank is this rank. World is the number of ranks.
func (t *ShmTransport) Rank() int  { return t.rank }
func (t *ShmTransport) World() int { return t.world }

// Arena is the shared data arena.
func (t *ShmTransport) Arena() []byte { return t.ctl.Data() }

// Flag loads flag i.
func (t *ShmTransport) Flag(i int) uint64 { return t.ctl.Flag(i).Load() }

// FlagMemory is the page-aligned memory that holds every flag, for a device
// to register; FlagWord is flag i's 8 bytes within it. A device that
// writes a flag word wakes no futex sleeper: its waiters must poll (the
// small all-reduce on the devices waits on the device too).
func (t *ShmTransport) FlagMemory() []byte { return t.ctl.FlagMemory() }

// FlagWord is flag i's 8-byte word (see FlagMemory).
func (t *ShmTransport) FlagWord(i int) []byte { return t.ctl.FlagBytes(i) }

// Set stores v in flag i (flags this rank owns only) and wakes its waiters.
func (t *ShmTransport) Set(i int, v uint64) { t.ctl.SetFlag(i, v) }

// The abort word: bits 0-15 the rank at fault + 1, 16-31 the raising rank
// + 1, 32-35 the cause, 36-63 the heartbeat age in milliseconds. 0 is
// healthy; a word holding only rank+1 (an older writer) reads as that rank
// failing.
func abortWord(e AbortError) uint64 {
	ms := min(uint64(e.Age.Milliseconds()), 1<<28-1)
	return uint64(e.Rank+1)&0xffff | uint64(e.By+1)&0xffff<<16 | uint64(e.Cause)&0xf<<32 | ms<<36
}

func readAbortWord(w uint64) *AbortError {
	e := &AbortError{Rank: int(w&0xffff) - 1, By: int(w>>16&0xffff) - 1, Cause: AbortCause(w >> 32 & 0xf),
		Age: time.Duration(w>>36) * time.Millisecond}
	if e.By < 0 {
		e.By = e.Rank
	}
	return e
}

// Abort raises the job's abort flag naming this rank as failed (the first
// rank to raise it is recorded); every rank's waits then fail with an
// *AbortError (ErrAborted).
func (t *ShmTransport) Abort() { t.abort(AbortError{Rank: t.rank, Cause: AbortFailed}) }

// AbortMismatch raises the job's abort flag for a collective call of rank
// peer that differs from this rank's (AbortMismatch): every rank's waits
// then fail with an *AbortError that matches ErrMismatch.
func (t *ShmTransport) AbortMismatch(peer int) { t.abort(AbortError{Rank: peer, Cause: AbortMismatch}) }

// abort raises the abort flag with e (By is this rank); the first wins.
func (t *ShmTransport) abort(e AbortError) {
	e.By = t.rank
	t.ctl.Abort().CompareAndSwap(0, abortWord(e))
}

// abortFor raises the abort flag for err, a CheckPeers error, naming the
// dead or stalled peer.
func (t *ShmTransport) abortFor(err error) {
	var pe *PeerError
	if !errors.As(err, &pe) {
		t.Abort()
		return
	}
	if pe.Idle > 0 {
		t.abort(AbortError{Rank: pe.Rank, Cause: AbortStalled, Age: pe.Idle})
	} else {
		t.abort(AbortError{Rank: pe.Rank, Cause: AbortExited})
	}
}

// Aborted returns an *AbortError (ErrAborted) naming the rank at fault if
// any rank raised the abort flag.
func (t *ShmTransport) Aborted() error {
	if w := t.ctl.Abort().Load(); w != 0 {
		return readAbortWord(w)
	}
	return nil
}

// Wait blocks until flag i ≥ v. It returns an error, after raising the abort
// flag, when ctx ends, when another rank aborted, or when a peer is dead.
func (t *ShmTransport) Wait(ctx context.Context, i int, v uint64) error {
	return t.WaitSpin(ctx, i, v, t.opts.Spin)
}

// WaitSpin is Wait polling for spin (instead of ShmOptions.Spin) before it
// sleeps.
func (t *ShmTransport) WaitSpin(ctx context.Context, i int, v uint64, spin time.Duration) error {
	f := t.ctl.Flag(i)
	if f.Load() >= v {
		return nil
	}
	start := time.Now()
	for n := 0; ; n++ {
		if f.Load() >= v {
			return nil
		}
		if n&15 == 15 {
			if err := t.Aborted(); err != nil {
				return err
			}
			if err := ctx.Err(); err != nil {
				return t.deadline(err, fmt.Sprintf("waiting for flag %d to reach %#x (at %#x)", i, v, f.Load()))
			}
			if err := t.CheckPeers(); err != nil {
				t.abortFor(err)
				return err
			}
		}
		if time.Since(start) < spin {
			SpinPause(n)
			continue
		}
		// Sleep on the flag's futex; wake at least every millisecond to
		// watch the abort flag, the deadline and the peers.
		t.sleeps.Add(1)
		slept := time.Now()
		if t.ctl.SleepFlag(i, v, time.Millisecond) {
			return nil
		}
		if time.Since(slept) >= 900*time.Microsecond {
			t.timeouts.Add(1)
		}
		n = 14 // the next iteration checks abort, deadline and peers
	}
}

// SleepStats counts, since the transport was made, the futex sleeps of
// Wait and how many of them ran out their millisecond without a wake-up
// (the allreduce trace reports both per call).
func (t *ShmTransport) SleepStats() (sleeps, timeouts uint64) {
	return t.sleeps.Load(), t.timeouts.Load()
}

// CheckPeers reports a *PeerError (ErrPeerDead) naming a peer whose
// process is gone or whose heartbeat stood still for longer than
// PeerTimeout. It checks at most once a millisecond and answers nil in
// between.
func (t *ShmTransport) CheckPeers() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	if now.Sub(t.lastCheck) < time.Millisecond {
		return nil
	}
	t.lastCheck = now
	for q := range t.world {
		if q == t.rank {
			continue
		}
		if pid := int(t.ctl.PID(q).Load()); pid != 0 && !shm.Alive(pid) {
			return &PeerError{Rank: q, PID: pid}
		}
		b := t.ctl.Heartbeat(q).Load()
		if b != t.beat[q] {
			t.beat[q], t.moved[q] = b, now
		} else if now.Sub(t.moved[q]) > t.opts.PeerTimeout {
			return &PeerError{Rank: q, Idle: now.Sub(t.moved[q]).Round(time.Millisecond)}
		}
	}
	return nil
}

// Check makes a wait's checks without waiting, for a caller that polls
// something else (a device event whose work waits for flags on the device):
// it returns an error, after raising the abort flag, when another rank
// aborted, when ctx ended (naming the peer with the stalest heartbeat, as
// Wait does; what says what was awaited) or when a peer is dead.
func (t *ShmTransport) Check(ctx context.Context, what string) error {
	if err := t.Aborted(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return t.deadline(err, what)
	}
	if err := t.CheckPeers(); err != nil {
		t.abortFor(err)
		return err
	}
	return nil
}

// deadline raises the abort flag for a wait whose ctx ended and returns its
// error. It names the peer whose heartbeat is stalest (beyond a few missed
// beats) as the suspect: a stopped rank makes the others time out.
func (t *ShmTransport) deadline(cause error, where string) error {
	t.mu.Lock()
	now, suspect, idle := time.Now(), -1, max(50*time.Millisecond, 5*t.opts.Heartbeat)
	for q := range t.world {
		if q == t.rank {
			continue
		}
		if b := t.ctl.Heartbeat(q).Load(); b != t.beat[q] {
			t.beat[q], t.moved[q] = b, now
		}
		if d := now.Sub(t.moved[q]); d > idle {
			suspect, idle = q, d
		}
	}
	t.mu.Unlock()
	if suspect < 0 {
		t.abort(AbortError{Rank: t.rank, Cause: AbortDeadline})
		return fmt.Errorf("%s: %w", where, cause)
	}
	idle = idle.Round(time.Millisecond)
	t.abort(AbortError{Rank: suspect, Cause: AbortDeadline, Age: idle})
	return fmt.Errorf("%s: rank %d has not heartbeaten for %v (stopped or hung?): %w", where, suspect, idle, cause)
}

// Close stops the heartbeat and returns once it no longer touches the
// control block, which the caller may then unmap.
func (t *ShmTransport) Close() error {
	t.stopOnce.Do(func() { close(t.stop) })
	<-t.stopped
	return nil
}
