package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/context/fakeshim"
)

const gib = int64(1) << 30

func dialShim(t *testing.T, d *testDaemon, h fakeshim.Hello, b fakeshim.Behavior) *fakeshim.Shim {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := fakeshim.Dial(ctx, d.swapSocket, h, b)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

func swapStatus(t *testing.T, d *testDaemon) statusView {
	t.Helper()
	out, _, err := migctl(t, "swap", "status", "--socket", d.ctlSocket, "-o", "json")
	require.NoError(t, err)
	var v statusView
	require.NoError(t, json.Unmarshal([]byte(out), &v))
	return v
}

func TestSwapCommands(t *testing.T) {
	d := startTestDaemon(t, "--gpu-memory", "40GiB")
	slow := fakeshim.Behavior{Chunks: 8, ChunkDelay: 5 * time.Millisecond}
	a := dialShim(t, d, fakeshim.Hello{PID: 1001, Job: "train", Priority: 2, Device: "GPU-1", Bytes: 6 * gib}, slow)
	b := dialShim(t, d, fakeshim.Hello{PID: 1002, Job: "train", Priority: 2, Device: "GPU-1", Bytes: 2 * gib}, slow)

	v := swapStatus(t, d)
	require.Len(t, v.Processes, 2)
	require.Equal(t, "train", v.Processes[0].Job)
	require.Equal(t, "running", v.Processes[0].State)
	require.Equal(t, 6*gib, v.Processes[0].GPUBytes)
	require.Equal(t, []deviceView{{Device: "GPU-1", Free: 32 * gib}}, v.Devices)

	table, _, err := migctl(t, "swap", "status", "--socket", d.ctlSocket)
	require.NoError(t, err)
	require.Contains(t, table, "PID")
	require.Contains(t, table, "ON-GPU")
	require.Contains(t, table, "6.0 GiB")

	out, errOut, err := migctl(t, "swap", "out", "--job", "train", "--socket", d.ctlSocket, "-o", "json")
	require.NoError(t, err)
	var res swapResults
	require.NoError(t, json.Unmarshal([]byte(out), &res))
	require.Len(t, res.Results, 2)
	require.True(t, res.Results[0].OK)
	require.Equal(t, 6*gib, res.Results[0].Bytes)
	require.Equal(t, "swap-out", res.Results[0].Direction)
	require.Contains(t, errOut, "swapping out", "progress bar on stderr")
	require.Contains(t, errOut, "100%", "the bar reaches the end")
	require.Contains(t, errOut, "8.0 GiB / 8.0 GiB", "the bar counts the job's bytes")
	require.True(t, a.Out())
	require.True(t, b.Out())

	v = swapStatus(t, d)
	require.Equal(t, "out", v.Processes[0].State)
	require.True(t, v.Processes[0].Hold)
	require.Zero(t, v.Processes[0].GPUBytes)
	require.False(t, v.Processes[0].LastProgress.IsZero())

	errCases := []struct {
		desc string
		args []string
		want string
	}{
		{"already out", []string{"swap", "out", "--pid", "1001"}, "pid 1001: already swapped out"},
		{"no such pid", []string{"swap", "in", "--pid", "77"}, "pid 77: no such shimmed process (see 'migctl swap status'"},
		{"no such job", []string{"swap", "out", "--job", "gpt"}, `job "gpt": no such job`},
		{"pid and job", []string{"swap", "out", "--pid", "1", "--job", "x"}, "exactly one of --pid and --job"},
		{"neither", []string{"swap", "in"}, "exactly one of --pid and --job"},
		{"bad output", []string{"swap", "status", "-o", "xml"}, "unknown output format"},
	}
	for _, tc := range errCases {
		t.Run(tc.desc, func(t *testing.T) {
			_, _, err := migctl(t, append(tc.args, "--socket", d.ctlSocket)...)
			require.ErrorContains(t, err, tc.want)
		})
	}

	out, _, err = migctl(t, "swap", "in", "--pid", "1002", "--socket", d.ctlSocket, "-q")
	require.NoError(t, err)
	require.Contains(t, out, "swap-in")
	require.Contains(t, out, "2.0 GiB")
	require.False(t, b.Out())
	require.True(t, a.Out())

	out, _, err = migctl(t, "swap", "status", "--socket", d.ctlSocket, "-o", "yaml")
	require.NoError(t, err)
	require.Contains(t, out, "state: out")
	require.Contains(t, out, "state: running")
}

func TestSwapFailuresAndTimeout(t *testing.T) {
	d := startTestDaemon(t, "--gpu-memory", "40GiB")
	dialShim(t, d, fakeshim.Hello{PID: 2001, Job: "ipc", Bytes: gib}, fakeshim.Behavior{RefuseOut: "IPC-exported allocation at 0x7f00"})
	out, _, err := migctl(t, "swap", "out", "--job", "ipc", "--socket", d.ctlSocket)
	require.ErrorContains(t, err, "swap-out of pid 2001 (job ipc) failed: IPC-exported allocation at 0x7f00")
	require.Contains(t, out, "false")

	dialShim(t, d, fakeshim.Hello{PID: 2003, Job: "dies", Bytes: gib}, fakeshim.Behavior{Chunks: 4, DisconnectMidSwap: true})
	_, _, err = migctl(t, "swap", "out", "--pid", "2003", "--socket", d.ctlSocket, "-q")
	require.ErrorContains(t, err, "swap-out of pid 2003 (job dies) failed: process exited (shim disconnected)")
	require.Eventually(t, func() bool {
		for _, p := range swapStatus(t, d).Processes {
			if p.PID == 2003 {
				return false
			}
		}
		return true
	}, 5*time.Second, 10*time.Millisecond, "the daemon forgets a process whose shim disconnected")

	dialShim(t, d, fakeshim.Hello{PID: 2002, Job: "slow", Bytes: gib}, fakeshim.Behavior{Chunks: 100, ChunkDelay: 20 * time.Millisecond})
	_, _, err = migctl(t, "swap", "out", "--job", "slow", "--socket", d.ctlSocket, "--timeout", "200ms", "-q")
	require.ErrorContains(t, err, "gave up after --timeout 200ms")
	v := swapStatus(t, d)
	require.Equal(t, "swapping-out", v.Processes[1].State, "the swap goes on in the daemon")
	require.Eventually(t, func() bool { return swapStatus(t, d).Processes[1].State == "out" }, 10*time.Second, 20*time.Millisecond)
}

func TestSwapReserve(t *testing.T) {
	d := startTestDaemon(t, "--gpu-memory", "16GiB")
	low := dialShim(t, d, fakeshim.Hello{PID: 3001, Job: "low", Priority: 0, Device: "0", Bytes: 12 * gib}, fakeshim.Behavior{})
	_, _, err := migctl(t, "swap", "reserve", "--device", "0", "--bytes", "20GiB", "--priority", "9", "--socket", d.ctlSocket)
	require.ErrorContains(t, err, "memory request denied: need 20.0 GiB")
	require.False(t, low.Out())

	out, _, err := migctl(t, "swap", "reserve", "--device", "0", "--bytes", "8GiB", "--priority", "9", "--socket", d.ctlSocket, "-o", "json")
	require.NoError(t, err)
	var r reserveView
	require.NoError(t, json.Unmarshal([]byte(out), &r))
	require.Equal(t, []int{3001}, r.Victims)
	require.Equal(t, 4*gib, r.FreeWas)
	require.True(t, low.Out())
}

func TestSwapWithoutDaemon(t *testing.T) {
	dir := t.TempDir()
	_, _, err := migctl(t, "swap", "status", "--socket", dir+"/none.sock")
	require.ErrorIs(t, err, errDaemonNotRunning)
	require.ErrorContains(t, err, "start it with 'sudo migctl daemon'")
}

// A --pid beyond PID_MAX_LIMIT is refused before it reaches the daemon: the
// request's int32 would wrap it to another process (2^32+1 is pid 1).
func TestSwapPIDOutOfRange(t *testing.T) {
	d := startTestDaemon(t, "--gpu-memory", "40GiB")
	one := dialShim(t, d, fakeshim.Hello{PID: 1, Job: "one", Bytes: gib}, fakeshim.Behavior{})
	for _, args := range [][]string{
		{"swap", "out", "--pid", "4294967297", "-q"},
		{"swap", "in", "--pid", "4294967297", "-q"},
		{"swap", "out", "--pid", "4294967296", "-q"},
		{"swap", "gate", "--pid", "4294967297", "--policy", "off"},
	} {
		t.Run(args[1]+"_"+args[3], func(t *testing.T) {
			_, _, err := migctl(t, append(args, "--socket", d.ctlSocket)...)
			require.ErrorContains(t, err, "is above the largest pid")
		})
	}
	require.False(t, one.Out(), "pid 1 was not swapped out")
}
