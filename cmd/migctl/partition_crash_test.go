package main

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/internal/testutil"
)

type cli struct {
	t     *testing.T
	bin   string
	state string
}

// run runs the binary with extra environment; it returns stdout and the error.
func (c cli) run(env []string, args ...string) (string, error) {
	cmd := exec.Command(c.bin, append([]string{"partition"}, args...)...)
	cmd.Args = append(cmd.Args, "--sim", "h200x2", "--sim-state", c.state)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.Output()
	return string(out), err
}

func (c cli) must(args ...string) string {
	c.t.Helper()
	out, err := c.run(nil, args...)
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		c.t.Fatalf("migctl %v: %v: %s", args, err, ee.Stderr)
	}
	require.NoError(c.t, err)
	return out
}

// TestCrashMidApplyConverges kills a real migctl process (SIGKILL, from an
// env hook) right after step k of an apply, for every k, then checks that
// recover (odd k) or a plain re-apply (even k) converges the node to the
// new layout, and that the GPU the crash interrupted was rolled forward.
func TestCrashMidApplyConverges(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the migctl binary")
	}
	bin := testutil.MigctlBin(t)
	const oldLayout, newLayout = "4g.71gb=1,3g.71gb=1", "2g.35gb=2,1g.18gb=3"

	template := filepath.Join(t.TempDir(), "template.json")
	c := cli{t: t, bin: bin, state: template}
	c.must("apply", "--gpus", "all", "--layout", oldLayout)
	var plan struct {
		GPUs []struct{ Steps []json.RawMessage }
	}
	require.NoError(t, json.Unmarshal([]byte(c.must("plan", "--gpus", "all", "--layout", newLayout, "-o", "json")), &plan))
	total := 0
	for _, g := range plan.GPUs {
		total += len(g.Steps)
	}
	require.Greater(t, total, 10)
	tmpl, err := os.ReadFile(template)
	require.NoError(t, err)

	for k := 1; k <= total; k++ {
		state := filepath.Join(partitionTempDir(t), "node.json")
		require.NoError(t, os.WriteFile(state, tmpl, 0o644))
		c := cli{t: t, bin: bin, state: state}
		_, err := c.run([]string{envCrashAfterStep + "=" + strconv.Itoa(k)}, "apply", "--gpus", "all", "--layout", newLayout)
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee, "step %d: migctl must have been killed", k)
		ws := ee.Sys().(syscall.WaitStatus)
		require.True(t, ws.Signaled() && ws.Signal() == syscall.SIGKILL, "step %d: %v", k, err)
		_, err = os.Stat(state + ".journal")
		require.NoError(t, err, "step %d: the journal must survive the crash", k)

		if k%2 == 1 {
			var rec struct {
				Outcome     string
				Transaction struct{ GPU int }
			}
			require.NoError(t, json.Unmarshal([]byte(c.must("recover", "-o", "json")), &rec))
			require.Equal(t, "rolled-forward", rec.Outcome, "step %d", k)
			// the interrupted GPU now has the new layout; the GPUs after it still the old one
			g := strconv.Itoa(rec.Transaction.GPU)
			c.must("assert", "--gpus", g, "--layout", newLayout)
			for i := rec.Transaction.GPU + 1; i < len(plan.GPUs); i++ {
				c.must("assert", "--gpus", strconv.Itoa(i), "--layout", oldLayout)
			}
		}
		c.must("apply", "--gpus", "all", "--layout", newLayout)
		c.must("assert", "--gpus", "all", "--layout", newLayout)
		_, err = os.Stat(state + ".journal")
		require.True(t, os.IsNotExist(err), "step %d: journal left behind", k)
	}
}

// partitionTempDir is a temporary directory on tmpfs when there is one: the
// simulator state and the journal are fsynced at every step.
func partitionTempDir(t *testing.T) string {
	t.Helper()
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		if d, err := os.MkdirTemp("/dev/shm", "migctl-test-"); err == nil {
			t.Cleanup(func() { os.RemoveAll(d) })
			return d
		}
	}
	return t.TempDir()
}

// TestApplyOutlivesAClosedPipe: 'migctl partition apply ... 2>&1 | head -1'
// closes the pipe while apply is between steps. The closed pipe must not
// kill apply half-way (SIGPIPE) and leave a GPU half-changed: the apply
// finishes, and only the output that could not be written is lost.
func TestApplyOutlivesAClosedPipe(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the migctl binary")
	}
	bin := testutil.MigctlBin(t)
	const layout = "2g.35gb=2,1g.18gb=3"
	tests := []struct {
		name           string
		stdout, stderr bool // which stream goes to a pipe closed at once
		wantOK         bool // exit status 0 (a lost result on stdout is an error)
	}{
		{"stderr closed", false, true, true},
		{"stdout closed", true, false, false},
		{"both closed", true, true, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := cli{t: t, bin: bin, state: filepath.Join(partitionTempDir(t), "node.json")}
			cmd := exec.Command(c.bin, "partition", "apply", "--gpus", "all", "--layout", layout, "--sim", "h200x2", "--sim-state", c.state)
			r, w, err := os.Pipe()
			require.NoError(t, err)
			require.NoError(t, r.Close())
			if tc.stdout {
				cmd.Stdout = w
			}
			if tc.stderr {
				cmd.Stderr = w
			}
			err = cmd.Run()
			require.NoError(t, w.Close())
			if tc.wantOK {
				require.NoError(t, err)
			} else {
				var ee *exec.ExitError
				require.ErrorAs(t, err, &ee)
				ws := ee.Sys().(syscall.WaitStatus)
				require.False(t, ws.Signaled(), "killed by %v half-way", ws.Signal())
			}
			c.must("assert", "--gpus", "all", "--layout", layout)
			_, err = os.Stat(c.state + ".journal")
			require.True(t, os.IsNotExist(err), "journal left behind")
		})
	}
}
