package allreduce

import (
	"context"
	"errors"
	"fmt"
	"strings"
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

// A collective ended by its context's cause (the trainer's collective
// deadline cancels with ErrTimeout as the cause rather than letting a
// deadline pass) says whom it waited for: the executor used to report the
// bare cause, or a lane that only waited for its own rank, and lost the rank
// at fault (`migctl bench` with a stopped rank then, at times, failed without
// naming it: internal/reliability's SIGSTOP row).
func TestCauseKeepsTheWait(t *testing.T) {
	// which lane of a rank notices first is timing: several rounds
	for round := range 6 {
		t.Run(fmt.Sprint(round), testCauseKeepsTheWait)
	}
}

func testCauseKeepsTheWait(t *testing.T) {
	g := newGroup(t, 3, HostStaged, Options{Chunk: 16 << 10, Slots: 2})
	causes := []error{errors.New("deadline of rank 0"), errors.New("deadline of rank 1")}
	errs := g.run(func(r int, c *Communicator) error {
		if r == 2 {
			return nil // stopped: never enters
		}
		buf, _ := g.devs[r].Alloc(1 << 20)
		ctx, cancel := context.WithCancelCause(context.Background())
		defer cancel(nil)
		dctx, dcancel := context.WithTimeout(ctx, time.Minute)
		defer dcancel()
		tm := time.AfterFunc(300*time.Millisecond, func() { cancel(causes[r]) })
		defer tm.Stop()
		return c.AllReduce(dctx, buf, buf, 1<<18, comm.Float32, comm.Sum)
	})
	named := 0
	for r := range 2 {
		require.Error(t, errs[r], "rank %d", r)
		if strings.Contains(errs[r].Error(), "(rank 2)") {
			named++
		}
		if errors.Is(errs[r], causes[r]) { // its own deadline ended it: it names the peer it waited for
			require.Regexp(t, fmt.Sprintf(`\(rank [^%d)]\)`, r), errs[r].Error(), "rank %d", r)
		}
	}
	require.Positive(t, named, "no rank named the stopped rank 2: %v", errs)
}
