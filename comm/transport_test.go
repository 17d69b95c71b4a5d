package comm

import (
	"context"
	"fmt"
	"os/exec"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/comm/shm"
)

// transports attaches world ranks of this process to one control block in
// Go memory (the race detector sees the atomics).
func transports(t *testing.T, world int, opts ShmOptions) []*ShmTransport {
	t.Helper()
	l := shm.Layout{World: world, Flags: world}
	buf := make([]byte, l.Size()+shm.Line)
	off := (shm.Line - int(uintptr(unsafe.Pointer(&buf[0])))%shm.Line) % shm.Line
	mem := buf[off : off+l.Size()]
	_, err := shm.Init(mem, l)
	require.NoError(t, err)
	var trs []*ShmTransport
	for r := range world {
		ctl, err := shm.Attach(mem, l)
		require.NoError(t, err)
		tr, err := NewShmTransport(ctl, r, opts)
		require.NoError(t, err)
		t.Cleanup(func() { _ = tr.Close() })
		trs = append(trs, tr)
	}
	return trs
}

func deadPID(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	require.NoError(t, cmd.Run())
	return cmd.Process.Pid
}

// TestAbortNamesTheRankAtFault: the rank that notices a dead or stalled
// peer aborts the job, and every other rank's error names the peer, not the
// rank that noticed.
func TestAbortNamesTheRankAtFault(t *testing.T) {
	tests := []struct {
		desc     string
		opts     ShmOptions
		fault    func(t *testing.T, trs []*ShmTransport)
		deadline time.Duration
		// what the rank that notices (rank 0) and the others (rank 1) say
		want0, want1 string
		peerDead     bool
	}{
		{"rank 3 exited", ShmOptions{}, func(t *testing.T, trs []*ShmTransport) {
			trs[3].ctl.PID(3).Store(uint64(deadPID(t)))
		}, 10 * time.Second, "rank 3 (pid ", "rank 3 exited (rank 0 noticed and aborted the job)", true},
		{"rank 3 stalled", ShmOptions{PeerTimeout: 200 * time.Millisecond}, func(t *testing.T, trs []*ShmTransport) {
			require.NoError(t, trs[3].Close()) // its heartbeat stops, as under SIGSTOP
		}, 10 * time.Second, "rank 3 has not heartbeaten for", "rank 3 stalled (rank 0 noticed and aborted the job)", true},
		{"rank 0's deadline while rank 3 is stopped", ShmOptions{}, func(t *testing.T, trs []*ShmTransport) {
			require.NoError(t, trs[3].Close())
		}, 500 * time.Millisecond, "rank 3 has not heartbeaten for", "rank 0 timed out waiting; rank 3 had not heartbeaten for", false},
		{"rank 2 failed", ShmOptions{}, func(t *testing.T, trs []*ShmTransport) {
			trs[2].Abort()
		}, 10 * time.Second, "rank 2 failed and aborted the job", "rank 2 failed and aborted the job", false},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			trs := transports(t, 4, tc.opts)
			tc.fault(t, trs)
			ctx, cancel := context.WithTimeout(context.Background(), tc.deadline)
			defer cancel()
			start := time.Now()
			err0 := trs[0].Wait(ctx, 0, 1)
			require.Error(t, err0)
			require.Less(t, time.Since(start), 5*time.Second)
			require.ErrorContains(t, err0, tc.want0)
			if tc.peerDead {
				require.ErrorIs(t, err0, ErrPeerDead)
			}
			err1 := trs[1].Aborted()
			require.ErrorIs(t, err1, ErrAborted)
			require.ErrorContains(t, err1, tc.want1)
			err1 = trs[1].Wait(context.Background(), 1, 1)
			require.ErrorContains(t, err1, tc.want1, "a wait of another rank fails with the same cause")
			if tc.peerDead {
				require.ErrorIs(t, err1, ErrPeerDead)
			}
			var ae *AbortError
			require.ErrorAs(t, err1, &ae)
			wantRank := 3
			if tc.desc == "rank 2 failed" {
				wantRank = 2
			}
			require.Equal(t, wantRank, ae.Rank, "the rank at fault")
		})
	}
}

func TestFaultRank(t *testing.T) {
	var fr interface{ FaultRank() int }
	require.ErrorAs(t, fmt.Errorf("x: %w", &AbortError{Rank: 3, By: 1, Cause: AbortExited}), &fr)
	require.Equal(t, 3, fr.FaultRank())
	require.ErrorAs(t, fmt.Errorf("x: %w", &PeerError{Rank: 5, PID: 9}), &fr)
	require.Equal(t, 5, fr.FaultRank())
}

// WaitSpin polls for its own spin: a flag set within it needs no futex
// sleep; with a short spin the same wait sleeps.
func TestWaitSpin(t *testing.T) {
	for _, tc := range []struct {
		spin   time.Duration
		sleeps bool
	}{{time.Second, false}, {time.Microsecond, true}} {
		trs := transports(t, 2, ShmOptions{})
		go func() {
			time.Sleep(20 * time.Millisecond)
			trs[1].Set(1, 7)
		}()
		require.NoError(t, trs[0].WaitSpin(context.Background(), 1, 7, tc.spin))
		sleeps, _ := trs[0].SleepStats()
		require.Equal(t, tc.sleeps, sleeps > 0, "spin %v: %d sleeps", tc.spin, sleeps)
	}
}
