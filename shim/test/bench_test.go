package shimtest

import (
	"strconv"

	ctxmgr "github.com/migctl/migctl/context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// launchCost runs the C microbenchmark (N no-op launches through a
// cuGetProcAddress pointer) and returns nanoseconds per launch.
func launchCost(t testing.TB, e *env, n int) float64 {
	t.Helper()
	return benchRun(t, e, n, "")["ns_per_launch"]
}

// benchRun runs the C microbenchmark (role "low"/"high": once the daemon's
// gate settings have arrived) and returns its RESULT numbers: ns_per_launch,
// and ns_ab_shim, ns_ab_direct, ns_ab_overhead (the same launch through the
// shim and straight into the fake, alternating in one process).
func benchRun(t testing.TB, e *env, n int, role string) map[string]float64 {
	t.Helper()
	args := []string{"gpa", "bench", strconv.Itoa(n)}
	if role != "" {
		args = append(args, role)
	}
	p := e.start(t, args...)
	lines := p.finish(t, 120*time.Second)
	res := line(t, lines, "RESULT")
	out := map[string]float64{}
	for _, k := range []string{"ns_per_launch", "ns_ab_shim", "ns_ab_direct", "ns_ab_overhead"} {
		v, err := strconv.ParseFloat(res[k], 64)
		require.NoError(t, err, "%s in %v", k, res)
		out[k] = v
	}
	if e.shim && e.socket != "" {
		require.Equal(t, modeVMM, line(t, lines, "STATS")["mode"])
	}
	return out
}

// The gate costs well under a microsecond per intercepted launch (target
// 0.5 µs on the GPU machine; the bound here is loose for shared CI runners).
func TestLaunchOverhead(t *testing.T) {
	needBin(t)
	if testing.Short() {
		t.Skip("timing test")
	}
	bare := newEnv(t)
	bare.shim = false
	e, _ := newEnvWithDaemon(t) // the daemon accepts the shim (its connection is buffered; nothing to wait for here)
	const n = 2_000_000
	base := launchCost(t, bare, n)
	shim := launchCost(t, e, n)
	t.Logf("no-op launch: %.1f ns without the shim, %.1f ns with it: %.1f ns per intercepted launch", base, shim, shim-base)
	require.Less(t, shim-base, 1000.0)
}

func BenchmarkLaunchOverhead(b *testing.B) {
	needBin(b)
	bare := newEnv(b)
	bare.shim = false
	e, _ := newEnvWithDaemon(b) // the daemon accepts the shim (its connection is buffered; nothing to wait for here)
	n := b.N
	if n < 100000 {
		n = 100000
	}
	base := launchCost(b, bare, n)
	shim := launchCost(b, e, n)
	b.ReportMetric(base, "ns/launch-bare")
	b.ReportMetric(shim, "ns/launch-shim")
	b.ReportMetric(shim-base, "ns/launch-overhead")
}

// gateCosts measures the shim's cost per no-op launch (through the shim minus
// straight into the fake, alternating in one process) with priority gating
// off, in a low-priority process whose higher-priority neighbour is idle (the
// gate checks and lets the launch pass), and in the high-priority process
// (which publishes its work in flight).
func gateCosts(t testing.TB, n int) (off, low, high float64) {
	t.Helper()
	oe, _ := newEnvWithDaemon(t)
	off = benchRun(t, oe, n, "")["ns_ab_overhead"]

	e := newEnv(t)
	startGateDaemon(t, e, ctxmgr.GatePolicy{Mode: ctxmgr.GateHold})
	idle := startPrio(t, e, "infer", 10) // the neighbour: registered, idle
	e.extra = []string{"MIGSWAP_PRIORITY=0"}
	low = benchRun(t, e, n, "low")["ns_ab_overhead"]
	idle.finish(t, 10*time.Second)

	e2 := newEnv(t)
	startGateDaemon(t, e2, ctxmgr.GatePolicy{Mode: ctxmgr.GateHold})
	below := startPrio(t, e2, "train", 0)
	e2.extra = []string{"MIGSWAP_PRIORITY=10"}
	high = benchRun(t, e2, n, "high")["ns_ab_overhead"]
	below.finish(t, 10*time.Second)
	return off, low, high
}

// The shim's whole cost on a launch the priority gate does not hold (swap
// gate, priority check, hook dispatch, counters) stays within 50 ns (issue
// 10) on a quiet machine; the bound here is loose for shared CI runners and
// the numbers are logged (BenchmarkGateCost reports them).
func TestGateCostUngated(t *testing.T) {
	needBin(t)
	if testing.Short() {
		t.Skip("timing test")
	}
	off, low, high := gateCosts(t, 1_000_000)
	t.Logf("shim cost per no-op launch (in-process A/B against the fake): %.1f ns gating off, %.1f ns low-priority "+
		"ungated, %.1f ns high-priority signalling", off, low, high)
	require.Less(t, low, 500.0)
}

func BenchmarkGateCost(b *testing.B) {
	needBin(b)
	n := b.N
	if n < 1_000_000 {
		n = 1_000_000
	}
	off, low, high := gateCosts(b, n)
	b.ReportMetric(off, "ns/launch-shim-off")
	b.ReportMetric(low, "ns/launch-shim-low-ungated")
	b.ReportMetric(high, "ns/launch-shim-high-signal")
}
