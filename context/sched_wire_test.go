package ctxmgr_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	ctxmgr "github.com/migctl/migctl/context"
	"github.com/migctl/migctl/context/fakeshim"
	"github.com/migctl/migctl/context/sched"
)

// fastSwaps is a cost model under which fair's quantum is its floor.
var fastSwaps = sched.Config{Cost: sched.Cost{Bandwidth: 1e15, Fixed: time.Millisecond}, Quantum: 300 * time.Millisecond, QuantumFactor: 1}

// schedDaemon starts a daemon (no MIG) with a 100-GiB declared device, the
// given Scheduler (nil: the priority policy) and no periodic rebalance, and
// returns its swap socket.
func schedDaemon(t *testing.T, sc *ctxmgr.Scheduler) (*ctxmgr.Daemon, string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "mcs")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	d, err := ctxmgr.StartDaemon(context.Background(), ctxmgr.DaemonConfig{
		ControlSocket: filepath.Join(dir, "ctl.sock"),
		SwapSocket:    filepath.Join(dir, "swap.sock"),
		Swap:          ctxmgr.Options{GPUMemory: 100 * gib, RebalanceEvery: -1, Sched: sc},
	})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, d.Close()) })
	return d, d.SwapSocket()
}

func schedShim(t *testing.T, socket string, h fakeshim.Hello) *fakeshim.Shim {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := fakeshim.Dial(ctx, socket, h, fakeshim.Behavior{Chunks: 1})
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

// need asks for bytes and requires the answer.
func need(t *testing.T, s *fakeshim.Shim, bytes int64, granted bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ok, reason, err := s.Need(ctx, bytes)
	require.NoError(t, err)
	require.Equal(t, granted, ok, "need answered: %q", reason)
	if ok {
		require.NoError(t, s.Usage(bytes))
	}
}

// TestDaemonFairRotation: two processes of one priority that do not fit
// together (60 GiB each on 100 GiB) take turns under --policy fair: the
// second one's need swaps the first out, and every quantum the one resident
// swaps out and the other in; never both in at once. Under the priority
// policy the second need is refused, as before the flag existed.
func TestDaemonFairRotation(t *testing.T) {
	t.Run("priority refuses", func(t *testing.T) {
		_, socket := schedDaemon(t, nil)
		schedShim(t, socket, fakeshim.Hello{PID: 1001, Job: "a", Device: "0", Bytes: 60 * gib})
		b := schedShim(t, socket, fakeshim.Hello{PID: 1002, Job: "b", Device: "0"})
		need(t, b, 60*gib, false)
	})
	t.Run("fair rotates", func(t *testing.T) {
		_, socket := schedDaemon(t, ctxmgr.NewScheduler(sched.NewFair(fastSwaps)))
		a := schedShim(t, socket, fakeshim.Hello{PID: 1001, Job: "a", Device: "0", Bytes: 60 * gib})
		b := schedShim(t, socket, fakeshim.Hello{PID: 1002, Job: "b", Device: "0"})
		var mu sync.Mutex
		bothIn := false
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() { // watch: the two are never in at once after b got memory
			defer close(done)
			for {
				select {
				case <-stop:
					return
				case <-time.After(2 * time.Millisecond):
				}
				// a in before and after b was seen in: both were in at once
				// (a full turn between the reads would take two quanta).
				mu.Lock()
				if len(b.Swaps()) > 0 && !a.Out() && !b.Out() && !a.Out() {
					bothIn = true
				}
				mu.Unlock()
			}
		}()
		start := time.Now()
		need(t, b, 60*gib, true)
		require.True(t, a.Out(), "b's need swapped a out")
		// Over ~2 s of 300-ms quanta each is switched several times, in turn.
		require.Eventually(t, func() bool { return len(a.Swaps()) >= 5 && len(b.Swaps()) >= 4 }, 10*time.Second, 10*time.Millisecond)
		close(stop)
		<-done
		elapsed := time.Since(start)
		mu.Lock()
		require.False(t, bothIn, "both processes were in at once")
		mu.Unlock()
		sa, sb := a.Swaps(), b.Swaps()
		for i, s := range sa {
			require.Equal(t, []string{"swap_out", "swap_in"}[i%2], s, "a's swaps %v", sa)
		}
		for i, s := range sb[:4] {
			require.Equal(t, []string{"swap_out", "swap_in"}[i%2], s, "b's swaps %v", sb)
		}
		// Turns last about a quantum: not a thrash of switches (a switch is
		// one process's swap-out and the other's swap-in).
		outs := (len(sa)+1)/2 + (len(sb)+1)/2
		require.LessOrEqual(t, outs, int(elapsed/(300*time.Millisecond))+1, "a %v, b %v in %v", sa, sb, elapsed)
	})
	t.Run("fair: a higher priority is never rotated out for a lower one", func(t *testing.T) {
		_, socket := schedDaemon(t, ctxmgr.NewScheduler(sched.NewFair(fastSwaps)))
		hi := schedShim(t, socket, fakeshim.Hello{PID: 1001, Job: "hi", Priority: 5, Device: "0", Bytes: 60 * gib})
		lo := schedShim(t, socket, fakeshim.Hello{PID: 1002, Job: "lo", Device: "0"})
		need(t, lo, 60*gib, false)
		time.Sleep(time.Second) // three quanta
		require.Empty(t, hi.Swaps())
	})
}

// TestDaemonSRF: under --policy srf a long process that asks for memory gets
// it (its allocation is waiting) and is then swapped out for the shorter one
// it displaced; it comes back when the short one exits. A short newcomer
// keeps the device from a long resident.
func TestDaemonSRF(t *testing.T) {
	expected := map[int]time.Duration{1001: 10 * time.Second, 1002: time.Hour, 2001: time.Hour, 2002: 10 * time.Second}
	sc := ctxmgr.NewScheduler(sched.NewSRF(fastSwaps), ctxmgr.WithExpected(func(p ctxmgr.Process) (time.Duration, bool) {
		d, ok := expected[p.PID]
		return d, ok
	}))
	_, socket := schedDaemon(t, sc)
	t.Run("a long newcomer waits for the short resident", func(t *testing.T) {
		short := schedShim(t, socket, fakeshim.Hello{PID: 1001, Job: "short", Device: "0", Bytes: 60 * gib})
		long := schedShim(t, socket, fakeshim.Hello{PID: 1002, Job: "long", Device: "0"})
		need(t, long, 60*gib, true)
		require.Eventually(t, func() bool { return len(short.Swaps()) == 2 && long.Out() }, 10*time.Second, 10*time.Millisecond)
		require.Equal(t, []string{"swap_out", "swap_in"}, short.Swaps())
		require.False(t, short.Out())
		short.Close()
		require.Eventually(t, func() bool { return !long.Out() }, 10*time.Second, 10*time.Millisecond, "long swapped back in after short exits")
		require.Equal(t, []string{"swap_out", "swap_in"}, long.Swaps())
		long.Close()
	})
	t.Run("a short newcomer keeps the device", func(t *testing.T) {
		long := schedShim(t, socket, fakeshim.Hello{PID: 2001, Job: "long", Device: "0", Bytes: 60 * gib})
		short := schedShim(t, socket, fakeshim.Hello{PID: 2002, Job: "short", Device: "0"})
		need(t, short, 60*gib, true)
		require.True(t, long.Out())
		time.Sleep(500 * time.Millisecond)
		require.Empty(t, short.Swaps())
		require.Equal(t, []string{"swap_out"}, long.Swaps())
	})
}

func TestParseExpected(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"90m", 90 * time.Minute, true},
		{"1h30m", 90 * time.Minute, true},
		{" 600 ", 600 * time.Second, true},
		{"2.5", 2500 * time.Millisecond, true},
		{"0", 0, false},
		{"-5m", -5 * time.Minute, false},
		{"soon", 0, false},
	} {
		t.Run(strconv.Quote(tc.in), func(t *testing.T) {
			d, ok := ctxmgr.ParseExpected(tc.in)
			require.Equal(t, tc.ok, ok)
			if ok {
				require.Equal(t, tc.want, d)
			}
		})
	}
}
