package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/context/fakeshim"
)

// 'migctl daemon --gate' classes the shimmed processes of a device by
// priority; 'swap status' shows the class and policy, 'swap gate' sets a
// job's policy.
func TestSwapGateAndStatusClasses(t *testing.T) {
	d := startTestDaemon(t, "--gpu-memory", "40GiB", "--gate", "gate")
	dialShim(t, d, fakeshim.Hello{PID: 2001, Job: "train", Priority: 0, Device: "GPU-1", Bytes: gib}, fakeshim.Behavior{})
	dialShim(t, d, fakeshim.Hello{PID: 2002, Job: "infer", Priority: 10, Device: "GPU-1", Bytes: gib}, fakeshim.Behavior{})
	dialShim(t, d, fakeshim.Hello{PID: 2003, Job: "other", Priority: 0, Device: "GPU-2", Bytes: gib}, fakeshim.Behavior{})

	byJob := func() map[string]processView {
		out := map[string]processView{}
		for _, p := range swapStatus(t, d).Processes {
			out[p.Job] = p
		}
		return out
	}
	// The daemon classes a process once it has registered it, which may
	// come just after the shim's dial returned.
	var v map[string]processView
	require.Eventually(t, func() bool {
		v = byJob()
		return v["train"].Gate.Class != "" && v["infer"].Gate.Class != "" && v["other"].Gate.Class != ""
	}, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, "low", v["train"].Gate.Class)
	require.Equal(t, "gate", v["train"].Gate.Policy)
	require.Equal(t, "high", v["infer"].Gate.Class)
	require.Equal(t, "alone", v["other"].Gate.Class)

	table, _, err := migctl(t, "swap", "status", "--socket", d.ctlSocket)
	require.NoError(t, err)
	require.Contains(t, table, "CLASS")
	require.Contains(t, table, "HELD")
	require.Contains(t, table, "0s/0")

	out, _, err := migctl(t, "swap", "gate", "--job", "train", "--policy", "budget=2,depth=4", "--socket", d.ctlSocket)
	require.NoError(t, err)
	require.Contains(t, out, "2001")
	require.Equal(t, "budget=2,depth=4", byJob()["train"].Gate.Policy)
	_, _, err = migctl(t, "swap", "gate", "--pid", "2001", "--policy", "default", "--socket", d.ctlSocket)
	require.NoError(t, err)
	require.Equal(t, "gate", byJob()["train"].Gate.Policy)

	for _, tc := range []struct {
		desc string
		args []string
		want string
	}{
		{"no such job", []string{"--job", "gpt", "--policy", "gate"}, `"gpt": no such job`},
		{"bad policy", []string{"--job", "train", "--policy", "budget=99"}, "budget 99 is out of range"},
		{"no policy", []string{"--job", "train"}, "--policy is required"},
		{"pid and job", []string{"--pid", "1", "--job", "x", "--policy", "gate"}, "exactly one of --pid and --job"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			_, _, err := migctl(t, append([]string{"swap", "gate", "--socket", d.ctlSocket}, tc.args...)...)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// Without --gate nothing is classed.
func TestSwapStatusGateOff(t *testing.T) {
	d := startTestDaemon(t, "--gpu-memory", "40GiB")
	dialShim(t, d, fakeshim.Hello{PID: 2101, Job: "train", Priority: 0, Device: "GPU-1", Bytes: gib}, fakeshim.Behavior{})
	dialShim(t, d, fakeshim.Hello{PID: 2102, Job: "infer", Priority: 10, Device: "GPU-1", Bytes: gib}, fakeshim.Behavior{})
	for _, p := range swapStatus(t, d).Processes {
		require.Empty(t, p.Gate.Class, "%s", p.Job)
		require.Equal(t, -1, p.Gate.Slot)
	}
}
