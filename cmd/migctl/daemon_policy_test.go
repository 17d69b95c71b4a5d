package main

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/context/fakeshim"
)

func TestDaemonPolicyFlags(t *testing.T) {
	for _, tc := range []struct {
		desc string
		args []string
		want string
	}{
		{desc: "an unknown policy", args: []string{"--policy", "lottery"}, want: `--policy "lottery": want one of priority, fair, srf`},
		{desc: "a zero quantum", args: []string{"--policy", "fair", "--quantum", "0s"}, want: "--quantum must be positive"},
		{desc: "a bad bandwidth", args: []string{"--swap-bandwidth", "fast"}, want: "--swap-bandwidth"},
		{desc: "a zero bandwidth", args: []string{"--swap-bandwidth", "0"}, want: "--swap-bandwidth must be positive"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			_, _, err := migctl(t, append([]string{"daemon", "--gpu-memory", "8GiB"}, tc.args...)...)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func TestDaemonPolicyHelp(t *testing.T) {
	out, _, err := migctl(t, "daemon", "--help")
	require.NoError(t, err)
	for _, want := range []string{"--policy", "priority|fair|srf", "round robin", "shortest remaining first", "MIGSWAP_EXPECTED",
		"--quantum", "--swap-bandwidth", "migctl daemon --policy fair"} {
		require.Contains(t, out, want)
	}
}

// TestDaemonPolicyFair: `migctl daemon --policy fair` lets a second
// equal-priority process that does not fit get its memory (the first is
// swapped out), where the default policy refuses it.
func TestDaemonPolicyFair(t *testing.T) {
	for _, tc := range []struct {
		policy  string
		granted bool
	}{{"priority", false}, {"fair", true}, {"srf", true}} {
		t.Run(tc.policy, func(t *testing.T) {
			d := startTestDaemon(t, "--gpu-memory", "10GiB", "--headroom", "0", "--policy", tc.policy)
			require.Contains(t, d.log.String(), "policy="+tc.policy)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			a, err := fakeshim.Dial(ctx, d.swapSocket, fakeshim.Hello{PID: 3001, Job: "a", Device: "0", Bytes: 6 << 30}, fakeshim.Behavior{})
			require.NoError(t, err)
			defer a.Close()
			b, err := fakeshim.Dial(ctx, d.swapSocket, fakeshim.Hello{PID: 3002, Job: "b", Device: "0"}, fakeshim.Behavior{})
			require.NoError(t, err)
			defer b.Close()
			ok, reason, err := b.Need(ctx, 6<<30)
			require.NoError(t, err)
			require.Equal(t, tc.granted, ok, reason)
			require.Equal(t, tc.granted, a.Out())
		})
	}
}
