package shimtest

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	ctxmgr "github.com/migctl/migctl/context"
	"github.com/migctl/migctl/internal/mps"
)

// Priority launch gating with the real daemon code (ctxmgr, in this process)
// and the real shim over the fake driver, whose sleep_us kernel keeps its
// stream busy for a given time without blocking the caller.

// gateDaemon is a daemon (shim socket + control API) run in the test.
type gateDaemon struct {
	d   *ctxmgr.Daemon
	ctl string
}

func startGateDaemon(t testing.TB, e *env, pol ctxmgr.GatePolicy) *gateDaemon {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	swap, ctl := filepath.Join(e.dir, "s.sock"), filepath.Join(e.dir, "c.sock")
	d, err := ctxmgr.StartDaemon(ctx, ctxmgr.DaemonConfig{ControlSocket: ctl, SwapSocket: swap,
		Swap: ctxmgr.Options{GPUMemory: 1 << 30, RebalanceEvery: -1, Gate: pol}})
	require.NoError(t, err)
	t.Cleanup(func() { cancel(); d.Close() })
	e.socket = swap
	return &gateDaemon{d: d, ctl: ctl}
}

// status returns the daemon's view of each job through the control API (the
// path 'migctl swap status' takes).
func (g *gateDaemon) status(t testing.TB) map[string]ctxmgr.Process {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl, err := ctxmgr.Dial(ctx, g.ctl)
	require.NoError(t, err)
	defer cl.Close()
	procs, _, err := cl.Status(ctx)
	require.NoError(t, err)
	out := map[string]ctxmgr.Process{}
	for _, p := range procs {
		out[p.Job] = p
	}
	return out
}

// startPrio starts `testprog gpa prio` as job with priority prio.
func startPrio(t testing.TB, e *env, job string, prio int) *proc {
	t.Helper()
	saved := e.extra
	e.extra = append(append([]string(nil), saved...), "MIGSWAP_JOB="+job, "MIGSWAP_PRIORITY="+strconv.Itoa(prio))
	p := e.start(t, "gpa", "prio")
	e.extra = saved
	p.waitLine(t, "READY", 20*time.Second)
	return p
}

func (p *proc) tell(t testing.TB, c string) {
	t.Helper()
	_, err := p.stdin.Write([]byte(c + "\n"))
	require.NoError(t, err)
}

// stats asks for a STATS_NOW line (answered even while a launch is held).
func (p *proc) stats(t testing.TB) map[string]string {
	t.Helper()
	p.tell(t, "stats")
	return p.waitLine(t, "STATS_NOW", 10*time.Second)
}

// launch queues n timed kernels of usec each and returns the LAUNCHED line.
func (p *proc) launch(t testing.TB, usec, n int, timeout time.Duration) map[string]string {
	t.Helper()
	p.tell(t, "launch "+strconv.Itoa(usec)+" "+strconv.Itoa(n))
	return p.waitLine(t, "LAUNCHED", timeout)
}

// waitGate waits until the process's shim has its gate settings: held
// (mask set) or signalling.
func (p *proc) waitGate(t testing.TB, held bool) {
	t.Helper()
	require.Eventually(t, func() bool {
		s := p.stats(t)
		if held {
			return s["prio_mask"] != "0"
		}
		return s["prio_signal"] == "1"
	}, 10*time.Second, 20*time.Millisecond, "gate settings did not arrive")
}

func usOf(t testing.TB, m map[string]string, k string) time.Duration {
	return time.Duration(num(t, m, k)) * time.Microsecond
}

// A low-priority process's launches wait while a high-priority process on the
// same device has work in flight, and go on when it completes; the daemon's
// status (the control API 'migctl swap status' uses) shows both classes and
// the held time the shim reported.
func TestGateHoldsLowWhileHighBusy(t *testing.T) {
	needBin(t)
	e := newEnv(t)
	g := startGateDaemon(t, e, ctxmgr.GatePolicy{Mode: ctxmgr.GateHold})
	high := startPrio(t, e, "infer", 10)
	low := startPrio(t, e, "train", 0)
	high.waitGate(t, false)
	low.waitGate(t, true)

	// high idle: the low launch passes at once
	l := low.launch(t, 1000, 1, 5*time.Second)
	require.Less(t, usOf(t, l, "elapsed_us"), 200*time.Millisecond)
	require.Equal(t, "0", low.stats(t)["prio_holds"])

	// high busy for 400 ms: the low launch waits for it
	const busy = 400 * time.Millisecond
	t0 := time.Now()
	high.launch(t, int(busy/time.Microsecond), 1, 5*time.Second)
	l = low.launch(t, 1000, 1, 10*time.Second)
	waited := usOf(t, l, "elapsed_us")
	t.Logf("low launch waited %v (high's kernel: %v, started %v before)", waited, busy, time.Since(t0)-waited)
	require.Greater(t, waited, busy/2, "the low launch was not held")
	require.Less(t, waited, busy+2*time.Second, "the low launch was held long after the high one completed")
	s := low.stats(t)
	require.Equal(t, uint64(1), num(t, s, "prio_holds"))
	require.Greater(t, time.Duration(num(t, s, "prio_held_ns")), busy/2)

	// released after: high idle again, low passes at once
	l = low.launch(t, 1000, 1, 5*time.Second)
	require.Less(t, usOf(t, l, "elapsed_us"), 200*time.Millisecond)

	require.Eventually(t, func() bool {
		st := g.status(t)
		return st["train"].Gate.Holds == 1 && st["infer"].Gate.BusyPeriods >= 1
	}, 5*time.Second, 50*time.Millisecond, "the daemon did not get the shims' gate stats")
	st := g.status(t)
	require.Equal(t, "low", st["train"].Gate.Class)
	require.Equal(t, "gate", st["train"].Gate.Policy)
	require.Equal(t, "high", st["infer"].Gate.Class)
	require.Greater(t, st["train"].Gate.HeldSeconds, (busy / 2).Seconds())
	require.Greater(t, st["infer"].Gate.BusySeconds, (busy / 2).Seconds())

	if migctl := os.Getenv("MIGCTL_BIN"); migctl != "" {
		out, err := exec.Command(migctl, "swap", "status", "--socket", g.ctl, "-o", "json").CombinedOutput()
		require.NoError(t, err, "%s", out)
		var v struct {
			Processes []struct {
				Job  string            `json:"job"`
				Gate ctxmgr.GateStatus `json:"gate"`
			} `json:"processes"`
		}
		require.NoError(t, json.Unmarshal(out, &v), "%s", out)
		jobs := map[string]ctxmgr.GateStatus{}
		for _, p := range v.Processes {
			jobs[p.Job] = p.Gate
		}
		require.Equal(t, "low", jobs["train"].Class, "%s", out)
		require.Equal(t, int64(1), jobs["train"].Holds, "%s", out)
		require.Greater(t, jobs["train"].HeldSeconds, (busy / 2).Seconds(), "%s", out)
		require.Equal(t, "high", jobs["infer"].Class, "%s", out)

		// a per-job policy from the CLI reaches the shim
		out, err = exec.Command(migctl, "swap", "gate", "--job", "train", "--policy", "budget=3,depth=5", "--socket", g.ctl, "-o", "json").CombinedOutput()
		require.NoError(t, err, "%s", out)
		require.Contains(t, string(out), `"policy": "budget=3,depth=5"`)
		require.Eventually(t, func() bool {
			s := low.stats(t)
			return s["prio_policy"] == "2" && s["prio_budget"] == "3" && s["prio_depth"] == "5"
		}, 5*time.Second, 20*time.Millisecond)
		require.Equal(t, "budget=3,depth=5", g.status(t)["train"].Gate.Policy)
		out, err = exec.Command(migctl, "swap", "gate", "--job", "nosuch", "--policy", "gate", "--socket", g.ctl).CombinedOutput()
		require.Error(t, err)
		require.Contains(t, string(out), "no such job")
	}
	high.finish(t, 10*time.Second)
	low.finish(t, 10*time.Second)
}

// With budget N, a held process keeps at most N of its launches in flight
// while the high-priority one is busy; with depth M it keeps at most M in
// flight while the high-priority one is idle; with the policy off nothing
// changes (all in flight at once).
func TestGateBudgetAndOff(t *testing.T) {
	needBin(t)
	const burst, kernel = 10, 20000 // 10 kernels of 20 ms on one stream
	for _, tc := range []struct {
		name        string
		pol         ctxmgr.GatePolicy
		maxInflight uint64
		held        bool
		highIdle    bool
	}{
		{"budget 2", ctxmgr.GatePolicy{Mode: ctxmgr.GateBudget, Budget: 2}, 2, true, false},
		{"budget 1", ctxmgr.GatePolicy{Mode: ctxmgr.GateBudget, Budget: 1}, 1, true, false},
		{"gate depth 3, high idle", ctxmgr.GatePolicy{Mode: ctxmgr.GateHold, Depth: 3}, 3, true, true},
		{"off", ctxmgr.GatePolicy{Mode: ctxmgr.GateOff}, burst, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			g := startGateDaemon(t, e, tc.pol)
			high := startPrio(t, e, "infer", 10)
			low := startPrio(t, e, "train", 0)
			if tc.held {
				high.waitGate(t, false)
				low.waitGate(t, true)
			} else {
				time.Sleep(200 * time.Millisecond) // give a (wrong) gate message time to arrive
				s := low.stats(t)
				require.Equal(t, "0", s["prio_mask"])
				require.Equal(t, "-1", s["prio_slot"])
				require.Equal(t, "0", high.stats(t)["prio_signal"])
			}
			if !tc.highIdle {
				high.launch(t, 2_000_000, 1, 5*time.Second) // busy for 2 s, well beyond the burst
			}
			l := low.launch(t, kernel, burst, 10*time.Second)
			t.Logf("%s: burst of %d took %s µs, at most %s in flight", tc.name, burst, l["elapsed_us"], l["maxinflight"])
			require.Equal(t, tc.maxInflight, num(t, l, "maxinflight"))
			s := low.stats(t)
			if tc.highIdle {
				require.Equal(t, "0", s["prio_holds"])
				require.Equal(t, "3", s["prio_depth"])
				require.Greater(t, usOf(t, l, "elapsed_us"), time.Duration(burst-tc.maxInflight-1)*kernel*time.Microsecond)
			} else if tc.held {
				require.NotEqual(t, "0", s["prio_holds"])
				require.Equal(t, "2", s["prio_policy"])
			} else {
				require.Equal(t, "0", s["prio_holds"])
				require.Less(t, usOf(t, l, "elapsed_us"), 500*time.Millisecond)
				st := g.status(t)
				require.Equal(t, "", st["train"].Gate.Class)
			}
			high.finish(t, 10*time.Second)
			low.finish(t, 10*time.Second)
		})
	}
}

// A high-priority process that dies with work in flight does not leave the
// low-priority one held: the daemon clears its busy bit when its connection
// ends; one that stops (SIGSTOP) is ignored once its heartbeat is stale.
func TestGateDeadOrStoppedHighReleasesLow(t *testing.T) {
	needBin(t)
	for _, how := range []string{"kill", "stop"} {
		t.Run(how, func(t *testing.T) {
			e := newEnv(t)
			startGateDaemon(t, e, ctxmgr.GatePolicy{Mode: ctxmgr.GateHold, Stale: 300 * time.Millisecond})
			high := startPrio(t, e, "infer", 10)
			low := startPrio(t, e, "train", 0)
			high.waitGate(t, false)
			low.waitGate(t, true)
			high.launch(t, 60_000_000, 1, 5*time.Second) // a minute of work
			time.AfterFunc(300*time.Millisecond, func() {
				if how == "kill" {
					_ = high.cmd.Process.Kill()
				} else {
					_ = high.cmd.Process.Signal(syscall.SIGSTOP)
				}
			})
			l := low.launch(t, 1000, 1, 20*time.Second)
			waited := usOf(t, l, "elapsed_us")
			t.Logf("%s: the low launch waited %v", how, waited)
			require.Greater(t, waited, 200*time.Millisecond, "not held before the high process went away")
			require.Less(t, waited, 5*time.Second)
			if how == "stop" {
				// still stopped: the next launch is not held either
				l = low.launch(t, 1000, 1, 5*time.Second)
				require.Less(t, usOf(t, l, "elapsed_us"), 200*time.Millisecond)
				_ = high.cmd.Process.Kill()
			}
			low.finish(t, 10*time.Second)
		})
	}
}

// On a device that runs kernels first come first served across processes
// (the fake's FAKECUDA_SHARED_DEVICE=1: no time slicing), a high-priority
// request waits behind whatever a best-effort process queued before it:
// gating alone cannot take back a backlog queued while the high process was
// idle; a depth limit keeps that backlog to a few kernels.
func TestGateDepthBoundsHighLatencyOnSharedDevice(t *testing.T) {
	needBin(t)
	const lowKernel, lowN, highKernel = 2000, 100, 1000 // the backlog: 100 x 2 ms
	for _, tc := range []struct {
		name     string
		pol      ctxmgr.GatePolicy
		min, max time.Duration
	}{
		{"off", ctxmgr.GatePolicy{Mode: ctxmgr.GateOff}, 100 * time.Millisecond, time.Second},
		{"gate without depth", ctxmgr.GatePolicy{Mode: ctxmgr.GateHold}, 100 * time.Millisecond, time.Second},
		{"gate depth 2", ctxmgr.GatePolicy{Mode: ctxmgr.GateHold, Depth: 2}, 0, 40 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.extra = []string{"FAKECUDA_SHARED_DEVICE=1"}
			startGateDaemon(t, e, tc.pol)
			high := startPrio(t, e, "infer", 10)
			low := startPrio(t, e, "train", 0)
			if tc.pol.Mode != ctxmgr.GateOff {
				high.waitGate(t, false)
				low.waitGate(t, true)
			}
			low.tell(t, "launch "+strconv.Itoa(lowKernel)+" "+strconv.Itoa(lowN))
			time.Sleep(30 * time.Millisecond) // the best-effort process is well into its work
			l := high.launch(t, highKernel, 1, 5*time.Second)
			high.tell(t, "sync")
			s := high.waitLine(t, "SYNCED", 10*time.Second)
			lat := usOf(t, l, "elapsed_us") + usOf(t, s, "elapsed_us")
			ll := low.waitLine(t, "LAUNCHED", 10*time.Second)
			low.tell(t, "sync")
			low.waitLine(t, "SYNCED", 10*time.Second)
			t.Logf("%s: high-priority request (1-ms kernel) took %v behind the best-effort backlog; the best-effort "+
				"launches took %s µs, at most %s in flight", tc.name, lat, ll["elapsed_us"], ll["maxinflight"])
			require.GreaterOrEqual(t, lat, tc.min)
			require.Less(t, lat, tc.max)
			if tc.pol.Depth > 0 {
				require.LessOrEqual(t, num(t, ll, "maxinflight"), uint64(tc.pol.Depth))
			}
			high.finish(t, 10*time.Second)
			low.finish(t, 10*time.Second)
		})
	}
}

// A signalling process (high priority, with a low-priority neighbour) that
// captures CUDA graphs while its other stream is busy, as torch.cuda.graph
// does after warm-up: the shim's watcher must never record or query an event
// while a global-mode capture is in progress, or the driver invalidates the
// capture (found on the H200: torch's graph capture failed under gating with
// cudaErrorStreamCaptureInvalidated). The fake driver invalidates a capture
// the way the real one does.
func TestGateWatcherLeavesCapturesAlone(t *testing.T) {
	needBin(t)
	for _, pol := range []ctxmgr.GatePolicy{
		{Mode: ctxmgr.GateHold},
		{Mode: ctxmgr.GateBudget, Budget: 8},
		{Mode: ctxmgr.GateHold, Depth: 32},
	} {
		t.Run(string(pol.Mode)+"-"+strconv.Itoa(pol.Budget+pol.Depth), func(t *testing.T) {
			e := newEnv(t)
			startGateDaemon(t, e, pol)
			high := startPrio(t, e, "infer", 10)
			low := startPrio(t, e, "train", 0)
			high.waitGate(t, false)
			low.waitGate(t, true)
			const rounds = 400
			// through the shim's hooks, and past them (a driver path the
			// shim does not wrap: only the driver's own capture status
			// protects the capture then)
			for _, how := range []string{"", " direct", " direct mixed slow"} {
				high.tell(t, "capture "+strconv.Itoa(rounds)+how)
				c := high.waitLine(t, "CAPTURED", 60*time.Second)
				require.Equal(t, uint64(0), num(t, c, "invalidated"), "captures%s invalidated by the shim (last error %s)", how, c["last"])
				require.Equal(t, uint64(rounds), num(t, c, "ok"))
				// launches into a capture are not counted, so the watcher
				// records no event on a stream that only captures: through
				// the hooks it knows from the capture's begin; past them from
				// the first capture it sees, after a round or two
				rec := num(t, c, "records_after_capture")
				switch how {
				case "":
					require.Zero(t, rec, "events recorded on the capturing stream between captures")
				case " direct mixed slow":
					// a stream with real launches as well, captured before;
					// the fake answers the watcher's capture checks 30 µs
					// late, so that a record the watcher made after its
					// check would often meet the next capture: the stream's
					// real launches are covered by events recorded when they
					// are launched instead: one per launch, none from the watcher
					require.Equal(t, uint64(rounds), rec, "events recorded on the mixed stream")
				default:
					require.Less(t, rec, uint64(rounds/10), "events recorded on the capturing stream between captures")
				}
				t.Logf("capture%s: %d events recorded on the capturing stream between captures", how, rec)
			}
			high.finish(t, 10*time.Second)
			low.finish(t, 10*time.Second)
		})
	}
}

// With the daemon's MPS control daemon present (its control pipe in
// SOCKET.mps, as `migctl daemon --mps` makes it), the shim joins it before
// the driver starts: CUDA_MPS_PIPE_DIRECTORY, and the client priority from
// MIGSWAP_PRIORITY (> 0: normal, 0; otherwise below normal, 1). A program's
// own settings and MIGSWAP_MPS=0 win.
func TestShimJoinsDaemonMPS(t *testing.T) {
	needBin(t)
	e := newEnv(t)
	startGateDaemon(t, e, ctxmgr.GatePolicy{Mode: ctxmgr.GateOff})
	ready := func(job string, prio int, extra ...string) map[string]string {
		saved := e.extra
		e.extra = append(append([]string(nil), saved...), "MIGSWAP_JOB="+job, "MIGSWAP_PRIORITY="+strconv.Itoa(prio))
		e.extra = append(e.extra, extra...)
		p := e.start(t, "gpa", "prio")
		e.extra = saved
		r := p.waitLine(t, "READY", 20*time.Second)
		p.tell(t, "stop")
		p.finish(t, 10*time.Second)
		return r
	}
	// no MPS: nothing set
	r := ready("plain", 10)
	require.Equal(t, "-", r["mps_pipe"])
	require.Equal(t, "-", r["mps_prio"])

	dir := ctxmgr.MPSPipeDir(e.socket)
	require.NoError(t, os.MkdirAll(dir, 0o700))
	require.NoError(t, syscall.Mkfifo(filepath.Join(dir, mps.ControlPipe), 0o600))
	for _, tc := range []struct {
		name        string
		prio        int
		extra       []string
		pipe, mprio string
	}{
		{"high", 10, nil, dir, "0"},
		{"best effort", 0, nil, dir, "1"},
		{"negative", -3, nil, dir, "1"},
		{"own priority kept", 0, []string{"CUDA_MPS_CLIENT_PRIORITY=0"}, dir, "0"},
		{"own pipe kept", 10, []string{"CUDA_MPS_PIPE_DIRECTORY=/elsewhere"}, "/elsewhere", "0"},
		{"opted out", 0, []string{"MIGSWAP_MPS=0"}, "-", "-"},
	} {
		r := ready(tc.name, tc.prio, tc.extra...)
		require.Equal(t, tc.pipe, r["mps_pipe"], tc.name)
		require.Equal(t, tc.mprio, r["mps_prio"], tc.name)
	}
	// the daemon's cap on best-effort clients' SMs (migctl daemon --mps-low-sm)
	require.NoError(t, os.WriteFile(filepath.Join(dir, mps.LowEnv),
		[]byte("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=40\nPATH=/not/this\n"), 0o644))
	r = ready("capped", 0)
	require.Equal(t, "40", r["mps_sm"])
	r = ready("capped, own share", 0, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=70")
	require.Equal(t, "70", r["mps_sm"])
	r = ready("high, not capped", 10)
	require.Equal(t, "-", r["mps_sm"])
	// the real control daemon's "control" may be a socket rather than a FIFO
	require.NoError(t, os.Remove(filepath.Join(dir, mps.ControlPipe)))
	ln, err := net.Listen("unix", filepath.Join(dir, mps.ControlPipe))
	require.NoError(t, err)
	defer ln.Close()
	r = ready("socket", 0)
	require.Equal(t, dir, r["mps_pipe"])
	require.Equal(t, "1", r["mps_prio"])
}
