package launcher

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/comm/rendezvous"
	"github.com/migctl/migctl/internal/supervisor"
)

// fakeDevices hands out MIG-like devices and records what happened.
type fakeDevices struct {
	mu       sync.Mutex
	acquired map[string]int // job → devices held
	calls    []string
	err      error
	block    bool // Acquire waits for ctx
	panics   bool
}

func (f *fakeDevices) Acquire(ctx context.Context, job string, n int) ([]Device, error) {
	f.mu.Lock()
	f.calls = append(f.calls, fmt.Sprintf("acquire %s %d", job, n))
	f.mu.Unlock()
	switch {
	case f.panics:
		panic("fake device source broke")
	case f.block:
		<-ctx.Done()
		return nil, ctx.Err()
	case f.err != nil:
		return nil, f.err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.acquired == nil {
		f.acquired = map[string]int{}
	}
	f.acquired[job] += n
	out := make([]Device, n)
	for i := range out {
		out[i] = Device{Visible: fmt.Sprintf("MIG-fake-%d", i), GPU: i / 7, Profile: "1g.18gb"}
	}
	return out, nil
}

func (f *fakeDevices) Release(_ context.Context, job string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "release "+job)
	delete(f.acquired, job)
	return nil
}

func (f *fakeDevices) held() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, v := range f.acquired {
		n += v
	}
	return n
}

// envWorker is a shell worker that writes its environment to
// $T_DIR/env-<gen>-<rank> and exits 0.
func envWorker(dir string) []string {
	return []string{"sh", "-c", `env > "` + dir + `/env-$MIGCTL_GENERATION-$RANK"`}
}

func readEnv(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	m := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			m[k] = v
		}
	}
	return m
}

// requireGone fails if the rendezvous socket's private directory is left.
func requireGone(t *testing.T, rdzv string) {
	t.Helper()
	p, ok := strings.CutPrefix(rdzv, "unix://")
	require.True(t, ok, rdzv)
	_, err := os.Stat(filepath.Dir(p))
	require.ErrorIs(t, err, os.ErrNotExist, "the rendezvous directory is left behind")
}

func TestEnvironment(t *testing.T) {
	dir := t.TempDir()
	devs := &fakeDevices{}
	cfg := Config{
		Command: envWorker(dir), NProc: 3, Job: "train1", Devices: devs, Backend: "host",
		Timeout: 42 * time.Second, MaxRestarts: 2, DaemonSocket: "/run/x/control.sock",
		Env: []string{"EXTRA=1"},
	}
	t.Setenv(EnvJobToken, "inherited-must-be-overridden")
	t.Setenv(EnvOMPThreads, "") // unset: one OpenMP thread per worker, as torchrun does
	res, err := Run(context.Background(), cfg)
	require.NoError(t, err)
	require.Equal(t, 3, res.World)
	require.Zero(t, devs.held(), "devices not released")
	require.Equal(t, []string{"acquire train1 3", "release train1"}, devs.calls)
	requireGone(t, res.Rendezvous)
	var token, port string
	for r := range 3 {
		env := readEnv(t, filepath.Join(dir, fmt.Sprintf("env-0-%d", r)))
		want := map[string]string{
			"RANK": strconv.Itoa(r), "LOCAL_RANK": strconv.Itoa(r), "WORLD_SIZE": "3", "LOCAL_WORLD_SIZE": "3",
			"GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "ROLE_RANK": strconv.Itoa(r), "ROLE_WORLD_SIZE": "3",
			"MASTER_ADDR": "127.0.0.1", "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "2",
			"TORCHELASTIC_RUN_ID": "train1", "CUDA_VISIBLE_DEVICES": fmt.Sprintf("MIG-fake-%d", r),
			"MIGCTL_RDZV_ADDR": res.Rendezvous, "MIGCTL_JOB": "train1", "MIGCTL_GENERATION": "0",
			"MIGCTL_BACKEND": "host", "MIGCTL_DEVICE": "0", "MIGCTL_TIMEOUT": "42s",
			"MIGCTL_SOCKET": "/run/x/control.sock", "EXTRA": "1", "OMP_NUM_THREADS": "1",
		}
		for k, v := range want {
			require.Equal(t, v, env[k], "rank %d: %s", r, k)
		}
		require.Len(t, env["MIGCTL_JOB_TOKEN"], 32)
		require.NotEqual(t, "inherited-must-be-overridden", env["MIGCTL_JOB_TOKEN"])
		require.NotContains(t, env["MIGCTL_JOB"], env["MIGCTL_JOB_TOKEN"][:8])
		require.True(t, strings.HasSuffix(env["TORCHELASTIC_ERROR_FILE"], "/error.json"))
		require.NotContains(t, env, "LD_PRELOAD")
		if r == 0 {
			token, port = env["MIGCTL_JOB_TOKEN"], env["MASTER_PORT"]
		}
		require.Equal(t, token, env["MIGCTL_JOB_TOKEN"])
		require.Equal(t, port, env["MASTER_PORT"])
	}
	n, err := strconv.Atoi(port)
	require.NoError(t, err)
	require.Positive(t, n)
}

func TestSwapAndNodes(t *testing.T) {
	dir := t.TempDir()
	lib := filepath.Join(dir, "libmigswap.so")
	require.NoError(t, os.WriteFile(lib, nil, 0o644))
	t.Setenv("LD_PRELOAD", "/other.so")
	t.Setenv(EnvOMPThreads, "4") // the user's choice stays
	// Node 1 of 2: joins node 0's endpoint, hosts nothing.
	cfg := Config{
		Command: envWorker(dir), NProc: 2, NNodes: 2, NodeRank: 1, RdzvEndpoint: "10.0.0.5:29400",
		Job: "j", Token: "tok", Devices: GPUOrdinals([]int{3}),
		Swap: &Swap{Library: lib, Socket: "/run/s.sock", Priority: 7},
	}
	res, err := Run(context.Background(), cfg)
	require.NoError(t, err)
	require.Equal(t, "10.0.0.5:29400", res.Rendezvous)
	for r := range 2 {
		env := readEnv(t, filepath.Join(dir, fmt.Sprintf("env-0-%d", 2+r)))
		want := map[string]string{
			"MIGCTL_JOB": res.Job, "TORCHELASTIC_RUN_ID": res.Job,
			"RANK": strconv.Itoa(2 + r), "LOCAL_RANK": strconv.Itoa(r), "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
			"GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29401",
			"MIGCTL_RDZV_ADDR": "10.0.0.5:29400", "MIGCTL_JOB_TOKEN": "tok", "CUDA_VISIBLE_DEVICES": "3",
			"MIGCTL_DEVICE": "0", "MIGCTL_BACKEND": "gpu",
			"LD_PRELOAD": lib + ":/other.so", "MIGSWAP_JOB": "j", "MIGSWAP_PRIORITY": "7", "MIGSWAP_SOCKET": "/run/s.sock",
			"OMP_NUM_THREADS": "4",
		}
		for k, v := range want {
			require.Equal(t, v, env[k], "rank %d: %s", 2+r, k)
		}
	}
	// Without --job every node derives the same name from the shared token
	// (and the name does not contain it).
	cfg.Job = ""
	again, err := Run(context.Background(), cfg)
	require.NoError(t, err)
	require.Regexp(t, `^run-[0-9a-f]{6}$`, again.Job)
	cfg.NodeRank = 0
	free, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	cfg.RdzvEndpoint = free.Addr().String()
	require.NoError(t, free.Close())
	node0, err := Run(context.Background(), cfg)
	require.NoError(t, err)
	require.Equal(t, again.Job, node0.Job)
}

func TestRoundRobin(t *testing.T) {
	devs, err := GPUOrdinals([]int{0, 1}).Acquire(context.Background(), "j", 5)
	require.NoError(t, err)
	var vis []string
	for _, d := range devs {
		vis = append(vis, d.Visible)
		require.Zero(t, d.Ordinal)
	}
	require.Equal(t, []string{"0", "1", "0", "1", "0"}, vis)
	_, err = RoundRobin(nil).Acquire(context.Background(), "j", 1)
	require.Error(t, err)
}

// TestRestart: a worker SIGKILLed in generation 0 → all restarted, the
// environment says generation 1, the rendezvous got a new generation.
func TestRestart(t *testing.T) {
	dir := t.TempDir()
	devs := &fakeDevices{}
	script := `env > "` + dir + `/env-$MIGCTL_GENERATION-$RANK"
if [ "$MIGCTL_GENERATION" = 0 ] && [ "$RANK" = 1 ]; then kill -9 $$; fi
if [ "$MIGCTL_GENERATION" = 0 ]; then sleep 30; fi`
	var log strings.Builder
	cfg := Config{Command: []string{"sh", "-c", script}, NProc: 3, MaxRestarts: 1, Devices: devs, Log: &log,
		Grace: time.Second}
	start := time.Now()
	res, err := Run(context.Background(), cfg)
	require.NoError(t, err, log.String())
	require.Less(t, time.Since(start), 15*time.Second)
	require.Equal(t, 1, res.Restarts)
	require.Len(t, res.Failures, 1)
	require.Equal(t, 1, res.Failures[0].Rank)
	require.Equal(t, "SIGKILL", res.Failures[0].Signal)
	require.Contains(t, log.String(), "restarting every worker (restart 1 of at most 1)")
	for r := range 3 {
		env := readEnv(t, filepath.Join(dir, fmt.Sprintf("env-1-%d", r)))
		require.Equal(t, "1", env["TORCHELASTIC_RESTART_COUNT"])
		require.Equal(t, "MIG-fake-"+strconv.Itoa(r), env["CUDA_VISIBLE_DEVICES"])
	}
	require.Zero(t, devs.held())
	requireGone(t, res.Rendezvous)
}

// TestFailureNamesRootCause: --max-restarts 0, rank 2 exits 3.
func TestFailureNamesRootCause(t *testing.T) {
	devs := &fakeDevices{}
	cfg := Config{Command: []string{"sh", "-c", `if [ "$RANK" = 2 ]; then exit 3; fi; sleep 30`}, NProc: 4, Devices: devs}
	start := time.Now()
	res, err := Run(context.Background(), cfg)
	require.ErrorIs(t, err, supervisor.ErrWorkerFailed)
	require.Contains(t, err.Error(), "rank 2 (pid")
	require.Contains(t, err.Error(), "exited with code 3")
	require.Less(t, time.Since(start), DefaultSettle+DefaultGrace)
	require.Equal(t, 2, res.RootCause.Rank)
	require.Equal(t, 3, res.RootCause.ExitCode)
	require.Equal(t, err.Error(), res.Error)
	require.Zero(t, devs.held())
	requireGone(t, res.Rendezvous)
}

// fakeRendezvous records what the supervisor hooks do to the server.
type fakeRendezvous struct {
	aborts []string
	gens   int
	err    error
}

func (f *fakeRendezvous) Err() error { return f.err }

func (f *fakeRendezvous) Serve(net.Listener) error { return nil }
func (f *fakeRendezvous) Stop()                    {}
func (f *fakeRendezvous) AbortJob(r string)        { f.aborts = append(f.aborts, r) }
func (f *fakeRendezvous) NewGeneration() int       { f.gens++; return f.gens }

func TestHooksDriveTheRendezvous(t *testing.T) {
	p := &plan{cfg: Config{NProc: 2, MaxRestarts: 1, Grace: time.Second}}
	fr := &fakeRendezvous{}
	sc := p.supervisorConfig(fr, nil)
	sc.OnFailure(supervisor.Failure{Exit: supervisor.Exit{Rank: 1, PID: 9, ExitCode: -1, Signal: "SIGKILL"}})
	require.Equal(t, []string{"rank 1 failed: rank 1 (pid 9) was killed by SIGKILL"}, fr.aborts)
	require.Empty(t, p.blame)
	require.NoError(t, sc.BeforeRestart(context.Background(), 1))
	require.Equal(t, 1, fr.gens)

	// A rank that noticed a stalled peer aborted the job first: the
	// failure carries its reason.
	fr.err = &rendezvous.AbortError{Rank: 2, Reason: "rank 2: rank 1 has not heartbeaten for 5s"}
	first := supervisor.Failure{Exit: supervisor.Exit{Rank: 0, PID: 8, ExitCode: 1}}
	require.Equal(t, 2, sc.Suspect(first), "the supervisor waits for the rank the abort names")
	sc.OnFailure(first)
	require.Equal(t, "rank 2: rank 1 has not heartbeaten for 5s", p.blame)

	// The abort names the root cause itself: no blame beside it.
	fr.err = &rendezvous.AbortError{Rank: 1, Reason: "rank 1 left the job: its connection to the rendezvous closed"}
	sc.OnFailure(supervisor.Failure{Exit: supervisor.Exit{Rank: 1, PID: 9, ExitCode: -1, Signal: "SIGKILL"}})
	require.Empty(t, p.blame)
	fr.err = nil
	require.Equal(t, -1, sc.Suspect(first))
}

func TestBadInputLeavesNothing(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer taken.Close()
	for _, tc := range []struct {
		desc string
		cfg  Config
		want error
		msg  string
	}{
		{desc: "np 0", cfg: Config{Command: []string{"true"}}, want: ErrInvalid, msg: "--np"},
		{desc: "missing binary", cfg: Config{Command: []string{"/no/such/train"}, NProc: 2}, want: ErrWorkerNotFound, msg: "does not exist"},
		{desc: "not in PATH", cfg: Config{Command: []string{"no-such-trainer-xyz"}, NProc: 2}, want: ErrWorkerNotFound, msg: "not in PATH"},
		{desc: "no command", cfg: Config{NProc: 2}, want: ErrInvalid, msg: "after --"},
		{desc: "port in use", cfg: Config{Command: []string{"true"}, NProc: 1, NNodes: 2, Token: "t",
			RdzvEndpoint: taken.Addr().String()}, want: ErrPortInUse, msg: "pick another port"},
		{desc: "nodes without token", cfg: Config{Command: []string{"true"}, NProc: 1, NNodes: 2, RdzvEndpoint: "h:1"},
			want: ErrInvalid, msg: EnvJobToken},
		{desc: "devices refused", cfg: Config{Command: []string{"true"}, NProc: 9}, want: ErrDevices, msg: "no room"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			devs := &fakeDevices{err: errors.New("no room for 9 x 1g.18gb")}
			tc.cfg.Devices = devs
			tmp := t.TempDir()
			t.Setenv("TMPDIR", tmp)
			_, err := Run(context.Background(), tc.cfg)
			require.ErrorIs(t, err, tc.want)
			require.Contains(t, err.Error(), tc.msg)
			require.NotContains(t, err.Error(), "\n")
			require.Zero(t, devs.held())
			if !errors.Is(err, ErrDevices) {
				require.Empty(t, devs.calls, "devices touched before the input was checked")
			} else {
				require.Equal(t, "release", strings.Fields(devs.calls[len(devs.calls)-1])[0])
			}
			ents, err := os.ReadDir(tmp)
			require.NoError(t, err)
			require.Empty(t, ents, "left in TMPDIR")
		})
	}
}

// TestInterruptWhileLeasing: Ctrl-C while the devices are being obtained
// ends Run at once, releases, removes the socket directory.
func TestInterruptWhileLeasing(t *testing.T) {
	devs := &fakeDevices{block: true}
	sigs := make(chan os.Signal, 1)
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	cfg := Config{Command: []string{"true"}, NProc: 2, Devices: devs, Signals: sigs}
	go func() {
		time.Sleep(200 * time.Millisecond)
		sigs <- syscall.SIGINT
	}()
	start := time.Now()
	res, err := Run(context.Background(), cfg)
	require.ErrorIs(t, err, supervisor.ErrInterrupted)
	require.Less(t, time.Since(start), 5*time.Second)
	require.Equal(t, "SIGINT", res.Interrupted)
	require.Contains(t, devs.calls, "release "+res.Job)
	ents, err := os.ReadDir(tmp)
	require.NoError(t, err)
	require.Empty(t, ents)
}

// TestPanicCleansUp: a panic inside Run (here from the device source)
// still releases the devices and removes the socket directory.
func TestPanicCleansUp(t *testing.T) {
	devs := &fakeDevices{panics: true}
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	cfg := Config{Command: []string{"true"}, NProc: 2, Devices: devs, Job: "p"}
	func() {
		defer func() { require.NotNil(t, recover()) }()
		_, _ = Run(context.Background(), cfg)
	}()
	require.Equal(t, []string{"acquire p 2", "release p"}, devs.calls)
	ents, err := os.ReadDir(tmp)
	require.NoError(t, err)
	require.Empty(t, ents)
}
