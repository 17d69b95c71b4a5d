package allreduce

import (
	"context"
	"fmt"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/migctl/migctl/comm"
)

// defaultEventSpin is how long waitEvent polls an event back to back before
// it starts napping between polls (Options.EventSpin).
const defaultEventSpin = 30 * time.Microsecond

// defaultSmallSpin is Options.SmallSpin's default where cores allow.
const defaultSmallSpin = 300 * time.Microsecond

// eventNap is the pause between polls after eventSpin. It is a futex
// timeout, not time.Sleep: the Go runtime rounds sleeps of an otherwise idle
// process up to a millisecond, which would stall the pipeline.
const eventNap = 10 * time.Microsecond

// readyEvent is an event that can signal its completion on a channel (the
// host backend's): waited for without polling.
type readyEvent interface {
	Ready() <-chan struct{}
}

// waitEvent waits until ev completes, ctx ends, or the job is aborted.
func waitEvent(ctx context.Context, ev comm.Event, tr Transport, spin time.Duration) error {
	if re, ok := ev.(readyEvent); ok {
		// Short host-stream work is usually done within a few scheduler
		// turns: look before setting up a ticker (a runtime timer per wait).
		ready := re.Ready()
		for range 64 {
			select {
			case <-ready:
				return nil
			default:
			}
			comm.Yield()
		}
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-re.Ready():
				return nil
			case <-ctx.Done():
				return fmt.Errorf("waiting for the device: %w", ctx.Err())
			case <-tick.C:
				if _, err := ev.Done(); err != nil {
					return err
				}
				if err := tr.Aborted(); err != nil {
					return err
				}
			}
		}
	}
	return pollEvent(ev, spin, func() error {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("waiting for the device: %w", err)
		}
		return tr.Aborted()
	})
}

// pollEvent polls ev back to back for spin, then napping between polls,
// and calls check every 64 polls: its error ends the wait.
func pollEvent(ev comm.Event, spin time.Duration, check func() error) error {
	start := time.Now()
	for i := 0; ; i++ {
		done, err := ev.Done()
		if err != nil {
			return err
		}
		if done {
			return nil
		}
		if i&63 == 63 {
			if err := check(); err != nil {
				return err
			}
		}
		if time.Since(start) < spin {
			comm.SpinPause(i)
			continue
		}
		nap(eventNap)
	}
}

// nap sleeps for about d (plus the kernel's timer slack) on a private futex
// that nobody wakes.
func nap(d time.Duration) {
	var word uint32
	ts := unix.NsecToTimespec(d.Nanoseconds())
	_, _, _ = unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(&word)), 0|128 /* FUTEX_WAIT_PRIVATE */, 0,
		uintptr(unsafe.Pointer(&ts)), 0, 0)
}
