//go:build !race

package allreduce

// Failure tests in which a released rank's kernel reads an input area that
// a held peer's stream writes afterwards: the undefined result the failure
// semantics allow (releaseWaits), which the race detector reports on the
// tests' Go-memory arena.

import (
	"context"
	"sync"
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

// With the small all-reduce on the devices (whose flags only the streams
// wait for), the comparison at the publish still finds a mismatched pair:
// every rank fails at once or at its next call, and no stream is left
// waiting (the abort releases the device waits; a released stream may then
// read what a peer's stream writes: not for the race detector).
func TestMismatchedCallsSmallOnDevice(t *testing.T) {
	g := newCUDAGroup(t, 3, Options{Chunk: 16 << 10, Slots: 3, SmallBytes: 4 << 10, SmallOnDevice: true})
	requireMismatchFound(t, g, func(ctx context.Context, c *Communicator, buf comm.Buffer, count int) error {
		return c.AllReduce(ctx, buf, buf, count, comm.Float32, comm.Sum)
	})
}

// Broadcasts queued on the devices (BroadcastOrdered) are compared at the
// publish too: ranks that disagree on the size find it at once or at their
// next call, and no stream is left waiting for the deadline.
func TestMismatchedBroadcastsOnDevice(t *testing.T) {
	g := newCUDAGroup(t, 3, Options{Chunk: 16 << 10, Slots: 3, BroadcastOnDevice: true})
	requireMismatchFound(t, g, func(ctx context.Context, c *Communicator, buf comm.Buffer, count int) error {
		ev, err := c.BroadcastOrdered(ctx, buf, buf, count, comm.Float32, 0)
		if err == nil && ev != nil {
			err = c.exec.settle(ctx, -1)
		}
		return err
	})
}

// requireMismatchFound runs call on the three ranks of g (streams that wait
// for the flags themselves) with rank 2 passing 8 more elements, requires a
// comm.ErrMismatch on some rank, then a call of equal sizes to fail with it
// on every rank, all well before the calls' deadline.
func requireMismatchFound(t *testing.T, g *cudaGroup, call func(ctx context.Context, c *Communicator, buf comm.Buffer, count int) error) {
	bufs := make([]comm.Buffer, 3)
	for r := range 3 {
		require.NotNil(t, g.comms[r].exec.words, "the fake driver's streams wait for the flags themselves")
		var err error
		bufs[r], err = g.devs[r].Alloc(4 << 10)
		require.NoError(t, err)
	}
	start := time.Now()
	run := func(count func(r int) int) []error {
		errs := make([]error, 3)
		var wg sync.WaitGroup
		for r, c := range g.comms {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				errs[r] = call(ctx, c, bufs[r], count(r))
			}()
		}
		wg.Wait()
		return errs
	}
	failed := 0
	for _, err := range run(func(r int) int { return 100 + r/2*8 }) { // rank 2: 8 more elements
		if err != nil {
			require.ErrorIs(t, err, comm.ErrMismatch)
			failed++
		}
	}
	require.Positive(t, failed, "found at the publish")
	for r, err := range run(func(int) int { return 100 }) {
		require.ErrorIs(t, err, comm.ErrMismatch, "rank %d, the next call", r)
	}
	require.Less(t, time.Since(start), 10*time.Second, "no stream left waiting for the deadline")
}
