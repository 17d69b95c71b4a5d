package allreduce

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/comm"
)

// A rank that never calls the collective: every other rank fails by its
// deadline, and the communicator stays unusable afterwards.
func TestStuckRankFailsEveryoneByDeadline(t *testing.T) {
	for _, alg := range []Algorithm{HostStaged, Ring} {
		t.Run(alg.String(), func(t *testing.T) {
			g := newGroup(t, 3, alg, Options{Chunk: 16 << 10, Slots: 2})
			const deadline = 300 * time.Millisecond
			start := time.Now()
			errs := g.run(func(r int, c *Communicator) error {
				if r == 2 {
					return nil // stuck: never enters
				}
				buf, _ := g.devs[r].Alloc(1 << 20)
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				defer cancel()
				return c.AllReduce(ctx, buf, buf, 1<<18, comm.Float32, comm.Sum)
			})
			require.Less(t, time.Since(start), deadline+5*time.Second)
			for r := range 2 {
				require.Error(t, errs[r], "rank %d", r)
				require.True(t, errors.Is(errs[r], context.DeadlineExceeded) || errors.Is(errs[r], comm.ErrAborted), "rank %d: %v", r, errs[r])
			}
			// Every rank, the stuck one included, now refuses to run.
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			require.ErrorIs(t, g.comms[2].Barrier(ctx), comm.ErrAborted)
			require.Error(t, g.comms[0].Barrier(ctx))
		})
	}
}

// One rank fails (its deadline is already over): the others, with a long
// deadline, fail quickly through the abort flag instead of waiting.
func TestAbortPropagates(t *testing.T) {
	g := newGroup(t, 4, HostStaged, Options{Chunk: 16 << 10, Slots: 2})
	start := time.Now()
	errs := g.run(func(r int, c *Communicator) error {
		buf, _ := g.devs[r].Alloc(4 << 20)
		d := time.Minute
		if r == 1 {
			d = time.Nanosecond
		}
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		time.Sleep(10 * time.Millisecond)
		return c.AllReduce(ctx, buf, buf, 1<<20, comm.Float32, comm.Sum)
	})
	require.Less(t, time.Since(start), 20*time.Second, "aborts do not wait for the other ranks' deadlines")
	for r, err := range errs {
		require.Error(t, err, "rank %d reported success", r)
	}
}

func TestCallWithoutDeadlineIsRefused(t *testing.T) {
	g := newGroup(t, 1, HostStaged, Options{})
	require.ErrorIs(t, g.comms[0].Barrier(context.Background()), comm.ErrInvalid)
}
