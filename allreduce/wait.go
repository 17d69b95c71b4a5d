package allreduce

import (
	"context"
	"fmt"
	"runtime"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/migctl/migctl/comm"
)

// eventSpin is how long waitEvent polls an event back to back before it
// starts napping between polls.
const eventSpin = 30 * time.Microsecond

// eventNap is the pause between polls after eventSpin. It is a futex
// timeout, not time.Sleep: the Go runtime rounds sleeps of an otherwise idle
// process up to a millisecond, which would stall the pipeline.
const eventNap = 10 * time.Microsecond

// waitEvent polls ev until it completes, ctx ends, or the job is aborted.
func waitEvent(ctx context.Context, ev comm.Event, tr Transport) error {
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
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("waiting for the device: %w", err)
			}
			if err := tr.Aborted(); err != nil {
				return err
			}
		}
		if time.Since(start) < eventSpin {
			runtime.Gosched()
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
