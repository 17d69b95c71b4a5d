package comm

import (
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// A spinning wait yields its P every spinYieldEvery polls, not every poll,
// unless the process has one P.
func TestSpinYieldEvery(t *testing.T) {
	n := spinYieldEvery()
	if runtime.GOMAXPROCS(0) == 1 {
		require.Equal(t, 1, n)
	} else {
		require.Equal(t, spinYieldDefault, n)
	}
	for i := range 3 * n {
		SpinPause(i) // must not block
	}
}

// Under HoldYields a spinning wait keeps its P: with one P another goroutine
// does not run while it polls, and does once the hold is released (its
// first yield). Each attempt spins ~64 polls, far below the runtime's 10-ms
// preemption; an attempt that saw the other run counts only if all do.
func TestHoldYieldsKeepsTheP(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	n := spinYieldDefault // what spinYieldEvery says on the test's first call may be 1 (one P)
	if spinYieldEvery() == 1 {
		n = 1
	}
	ran := func(hold bool) bool {
		var done atomic.Bool
		release := func() {}
		if hold {
			release = HoldYields()
		}
		go done.Store(true)
		for i := range n {
			SpinPause(i)
			Yield()
		}
		seen := done.Load()
		release()
		for !done.Load() {
			Yield() // released: the goroutine gets the P
		}
		return seen
	}
	kept := false
	for range 3 {
		if !ran(true) {
			kept = true
			break
		}
	}
	require.True(t, kept, "a goroutine ran on the one P while a wait under HoldYields spun")
	require.True(t, ran(false), "a spinning wait without HoldYields never yielded its P")
	release := HoldYields()
	release()
	release() // idempotent
	require.Zero(t, held.Load())
}
