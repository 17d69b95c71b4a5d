package supervisor

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/internal/testutil"
)

// The test binary doubles as the worker: with envWorker set, TestMain runs
// worker() instead of the tests and exits. worker() never calls Run, so the
// re-execution cannot recurse.
const envWorker = "SUPERVISOR_TEST_WORKER"

func TestMain(m *testing.M) {
	if mode := os.Getenv(envWorker); mode != "" {
		os.Exit(worker(mode))
	}
	os.Exit(m.Run())
}

func envInt(k string) int {
	n, _ := strconv.Atoi(os.Getenv(k))
	return n
}

// touch creates dir/name (a marker the test waits for).
func touch(name string) {
	_ = os.WriteFile(filepath.Join(os.Getenv("T_DIR"), name), nil, 0o600)
}

// worker is one test worker. RANK and GEN come from Config.Env.
func worker(mode string) int {
	rank, gen := envInt("RANK"), envInt("GEN")
	id := fmt.Sprintf("%d-%d", gen, rank)
	switch mode {
	case "ok":
		fmt.Printf("out %d\n", rank)
		fmt.Fprintf(os.Stderr, "err %d\n", rank)
		fmt.Print("no newline at the end")
		return 0
	case "lines": // many long lines, fast, on both streams
		line := strings.Repeat(strconv.Itoa(rank), 2000)
		for range 100 {
			fmt.Println(line)
			fmt.Fprintln(os.Stderr, line)
		}
		return 0
	case "exit": // rank FAIL_RANK exits FAIL_CODE, the others wait for a signal
		if rank == envInt("FAIL_RANK") {
			time.Sleep(100 * time.Millisecond)
			return envInt("FAIL_CODE")
		}
		time.Sleep(time.Minute)
		return 0
	case "gen0sleep": // generation 0 sleeps (to be killed), later ones succeed
		if gen == 0 {
			touch("ready-" + id)
			time.Sleep(time.Minute)
		}
		return 0
	case "stubborn": // rank 0 fails once the others ignore SIGTERM and left a grandchild
		if rank == 0 {
			// Not before: a slow start (a loaded machine, the race
			// detector) would otherwise meet the SIGTERM unprotected.
			for r := 1; r < envInt("N_WORKERS"); r++ {
				waitFile(os.Getenv("T_DIR"), fmt.Sprintf("grandchild-%d-%d", gen, r))
			}
			time.Sleep(100 * time.Millisecond)
			return 1
		}
		signal.Ignore(syscall.SIGTERM)
		gc := exec.Command("sleep", "60")
		_ = gc.Start()
		_ = os.WriteFile(filepath.Join(os.Getenv("T_DIR"), "grandchild-"+id), []byte(strconv.Itoa(gc.Process.Pid)), 0o600)
		time.Sleep(time.Minute)
		return 0
	case "stall": // rank 1 stops itself (SIGSTOP); rank 0 fails as at a deadline
		if rank == 1 {
			touch("ready-" + id)
			_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
			time.Sleep(time.Minute)
			return 0
		}
		waitFile(os.Getenv("T_DIR"), "ready-"+fmt.Sprintf("%d-1", gen))
		time.Sleep(300 * time.Millisecond)
		return 1
	case "trap": // notes SIGUSR1 and SIGTERM, exits 3 on SIGTERM
		ch := make(chan os.Signal, 4)
		signal.Notify(ch, syscall.SIGUSR1, syscall.SIGTERM)
		touch("ready-" + id)
		for sig := range ch {
			touch(unixName(sig) + "-" + id)
			if sig == syscall.SIGTERM {
				return 3
			}
		}
	case "deaf": // ignores SIGINT and SIGTERM
		signal.Ignore(syscall.SIGINT, syscall.SIGTERM)
		touch("ready-" + id)
		time.Sleep(time.Minute)
		return 0
	case "aftermath": // rank 0 fails first; rank 1 then meets the fate the test wrote
		if rank == 1 {
			touch("ready-" + id)
			waitFile(os.Getenv("T_DIR"), "fate")
			b, _ := os.ReadFile(filepath.Join(os.Getenv("T_DIR"), "fate"))
			switch string(b) {
			case "kill":
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			case "ok":
				return 0
			}
		} else if rank == 0 {
			waitFile(os.Getenv("T_DIR"), "ready-"+fmt.Sprintf("%d-1", gen))
			return 1
		}
		time.Sleep(time.Minute)
		return 0
	case "errorfile":
		if rank == 1 {
			rec := `{"message": {"message": "ValueError: bad batch\nline 2", "extraInfo": {"py_callstack": "...", "timestamp": "1700000000"}}}`
			_ = os.WriteFile(os.Getenv("TORCHELASTIC_ERROR_FILE"), []byte(rec), 0o600)
			return 1
		}
		time.Sleep(time.Minute)
		return 0
	}
	return 99
}

func unixName(sig os.Signal) string { return SignalName(sig) }

// baseConfig runs n copies of this test binary as workers in mode.
func baseConfig(t *testing.T, n int, mode string, extra ...string) Config {
	t.Helper()
	dir := t.TempDir()
	self, err := os.Executable()
	require.NoError(t, err)
	return Config{
		N:            n,
		Command:      []string{self},
		ErrorFileEnv: "TORCHELASTIC_ERROR_FILE",
		Grace:        2 * time.Second,
		Env: func(w Worker) []string {
			return append([]string{envWorker + "=" + mode, "RANK=" + strconv.Itoa(w.Rank),
				"GEN=" + strconv.Itoa(w.Generation), "T_DIR=" + dir}, extra...)
		},
	}
}

// tracker records every started worker's pid (its process group).
type tracker struct {
	mu   sync.Mutex
	pids map[string]int // "gen-rank" → pid
}

func (tr *tracker) onStart(w Worker, pid int) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.pids == nil {
		tr.pids = map[string]int{}
	}
	tr.pids[fmt.Sprintf("%d-%d", w.Generation, w.Rank)] = pid
}

func (tr *tracker) pid(id string) int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.pids[id]
}

// requireNoGroups fails if a live (non-zombie) process is left in the
// process group of any started worker. A process the supervisor killed
// (SIGKILL to the group, a grandchild included) may still be torn down by
// the kernel when Run returns on a loaded machine: it is given 5 s.
func (tr *tracker) requireNoGroups(t *testing.T) {
	t.Helper()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	require.NotEmpty(t, tr.pids)
	for id, pgid := range tr.pids {
		var left []int
		for range 100 {
			if left = liveInGroup(t, pgid); len(left) == 0 {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		require.Empty(t, left, "worker %s's process group %d still has processes after 5 s", id, pgid)
	}
}

// liveInGroup lists the processes of group pgid that are not zombies.
func liveInGroup(t *testing.T, pgid int) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	require.NoError(t, err)
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...; comm may hold spaces.
		rest := string(b[bytes.LastIndexByte(b, ')')+2:])
		f := strings.Fields(rest)
		if len(f) < 3 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		if g, _ := strconv.Atoi(f[2]); g == pgid {
			out = append(out, pid)
		}
	}
	return out
}

// waitFile waits up to 20 s for dir/name; it is called from helper
// goroutines, so it reports by its result (the test's later checks fail).
func waitFile(dir, name string) bool {
	for range 400 {
		if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}

func tdir(cfg Config) string {
	for _, kv := range cfg.Env(Worker{}) {
		if v, ok := strings.CutPrefix(kv, "T_DIR="); ok {
			return v
		}
	}
	return ""
}

func TestSuccess(t *testing.T) {
	cfg := baseConfig(t, 3, "ok")
	cfg.FirstRank = 4
	var out, errOut testutil.LockedBuffer
	cfg.Stdout, cfg.Stderr = &out, &errOut
	tr := &tracker{}
	cfg.OnStart = tr.onStart
	res, err := Run(context.Background(), cfg)
	require.NoError(t, err)
	require.Zero(t, res.Restarts)
	require.Nil(t, res.RootCause())
	require.Len(t, res.Workers, 3)
	for i, w := range res.Workers {
		require.Equal(t, Exit{Rank: 4 + i, LocalRank: i, PID: tr.pid(fmt.Sprintf("0-%d", 4+i))}, w)
		require.Contains(t, out.String(), fmt.Sprintf("[%d]: out %d\n", 4+i, 4+i))
		require.Contains(t, out.String(), fmt.Sprintf("[%d]: no newline at the end\n", 4+i))
		require.Contains(t, errOut.String(), fmt.Sprintf("[%d]: err %d\n", 4+i, 4+i))
	}
	tr.requireNoGroups(t)
}

// TestRestartAllAfterSIGKILL: a worker killed with SIGKILL makes every
// worker restart; the hook sees the new generation; the root cause names
// the killed rank and the signal.
func TestRestartAllAfterSIGKILL(t *testing.T) {
	cfg := baseConfig(t, 3, "gen0sleep")
	cfg.MaxRestarts = 2
	dir := tdir(cfg)
	tr := &tracker{}
	cfg.OnStart = tr.onStart
	var hooks []int
	cfg.BeforeRestart = func(_ context.Context, gen int) error {
		hooks = append(hooks, gen)
		return nil
	}
	var failures []Failure
	cfg.OnFailure = func(f Failure) { failures = append(failures, f) }
	go func() {
		for r := range 3 {
			waitFile(dir, fmt.Sprintf("ready-0-%d", r))
		}
		_ = syscall.Kill(tr.pid("0-1"), syscall.SIGKILL)
	}()
	start := time.Now()
	res, err := Run(context.Background(), cfg)
	require.NoError(t, err)
	require.Less(t, time.Since(start), 20*time.Second)
	require.Equal(t, 1, res.Restarts)
	require.Equal(t, []int{1}, hooks)
	require.Len(t, res.Failures, 1)
	f := res.Failures[0]
	require.Equal(t, 1, f.Rank)
	require.Equal(t, "SIGKILL", f.Signal)
	require.Equal(t, -1, f.ExitCode)
	require.Equal(t, tr.pid("0-1"), f.PID)
	require.Equal(t, 0, f.Generation)
	require.Equal(t, []Failure{f}, failures)
	for r := range 3 {
		require.NotZero(t, tr.pid(fmt.Sprintf("1-%d", r)), "rank %d not restarted", r)
		require.Zero(t, res.Workers[r].ExitCode)
	}
	tr.requireNoGroups(t)
}

// TestSuspectIsTheRootCause: a rank that dies takes its peers down
// through the rendezvous before its own exit is reaped; the rank the caller
// suspects is the root cause when it fails within Settle, and the first
// failure stays the root cause when it does not (or none is suspected).
func TestSuspectIsTheRootCause(t *testing.T) {
	for _, tc := range []struct {
		desc, fate string
		suspect    int
		wantRank   int
		wantSignal string
		wantCode   int
	}{
		{"suspect killed", "kill", 1, 1, "SIGKILL", -1},
		{"suspect exits 0", "ok", 1, 0, "", 1},
		{"suspect lives on", "stay", 1, 0, "", 1},
		{"no suspect", "kill", -1, 0, "", 1},
		{"the failed rank suspects itself", "kill", 0, 0, "", 1},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			cfg := baseConfig(t, 3, "aftermath")
			cfg.Settle = 500 * time.Millisecond
			dir := tdir(cfg)
			var asked []Failure
			cfg.Suspect = func(f Failure) int {
				asked = append(asked, f)
				require.NoError(t, os.WriteFile(filepath.Join(dir, "fate"), []byte(tc.fate), 0o600))
				return tc.suspect
			}
			var failures []Failure
			cfg.OnFailure = func(f Failure) { failures = append(failures, f) }
			res, err := Run(context.Background(), cfg)
			require.ErrorIs(t, err, ErrWorkerFailed)
			require.Len(t, asked, 1)
			require.Equal(t, 0, asked[0].Rank, "the first failure is rank 0's")
			require.Len(t, res.Failures, 1)
			f := res.Failures[0]
			require.Equal(t, tc.wantRank, f.Rank)
			require.Equal(t, tc.wantSignal, f.Signal)
			require.Equal(t, tc.wantCode, f.ExitCode)
			require.Equal(t, []Failure{f}, failures, "OnFailure is called once, with the root cause")
		})
	}
}

// TestNoRestartLeft: --max-restarts 0 and a worker exiting 7 → the run fails
// naming rank and code, quickly, every other worker stopped.
func TestNoRestartLeft(t *testing.T) {
	cfg := baseConfig(t, 4, "exit", "FAIL_RANK=2", "FAIL_CODE=7")
	tr := &tracker{}
	cfg.OnStart = tr.onStart
	cfg.Settle = 100 * time.Millisecond
	start := time.Now()
	res, err := Run(context.Background(), cfg)
	took := time.Since(start)
	require.ErrorIs(t, err, ErrWorkerFailed)
	require.Contains(t, err.Error(), "rank 2 (pid ")
	require.Contains(t, err.Error(), "exited with code 7")
	require.Zero(t, res.Restarts)
	rc := res.RootCause()
	require.NotNil(t, rc)
	require.Equal(t, 2, rc.Rank)
	require.Equal(t, 7, rc.ExitCode)
	require.Empty(t, rc.Signal)
	// The others were ended by SIGTERM (they do not catch it), not the grace.
	require.Less(t, took, cfg.Grace)
	for _, w := range res.Workers {
		if w.Rank != 2 {
			require.Equal(t, "SIGTERM", w.Signal, "rank %d", w.Rank)
		}
	}
	tr.requireNoGroups(t)
}

// TestGraceThenKill: workers that ignore SIGTERM (and started a grandchild)
// are killed after the grace period, grandchild included.
func TestGraceThenKill(t *testing.T) {
	cfg := baseConfig(t, 3, "stubborn", "N_WORKERS=3")
	cfg.Grace = 500 * time.Millisecond
	dir := tdir(cfg)
	tr := &tracker{}
	cfg.OnStart = tr.onStart
	start := time.Now()
	res, err := Run(context.Background(), cfg)
	took := time.Since(start)
	require.ErrorIs(t, err, ErrWorkerFailed)
	require.Equal(t, 0, res.RootCause().Rank)
	require.GreaterOrEqual(t, took, cfg.Grace)
	require.Less(t, took, cfg.Grace+5*time.Second)
	for _, r := range []int{1, 2} {
		require.Equal(t, "SIGKILL", res.Workers[r].Signal)
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("grandchild-0-%d", r)))
		require.NoError(t, err)
		gc, _ := strconv.Atoi(string(b))
		require.NotZero(t, gc)
	}
	tr.requireNoGroups(t)
}

// TestStalledWorkerEndsWithinTheMargin: a stopped (SIGSTOP) worker is ended
// by the SIGTERM + SIGCONT that follows the first failure, well before the
// grace period: the run ends within Settle + Grace of the first failure.
func TestStalledWorkerEndsWithinTheMargin(t *testing.T) {
	cfg := baseConfig(t, 2, "stall")
	cfg.Grace = 20 * time.Second
	cfg.Settle = 200 * time.Millisecond
	tr := &tracker{}
	cfg.OnStart = tr.onStart
	var failedAt time.Time
	cfg.OnFailure = func(Failure) { failedAt = time.Now() }
	res, err := Run(context.Background(), cfg)
	require.ErrorIs(t, err, ErrWorkerFailed)
	require.Equal(t, 0, res.RootCause().Rank)
	require.Less(t, time.Since(failedAt), cfg.Settle+2*time.Second, "a stopped worker waited for the grace period")
	require.Equal(t, "SIGTERM", res.Workers[1].Signal)
	tr.requireNoGroups(t)
}

// TestSignalForwarding: SIGUSR1 reaches every worker and the run goes on;
// SIGTERM reaches every worker and ends the run without a restart.
func TestSignalForwarding(t *testing.T) {
	cfg := baseConfig(t, 3, "trap")
	cfg.MaxRestarts = 3
	dir := tdir(cfg)
	sigs := make(chan os.Signal, 1)
	cfg.Signals = sigs
	tr := &tracker{}
	cfg.OnStart = tr.onStart
	go func() {
		for r := range 3 {
			waitFile(dir, fmt.Sprintf("ready-0-%d", r))
		}
		sigs <- syscall.SIGUSR1
		for r := range 3 {
			waitFile(dir, fmt.Sprintf("SIGUSR1-0-%d", r))
		}
		sigs <- syscall.SIGTERM
	}()
	res, err := Run(context.Background(), cfg)
	require.ErrorIs(t, err, ErrInterrupted)
	require.Contains(t, err.Error(), "SIGTERM")
	require.Equal(t, "SIGTERM", res.Interrupted)
	require.Zero(t, res.Restarts)
	require.Empty(t, res.Failures)
	for r := range 3 {
		require.FileExists(t, filepath.Join(dir, fmt.Sprintf("SIGTERM-0-%d", r)))
		require.Equal(t, 3, res.Workers[r].ExitCode)
	}
	tr.requireNoGroups(t)
}

// TestInterruptDuringStartup: a Ctrl-C before the workers are ready kills
// them at once, even workers that ignore SIGINT and SIGTERM.
func TestInterruptDuringStartup(t *testing.T) {
	cfg := baseConfig(t, 2, "deaf")
	cfg.Grace = 30 * time.Second
	dir := tdir(cfg)
	sigs := make(chan os.Signal, 1)
	cfg.Signals = sigs
	cfg.Ready = func(int) bool { return false } // still starting
	tr := &tracker{}
	cfg.OnStart = tr.onStart
	go func() {
		for r := range 2 {
			waitFile(dir, fmt.Sprintf("ready-0-%d", r))
		}
		sigs <- syscall.SIGINT
	}()
	start := time.Now()
	res, err := Run(context.Background(), cfg)
	require.ErrorIs(t, err, ErrInterrupted)
	require.Less(t, time.Since(start), 10*time.Second)
	require.Equal(t, "SIGINT", res.Interrupted)
	for _, w := range res.Workers {
		require.Equal(t, "SIGKILL", w.Signal)
	}
	tr.requireNoGroups(t)
}

// TestSecondInterruptKills: a second Ctrl-C does not wait for the grace
// period of the first.
func TestSecondInterruptKills(t *testing.T) {
	cfg := baseConfig(t, 2, "deaf")
	cfg.Grace = 30 * time.Second
	dir := tdir(cfg)
	sigs := make(chan os.Signal, 1)
	cfg.Signals = sigs
	tr := &tracker{}
	cfg.OnStart = tr.onStart
	go func() {
		for r := range 2 {
			waitFile(dir, fmt.Sprintf("ready-0-%d", r))
		}
		sigs <- syscall.SIGINT
		time.Sleep(300 * time.Millisecond)
		sigs <- syscall.SIGINT
	}()
	start := time.Now()
	res, err := Run(context.Background(), cfg)
	require.ErrorIs(t, err, ErrInterrupted)
	require.Less(t, time.Since(start), 10*time.Second)
	for _, w := range res.Workers {
		require.Equal(t, "SIGKILL", w.Signal)
	}
	tr.requireNoGroups(t)
}

// TestInterruptBeforeStart: a signal already pending when Run starts means
// no worker is started at all.
func TestInterruptBeforeStart(t *testing.T) {
	cfg := baseConfig(t, 3, "deaf")
	sigs := make(chan os.Signal, 1)
	sigs <- syscall.SIGINT
	cfg.Signals = sigs
	started := 0
	cfg.OnStart = func(Worker, int) { started++ }
	res, err := Run(context.Background(), cfg)
	require.ErrorIs(t, err, ErrInterrupted)
	require.Zero(t, started)
	require.Equal(t, "SIGINT", res.Interrupted)
}

// TestContextCancel acts as a SIGTERM.
func TestContextCancel(t *testing.T) {
	cfg := baseConfig(t, 2, "trap")
	dir := tdir(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tr := &tracker{}
	cfg.OnStart = tr.onStart
	go func() {
		for r := range 2 {
			waitFile(dir, fmt.Sprintf("ready-0-%d", r))
		}
		cancel()
	}()
	res, err := Run(ctx, cfg)
	require.ErrorIs(t, err, ErrInterrupted)
	require.Equal(t, context.Canceled.Error(), res.Interrupted)
	for r := range 2 {
		require.FileExists(t, filepath.Join(dir, fmt.Sprintf("SIGTERM-0-%d", r)))
	}
	tr.requireNoGroups(t)
}

func TestStartError(t *testing.T) {
	cfg := baseConfig(t, 2, "ok")
	cfg.Command = []string{filepath.Join(t.TempDir(), "no-such-worker")}
	_, err := Run(context.Background(), cfg)
	require.ErrorIs(t, err, ErrStart)
	require.Contains(t, err.Error(), "no-such-worker")
}

// TestWholeLines: many ranks writing long lines at once never mix within a
// line on the console.
func TestWholeLines(t *testing.T) {
	cfg := baseConfig(t, 4, "lines")
	var out, errOut testutil.LockedBuffer
	cfg.Stdout, cfg.Stderr = &out, &errOut
	_, err := Run(context.Background(), cfg)
	require.NoError(t, err)
	re := regexp.MustCompile(`^\[(\d)\]: (\d)+$`)
	for name, s := range map[string]string{"stdout": out.String(), "stderr": errOut.String()} {
		lines := strings.Split(strings.TrimSuffix(s, "\n"), "\n")
		require.Len(t, lines, 4*100, name)
		for _, l := range lines {
			m := re.FindStringSubmatch(l)
			require.NotNil(t, m, "%s: mixed line %.80q", name, l)
			require.Equal(t, m[1], m[2])
			require.Equal(t, strings.Repeat(m[1], 2000), l[len("[0]: "):])
		}
	}
}

// TestLogDirAndTee: with LogDir each rank's streams land unprefixed in
// attempt_0/<rank>/{stdout,stderr}.log; Tee stderr shows only stderr.
func TestLogDirAndTee(t *testing.T) {
	cfg := baseConfig(t, 2, "ok")
	cfg.LogDir = t.TempDir()
	cfg.Tee = TeeStderr
	var out, errOut testutil.LockedBuffer
	cfg.Stdout, cfg.Stderr = &out, &errOut
	_, err := Run(context.Background(), cfg)
	require.NoError(t, err)
	require.Empty(t, out.String())
	for r := range 2 {
		b, err := os.ReadFile(filepath.Join(cfg.LogDir, "attempt_0", strconv.Itoa(r), "stdout.log"))
		require.NoError(t, err)
		require.Equal(t, fmt.Sprintf("out %d\nno newline at the end\n", r), string(b))
		b, err = os.ReadFile(filepath.Join(cfg.LogDir, "attempt_0", strconv.Itoa(r), "stderr.log"))
		require.NoError(t, err)
		require.Equal(t, fmt.Sprintf("err %d\n", r), string(b))
		require.Contains(t, errOut.String(), fmt.Sprintf("[%d]: err %d\n", r, r))
	}
}

// TestErrorFile: the root cause carries the torchrun error record its worker
// wrote, and its path under LogDir.
func TestErrorFile(t *testing.T) {
	for _, logDir := range []bool{false, true} {
		t.Run(fmt.Sprintf("logdir=%v", logDir), func(t *testing.T) {
			cfg := baseConfig(t, 3, "errorfile")
			if logDir {
				cfg.LogDir = t.TempDir()
			}
			res, err := Run(context.Background(), cfg)
			require.ErrorIs(t, err, ErrWorkerFailed)
			require.Contains(t, err.Error(), "rank 1 (pid ")
			require.Contains(t, err.Error(), "exited with code 1: ValueError: bad batch")
			rc := res.RootCause()
			require.NotNil(t, rc.Error)
			require.Equal(t, "ValueError: bad batch\nline 2", rc.Error.Message)
			require.Equal(t, int64(1700000000), rc.Error.Timestamp)
			if logDir {
				require.Equal(t, filepath.Join(cfg.LogDir, "attempt_0", "1", "error.json"), rc.ErrorFile)
				require.FileExists(t, rc.ErrorFile)
			} else {
				require.Empty(t, rc.ErrorFile)
			}
		})
	}
}

func TestReadErrorFile(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		desc, body, msg string
		ts              int64
		none            bool
	}{
		{desc: "torchrun record", body: `{"message": {"message": "boom", "extraInfo": {"timestamp": "12"}}}`, msg: "boom", ts: 12},
		{desc: "plain message", body: `{"message": "plain", "timestamp": 5}`, msg: "plain", ts: 5},
		{desc: "other JSON", body: `{"error": 1}`},
		{desc: "not JSON", body: `Traceback...`, none: true},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			p := filepath.Join(dir, "e.json")
			require.NoError(t, os.WriteFile(p, []byte(tc.body), 0o600))
			rec := readErrorFile(p)
			if tc.none {
				require.Nil(t, rec)
				return
			}
			require.NotNil(t, rec)
			require.Equal(t, tc.msg, rec.Message)
			require.Equal(t, tc.ts, rec.Timestamp)
			require.JSONEq(t, tc.body, string(rec.Raw))
		})
	}
	require.Nil(t, readErrorFile(filepath.Join(dir, "missing.json")))
}

func TestConfigValidated(t *testing.T) {
	ok := Config{N: 1, Command: []string{"true"}, Grace: time.Second}
	for _, tc := range []struct {
		desc string
		mut  func(*Config)
	}{
		{"no workers", func(c *Config) { c.N = 0 }},
		{"no command", func(c *Config) { c.Command = nil }},
		{"negative restarts", func(c *Config) { c.MaxRestarts = -1 }},
		{"no grace", func(c *Config) { c.Grace = 0 }},
		{"bad tee", func(c *Config) { c.Tee = 9 }},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			c := ok
			tc.mut(&c)
			_, err := Run(context.Background(), c)
			require.ErrorIs(t, err, ErrInvalid)
		})
	}
}

func TestParseTee(t *testing.T) {
	for in, want := range map[string]Tee{"": TeeNone, "none": TeeNone, "1": TeeStdout, "stderr": TeeStderr, "all": TeeAll, "3": TeeAll} {
		got, err := ParseTee(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	_, err := ParseTee("4")
	require.Error(t, err)
}
