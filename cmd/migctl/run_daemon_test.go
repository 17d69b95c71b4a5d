package main

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	ctxmgr "github.com/migctl/migctl/context"
	"github.com/migctl/migctl/internal/testutil"
	"github.com/migctl/migctl/mig"
	"github.com/migctl/migctl/mig/migsim"
)

// startSimDaemon starts a daemon leasing MIG devices of a simulated node of
// gpus H200s (reapEvery: how often it looks for leases whose process has
// gone; 0: its default), closed when the test ends. Its sockets live in a
// short directory of their own (sun_path is 108 bytes).
func startSimDaemon(t *testing.T, gpus int, reapEvery time.Duration) *ctxmgr.Daemon {
	t.Helper()
	dir, err := os.MkdirTemp("", "mrd")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	d, err := ctxmgr.StartDaemon(context.Background(), ctxmgr.DaemonConfig{
		ControlSocket: filepath.Join(dir, "ctl.sock"),
		SwapSocket:    filepath.Join(dir, "swap.sock"),
		MIG:           mig.NewManager(migsim.New(migsim.H200, gpus)),
		Leases:        ctxmgr.LeaseOptions{EnableMIG: true},
		ReapEvery:     reapEvery,
		Swap:          ctxmgr.Options{GPUMemory: 80 << 30, RebalanceEvery: -1},
	})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, d.Close()) })
	return d
}

// TestRunLeasesReleased: `migctl run --socket` against a running daemon
// (over a simulated H200 node) leaves no lease behind, whether the job
// succeeds, fails, is restarted after a SIGKILL, or is interrupted; while
// it runs the leases are the job's, one per rank.
func TestRunLeasesReleased(t *testing.T) {
	bin := testutil.MigctlBin(t)
	d := startSimDaemon(t, 2, 20*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := ctxmgr.Dial(ctx, d.ControlSocket())
	require.NoError(t, err)
	defer c.Close()
	leases := func() []ctxmgr.Lease {
		ls, err := c.Leases(ctx)
		require.NoError(t, err)
		return ls
	}

	// During the run: rank 0 reports how many leases the job holds.
	r := newRunCLI(t, bin)
	r.env = append(r.env, "MIGCTL_SOCKET="+d.ControlSocket())
	watch := make(chan []ctxmgr.Lease, 1)
	go func() {
		for range 200 {
			if _, err := os.Stat(filepath.Join(r.dir, "ready-0")); err == nil {
				ls, _ := c.Leases(ctx)
				watch <- ls
				_ = os.WriteFile(filepath.Join(r.dir, "go"), nil, 0o600)
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		watch <- nil
	}()
	_, stderr, err := r.run(t, nil, "--np", "3", "--profile", "1g.18gb", "--backend", "host", "--job", "leased", "--",
		"sh", "-c", `touch "$T_DIR/ready-$RANK"; while [ ! -e "$T_DIR/go" ]; do sleep 0.05; done`)
	require.NoError(t, err, stderr)
	during := <-watch
	require.Len(t, during, 3, "leases while the job ran")
	for _, le := range during {
		require.Equal(t, "leased", le.Job)
	}
	require.Empty(t, leases(), "leases left after success")

	// Failure with no restart left.
	r = newRunCLI(t, bin)
	r.env = append(r.env, "MIGCTL_SOCKET="+d.ControlSocket())
	_, _, err = r.run(t, nil, "--np", "2", "--profile", "1g.18gb", "--backend", "host", "--", "sh", "-c", `exit 3`)
	require.Error(t, err)
	require.Empty(t, leases(), "leases left after a failure")

	// A rank SIGKILLed, all restarted.
	r = newRunCLI(t, bin)
	r.env = append(r.env, "MIGCTL_SOCKET="+d.ControlSocket())
	stdout, stderr, err := r.run(t, nil, "--np", "3", "--profile", "1g.18gb", "--backend", "host", "--max-restarts", "1", "-o", "json",
		"--", "sh", "-c", `if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "$RANK" = 2 ]; then kill -9 $$; fi; sleep 0.2`)
	require.NoError(t, err, stderr)
	require.Equal(t, 1, summary(t, stdout).Restarts)
	require.Empty(t, leases(), "leases left after a restart")

	// Interrupted.
	r = newRunCLI(t, bin)
	r.env = append(r.env, "MIGCTL_SOCKET="+d.ControlSocket())
	cmd := r.cmd(ctx, nil, "--np", "2", "--profile", "1g.18gb", "--backend", "host", "--", "sh", "-c",
		`echo $$ > "$T_DIR/pid-$RANK"; exec sleep 60`)
	require.NoError(t, cmd.Start())
	for i := 0; i < 200 && len(readPids(t, r.dir, "pid-")) < 2; i++ {
		time.Sleep(50 * time.Millisecond)
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	err = cmd.Wait()
	require.Error(t, err)
	requireDead(t, readPids(t, r.dir, "pid-"))
	require.Empty(t, leases(), "leases left after SIGTERM")
	r.requireClean(t)

	// Killed with SIGKILL: the daemon ends the leases of the dead launcher.
	r = newRunCLI(t, bin)
	r.env = append(r.env, "MIGCTL_SOCKET="+d.ControlSocket())
	cmd = r.cmd(ctx, nil, "--np", "2", "--profile", "1g.18gb", "--backend", "host", "--", "sh", "-c",
		`echo $$ > "$T_DIR/pid-$RANK"; exec sleep 60`)
	require.NoError(t, cmd.Start())
	for i := 0; i < 200 && len(readPids(t, r.dir, "pid-")) < 2; i++ {
		time.Sleep(50 * time.Millisecond)
	}
	require.Len(t, leases(), 2)
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	var left []ctxmgr.Lease
	for range 100 {
		if left = leases(); len(left) == 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	require.Empty(t, left, "leases of a launcher killed with SIGKILL")
}

// TestRunSameJobName: two `migctl run --job same` on one daemon; the one
// that ends first gives back its own leases only, so the other keeps its
// devices and a third job cannot be granted them while it runs.
func TestRunSameJobName(t *testing.T) {
	bin := testutil.MigctlBin(t)
	d := startSimDaemon(t, 1, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := ctxmgr.Dial(ctx, d.ControlSocket())
	require.NoError(t, err)
	defer c.Close()
	uuids := func(job string) []string {
		ls, err := c.Leases(ctx)
		require.NoError(t, err)
		var out []string
		for _, le := range ls {
			if le.Job == job {
				out = append(out, le.UUID)
			}
		}
		return out
	}

	// The long run: two ranks wait for $T_DIR/go.
	long := newRunCLI(t, bin)
	long.env = append(long.env, "MIGCTL_SOCKET="+d.ControlSocket())
	cmd := long.cmd(ctx, nil, "--np", "2", "--profile", "1g.18gb", "--backend", "host", "--job", "same", "--", "sh", "-c",
		`echo $$ > "$T_DIR/ready-$RANK"; while [ ! -e "$T_DIR/go" ]; do sleep 0.05; done`)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for i := 0; i < 200 && len(readPids(t, long.dir, "ready-")) < 2; i++ {
		time.Sleep(50 * time.Millisecond)
	}
	held := uuids("same")
	require.Len(t, held, 2)

	// A short run under the same name comes and goes.
	short := newRunCLI(t, bin)
	short.env = append(short.env, "MIGCTL_SOCKET="+d.ControlSocket())
	_, stderr, err := short.run(t, nil, "--np", "1", "--profile", "1g.18gb", "--backend", "host", "--job", "same", "--", "true")
	require.NoError(t, err, stderr)
	require.Equal(t, held, uuids("same"), "the long run's leases after the short one ended")

	// Another job gets other devices.
	other := newRunCLI(t, bin)
	other.env = append(other.env, "MIGCTL_SOCKET="+d.ControlSocket())
	stdout, stderr, err := other.run(t, nil, "--np", "2", "--profile", "1g.18gb", "--backend", "host", "--job", "other", "-o", "json", "--", "true")
	require.NoError(t, err, stderr)
	for _, dev := range summary(t, stdout).Devices {
		require.NotContains(t, held, dev.Visible, "a device of the running job was granted to another")
	}

	require.NoError(t, os.WriteFile(filepath.Join(long.dir, "go"), nil, 0o600))
	require.NoError(t, cmd.Wait())
	require.Empty(t, uuids("same"), "leases left after the long run")
}

// TestRunSimOneLeaseRegistry: a simulated node has one lease registry at a
// time. A second `migctl run --sim` (a daemon of its own) beside a running
// one, or one beside `migctl daemon --sim`, is refused, naming the holder,
// before it leases or reshapes anything: otherwise it would see the other's
// leased instances as free, and grant them again or destroy them to make
// room.
func TestRunSimOneLeaseRegistry(t *testing.T) {
	bin := testutil.MigctlBin(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	first := newRunCLI(t, bin)
	first.sim = []string{"--sim", "h200", "--sim-state", filepath.Join(t.TempDir(), "sim.json")}
	cmd := first.cmd(ctx, nil, append(first.sim, "--np", "7", "--profile", "1g.18gb", "--", "sh", "-c",
		`echo $$ > "$T_DIR/ready-$RANK"; while [ ! -e "$T_DIR/go" ]; do sleep 0.05; done`)...)
	var firstErr testutil.LockedBuffer
	cmd.Stderr = &firstErr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for i := 0; i < 200 && len(readPids(t, first.dir, "ready-")) < 7; i++ {
		time.Sleep(50 * time.Millisecond)
	}
	require.Len(t, readPids(t, first.dir, "ready-"), 7, firstErr.String())
	before := first.show(t)

	tests := []struct {
		desc string
		args []string
		want string
	}{
		{"the same profile", []string{"--np", "2", "--profile", "1g.18gb"}, "another 'migctl run' (pid "},
		{"a profile that needs the whole GPU", []string{"--np", "1", "--profile", "7g.141gb"}, "with a daemon of its own"},
	}
	for _, tt := range tests {
		t.Run(tt.desc, func(t *testing.T) {
			second := newRunCLI(t, bin)
			stdout, stderr, err := second.run(t, nil, append(append(append([]string{}, first.sim...), tt.args...), "--", "true")...)
			require.Error(t, err)
			require.Empty(t, stdout)
			require.Contains(t, stderr, tt.want)
			require.Equal(t, before, first.show(t), "the running job's node changed")
			second.requireClean(t)
		})
	}
	require.NoError(t, os.WriteFile(filepath.Join(first.dir, "go"), nil, 0o600))
	require.NoError(t, cmd.Wait(), firstErr.String())

	t.Run("beside migctl daemon --sim", func(t *testing.T) {
		d := startTestDaemon(t, first.sim...)
		r := newRunCLI(t, bin)
		_, stderr, err := r.run(t, nil, append(append([]string{}, first.sim...), "--np", "1", "--profile", "1g.18gb", "--", "true")...)
		require.Error(t, err)
		require.Contains(t, stderr, "a 'migctl daemon' (pid ")
		require.Contains(t, stderr, "--socket "+d.ctlSocket)
		// through the daemon it runs
		_, stderr, err = r.run(t, []string{"MIGCTL_SOCKET=" + d.ctlSocket}, append(append([]string{}, first.sim...), "--np", "1", "--profile", "1g.18gb", "--", "true")...)
		require.NoError(t, err, stderr)
	})
}
