package allreduce

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/comm"
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

// A one-lane collective's waits poll for SmallSpin: a peer 20 ms late costs
// no futex sleep with a 2-s spin, and sleeps with the spin off.
func TestSmallSpinReachesTheWaits(t *testing.T) {
	for _, tc := range []struct {
		spin   time.Duration
		sleeps bool
	}{{2 * time.Second, false}, {-1, true}} {
		g := newGroup(t, 2, HostStaged, Options{Chunk: 4 << 10, Slots: 2, SmallSpin: tc.spin})
		bufs := make([]*comm.HostBuffer, 2)
		for r := range bufs {
			bufs[r] = hostBuf(t, g.devs[r], make([]byte, 1024), 1024)
		}
		before, _ := g.trs[0].SleepStats()
		errs := g.run(func(r int, c *Communicator) error {
			if r == 1 {
				time.Sleep(20 * time.Millisecond)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			return c.AllReduce(ctx, bufs[r], bufs[r], 256, comm.Float32, comm.Sum)
		})
		require.NoError(t, errors.Join(errs...))
		after, _ := g.trs[0].SleepStats()
		require.Equal(t, tc.sleeps, after > before, "spin %v: %d futex sleeps", tc.spin, after-before)
	}
}
