//go:build !race

package allreduce

// Failure tests in which a released rank's kernel reads an input area that
// a held peer's stream writes afterwards: the undefined result the failure
// semantics allow (releaseWaits), which the race detector reports on the
// tests' Go-memory arena.

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/comm"
)

// TestSmallOnDeviceCloseAfterFailure: a rank whose watchdog failed its
// queued calls, and whose next call then failed (forgetting them), still
// closes: releasing the device waits goes on until its streams drained,
// although the held peer's stream lowers a released flag when it runs.
func TestSmallOnDeviceCloseAfterFailure(t *testing.T) {
	g, bufs, short, long := heldRanks(t) // rank 2 never calls
	for range 2 {
		_, err := g.comms[0].AllReduceOrdered(long, bufs[0], bufs[0], 256, comm.Float32, comm.Sum)
		require.NoError(t, err)
	}
	for i := range 3 {
		ctx := long
		if i == 0 {
			ctx = short
		}
		_, err := g.comms[1].AllReduceOrdered(ctx, bufs[1], bufs[1], 256, comm.Float32, comm.Sum)
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return g.comms[1].exec.tr.Aborted() != nil }, 5*time.Second, time.Millisecond)
	g.fakes[0].Release()
	g.fakes[1].Release()
	_, err := g.comms[1].AllReduceOrdered(long, bufs[1], bufs[1], 256, comm.Float32, comm.Sum)
	require.ErrorIs(t, err, comm.ErrAborted)
	done := make(chan error, 2)
	for r := range 2 {
		go func() { done <- g.comms[r].exec.Close() }()
	}
	for range 2 {
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			t.Fatal("Close hangs")
		}
	}
}

// TestSmallOnDeviceReleaseOverwritten: a failed rank's release of a
// peer's flag is lowered again when the peer's stream writes the flag
// itself afterwards (rank 0 was held); the watchdog releases again until
// its calls' events completed, so rank 1's second call is not left waiting.
func TestSmallOnDeviceReleaseOverwritten(t *testing.T) {
	g, bufs, short, long := heldRanks(t) // rank 2 never calls
	_, err := g.comms[0].AllReduceOrdered(long, bufs[0], bufs[0], 256, comm.Float32, comm.Sum)
	require.NoError(t, err)
	_, err = g.comms[1].AllReduceOrdered(short, bufs[1], bufs[1], 256, comm.Float32, comm.Sum)
	require.NoError(t, err)
	ev2, err := g.comms[1].AllReduceOrdered(long, bufs[1], bufs[1], 256, comm.Float32, comm.Sum)
	require.NoError(t, err)
	flag0 := func() uint64 { return g.comms[0].exec.tr.Flag(FlagOf(0, roleA)) }
	require.Eventually(t, func() bool { return flag0() >= 1<<62 }, 5*time.Second, time.Millisecond,
		"rank 1's watchdog released rank 0's flag")
	g.fakes[0].Release() // rank 0's stream now writes its own flag: epochOf(1)|1
	g.fakes[1].Release()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, ev2.Wait(ctx), "released again")
	for r := range 2 {
		require.NoError(t, g.comms[r].exec.Close(), "rank %d closes without hanging", r)
	}
}

// heldRanks is smallDeviceGroup with ranks 0 and 1's drivers held, a
// context that ends in 200 ms and one that lasts a minute.
func heldRanks(t *testing.T) (g *cudaGroup, bufs []comm.Buffer, short, long context.Context) {
	g, bufs = smallDeviceGroup(t)
	g.fakes[0].Hold()
	g.fakes[1].Hold()
	short, c1 := context.WithTimeout(context.Background(), 200*time.Millisecond)
	t.Cleanup(c1)
	long, c2 := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(c2)
	return g, bufs, short, long
}
