package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/comm/rendezvous"
	"github.com/migctl/migctl/internal/testutil"
)

// The tests run python/tests/*.py in real processes against the built
// library: the C ABI through ctypes (any python3), and the torch backend
// through Debian's torch, which belongs to /usr/bin/python3 (CI installs
// python3-torch with scripts/setup.sh). `make test` passes MIGCTL_LIB and
// MIGCTL_BIN; without them the test builds both, into directories that
// testutil.Main removes when the tests end.

const python = "/usr/bin/python3"

func TestMain(m *testing.M) { testutil.Main(m) }

var (
	buildOnce sync.Once
	libPath   string
	buildErr  error
)

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	return root
}

// artifacts returns libmigctl.so and the migctl binary, built once if the
// environment does not name them.
func artifacts(t *testing.T) (lib, bin string) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: the library tests start Python processes")
	}
	if _, err := os.Stat(python); err != nil {
		t.Skipf("%s not found: the C ABI and torch backend tests need it", python)
	}
	bin = testutil.MigctlBin(t)
	buildOnce.Do(func() {
		if libPath = os.Getenv("MIGCTL_LIB"); libPath != "" {
			return
		}
		dir, err := os.MkdirTemp("", "libmigctl-test-")
		if err != nil {
			buildErr = err
			return
		}
		testutil.RemoveAtEnd(t, dir)
		root, _ := filepath.Abs("../..")
		libPath = filepath.Join(dir, "libmigctl.so")
		cmd := exec.Command("go", "build", "-o", libPath, "-buildmode=c-shared", "./cmd/libmigctl")
		cmd.Dir = root
		if b, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build -buildmode=c-shared ./cmd/libmigctl: %w\n%s", err, b)
		}
	})
	require.NoError(t, buildErr)
	return libPath, bin
}

func needTorch(t *testing.T) {
	t.Helper()
	if err := exec.Command(python, "-c", "import torch.distributed").Run(); err != nil {
		t.Skipf("%s has no torch: install Debian's python3-torch (apt-get install -y python3-torch, "+
			"or run scripts/setup.sh as root) to run the torch backend tests", python)
	}
}

// rankLines is the JSON line each rank printed ("[r]: {...}" under migctl run).
func rankLines(t *testing.T, out string) map[int]map[string]any {
	t.Helper()
	res := map[int]map[string]any{}
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if i := strings.Index(line, ": {"); i >= 0 && strings.HasPrefix(line, "[") {
			line = line[i+2:]
		}
		if !strings.HasPrefix(line, "{") {
			continue
		}
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) != nil {
			continue
		}
		if r, ok := m["rank"].(float64); ok {
			res[int(r)] = m
		}
	}
	return res
}

// runRanks starts script on np ranks under `migctl run --sim h200x8`: a
// simulated node with an embedded daemon leasing one 1g.18gb instance per
// rank, workers on the host backend (what CI can run).
func runRanks(t *testing.T, np int, limit time.Duration, script string, args ...string) map[int]map[string]any {
	t.Helper()
	return runRanksEnv(t, nil, np, limit, script, args...)
}

// runRanksEnv is runRanks with env added to the workers' environment.
func runRanksEnv(t *testing.T, env []string, np int, limit time.Duration, script string, args ...string) map[int]map[string]any {
	t.Helper()
	lib, bin := artifacts(t)
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	argv := append([]string{"run", "--sim", "h200x8", "--profile", "1g.18gb", "--np", fmt.Sprint(np), "-q", "--timeout", "60s", "--",
		python, filepath.Join(repoRoot(t), "python", "tests", script)}, args...)
	cmd := exec.CommandContext(ctx, bin, argv...)
	cmd.Env = append(append(os.Environ(), "MIGCTL_LIB="+lib, "OMP_NUM_THREADS=1"), env...)
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "migctl run %s:\n%s", script, out)
	lines := rankLines(t, string(out))
	require.Len(t, lines, np, "one JSON line per rank:\n%s", out)
	for r, m := range lines {
		f, _ := m["failures"].([]any)
		require.Empty(t, f, "rank %d of %s:\n%s", r, script, out)
	}
	return lines
}

// TestCABIThroughCtypes runs the C ABI's checks with migctl_run's
// collectives on the dispatcher and on the calling thread (direct), and as
// the machine decides.
func TestCABIThroughCtypes(t *testing.T) {
	for _, tc := range []struct {
		name   string
		env    []string
		direct float64 // migctl_run's collectives on the calling thread per rank (-1: any)
	}{
		{"default", nil, -1},
		{"direct", []string{"MIGCTL_LIB_DIRECT_MAX=1048576"}, 5},
		{"dispatcher", []string{"MIGCTL_LIB_DIRECT_MAX=0"}, 0},
		{"complete on device", []string{"MIGCTL_TUNING=complete=device"}, -1}, // not on the host backend
	} {
		t.Run(tc.name, func(t *testing.T) {
			for r, m := range runRanksEnv(t, tc.env, 3, 2*time.Minute, "abi_check.py") {
				if tc.direct >= 0 {
					require.Equal(t, tc.direct, m["direct"], "rank %d", r)
				}
			}
		})
	}
}

// TestCABIFromC builds a C program against include/migctl.h and runs it
// alone (a group of one), linked the plain way: the library has no
// unresolved symbols beyond libc's.
func TestCABIFromC(t *testing.T) {
	lib, _ := artifacts(t)
	cc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("no gcc")
	}
	root := repoRoot(t)
	exe := filepath.Join(t.TempDir(), "smoke")
	dir := filepath.Dir(lib)
	link := filepath.Join(t.TempDir(), "libmigctl.so") // -lmigctl needs that name
	require.NoError(t, os.Symlink(lib, link))
	out, err := exec.Command(cc, "-Wall", "-Werror", "-I", filepath.Join(root, "include"), "testdata/smoke.c", "-o", exe,
		"-L", filepath.Dir(link), "-lmigctl", "-Wl,--no-allow-shlib-undefined", "-Wl,-rpath,"+dir).CombinedOutput()
	require.NoError(t, err, "%s", out)
	cmd := exec.Command(exe)
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); k != "RANK" && k != "WORLD_SIZE" && !strings.HasPrefix(k, "MIGCTL_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "MIGCTL_BACKEND=host", "LD_LIBRARY_PATH="+dir)
	out, err = cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Equal(t, "ok\n", string(out))
}

func TestTorchBackendOps(t *testing.T) {
	artifacts(t)
	needTorch(t)
	lines := runRanks(t, 3, 5*time.Minute, "ops_check.py")
	require.Greater(t, lines[0]["checks"].(float64), 800.0)
	require.Equal(t, "migctl", lines[0]["backend"])
}

// TestTorchSubgroups: groups of some of the ranks (dist.new_group(ranks=
// [...])) run every collective among their members, beside the job's group
// and each other, DDP on them matches gloo's, and one formed before the
// job's migctl group says what to do.
func TestTorchSubgroups(t *testing.T) {
	artifacts(t)
	needTorch(t)
	for _, tc := range []struct {
		name string
		np   int
		args []string
	}{
		{"pairs", 4, nil},
		{"a rank without a pair", 5, nil},
		{"gloo default", 4, []string{"--gloo-default"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lines := runRanks(t, tc.np, 3*time.Minute, "subgroup_check.py", tc.args...)
			for r, m := range lines {
				require.Greater(t, m["checks"].(float64), 0.0, "rank %d", r)
			}
			if tc.args == nil {
				require.Greater(t, lines[1]["checks"].(float64), 20.0, "rank 1: every collective of both groups")
			}
		})
	}
}

// TestTorchPointToPoint: dist.send/recv/isend/irecv and batch_isend_irecv
// between the ranks, every rank sending first in a ring, in order, beside
// pending collectives, within a group of some ranks, and a two-stage
// pipeline that matches the whole model run in one process.
func TestTorchPointToPoint(t *testing.T) {
	artifacts(t)
	needTorch(t)
	for _, np := range []int{2, 3} {
		t.Run(fmt.Sprintf("np=%d", np), func(t *testing.T) {
			lines := runRanks(t, np, 3*time.Minute, "p2p_check.py")
			for r, m := range lines {
				require.Greater(t, m["checks"].(float64), 30.0, "rank %d", r)
			}
		})
	}
}

// TestTorchSyncAllReduce: an all-reduce whose caller waits at once (torch
// 2.x's opts.asyncOp=False) goes through migctl_run and returns a finished
// Work, in order behind the collectives in flight, on every dtype and op.
func TestTorchSyncAllReduce(t *testing.T) {
	artifacts(t)
	needTorch(t)
	lines := runRanks(t, 3, 3*time.Minute, "sync_check.py")
	require.Greater(t, lines[0]["checks"].(float64), 100.0)
}

func TestTorchDDPMatchesGloo(t *testing.T) {
	artifacts(t)
	needTorch(t)
	lines := runRanks(t, 2, 5*time.Minute, "ddp_check.py")
	for r, m := range lines {
		require.Equal(t, 0.0, m["max_diff_migctl_gloo"], "rank %d", r)
		require.Equal(t, 0.0, m["max_diff_hook_gloo"], "rank %d", r)
		require.Equal(t, true, m["losses_equal"], "rank %d", r)
	}
}

func TestTorchCommHookOnGlooJob(t *testing.T) {
	artifacts(t)
	needTorch(t)
	for r, m := range runRanks(t, 2, 3*time.Minute, "hook_check.py") {
		require.Equal(t, 0.0, m["max_diff"], "rank %d", r)
	}
}

// TestTorchCollectivesDoNotBlock: with the last rank 2 s late, the others'
// async collectives (and DDP's bucket all-reduces in backward) return at once
// and complete later, their Futures through the completion thread.
func TestTorchCollectivesDoNotBlock(t *testing.T) {
	artifacts(t)
	needTorch(t)
	for r, m := range runRanks(t, 3, 3*time.Minute, "async_check.py") {
		if r == 2 {
			continue // the slow rank
		}
		require.Less(t, m["issue_s"].(float64), 0.5, "rank %d", r)
		require.Greater(t, m["done_s"].(float64), 1.0, "rank %d", r)
	}
}

// TestTorchChainedAllReduces: asynchronous all-reduces issued back to back
// (a large one's successor starts before it has ended), an in-place chain
// among them: every element right, with chaining and without.
func TestTorchChainedAllReduces(t *testing.T) {
	artifacts(t)
	needTorch(t)
	// complete=queued: nothing queues on the host backend (chain_check fails
	// where the counter moves).
	for _, env := range [][]string{nil, {"MIGCTL_TUNING=chain=off"}, {"MIGCTL_TUNING=complete=queued"}} {
		for r, m := range runRanksEnv(t, env, 3, 3*time.Minute, "chain_check.py") {
			require.Equal(t, 36.0, m["calls"], "rank %d (%v)", r, env)
		}
	}
}

// TestTorchKilledRank hosts the rendezvous itself (migctl run would stop the
// survivors with SIGTERM): rank 1 SIGKILLs itself mid-loop, ranks 0 and 2
// must raise within the collective deadline — from dist.all_reduce, from
// the Future's wait() of an asynchronous one, and from DDP's backward, where
// the reducer reads the bucket's Future in C++ (an error set the Python way
// crashed the process there: see migctl_torch/_futures.py), from a
// group of some of the ranks that the dead one belonged to, and from
// point-to-point transfers (a ring of isend/recv).
func TestTorchKilledRank(t *testing.T) {
	lib, _ := artifacts(t)
	needTorch(t)
	for _, tc := range []struct {
		name string
		args []string
	}{{"all_reduce", nil}, {"future", []string{"--future"}}, {"ddp", []string{"--ddp"}}, {"subgroup", []string{"--subgroup"}},
		{"p2p", []string{"--p2p"}}} {
		t.Run(tc.name, func(t *testing.T) { killedRank(t, lib, tc.args) })
	}
}

func killedRank(t *testing.T, lib string, args []string) {
	const np, killed = 3, 1
	const deadline = 10 * time.Second
	b := make([]byte, 16)
	_, err := rand.Read(b)
	require.NoError(t, err)
	token := hex.EncodeToString(b)
	srv, err := rendezvous.NewServer(token, np)
	require.NoError(t, err)
	dir := t.TempDir()
	sock := filepath.Join(dir, "rdzv.sock")
	lis, err := net.Listen("unix", sock)
	require.NoError(t, err)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	port := freePort(t)

	type result struct {
		out  bytes.Buffer
		err  error
		done time.Time
	}
	res := make([]*result, np)
	cmds := make([]*exec.Cmd, np)
	var wg sync.WaitGroup
	for r := range np {
		res[r] = &result{}
		cmd := exec.Command(python, append([]string{filepath.Join(repoRoot(t), "python", "tests", "kill_check.py"),
			"--kill", fmt.Sprint(killed)}, args...)...)
		cmd.Env = append(os.Environ(), "MIGCTL_LIB="+lib, "OMP_NUM_THREADS=1",
			fmt.Sprintf("RANK=%d", r), fmt.Sprintf("LOCAL_RANK=%d", r), fmt.Sprintf("WORLD_SIZE=%d", np),
			fmt.Sprintf("LOCAL_WORLD_SIZE=%d", np), "MASTER_ADDR=127.0.0.1", fmt.Sprintf("MASTER_PORT=%d", port),
			"MIGCTL_RDZV_ADDR=unix://"+sock, "MIGCTL_JOB_TOKEN="+token, "MIGCTL_JOB=killtest",
			"MIGCTL_BACKEND=host", "MIGCTL_SHM_ROOT="+dir, "MIGCTL_TIMEOUT="+deadline.String())
		cmd.Stdout, cmd.Stderr = &res[r].out, &res[r].out
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		require.NoError(t, cmd.Start())
		cmds[r] = cmd
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[r].err = cmd.Wait()
			res[r].done = time.Now()
		}()
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(3 * time.Minute):
		for _, c := range cmds {
			_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
		}
		<-finished
		t.Fatalf("ranks still running 3 minutes after start")
	}
	require.Error(t, res[killed].err, "rank %d should have died:\n%s", killed, res[killed].out.String())
	for r := range np {
		if r == killed {
			continue
		}
		require.NoError(t, res[r].err, "rank %d did not raise cleanly:\n%s", r, res[r].out.String())
		lines := rankLines(t, res[r].out.String())
		require.Equal(t, true, lines[r]["raised"], "rank %d:\n%s", r, res[r].out.String())
		after := res[r].done.Sub(res[killed].done)
		require.Less(t, after, deadline+5*time.Second, "rank %d raised %v after the kill", r, after)
		t.Logf("rank %d raised %v after rank %d died: %v", r, after.Round(time.Millisecond), killed, lines[r]["error"])
	}
}

// TestTorchTimeoutFromInit: init_process_group's timeout (2 s) is the
// collectives' deadline, over the launcher's 60 s: a rank that stops calling
// makes the other raise a timeout error after 2 s.
func TestTorchTimeoutFromInit(t *testing.T) {
	artifacts(t)
	needTorch(t)
	lines := runRanks(t, 2, 2*time.Minute, "timeout_check.py", "--timeout", "2")
	require.GreaterOrEqual(t, lines[0]["seconds"], 2.0)
	require.Less(t, lines[0]["seconds"], 7.0)
	require.Contains(t, lines[0]["error"], "deadline")
}

// TestTorchMismatchedCalls: ranks whose collective calls differ (a count, an
// element type, a collective, a model's shapes under DDP) all raise within
// seconds, the error naming the cause, where they used to return a wrong
// result or wait for the deadline.
func TestTorchMismatchedCalls(t *testing.T) {
	artifacts(t)
	needTorch(t)
	for _, c := range []string{"count", "dtype", "coll", "ddp"} {
		t.Run(c, func(t *testing.T) {
			for r, m := range runRanks(t, 3, 2*time.Minute, "mismatch_check.py", "--case", c) {
				require.Equal(t, true, m["raised"], "rank %d", r)
				if c != "ddp" {
					require.Contains(t, m["error"], "collective calls differ between ranks", "rank %d", r)
				}
			}
		})
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// TestTorchExampleProfile: examples/pytorch's diagnosis flags on CPU — a
// DDP run over migctl with --profile writes rank 0's trace of the profiled
// steps, reports every rank's CPU time per step, and profile_summary.py
// reads the trace back (the step, its backward range, the threads).
func TestTorchExampleProfile(t *testing.T) {
	lib, bin := artifacts(t)
	needTorch(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	prefix := filepath.Join(dir, "resnet")
	cmd := exec.CommandContext(ctx, bin, "run", "--sim", "h200x8", "--profile", "1g.18gb", "--np", "2", "-q", "--timeout", "60s", "--",
		python, filepath.Join(repoRoot(t), "examples", "pytorch", "ddp_resnet.py"), "--backend", "migctl", "--device", "cpu",
		"--batch", "2", "--image-size", "32", "--classes", "10", "--warmup", "1", "--steps", "3", "--bucket-view",
		"--profile", prefix, "--profile-steps", "2")
	cmd.Env = append(os.Environ(), "MIGCTL_LIB="+lib, "OMP_NUM_THREADS=1")
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	rep := exampleReport(t, out)
	require.Equal(t, true, rep["ranks_identical"], "%v", rep)
	cpu, _ := rep["cpu_ms_per_step"].([]any)
	require.Len(t, cpu, 2, "%v", rep)
	for _, c := range cpu {
		require.Greater(t, c.(float64), 0.0, "%v", rep)
	}
	trace := prefix + ".rank0.json.gz"
	require.FileExists(t, trace)
	require.NoFileExists(t, prefix+".rank1.json.gz", "only --profile-ranks (default 0) write a trace")
	sum, err := exec.CommandContext(ctx, python, filepath.Join(repoRoot(t), "examples", "pytorch", "profile_summary.py"),
		trace).CombinedOutput()
	require.NoError(t, err, "%s", sum)
	require.Contains(t, string(sum), "train_step_2: ", "the second profiled step by default")
	require.Contains(t, string(sum), "backward")
	require.Contains(t, string(sum), "DistributedDataParallel.forward")
	require.Contains(t, string(sum), "thread ")
	out2, err := exec.CommandContext(ctx, python, filepath.Join(repoRoot(t), "examples", "pytorch", "profile_summary.py"),
		trace, "--step", "9").CombinedOutput()
	require.Error(t, err, "a step that was not profiled")
	require.Contains(t, string(out2), "no train_step_9")
}

// exampleReport is rank 0's report of an examples/pytorch run under migctl
// run: its line "[0]: {...}" (the examples' lines name no rank).
func exampleReport(t *testing.T, out []byte) map[string]any {
	t.Helper()
	var rep map[string]any
	for _, line := range strings.Split(string(out), "\n") {
		if j, ok := strings.CutPrefix(line, "[0]: "); ok && strings.HasPrefix(j, "{") {
			require.NoError(t, json.Unmarshal([]byte(j), &rep), "%s", line)
		}
	}
	require.NotNil(t, rep, "rank 0's report:\n%s", out)
	return rep
}

// TestTorchExampleLockstep: --backend none --lockstep trains with a barrier
// per step and no gradients moved, over migctl under migctl run unless
// --lockstep-via names another backend; --lockstep-via alone is refused.
func TestTorchExampleLockstep(t *testing.T) {
	lib, bin := artifacts(t)
	needTorch(t)
	for _, tc := range []struct {
		name    string
		args    []string
		barrier string // rank 0's barrier_backend; "" : the run fails
		refusal string
	}{
		{"migctl under migctl run", []string{"--lockstep"}, "migctl", ""},
		{"gloo", []string{"--lockstep", "--lockstep-via", "gloo"}, "gloo", ""},
		{"via without lockstep", []string{"--lockstep-via", "gloo"}, "", "--lockstep-via is for --lockstep"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			argv := append([]string{"run", "--sim", "h200x8", "--profile", "1g.18gb", "--np", "2", "-q", "--timeout", "60s", "--",
				python, filepath.Join(repoRoot(t), "examples", "pytorch", "ddp_resnet.py"), "--backend", "none", "--device", "cpu",
				"--batch", "2", "--image-size", "32", "--classes", "10", "--warmup", "1", "--steps", "2"}, tc.args...)
			cmd := exec.CommandContext(ctx, bin, argv...)
			cmd.Env = append(os.Environ(), "MIGCTL_LIB="+lib, "OMP_NUM_THREADS=1")
			cmd.WaitDelay = 5 * time.Second
			out, err := cmd.CombinedOutput()
			if tc.barrier == "" {
				require.Error(t, err, "%s", out)
				require.Contains(t, string(out), tc.refusal)
				return
			}
			require.NoError(t, err, "%s", out)
			rep := exampleReport(t, out)
			require.Equal(t, true, rep["lockstep"], "%v", rep)
			require.Equal(t, tc.barrier, rep["barrier_backend"], "%v", rep)
			require.Equal(t, "none", rep["backend"], "%v", rep)
		})
	}
}

// TestTorchExampleSyncEvery: --sync-every K times windows of K steps with
// the host waiting for the device only at their edges; the training is the
// same step for step (losses and parameters equal to --sync-every 1's), the
// report says K, --time-ddp's CPU figures hold at K > 1, and a K that does
// not divide --steps, or is below 1, is refused before any rank trains.
func TestTorchExampleSyncEvery(t *testing.T) {
	lib, bin := artifacts(t)
	needTorch(t)
	run := func(t *testing.T, args ...string) ([]byte, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		argv := append([]string{"run", "--sim", "h200x8", "--profile", "1g.18gb", "--np", "2", "-q", "--timeout", "60s", "--",
			python, filepath.Join(repoRoot(t), "examples", "pytorch", "ddp_resnet.py"), "--backend", "migctl", "--device", "cpu",
			"--batch", "2", "--image-size", "32", "--classes", "10", "--warmup", "1"}, args...)
		cmd := exec.CommandContext(ctx, bin, argv...)
		cmd.Env = append(os.Environ(), "MIGCTL_LIB="+lib, "OMP_NUM_THREADS=1")
		cmd.WaitDelay = 5 * time.Second
		return cmd.CombinedOutput()
	}
	reports := map[int]map[string]any{}
	for _, k := range []int{1, 2} {
		out, err := run(t, "--steps", "4", "--sync-every", fmt.Sprint(k))
		require.NoError(t, err, "%s", out)
		rep := exampleReport(t, out)
		require.Equal(t, float64(k), rep["sync_every"], "%v", rep)
		require.Equal(t, true, rep["ranks_identical"], "%v", rep)
		require.Len(t, rep["losses"], 5, "warmup + 4 timed steps: %v", rep)
		reports[k] = rep
	}
	require.Equal(t, reports[1]["losses"], reports[2]["losses"], "the same steps, read later")
	require.Equal(t, reports[1]["param_checksum"], reports[2]["param_checksum"])
	// --time-ddp's CPU figures hold at any K: one mean per rank over the timed steps
	out, err := run(t, "--steps", "4", "--sync-every", "2", "--time-ddp")
	require.NoError(t, err, "%s", out)
	rep := exampleReport(t, out)
	sync, ok := rep["buffer_sync"].(map[string]any)
	require.True(t, ok, "%v", rep)
	cpu, _ := sync["cpu_ms"].([]any)
	require.Len(t, cpu, 2, "%v", rep)
	for _, c := range cpu {
		require.Greater(t, c.(float64), 0.0, "DDP's buffer sync took CPU time: %v", rep)
	}
	for _, tc := range []struct {
		args    []string
		refusal string
	}{
		{[]string{"--steps", "3", "--sync-every", "2"}, "--steps 3 is not a multiple of --sync-every 2"},
		{[]string{"--steps", "3", "--sync-every", "0"}, "--sync-every 0: must be at least 1"},
	} {
		out, err := run(t, tc.args...)
		require.Error(t, err, "%s", out)
		require.Contains(t, string(out), tc.refusal)
	}
}

// TestTorchExamplePipeline: examples/pytorch/pipeline.py, a model split into
// one stage per rank and trained with GPipe over isend/irecv, ends each
// stage within fp32 round-off of the whole model trained in one process,
// with the same losses over migctl as over gloo.
func TestTorchExamplePipeline(t *testing.T) {
	lib, bin := artifacts(t)
	needTorch(t)
	losses := map[string][]any{}
	for _, backend := range []string{"migctl", "gloo"} {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		cmd := exec.CommandContext(ctx, bin, "run", "--sim", "h200x8", "--profile", "1g.18gb", "--np", "3", "-q", "--timeout", "60s", "--",
			python, filepath.Join(repoRoot(t), "examples", "pytorch", "pipeline.py"), "--backend", backend, "--device", "cpu",
			"--width", "64", "--layers", "5", "--batch", "24", "--micro", "4", "--warmup", "1", "--steps", "4", "--losses", "5", "--check")
		cmd.Env = append(os.Environ(), "MIGCTL_LIB="+lib, "OMP_NUM_THREADS=1")
		cmd.WaitDelay = 5 * time.Second
		out, err := cmd.CombinedOutput()
		cancel()
		require.NoError(t, err, "%s", out)
		rep := exampleReport(t, out)
		require.Equal(t, backend, rep["backend"], "%v", rep)
		require.Less(t, rep["max_diff_whole"].(float64), 1e-5, "%v", rep)
		l, _ := rep["losses"].([]any)
		require.Len(t, l, 5, "%v", rep)
		losses[backend] = l
	}
	require.Equal(t, losses["gloo"], losses["migctl"])
}
