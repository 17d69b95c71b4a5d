package ctxmgr_test

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	ctxmgr "github.com/migctl/migctl/context"
	"github.com/migctl/migctl/context/fakeshim"
	"github.com/migctl/migctl/context/swapproto"
)

const gib = int64(1) << 30

type daemon struct {
	m      *ctxmgr.Manager
	socket string
}

// startDaemon runs a Manager on a shim socket in a fresh directory.
func startDaemon(t *testing.T, opts ctxmgr.Options) *daemon {
	t.Helper()
	socket := filepath.Join(t.TempDir(), "run", "migswap.sock")
	ln, err := ctxmgr.ListenUnix(socket, nil)
	require.NoError(t, err)
	if opts.RebalanceEvery == 0 {
		opts.RebalanceEvery = -1 // only events trigger swap-ins, so tests see their cause
	}
	m := ctxmgr.NewManager(opts)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Error("Serve did not return after cancel")
		}
	})
	return &daemon{m: m, socket: socket}
}

func (d *daemon) shim(t *testing.T, h fakeshim.Hello, b fakeshim.Behavior) *fakeshim.Shim {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := fakeshim.Dial(ctx, d.socket, h, b)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

func (d *daemon) proc(t *testing.T, pid int) (ctxmgr.Process, bool) {
	t.Helper()
	procs, _, err := d.m.Status(context.Background())
	require.NoError(t, err)
	for _, p := range procs {
		if p.PID == pid {
			return p, true
		}
	}
	return ctxmgr.Process{}, false
}

func (d *daemon) waitState(t *testing.T, pid int, want ctxmgr.State) {
	t.Helper()
	require.Eventually(t, func() bool {
		p, ok := d.proc(t, pid)
		return ok && p.State == want
	}, 5*time.Second, 5*time.Millisecond, "pid %d never reached %s", pid, want)
}

func ctx5s(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestSocketsAreOwnerOnly(t *testing.T) {
	d := startDaemon(t, ctxmgr.Options{})
	fi, err := os.Stat(filepath.Dir(d.socket))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), fi.Mode().Perm())
	fi, err = os.Stat(d.socket)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	require.NotZero(t, fi.Mode()&os.ModeSocket)

	_, err = ctxmgr.ListenUnix(d.socket, nil)
	require.ErrorContains(t, err, "another daemon is listening")
}

func TestListenUnixReplacesStaleSocket(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "s.sock")
	ln, err := ctxmgr.ListenUnix(socket, nil)
	require.NoError(t, err)
	// A dead daemon leaves its socket file behind.
	if ul, ok := ln.(interface{ SetUnlinkOnClose(bool) }); ok {
		ul.SetUnlinkOnClose(false)
	}
	require.NoError(t, ln.Close())
	_, err = os.Stat(socket)
	require.NoError(t, err)
	ln, err = ctxmgr.ListenUnix(socket, nil)
	require.NoError(t, err)
	require.NoError(t, ln.Close())

	notSock := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(notSock, nil, 0o600))
	_, err = ctxmgr.ListenUnix(notSock, nil)
	require.ErrorContains(t, err, "not a socket")
}

func TestPeerPolicyRefusesStrangers(t *testing.T) {
	require.True(t, ctxmgr.SameUIDOrRoot(1000)(1000))
	require.True(t, ctxmgr.SameUIDOrRoot(1000)(0))
	require.False(t, ctxmgr.SameUIDOrRoot(1000)(1001))

	socket := filepath.Join(t.TempDir(), "s.sock")
	var seen []uint32
	var mu sync.Mutex
	ln, err := ctxmgr.ListenUnix(socket, func(uid uint32) bool {
		mu.Lock()
		seen = append(seen, uid)
		mu.Unlock()
		return false
	})
	require.NoError(t, err)
	m := ctxmgr.NewManager(ctxmgr.Options{RebalanceEvery: -1})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go m.Serve(ctx, ln)
	_, err = fakeshim.Dial(ctx5s(t), socket, fakeshim.Hello{PID: 1}, fakeshim.Behavior{})
	require.Error(t, err, "a refused peer must not get a welcome")
	mu.Lock()
	require.Equal(t, []uint32{uint32(os.Getuid())}, seen)
	mu.Unlock()
	procs, _, err := m.Status(ctx)
	require.NoError(t, err)
	require.Empty(t, procs)
}

func TestRegisterUsageAndForget(t *testing.T) {
	d := startDaemon(t, ctxmgr.Options{GPUMemory: 80 * gib})
	s := d.shim(t, fakeshim.Hello{PID: 101, Job: "train", Priority: 3, Device: "GPU-a", Bytes: 10 * gib}, fakeshim.Behavior{})
	s2 := d.shim(t, fakeshim.Hello{PID: 102, Device: "GPU-a"}, fakeshim.Behavior{})

	p, ok := d.proc(t, 101)
	require.True(t, ok)
	require.Equal(t, "train", p.Job)
	require.Equal(t, 3, p.Priority)
	require.Equal(t, "GPU-a", p.Device)
	require.Equal(t, 10*gib, p.Bytes)
	require.Equal(t, ctxmgr.Running, p.State)
	require.False(t, p.Started.IsZero())
	require.Equal(t, os.Getpid(), p.PeerPID, "SO_PEERCRED pid recorded when it differs")
	p2, ok := d.proc(t, 102)
	require.True(t, ok)
	require.Equal(t, "pid-102", p2.Job, "default job name")

	require.NoError(t, s.Usage(30*gib))
	require.Eventually(t, func() bool { p, _ := d.proc(t, 101); return p.Bytes == 30*gib }, 5*time.Second, 5*time.Millisecond)
	_, free, err := d.m.Status(context.Background())
	require.NoError(t, err)
	require.Equal(t, 50*gib, free["GPU-a"])

	require.NoError(t, s.Close())
	require.Eventually(t, func() bool { _, ok := d.proc(t, 101); return !ok }, 5*time.Second, 5*time.Millisecond)
	_, ok = d.proc(t, 102)
	require.True(t, ok)
	_ = s2
}

func TestProtocolErrors(t *testing.T) {
	d := startDaemon(t, ctxmgr.Options{})
	s := d.shim(t, fakeshim.Hello{PID: 7}, fakeshim.Behavior{})
	require.NoError(t, s.Send(swapproto.Message{Type: "telemetry"}))
	require.NoError(t, s.SendLine([]byte("not json\n")))
	require.NoError(t, s.Send(swapproto.Message{Type: swapproto.TypeResult, ID: "99", OK: true}))
	require.NoError(t, s.Send(swapproto.Message{Type: swapproto.TypeWelcome}))
	require.Eventually(t, func() bool { return len(s.Errors()) == 4 }, 5*time.Second, 5*time.Millisecond)
	require.Contains(t, s.Errors()[0], `unknown message type "telemetry"`)
	require.Contains(t, s.Errors()[1], "malformed")
	require.Contains(t, s.Errors()[2], "unknown swap id 99")
	require.Contains(t, s.Errors()[3], "unexpected message type")
	_, ok := d.proc(t, 7)
	require.True(t, ok, "errors do not end the connection")

	tests := []struct {
		desc string
		h    fakeshim.Hello
		want string
	}{
		{"duplicate pid", fakeshim.Hello{PID: 7}, "already registered"},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			_, err := fakeshim.Dial(ctx5s(t), d.socket, tc.h, fakeshim.Behavior{})
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func TestManualSwap(t *testing.T) {
	d := startDaemon(t, ctxmgr.Options{GPUMemory: 80 * gib})
	slow := fakeshim.Behavior{Chunks: 5, ChunkDelay: 5 * time.Millisecond}
	a := d.shim(t, fakeshim.Hello{PID: 201, Job: "j", Bytes: 4 * gib, Device: "0"}, slow)
	b := d.shim(t, fakeshim.Hello{PID: 202, Job: "j", Bytes: 2 * gib, Device: "0"}, slow)
	ctx := ctx5s(t)

	var progress []ctxmgr.Progress
	res, err := d.m.Swap(ctx, ctxmgr.SwapOut, ctxmgr.Target{Job: "j"}, func(p ctxmgr.Progress) { progress = append(progress, p) })
	require.NoError(t, err)
	require.Len(t, res, 2)
	for i, want := range []struct {
		pid   int
		bytes int64
	}{{201, 4 * gib}, {202, 2 * gib}} {
		require.Equal(t, want.pid, res[i].PID)
		require.True(t, res[i].OK, res[i].Error)
		require.Equal(t, want.bytes, res[i].Bytes)
		require.Equal(t, "swap-out", res[i].Direction)
	}
	require.NotEmpty(t, progress)
	last := map[int]ctxmgr.Progress{}
	for _, p := range progress {
		require.LessOrEqual(t, p.Done, p.Total)
		last[p.PID] = p
	}
	require.Equal(t, int64(4*gib), last[201].Done)
	require.True(t, a.Out())
	require.True(t, b.Out())
	p, _ := d.proc(t, 201)
	require.Equal(t, ctxmgr.Out, p.State)
	require.True(t, p.Hold)
	require.Zero(t, p.GPUBytes())
	require.False(t, p.LastProgress.IsZero())
	_, free, err := d.m.Status(ctx)
	require.NoError(t, err)
	require.Equal(t, 80*gib, free["0"])

	errCases := []struct {
		desc string
		dir  ctxmgr.Direction
		t    ctxmgr.Target
		want error
	}{
		{"already out by job", ctxmgr.SwapOut, ctxmgr.Target{Job: "j"}, ctxmgr.ErrAlreadyOut},
		{"already out by pid", ctxmgr.SwapOut, ctxmgr.Target{PID: 201}, ctxmgr.ErrAlreadyOut},
		{"no such pid", ctxmgr.SwapOut, ctxmgr.Target{PID: 999}, ctxmgr.ErrNoSuchProcess},
		{"no such job", ctxmgr.SwapIn, ctxmgr.Target{Job: "nope"}, ctxmgr.ErrNoSuchJob},
	}
	for _, tc := range errCases {
		t.Run(tc.desc, func(t *testing.T) {
			_, err := d.m.Swap(ctx, tc.dir, tc.t, nil)
			require.ErrorIs(t, err, tc.want)
		})
	}

	res, err = d.m.Swap(ctx, ctxmgr.SwapIn, ctxmgr.Target{PID: 202}, nil)
	require.NoError(t, err)
	require.Len(t, res, 1)
	require.True(t, res[0].OK)
	require.False(t, b.Out())
	require.True(t, a.Out(), "the other process of the job stays out")
	_, err = d.m.Swap(ctx, ctxmgr.SwapIn, ctxmgr.Target{PID: 202}, nil)
	require.ErrorIs(t, err, ctxmgr.ErrAlreadyIn)
	require.Equal(t, []string{"swap_out", "swap_in"}, b.Swaps())
	require.Equal(t, []string{"swap_out"}, a.Swaps())
}

func TestSwapRefusedAndBlocked(t *testing.T) {
	d := startDaemon(t, ctxmgr.Options{GPUMemory: 80 * gib})
	s := d.shim(t, fakeshim.Hello{PID: 301, Bytes: gib}, fakeshim.Behavior{RefuseOut: "IPC-exported allocation"})
	ctx := ctx5s(t)
	res, err := d.m.Swap(ctx, ctxmgr.SwapOut, ctxmgr.Target{PID: 301}, nil)
	require.NoError(t, err)
	require.False(t, res[0].OK)
	require.Equal(t, "IPC-exported allocation", res[0].Error)
	d.waitState(t, 301, ctxmgr.Running)

	s.SetBehavior(fakeshim.Behavior{FailIn: "out of memory"})
	res, err = d.m.Swap(ctx, ctxmgr.SwapOut, ctxmgr.Target{PID: 301}, nil)
	require.NoError(t, err)
	require.True(t, res[0].OK)
	res, err = d.m.Swap(ctx, ctxmgr.SwapIn, ctxmgr.Target{PID: 301}, nil)
	require.NoError(t, err)
	require.False(t, res[0].OK)
	require.Equal(t, "out of memory", res[0].Error)
	d.waitState(t, 301, ctxmgr.Blocked)

	// The policy does not retry at the same free memory; an operator can.
	s.SetBehavior(fakeshim.Behavior{})
	require.NoError(t, d.m.Rebalance(ctx))
	p, _ := d.proc(t, 301)
	require.Equal(t, ctxmgr.Blocked, p.State)
	require.NotZero(t, p.BlockedEpoch)
	res, err = d.m.Swap(ctx, ctxmgr.SwapIn, ctxmgr.Target{PID: 301}, nil)
	require.NoError(t, err)
	require.True(t, res[0].OK)
	d.waitState(t, 301, ctxmgr.Running)
	require.False(t, s.Out())
	require.Equal(t, []string{"swap_out", "swap_out", "swap_in", "swap_in"}, s.Swaps())
}

func TestDisconnectMidSwap(t *testing.T) {
	d := startDaemon(t, ctxmgr.Options{GPUMemory: 80 * gib})
	s := d.shim(t, fakeshim.Hello{PID: 401, Bytes: gib}, fakeshim.Behavior{DisconnectMidSwap: true})
	res, err := d.m.Swap(ctx5s(t), ctxmgr.SwapOut, ctxmgr.Target{PID: 401}, nil)
	require.NoError(t, err)
	require.Len(t, res, 1)
	require.False(t, res[0].OK)
	require.Equal(t, ctxmgr.ErrDisconnected.Error(), res[0].Error)
	<-s.Done()
	require.Eventually(t, func() bool { _, ok := d.proc(t, 401); return !ok }, 5*time.Second, 5*time.Millisecond)
}

func TestNeedSwapsOutVictimsThenGrants(t *testing.T) {
	d := startDaemon(t, ctxmgr.Options{GPUMemory: 40 * gib})
	b := fakeshim.Behavior{Chunks: 2, ChunkDelay: time.Millisecond}
	low := d.shim(t, fakeshim.Hello{PID: 501, Job: "low", Priority: 0, Device: "0", Bytes: 10 * gib}, b)
	lowNew := d.shim(t, fakeshim.Hello{PID: 502, Job: "low2", Priority: 0, Device: "0", Bytes: 10 * gib}, b)
	mid := d.shim(t, fakeshim.Hello{PID: 503, Job: "mid", Priority: 5, Device: "0", Bytes: 10 * gib}, b)
	high := d.shim(t, fakeshim.Hello{PID: 504, Job: "high", Priority: 9, Device: "0", Bytes: 5 * gib}, b)
	ctx := ctx5s(t)
	// 40 - 35 = 5 GiB free; 12 GiB needs 7 more: the most recent low-priority
	// process (502) alone frees 10.
	granted, reason, err := high.Need(ctx, 12*gib)
	require.NoError(t, err)
	require.True(t, granted, reason)
	require.True(t, lowNew.Out())
	require.False(t, low.Out())
	require.False(t, mid.Out())
	p, _ := d.proc(t, 502)
	require.Equal(t, ctxmgr.Out, p.State)
	require.False(t, p.Hold, "policy swaps are not operator holds")

	// The grant is reserved until the requester reports usage: nothing comes back in.
	require.NoError(t, d.m.Rebalance(ctx))
	require.True(t, lowNew.Out())
	require.NoError(t, high.Usage(17*gib))

	// Not enough even with every lower-priority process: denied, nothing moves.
	granted, reason, err = mid.Need(ctx, 30*gib)
	require.NoError(t, err)
	require.False(t, granted)
	require.Contains(t, reason, "memory request denied")
	require.Contains(t, reason, "need 30.0 GiB")
	require.False(t, low.Out())
	require.Equal(t, []string{}, append([]string{}, low.Swaps()...))

	// The high-priority job ends: its memory frees and 502 comes back in.
	require.NoError(t, high.Close())
	d.waitState(t, 502, ctxmgr.Running)
	require.Eventually(t, func() bool { return !lowNew.Out() }, 5*time.Second, 5*time.Millisecond)
	require.Equal(t, []string{"swap_out", "swap_in"}, lowNew.Swaps())
}

func TestLowerUsageSwapsBackInHighestPriorityFirst(t *testing.T) {
	d := startDaemon(t, ctxmgr.Options{GPUMemory: 20 * gib})
	a := d.shim(t, fakeshim.Hello{PID: 601, Priority: 1, Device: "0", Bytes: 8 * gib}, fakeshim.Behavior{})
	bb := d.shim(t, fakeshim.Hello{PID: 602, Priority: 2, Device: "0", Bytes: 8 * gib}, fakeshim.Behavior{})
	big := d.shim(t, fakeshim.Hello{PID: 603, Priority: 9, Device: "0", Bytes: 4 * gib}, fakeshim.Behavior{})
	ctx := ctx5s(t)
	granted, reason, err := big.Need(ctx, 16*gib)
	require.NoError(t, err)
	require.True(t, granted, reason)
	require.True(t, a.Out())
	require.True(t, bb.Out())
	require.NoError(t, big.Usage(20*gib))
	require.NoError(t, d.m.Rebalance(ctx))
	require.True(t, a.Out())

	// 9 GiB frees: room for one of them, the higher-priority one.
	require.NoError(t, big.Usage(11*gib))
	d.waitState(t, 602, ctxmgr.Running)
	require.NoError(t, d.m.Rebalance(ctx))
	p, _ := d.proc(t, 601)
	require.Equal(t, ctxmgr.Out, p.State)
	require.True(t, a.Out())
}

func TestManualHoldIsNotSwappedBackIn(t *testing.T) {
	d := startDaemon(t, ctxmgr.Options{GPUMemory: 20 * gib})
	a := d.shim(t, fakeshim.Hello{PID: 701, Device: "0", Bytes: 8 * gib}, fakeshim.Behavior{})
	ctx := ctx5s(t)
	_, err := d.m.Swap(ctx, ctxmgr.SwapOut, ctxmgr.Target{PID: 701}, nil)
	require.NoError(t, err)
	require.NoError(t, d.m.Rebalance(ctx))
	require.True(t, a.Out())
	require.Equal(t, []string{"swap_out"}, a.Swaps())
}

func TestBlockedSwapInRetriedWhenMemoryFrees(t *testing.T) {
	d := startDaemon(t, ctxmgr.Options{GPUMemory: 20 * gib})
	low := d.shim(t, fakeshim.Hello{PID: 801, Priority: 0, Device: "0", Bytes: 8 * gib}, fakeshim.Behavior{})
	high := d.shim(t, fakeshim.Hello{PID: 802, Priority: 5, Device: "0", Bytes: 8 * gib}, fakeshim.Behavior{})
	ctx := ctx5s(t)
	granted, _, err := high.Need(ctx, 8*gib)
	require.NoError(t, err)
	require.True(t, granted)
	require.NoError(t, high.Usage(16*gib))
	low.SetBehavior(fakeshim.Behavior{FailIn: "CUDA_ERROR_OUT_OF_MEMORY"})
	require.NoError(t, high.Usage(8*gib)) // frees 8: the policy tries, the shim fails
	d.waitState(t, 801, ctxmgr.Blocked)
	low.SetBehavior(fakeshim.Behavior{})
	require.NoError(t, high.Usage(7*gib))
	d.waitState(t, 801, ctxmgr.Running)
	require.Equal(t, []string{"swap_out", "swap_in", "swap_in"}, low.Swaps())
}

func TestNeedHeadroom(t *testing.T) {
	tests := []struct {
		desc        string
		headroom    int64
		wantVictims bool
	}{
		{"fits exactly without headroom", 0, false},
		{"headroom makes room first", 2 * gib, true},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			d := startDaemon(t, ctxmgr.Options{GPUMemory: 20 * gib, Headroom: tc.headroom})
			low := d.shim(t, fakeshim.Hello{PID: 1101, Priority: 0, Device: "0", Bytes: 10 * gib}, fakeshim.Behavior{})
			high := d.shim(t, fakeshim.Hello{PID: 1102, Priority: 5, Device: "0"}, fakeshim.Behavior{})
			granted, reason, err := high.Need(ctx5s(t), 10*gib)
			require.NoError(t, err)
			require.True(t, granted, reason)
			require.Equal(t, tc.wantVictims, low.Out())
		})
	}
	d := startDaemon(t, ctxmgr.Options{GPUMemory: 20 * gib, Headroom: gib})
	high := d.shim(t, fakeshim.Hello{PID: 1103, Priority: 5, Device: "0"}, fakeshim.Behavior{})
	granted, reason, err := high.Need(ctx5s(t), 20*gib)
	require.NoError(t, err)
	require.False(t, granted)
	require.Contains(t, reason, "need 21.0 GiB")
	require.Contains(t, reason, "includes 1.0 GiB of headroom")
}

func TestReservationExpiresWithoutUsage(t *testing.T) {
	d := startDaemon(t, ctxmgr.Options{GPUMemory: 16 * gib, ReservationTTL: 100 * time.Millisecond})
	low := d.shim(t, fakeshim.Hello{PID: 1201, Priority: 0, Device: "0", Bytes: 12 * gib}, fakeshim.Behavior{})
	high := d.shim(t, fakeshim.Hello{PID: 1202, Priority: 5, Device: "0"}, fakeshim.Behavior{})
	granted, reason, err := high.Need(ctx5s(t), 8*gib)
	require.NoError(t, err)
	require.True(t, granted, reason)
	require.True(t, low.Out())
	// The requester never allocates (no usage report): once the grant expires
	// the memory is free again and the victim comes back.
	d.waitState(t, 1201, ctxmgr.Running)
	require.False(t, low.Out())
	require.Equal(t, []string{"swap_out", "swap_in"}, low.Swaps())
}

// BenchmarkSwapRoundTrip measures what the daemon and the protocol add to a
// swap: a manual swap-out and swap-in of a fake shim that moves nothing.
func BenchmarkSwapRoundTrip(b *testing.B) {
	socket := filepath.Join(b.TempDir(), "s.sock")
	ln, err := ctxmgr.ListenUnix(socket, nil)
	require.NoError(b, err)
	m := ctxmgr.NewManager(ctxmgr.Options{GPUMemory: 80 * gib, RebalanceEvery: -1})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go m.Serve(ctx, ln)
	s, err := fakeshim.Dial(ctx, socket, fakeshim.Hello{PID: 1, Bytes: gib}, fakeshim.Behavior{Chunks: 1})
	require.NoError(b, err)
	defer s.Close()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, dir := range []ctxmgr.Direction{ctxmgr.SwapOut, ctxmgr.SwapIn} {
			res, err := m.Swap(ctx, dir, ctxmgr.Target{PID: 1}, nil)
			if err != nil || !res[0].OK {
				b.Fatalf("%v %v", err, res)
			}
		}
	}
}
