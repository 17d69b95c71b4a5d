package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	ctxmgr "github.com/migctl/migctl/context"

	"github.com/migctl/migctl/internal/testutil"
)

func TestLeaseCommandsRoundTrip(t *testing.T) {
	simState := filepath.Join(t.TempDir(), "sim.json")
	d := startTestDaemon(t, "--sim", "h200x8", "--sim-state", simState)
	require.Contains(t, d.log.String(), `mig="simulated h200x8"`)
	require.Contains(t, d.log.String(), "the simulated NVIDIA H200", "--sim alone gives the swap policy the GPU's memory")
	require.Contains(t, d.log.String(), "lease-state="+simState+".leases.json")
	sock := []string{"--socket", d.ctlSocket}
	lease := func(args ...string) (string, error) {
		out, _, err := migctl(t, append(append([]string{"lease"}, args...), sock...)...)
		return out, err
	}

	out, err := lease("acquire", "--job", "a", "--profile", "1g.18gb", "--count", "7", "-o", "json")
	require.NoError(t, err)
	var v leaseView
	require.NoError(t, json.Unmarshal([]byte(out), &v))
	require.Len(t, v.Leases, 7)
	for _, le := range v.Leases {
		require.Equal(t, "a", le.Job)
		require.Equal(t, "1g.18gb", le.Profile)
		require.True(t, le.Created, "made on the fresh simulated GPU")
	}

	// the daemon does not hold the simulated node: partition commands see its work
	shown, _, err := migctl(t, "partition", "show", "--sim", "h200x8", "--sim-state", simState, "-o", "json")
	require.NoError(t, err)
	for _, le := range v.Leases {
		require.Contains(t, shown, le.UUID)
	}

	table, err := lease("list")
	require.NoError(t, err)
	for _, want := range []string{"JOB", "UUID", "PLACEMENT", v.Leases[0].UUID, "created"} {
		require.Contains(t, table, want)
	}
	yaml, err := lease("list", "--job", "a", "-o", "yaml")
	require.NoError(t, err)
	require.Contains(t, yaml, "job: a")
	none, err := lease("list", "--job", "other", "-o", "json")
	require.NoError(t, err)
	require.JSONEq(t, `{"leases": []}`, none)

	_, err = lease("acquire", "--job", "b", "--profile", "1g.18gb", "--gpu", "0")
	require.ErrorIs(t, err, ctxmgr.ErrNoFreeInstance)
	require.ErrorContains(t, err, "leased by job a")
	require.ErrorContains(t, err, "'migctl lease release --job a'")

	out, err = lease("release", "--job", "a", "-o", "json")
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal([]byte(out), &v))
	require.Len(t, v.Leases, 7)
	out, err = lease("acquire", "--job", "b", "--profile", "3g.71gb", "--gpu", "0", "-o", "json")
	require.NoError(t, err, "job a's idle instances are reshaped for b")
	require.NoError(t, json.Unmarshal([]byte(out), &v))
	_, err = lease("release", "--uuid", v.Leases[0].UUID)
	require.NoError(t, err)

	errCases := []struct {
		desc string
		args []string
		want string
	}{
		{"release twice", []string{"release", "--job", "a"}, "no such lease (see 'migctl lease list')"},
		{"no job", []string{"acquire", "--profile", "1g.18gb"}, "--job NAME"},
		{"no profile", []string{"acquire", "--job", "x"}, "--profile 1g.18gb"},
		{"zero count", []string{"acquire", "--job", "x", "--profile", "1g.18gb", "--count", "0"}, "at least 1"},
		{"unknown profile", []string{"acquire", "--job", "x", "--profile", "4g.1gb"}, "partition profiles"},
		{"both job and uuid", []string{"release", "--job", "a", "--uuid", "MIG-x"}, "exactly one of --job and --uuid"},
		{"bad output", []string{"list", "-o", "xml"}, "unknown output format"},
	}
	for _, tc := range errCases {
		t.Run(tc.desc, func(t *testing.T) {
			_, err := lease(tc.args...)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func TestLeaseWithoutDaemon(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "none.sock")
	_, _, err := migctl(t, "lease", "list", "--socket", sock)
	require.ErrorIs(t, err, errDaemonNotRunning)
	require.ErrorContains(t, err, "not running at "+sock)
	require.ErrorContains(t, err, "migctl daemon --sim h200x8")
}

// TestDaemonSimNeedsNoFlags: a newcomer's 'migctl daemon --sim h200x8' with
// the sockets from the environment, and 'migctl lease' finding it there.
func TestDaemonSimNeedsNoFlags(t *testing.T) {
	dir, err := os.MkdirTemp("", "mcn")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	d := &testDaemon{ctlSocket: filepath.Join(dir, "c.sock"), swapSocket: filepath.Join(dir, "s.sock"), log: &testutil.LockedBuffer{}}
	t.Setenv(envControlSocket, d.ctlSocket)
	t.Setenv(envSwapSocket, d.swapSocket)
	t.Setenv("XDG_STATE_HOME", filepath.Join(dir, "state"))
	t.Setenv(envSim, "")
	t.Setenv(envSimState, "")
	runTestDaemon(t, d, []string{"daemon", "--sim", "h200x8"})
	require.FileExists(t, filepath.Join(dir, "state", "migctl", "sim-h200x8.json"), "the simulated node's default state file")

	out, _, err := migctl(t, "lease", "acquire", "--job", "first", "--profile", "7g.141gb", "-o", "json")
	require.NoError(t, err, d.log.String())
	var v leaseView
	require.NoError(t, json.Unmarshal([]byte(out), &v))
	require.Len(t, v.Leases, 1)
	require.FileExists(t, filepath.Join(dir, "state", "migctl", "sim-h200x8.json.leases.json"), "the lease state beside it")
}
