package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/internal/testutil"
)

// sgdBin builds the trainer example (trainer/example/sgd) into a directory
// of the test's.
func sgdBin(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "sgd")
	b, err := exec.Command("go", "build", "-o", out, "github.com/migctl/migctl/trainer/example/sgd").CombinedOutput()
	require.NoError(t, err, "building the sgd example: %s", b)
	return out
}

// weights reads every rank's final weights from the example's --out dir.
func weights(t *testing.T, dir string, n int) [][]float64 {
	t.Helper()
	out := make([][]float64, n)
	for r := range n {
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("weights-%d.bin", r)))
		require.NoError(t, err)
		w := make([]float64, len(b)/8)
		for i := range w {
			w[i] = math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
		}
		out[r] = w
	}
	return out
}

func requireSameWeights(t *testing.T, want []float64, ws [][]float64, tol float64) {
	t.Helper()
	for r, w := range ws {
		require.Equal(t, ws[0], w, "rank %d's weights differ from rank 0's", r)
	}
	require.Len(t, ws[0], len(want))
	for i := range want {
		d := math.Abs(want[i]-ws[0][i]) / math.Max(math.Max(math.Abs(want[i]), math.Abs(ws[0][i])), 1e-12)
		require.LessOrEqual(t, d, tol, "weight %d: %v vs %v", i, ws[0][i], want[i])
	}
}

// pidsOf lists the live processes running the executable at path.
func pidsOf(path string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil {
			continue
		}
		if exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe")); err == nil && exe == path {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
			if i := strings.LastIndexByte(string(b), ')'); i > 0 && len(b) > i+2 && b[i+2] != 'Z' {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// startAndKill starts a run of np workers of the executable exe, waits
// until they all run, lets them work for after, and SIGKILLs the victim-th
// of them (in pid order). It returns the command (to Wait for), the workers'
// pids and the run's output.
func startAndKill(t *testing.T, c *exec.Cmd, exe string, np, victim int, after time.Duration) (*exec.Cmd, []int, *testutil.LockedBuffer, *testutil.LockedBuffer) {
	t.Helper()
	return startAndSignal(t, c, exe, np, victim, after, syscall.SIGKILL)
}

// startAndSignal is startAndKill with another signal (SIGSTOP: a stalled
// worker).
func startAndSignal(t *testing.T, c *exec.Cmd, exe string, np, victim int, after time.Duration,
	sig syscall.Signal) (*exec.Cmd, []int, *testutil.LockedBuffer, *testutil.LockedBuffer) {
	t.Helper()
	var stdout, stderr testutil.LockedBuffer
	c.Stdout, c.Stderr = &stdout, &stderr
	require.NoError(t, c.Start())
	var pids []int
	for range 200 {
		if pids = pidsOf(exe); len(pids) == np {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	require.Len(t, pids, np, stderr.String())
	time.Sleep(after)
	require.NoError(t, syscall.Kill(pids[victim], sig))
	return c, pids, &stdout, &stderr
}

// TestRunTrainsOnSimulatedMIG is the newcomer's command: `migctl run --sim
// h200x8 --np N --profile 1g.18gb -- sgd` leases N instances (creating them
// on the empty simulated node), trains, and ends with the weights of one
// rank that took the whole batch; a worker SIGKILLed mid-run restarts the
// job (which resumes from its checkpoint) and ends with the same weights;
// with --max-restarts 0 the run fails naming the killed rank.
func TestRunTrainsOnSimulatedMIG(t *testing.T) {
	bin, sgd := testutil.MigctlBin(t), sgdBin(t)
	shmDir := t.TempDir() // the workers' segments go here: it must end empty
	train := []string{"--steps", "40", "--batch", "84", "--seed", "5", "--log-every", "0"}
	run := func(t *testing.T, r *runCLI, np int, extra []string, out string, sgdArgs ...string) (string, string, error) {
		args := append(append([]string{}, r.sim...), "--np", fmt.Sprint(np), "--profile", "1g.18gb", "-o", "json", "--grace", "1s",
			"--shm-dir", shmDir)
		args = append(append(args, extra...), "--", sgd)
		args = append(append(args, train...), "--out", out)
		return r.run(t, nil, append(args, sgdArgs...)...)
	}
	r1 := newRunCLI(t, bin)
	one := filepath.Join(t.TempDir(), "one")
	_, stderr, err := run(t, r1, 1, nil, one)
	require.NoError(t, err, stderr)
	ref := weights(t, one, 1)[0]

	for _, np := range []int{2, 3, 7} {
		t.Run(fmt.Sprintf("%d ranks", np), func(t *testing.T) {
			r := newRunCLI(t, bin)
			out := filepath.Join(t.TempDir(), "out")
			stdout, stderr, err := run(t, r, np, nil, out)
			require.NoError(t, err, stderr)
			res := summary(t, stdout)
			require.Equal(t, np, res.World)
			require.Len(t, res.Devices, np)
			seen := map[string]bool{}
			for _, d := range res.Devices {
				require.True(t, strings.HasPrefix(d.Visible, "MIG-"), "device %q", d.Visible)
				require.False(t, seen[d.Visible], "MIG device %s leased twice", d.Visible)
				seen[d.Visible] = true
			}
			requireSameWeights(t, ref, weights(t, out, np), 1e-6)
			// The instances were created on the simulated node and outlive the run.
			show, err := exec.Command(bin, append([]string{"partition", "show", "-o", "json"}, r.sim...)...).CombinedOutput()
			require.NoError(t, err, string(show))
			require.GreaterOrEqual(t, strings.Count(string(show), "1g.18gb"), np, string(show))
			r.requireClean(t)
		})
	}

	t.Run("worker killed, job restarted", func(t *testing.T) {
		r := newRunCLI(t, bin)
		out, ckpt := filepath.Join(t.TempDir(), "out"), filepath.Join(t.TempDir(), "ckpt")
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		args := append(append([]string{}, r.sim...), "--np", "4", "--profile", "1g.18gb", "-o", "json", "--grace", "1s",
			"--shm-dir", shmDir, "--max-restarts", "2", "--", sgd)
		args = append(append(args, train...), "--out", out, "--ckpt", ckpt, "--ckpt-every", "5", "--step-delay", "40ms")
		c, victims, stdout, stderr := startAndKill(t, r.cmd(ctx, nil, args...), sgd, 4, 2, 500*time.Millisecond)
		require.NoError(t, c.Wait(), stderr.String())
		res := summary(t, stdout.String())
		require.Equal(t, 1, res.Restarts)
		require.NotNil(t, res.RootCause)
		require.Equal(t, "SIGKILL", res.RootCause.Signal)
		requireSameWeights(t, ref, weights(t, out, 4), 1e-6)
		requireDead(t, victims)
		require.Empty(t, pidsOf(sgd), "workers left running")
		r.requireClean(t)
	})

	t.Run("worker killed, no restarts", func(t *testing.T) {
		r := newRunCLI(t, bin)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		args := append(append([]string{}, r.sim...), "--np", "3", "--profile", "1g.18gb", "-o", "json", "--grace", "1s",
			"--shm-dir", shmDir, "--max-restarts", "0", "--", sgd, "--steps", "400", "--batch", "84", "--step-delay", "20ms")
		c, victims, stdout, stderr := startAndKill(t, r.cmd(ctx, nil, args...), sgd, 3, 1, 300*time.Millisecond)
		err := c.Wait()
		require.Error(t, err, "the run succeeded although a worker was killed")
		res := summary(t, stdout.String())
		require.Equal(t, 0, res.Restarts)
		require.NotNil(t, res.RootCause, stderr.String())
		require.Equal(t, "SIGKILL", res.RootCause.Signal, "root cause %+v\n%s", *res.RootCause, stderr.String())
		require.Equal(t, victims[1], res.RootCause.PID, stderr.String())
		require.Contains(t, stderr.String(), fmt.Sprintf("rank %d", res.RootCause.Rank))
		require.Empty(t, pidsOf(sgd), "workers left running")
		r.requireClean(t)
	})
	t.Run("worker stopped (SIGSTOP): the summary blames it, not a witness", func(t *testing.T) {
		// A stopped rank keeps its rendezvous connection: only its peers'
		// liveness checks see it, and they report it to the rendezvous.
		r := newRunCLI(t, bin)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		args := append(append([]string{}, r.sim...), "--np", "3", "--profile", "1g.18gb", "-o", "json", "--grace", "1s",
			"--shm-dir", shmDir, "--max-restarts", "0", "--", sgd, "--steps", "4000", "--batch", "84", "--step-delay", "20ms")
		c, victims, stdout, stderr := startAndSignal(t, r.cmd(ctx, nil, args...), sgd, 3, 1, 300*time.Millisecond, syscall.SIGSTOP)
		require.Error(t, c.Wait(), "the run succeeded although a worker was stopped")
		res := summary(t, stdout.String())
		require.NotNil(t, res.RootCause, stderr.String())
		blamed := res.Blame
		if res.RootCause.PID == victims[1] {
			blamed = res.RootCause.String() // it ended first (SIGCONT, SIGTERM) and is the root cause itself
		}
		require.Contains(t, blamed, "rank 1", "root cause %+v, blame %q\n%s", *res.RootCause, res.Blame, stderr.String())
		requireDead(t, victims)
		require.Empty(t, pidsOf(sgd), "workers left running")
		r.requireClean(t)
	})
	t.Run("a rank that exits 0 without joining", func(t *testing.T) {
		// Before, the others waited for it until the SDK's start-up limit
		// (5 minutes); now the rendezvous fails them at once, naming it.
		r := newRunCLI(t, bin)
		start := time.Now()
		args := append(append([]string{}, r.sim...), "--np", "3", "--profile", "1g.18gb", "-o", "json", "--grace", "1s",
			"--shm-dir", shmDir, "--", "sh", "-c", `if [ "$RANK" = 1 ]; then exit 0; fi; exec "$0" "$@"`, sgd)
		stdout, stderr, err := r.run(t, nil, append(args, train...)...)
		require.Error(t, err, "the run succeeded although rank 1 never joined")
		require.Less(t, time.Since(start), time.Minute, "the joining ranks waited for rank 1: %s", stderr)
		res := summary(t, stdout)
		require.NotNil(t, res.RootCause, stderr)
		require.NotEqual(t, 1, res.RootCause.Rank, "rank 1 did not fail")
		require.Contains(t, res.Blame, "rank 1 (pid ", stderr)
		require.Contains(t, res.Blame, "exited with code 0 before every rank joined the group", stderr)
		require.Empty(t, pidsOf(sgd), "workers left running")
		r.requireClean(t)
	})
	left, err := os.ReadDir(shmDir)
	require.NoError(t, err)
	require.Empty(t, left, "shared-memory segments left behind")
}

// TestRunGangSwapHeldPastDeadline: a 4-rank job under a running daemon is
// swapped out as a gang and held 90 s, longer than its 20-s collective
// deadline, then swapped back in; it trains on and ends with the weights of
// a run without the swap.
func TestRunGangSwapHeldPastDeadline(t *testing.T) {
	if testing.Short() {
		t.Skip("holds a job for 90 s")
	}
	shimDir, bin := e2eBinaries(t)
	sgd := sgdBin(t)
	r := newRunCLI(t, bin)
	dir, err := os.MkdirTemp("", "mgs")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	ctl, swp := filepath.Join(dir, "c.sock"), filepath.Join(dir, "s.sock")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	daemon := exec.CommandContext(ctx, bin, append([]string{"daemon", "--socket", ctl, "--swap-socket", swp}, r.sim...)...)
	var dlog testutil.LockedBuffer
	daemon.Stderr = &dlog
	require.NoError(t, daemon.Start())
	t.Cleanup(func() { _ = daemon.Process.Signal(syscall.SIGTERM); _ = daemon.Wait() })
	for i := 0; ; i++ {
		if _, err := os.Stat(ctl); err == nil {
			break
		}
		require.Less(t, i, 500, "daemon did not start: %s", dlog.String())
		time.Sleep(10 * time.Millisecond)
	}
	train := []string{"--steps", "120", "--batch", "56", "--seed", "9", "--log-every", "0", "--step-delay", "25ms"}
	migctl := func(args ...string) string {
		out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
		require.NoError(t, err, "migctl %v: %s", args, out)
		return string(out)
	}
	start := func(job, out string) (*exec.Cmd, *testutil.LockedBuffer, *testutil.LockedBuffer) {
		args := append(append([]string{}, r.sim...), "--socket", ctl, "--swap", "--swap-lib", filepath.Join(shimDir, "libmigswap.so"),
			"--swap-socket", swp, "--job", job,
			"--np", "4", "--profile", "1g.18gb", "--timeout", "20s", "-o", "json", "--", sgd)
		args = append(append(args, train...), "--out", out)
		c := r.cmd(ctx, nil, args...)
		var stdout, stderr testutil.LockedBuffer
		c.Stdout, c.Stderr = &stdout, &stderr
		require.NoError(t, c.Start())
		return c, &stdout, &stderr
	}
	plainOut := filepath.Join(t.TempDir(), "plain")
	c, _, stderr := start("plain", plainOut)
	require.NoError(t, c.Wait(), stderr.String())

	out := filepath.Join(t.TempDir(), "held")
	c, stdout, stderr := start("held", out)
	type proc struct {
		PID   int    `json:"pid"`
		Job   string `json:"job"`
		State string `json:"state"`
	}
	status := func() []proc {
		var st struct {
			Processes []proc `json:"processes"`
		}
		require.NoError(t, json.Unmarshal([]byte(migctl("swap", "status", "--socket", ctl, "-o", "json")), &st))
		var mine []proc
		for _, p := range st.Processes {
			if p.Job == "held" {
				mine = append(mine, p)
			}
		}
		return mine
	}
	for i := 0; len(status()) < 4; i++ {
		require.Less(t, i, 300, "the job's 4 ranks never registered with the daemon: %s", stderr.String())
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // mid-training
	migctl("swap", "out", "--job", "held", "--socket", ctl)
	for _, p := range status() {
		require.Equal(t, "out", p.State, "pid %d", p.PID)
	}
	time.Sleep(90 * time.Second)
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c.Process.Pid))
	require.NoError(t, err)
	require.NotContains(t, string(b[strings.LastIndexByte(string(b), ')'):]), ") Z", "the held job ended while swapped out: %s", stderr.String())
	require.Len(t, pidsOf(sgd), 4, "ranks died while held: %s", stderr.String())
	migctl("swap", "in", "--job", "held", "--socket", ctl)
	require.NoError(t, c.Wait(), stderr.String())
	res := summary(t, stdout.String())
	require.Equal(t, 0, res.Restarts, "the job was restarted: %s", stderr.String())
	requireSameWeights(t, weights(t, plainOut, 4)[0], weights(t, out, 4), 0)
}

// TestRunGPUsPassesDaemonSocket: with --gpus (no leases) a daemon named by
// --socket still reaches the workers (MIGCTL_SOCKET, and with --swap the
// shim's MIGSWAP_SOCKET), so a job on whole GPUs follows its swaps.
func TestRunGPUsPassesDaemonSocket(t *testing.T) {
	r := newRunCLI(t, testutil.MigctlBin(t))
	lib := filepath.Join(t.TempDir(), "libmigswap.so") // not loaded by sh's echo: any file will do
	require.NoError(t, os.WriteFile(lib, nil, 0o644))
	stdout, stderr, err := r.run(t, []string{"LD_PRELOAD="}, "--gpus", "0", "--np", "1", "-q", "--socket", "/tmp/x-control.sock",
		"--swap", "--swap-lib", lib, "--swap-socket", "/tmp/x-swap.sock", "--",
		"sh", "-c", `echo "sock=$MIGCTL_SOCKET swap=$MIGSWAP_SOCKET"`)
	require.NoError(t, err, stderr)
	require.Contains(t, stdout, "sock=/tmp/x-control.sock swap=/tmp/x-swap.sock")
}
