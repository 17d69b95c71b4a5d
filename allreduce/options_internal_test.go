package allreduce

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// One-lane collectives poll longer only where every rank can have a core.
func TestSmallSpinDefault(t *testing.T) {
	cpus := numCPU()
	for _, tc := range []struct {
		world int
		set   time.Duration
		want  time.Duration
	}{
		{max(1, cpus/2), 0, defaultSmallSpin},
		{cpus/2 + 1, 0, 0},
		{2 * cpus, 0, 0},
		{1, -1, 0},
		{2 * cpus, 5 * time.Microsecond, 5 * time.Microsecond},
	} {
		o := Options{SmallSpin: tc.set}.withDefaults(tc.world)
		require.Equal(t, tc.want, o.SmallSpin, "world %d of %d cores, set %v", tc.world, cpus, tc.set)
	}
}
