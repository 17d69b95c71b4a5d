package main

import (
	"encoding/binary"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestFairPolicyEndToEndWithShim: `migctl daemon --policy fair` with the real
// libmigswap.so on the fake libcuda.so. Two equal-priority programs of 8 MiB
// each share a 12-MiB device: the second one's allocation fails, its need
// makes the daemon swap the first out, and then they take turns of one
// quantum (1 s). Both finish with every float of their buffers right (the
// shim's checksums on) after their swaps.
func TestFairPolicyEndToEndWithShim(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the shim and the migctl binary; skipped with -short")
	}
	shimDir, bin := e2eBinaries(t)
	swapSock, ctlSock, stats, dlog := startE2EDaemon(t, bin, "--gpu-memory", "12MiB", "--rebalance-every", "1s",
		"--policy", "fair", "--quantum", "1s", "--swap-bandwidth", "1TiB")

	env := func(job string) []string {
		return append(e2eEnv(shimDir, swapSock, stats, job, 0), "FAKECUDA_MEM_BYTES="+strconv.Itoa(12<<20))
	}
	a := startProgram(t, shimDir, env("a"), "dlsym", "loop", "1", strconv.Itoa(8<<20))
	a.expect(t, "READY", 10*time.Second)
	require.Eventually(t, func() bool { return e2eStatus(t, bin, ctlSock)["a"].Bytes == 8<<20 }, 10*time.Second, 20*time.Millisecond)
	b := startProgram(t, shimDir, env("b"), "dlsym", "loop", "1", strconv.Itoa(8<<20))
	// b's one allocation fails on the device (one buffer each: the daemon's
	// declared budget cannot lag behind b's own usage reports), its need
	// swaps a out.
	b.expect(t, "READY", 30*time.Second)
	require.Contains(t, dlog.String(), "need granted")

	// Turns: three swap-ins (a, b, a again), never both running (the device
	// holds one). (--rebalance-every 1s: when the first to stop exits, the
	// other's swap-in can race the release of its memory and is retried.)
	start := time.Now()
	require.Eventually(t, func() bool {
		st := e2eStatus(t, bin, ctlSock)
		require.False(t, st["a"].State == "running" && st["b"].State == "running", "both running on a device that holds one: %+v", st)
		return countSwaps(dlog.String(), "swap-in") >= 3
	}, 30*time.Second, 50*time.Millisecond, "the two programs did not take turns")
	elapsed := time.Since(start)
	// Not a thrash: about one switch per quantum.
	require.LessOrEqual(t, countSwaps(dlog.String(), "swap-out"), int(elapsed/time.Second)+3, "in %v:\n%s", elapsed, dlog.String())

	// The fake device never frees the memory of a process that exits (a real
	// driver does): give it room for the leak of the first to finish, so the
	// other can come back in and finish too (the daemon still budgets 12 MiB).
	f, err := os.OpenFile(stats, os.O_RDWR, 0)
	require.NoError(t, err)
	capacity := make([]byte, 8)
	binary.LittleEndian.PutUint64(capacity, 24<<20)
	_, err = f.WriteAt(capacity, 8) // struct fakecuda_stats: magic, capacity, in_use
	require.NoError(t, err)
	require.NoError(t, f.Close())
	for _, p := range []*program{a, b} {
		_, err := io.WriteString(p.stdin, "stop\n")
		require.NoError(t, err)
	}
	for name, p := range map[string]*program{"a": a, "b": b} {
		st := p.expect(t, "STATS", 30*time.Second)
		n, _ := strconv.Atoi(st["swaps_out"])
		require.GreaterOrEqual(t, n, 1, "%s: %v", name, st)
		r := p.expect(t, "RESULT", 30*time.Second)
		require.Equal(t, "1", r["ok"], "%s after its swaps: %v", name, r)
		require.Equal(t, "0", r["wrong"])
		<-p.done
	}
}

// countSwaps counts the daemon's successful swap results in direction dir.
func countSwaps(log, dir string) int {
	n := 0
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, `msg="swap result"`) && strings.Contains(l, "dir="+dir) && strings.Contains(l, "ok=true") {
			n++
		}
	}
	return n
}
