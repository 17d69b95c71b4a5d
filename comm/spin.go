package comm

import (
	"os"
	"runtime"
	"strconv"
	"sync"
)

// EnvSpinYield sets how many polls a spinning wait makes between two
// runtime.Gosched calls (default spinYieldDefault; 1: every poll, as before).
// A Gosched puts the goroutine back on the run queue, and with idle Ps the
// runtime wakes another thread to look for work, which finds none: seven
// ranks of 16 Ps each polling that way keep the cores busy with threads
// that wake and park (measured in the PyTorch processes, where the C ABI's
// call went from 115 to 78 µs with GOMAXPROCS=2).
const EnvSpinYield = "MIGCTL_SPIN_YIELD"

const spinYieldDefault = 64

var spinYieldEvery = sync.OnceValue(func() int {
	if n, err := strconv.Atoi(os.Getenv(EnvSpinYield)); err == nil && n >= 1 {
		return n
	}
	if runtime.GOMAXPROCS(0) == 1 {
		return 1 // one P: what the wait waits for may need it
	}
	return spinYieldDefault
})

// SpinPause is what a spinning wait does between two polls, the i-th: a
// Gosched every EnvSpinYield polls, nothing in between.
func SpinPause(i int) {
	if n := spinYieldEvery(); n == 1 || i%n == n-1 {
		runtime.Gosched()
	}
}
