package shimtest

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// With the real node daemon (`migctl daemon`, $MIGCTL_BIN as `make test` sets it):
// `migctl swap out/in --job` moves the program's memory out and back, the fake
// device really frees it, and every float survives. Skipped without $MIGCTL_BIN.
func TestWithMigctlDaemon(t *testing.T) {
	needBin(t)
	migctl := os.Getenv("MIGCTL_BIN")
	if migctl == "" {
		t.Skip("MIGCTL_BIN not set (make test sets it)")
	}
	_, err := os.Stat(migctl)
	require.NoError(t, err)
	e := newEnv(t)
	swapSock := filepath.Join(e.dir, "s.sock")
	ctlSock := filepath.Join(e.dir, "c.sock")
	ctx, cancel := context.WithCancel(context.Background())
	daemon := exec.CommandContext(ctx, migctl, "daemon", "--gpu-memory", "1GiB", "--swap-socket", swapSock,
		"--socket", ctlSock, "--rebalance-every", "0")
	daemon.Stderr = &prefixWriter{t: t}
	require.NoError(t, daemon.Start())
	t.Cleanup(func() { cancel(); _ = daemon.Wait() })
	require.Eventually(t, func() bool {
		_, err1 := os.Stat(swapSock)
		_, err2 := os.Stat(ctlSock)
		return err1 == nil && err2 == nil
	}, 20*time.Second, 20*time.Millisecond, "the daemon did not create its sockets")

	e.socket = swapSock
	e.extra = []string{"MIGSWAP_JOB=victim"}
	p := e.start(t, "gpa", "loop", "2", "4194304")
	p.waitLine(t, "READY", 20*time.Second)
	resident := readFakeStats(t, e.stats)
	require.Equal(t, uint64(8<<20), resident.VMMInUse)

	swap := func(dir string) map[string]any {
		out, err := exec.Command(migctl, "swap", dir, "--job", "victim", "--socket", ctlSock, "-q", "-o", "json").CombinedOutput()
		require.NoError(t, err, "migctl swap %s: %s", dir, out)
		var v any
		require.NoError(t, json.Unmarshal(out, &v), "%s", out)
		if l, ok := v.([]any); ok {
			require.Len(t, l, 1)
			v = l[0]
		}
		m, ok := v.(map[string]any)
		require.True(t, ok, "%s", out)
		return m
	}
	for i := 0; i < 3; i++ {
		swap("out")
		st := readFakeStats(t, e.stats)
		require.Equal(t, uint64(0), st.InUse, "cycle %d: memory not released while out", i)
		time.Sleep(20 * time.Millisecond)
		require.Equal(t, st.Launches, readFakeStats(t, e.stats).Launches, "a kernel ran while swapped out")
		swap("in")
		require.Equal(t, resident.VMMInUse, readFakeStats(t, e.stats).VMMInUse)
	}
	lines := p.finish(t, 20*time.Second)
	res := line(t, lines, "RESULT")
	require.Equal(t, "1", res["ok"], "%v", res)
	st := line(t, lines, "STATS")
	require.Equal(t, uint64(3), num(t, st, "swaps_out"))
	require.Equal(t, uint64(3), num(t, st, "swaps_in"))
}
