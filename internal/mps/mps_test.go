package mps_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/internal/mps"
	"github.com/migctl/migctl/internal/testutil"
)

// A control pipe left by a daemon that was killed is asked to quit before a
// new control daemon starts.
func TestStartStalePipe(t *testing.T) {
	dir := t.TempDir()
	pipeDir := filepath.Join(dir, "x.mps")
	require.NoError(t, os.MkdirAll(filepath.Join(pipeDir, "log"), 0o700))
	_, err := mps.Start(context.Background(), testutil.FakeMPSControl(t), pipeDir, 0, nil)
	require.NoError(t, err)
	// killed: nobody stops it; the next start finds its pipe
	m2, err := mps.Start(context.Background(), testutil.FakeMPSControl(t), pipeDir, 0, nil)
	require.NoError(t, err)
	require.NoError(t, m2.Stop())
	log, err := os.ReadFile(filepath.Join(pipeDir, "log", "control.log"))
	require.NoError(t, err)
	require.Equal(t, "started\nquit\nstarted\nquit\n", string(log))
}

// --mps-low-sm: the cap the shim applies to best-effort clients.
func TestStartLowSM(t *testing.T) {
	for _, tc := range []struct {
		pct  int
		want string
	}{{0, ""}, {50, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50\n"}, {100, ""}} {
		dir := t.TempDir()
		m, err := mps.Start(context.Background(), testutil.FakeMPSControl(t), filepath.Join(dir, "p"), tc.pct, nil)
		require.NoError(t, err)
		b, err := os.ReadFile(filepath.Join(dir, "p", mps.LowEnv))
		require.NoError(t, err)
		require.Equal(t, tc.want, string(b))
		require.NoError(t, m.Stop())
	}
	_, err := mps.Start(context.Background(), testutil.FakeMPSControl(t), t.TempDir(), 101, nil)
	require.ErrorContains(t, err, "101")
}
