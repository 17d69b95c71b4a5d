package shm

import (
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Each flag's cache line holds the value (8 bytes), an event count bumped on
// every store (4 bytes, the futex word) and the number of sleeping waiters
// (4 bytes). Waiters sleep on the event count with FUTEX_WAIT on the shared
// mapping; a store wakes them only when someone sleeps.

const (
	futexWait = 0 // FUTEX_WAIT (shared, not FUTEX_PRIVATE_FLAG: other processes wait too)
	futexWake = 1 // FUTEX_WAKE
)

func (c *Control) seq(i int) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&c.mem[c.l.flagsOff()+i*Line+8]))
}

func (c *Control) sleepers(i int) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&c.mem[c.l.flagsOff()+i*Line+12]))
}

// SetFlag stores v in flag i and wakes its sleeping waiters.
func (c *Control) SetFlag(i int, v uint64) {
	c.Flag(i).Store(v)
	c.seq(i).Add(1)
	if c.sleepers(i).Load() != 0 {
		w := c.seq(i)
		_, _, _ = unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWake, 1<<30, 0, 0, 0)
	}
}

// SleepFlag sleeps until flag i has been stored to since it was below v,
// or for at most d. It returns whether flag i ≥ v. Spurious returns happen;
// callers loop.
func (c *Control) SleepFlag(i int, v uint64, d time.Duration) bool {
	w := c.seq(i)
	s := w.Load()
	if c.Flag(i).Load() >= v {
		return true
	}
	c.sleepers(i).Add(1)
	ts := unix.NsecToTimespec(d.Nanoseconds())
	_, _, _ = unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWait, uintptr(s),
		uintptr(unsafe.Pointer(&ts)), 0, 0)
	c.sleepers(i).Add(^uint32(0))
	return c.Flag(i).Load() >= v
}
