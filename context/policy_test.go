package ctxmgr

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const gib = int64(1) << 30

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func mkProc(pid, prio int, bytes int64, state State, startedMin int) Process {
	return Process{PID: pid, Job: "job", Priority: prio, Device: "GPU-0", Bytes: bytes, State: state,
		Started: t0.Add(time.Duration(startedMin) * time.Minute)}
}

func TestPlanNeed(t *testing.T) {
	tests := []struct {
		desc        string
		free        int64
		procs       []Process
		req         Request
		wantGranted bool
		wantVictims []int
		wantReason  string
	}{
		{
			desc: "fits in free memory: no victims",
			free: 10 * gib, procs: []Process{mkProc(1, 0, 20*gib, Running, 0)},
			req: Request{PID: 9, Device: "GPU-0", Bytes: 10 * gib, Priority: 5}, wantGranted: true,
		},
		{
			desc: "lowest priority goes first",
			free: 0, procs: []Process{mkProc(1, 1, 8*gib, Running, 0), mkProc(2, 0, 8*gib, Running, 0), mkProc(3, 2, 8*gib, Running, 0)},
			req: Request{PID: 9, Device: "GPU-0", Bytes: 8 * gib, Priority: 5}, wantGranted: true, wantVictims: []int{2},
		},
		{
			desc: "among equal priorities the most recently started goes first",
			free: 1 * gib, procs: []Process{mkProc(1, 0, 4*gib, Running, 0), mkProc(2, 0, 4*gib, Running, 10), mkProc(3, 0, 4*gib, Running, 5)},
			req: Request{PID: 9, Device: "GPU-0", Bytes: 9 * gib, Priority: 1}, wantGranted: true, wantVictims: []int{2, 3},
		},
		{
			desc: "keeps going until it fits, counting free memory",
			free: 2 * gib, procs: []Process{mkProc(1, 0, 3*gib, Running, 0), mkProc(2, 1, 3*gib, Running, 0), mkProc(3, 2, 3*gib, Running, 0)},
			req: Request{PID: 9, Device: "GPU-0", Bytes: 8 * gib, Priority: 3}, wantGranted: true, wantVictims: []int{1, 2},
		},
		{
			desc: "equal or higher priority is never a victim; denied without victims",
			free: 1 * gib, procs: []Process{mkProc(1, 0, 2*gib, Running, 0), mkProc(2, 5, 30*gib, Running, 0), mkProc(3, 6, 30*gib, Running, 0)},
			req:        Request{PID: 9, Device: "GPU-0", Bytes: 10 * gib, Priority: 5},
			wantReason: `need 10.0 GiB on device "GPU-0": 1.0 GiB free, lower-priority jobs (priority < 5) hold 2.0 GiB; 60.0 GiB more is held by processes of priority >= 5 or not running`,
		},
		{
			desc: "other devices, swapped-out, swapping and waiting processes are not victims",
			free: 0, procs: []Process{
				{PID: 1, Priority: 0, Device: "GPU-1", Bytes: 50 * gib, State: Running},
				mkProc(2, 0, 50*gib, Out, 0), mkProc(3, 0, 50*gib, SwappingOut, 0), mkProc(4, 0, 50*gib, SwappingIn, 0),
				{PID: 5, Priority: 0, Device: "GPU-0", Bytes: 50 * gib, State: Running, Waiting: true},
				mkProc(6, 0, 1*gib, Running, 0),
			},
			req:        Request{PID: 9, Device: "GPU-0", Bytes: 2 * gib, Priority: 5},
			wantReason: `need 2.0 GiB on device "GPU-0": 0 B free, lower-priority jobs (priority < 5) hold 1.0 GiB; 50.0 GiB more is held by processes of priority >= 5 or not running`,
		},
		{
			desc: "the requester itself is not a victim",
			free: 0, procs: []Process{mkProc(9, 0, 10*gib, Running, 0), mkProc(1, -1, 4*gib, Running, 0)},
			req: Request{PID: 9, Device: "GPU-0", Bytes: 4 * gib, Priority: 0}, wantGranted: true, wantVictims: []int{1},
		},
		{
			desc: "negative priorities order like any integers",
			free: 0, procs: []Process{mkProc(1, -1, 4*gib, Running, 0), mkProc(2, -7, 4*gib, Running, 0)},
			req: Request{Device: "GPU-0", Bytes: 4 * gib, Priority: 0}, wantGranted: true, wantVictims: []int{2},
		},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			got := PlanNeed(Snapshot{Free: map[string]int64{"GPU-0": tc.free}, Procs: tc.procs}, tc.req)
			require.Equal(t, tc.wantGranted, got.Granted)
			require.Equal(t, tc.wantVictims, got.Victims)
			require.Equal(t, tc.wantReason, got.Reason)
			if got.Granted {
				require.GreaterOrEqual(t, got.Free+got.Freed, tc.req.Bytes)
			} else {
				require.Zero(t, got.Freed)
			}
		})
	}
}

func TestPlanSwapIn(t *testing.T) {
	held := mkProc(7, 9, 1*gib, Out, 0)
	held.Hold = true
	tests := []struct {
		desc  string
		free  map[string]int64
		epoch uint64
		procs []Process
		want  []int
	}{
		{
			desc:  "highest priority first, then oldest",
			free:  map[string]int64{"GPU-0": 8 * gib},
			procs: []Process{mkProc(1, 0, 4*gib, Out, 0), mkProc(2, 3, 4*gib, Out, 5), mkProc(3, 3, 4*gib, Out, 1)},
			want:  []int{3, 2},
		},
		{
			desc:  "a bigger one that does not fit does not stop a smaller one",
			free:  map[string]int64{"GPU-0": 5 * gib},
			epoch: 1,
			procs: []Process{mkProc(1, 9, 6*gib, Out, 0), mkProc(2, 1, 5*gib, Blocked, 0)},
			want:  []int{2},
		},
		{
			desc:  "held by an operator, running and swapping processes stay where they are",
			free:  map[string]int64{"GPU-0": 100 * gib},
			procs: []Process{held, mkProc(1, 0, 1*gib, Running, 0), mkProc(2, 0, 1*gib, SwappingOut, 0), mkProc(3, 0, 1*gib, SwappingIn, 0)},
			want:  nil,
		},
		{
			desc:  "each device has its own free memory",
			free:  map[string]int64{"GPU-0": 1 * gib, "GPU-1": 10 * gib},
			procs: []Process{mkProc(1, 5, 2*gib, Out, 0), {PID: 2, Priority: 0, Device: "GPU-1", Bytes: 2 * gib, State: Out}},
			want:  []int{2},
		},
		{
			desc:  "a blocked process is retried only when memory was freed since its failure",
			free:  map[string]int64{"GPU-0": 10 * gib},
			epoch: 7,
			procs: []Process{
				{PID: 1, Priority: 9, Device: "GPU-0", Bytes: 2 * gib, State: Blocked, BlockedEpoch: 7},
				{PID: 2, Priority: 1, Device: "GPU-0", Bytes: 2 * gib, State: Blocked, BlockedEpoch: 6},
			},
			want: []int{2},
		},
		{
			desc:  "nothing free, nothing comes in",
			free:  map[string]int64{},
			procs: []Process{mkProc(1, 5, 1, Out, 0)},
			want:  nil,
		},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			require.Equal(t, tc.want, PlanSwapIn(Snapshot{Free: tc.free, Procs: tc.procs, Epoch: tc.epoch}))
		})
	}
}

func TestFormatBytes(t *testing.T) {
	for in, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1536: "1.5 KiB", 16 * gib: "16.0 GiB"} {
		require.Equal(t, want, FormatBytes(in))
	}
}
