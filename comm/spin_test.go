package comm

import (
	"runtime"
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
