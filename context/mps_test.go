package ctxmgr_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	ctxmgr "github.com/migctl/migctl/context"
)

func fakeMPS(t *testing.T) string {
	t.Helper()
	p, err := filepath.Abs("testdata/fake-mps-control")
	require.NoError(t, err)
	return p
}

// The daemon's MPS control daemon lives next to the shim socket (where the
// shim looks), starts before shims are served and quits with the daemon.
func TestDaemonMPSStartsAndStops(t *testing.T) {
	dir := t.TempDir()
	swap := filepath.Join(dir, "s.sock")
	d, err := ctxmgr.StartDaemon(context.Background(), ctxmgr.DaemonConfig{
		ControlSocket: filepath.Join(dir, "c.sock"), SwapSocket: swap,
		Swap: ctxmgr.Options{GPUMemory: 1 << 30}, MPS: true, MPSControl: fakeMPS(t)})
	require.NoError(t, err)
	pipe := filepath.Join(ctxmgr.MPSPipeDir(swap), ctxmgr.MPSControlPipe)
	require.Equal(t, swap+".mps", d.MPSPipeDir())
	fi, err := os.Stat(pipe)
	require.NoError(t, err)
	require.Equal(t, os.ModeNamedPipe, fi.Mode()&os.ModeNamedPipe)
	// the pipe is there before the shim socket: a shim finds it at process start
	si, err := os.Stat(swap)
	require.NoError(t, err)
	require.False(t, fi.ModTime().After(si.ModTime()), "MPS pipe %v, shim socket %v", fi.ModTime(), si.ModTime())
	require.NoError(t, d.Close())
	_, err = os.Stat(pipe) // the fake removes its pipe when it quits
	require.ErrorIs(t, err, os.ErrNotExist, "the control daemon was not asked to quit")
	log, err := os.ReadFile(filepath.Join(ctxmgr.MPSPipeDir(swap), "log", "control.log"))
	require.NoError(t, err)
	require.Equal(t, "started\nquit\n", string(log))
}

// A control pipe left by a daemon that was killed is asked to quit before a
// new control daemon starts.
func TestDaemonMPSStalePipe(t *testing.T) {
	dir := t.TempDir()
	pipeDir := filepath.Join(dir, "x.mps")
	require.NoError(t, os.MkdirAll(filepath.Join(pipeDir, "log"), 0o700))
	_, err := ctxmgr.StartMPS(context.Background(), fakeMPS(t), pipeDir, 0, nil)
	require.NoError(t, err)
	// killed: nobody stops it; the next start finds its pipe
	m2, err := ctxmgr.StartMPS(context.Background(), fakeMPS(t), pipeDir, 0, nil)
	require.NoError(t, err)
	require.NoError(t, m2.Stop())
	log, err := os.ReadFile(filepath.Join(pipeDir, "log", "control.log"))
	require.NoError(t, err)
	require.Equal(t, "started\nquit\nstarted\nquit\n", string(log))
}

// --mps-low-sm: the cap the shim applies to best-effort clients.
func TestDaemonMPSLowSM(t *testing.T) {
	for _, tc := range []struct {
		pct  int
		want string
	}{{0, ""}, {50, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50\n"}, {100, ""}} {
		dir := t.TempDir()
		m, err := ctxmgr.StartMPS(context.Background(), fakeMPS(t), filepath.Join(dir, "p"), tc.pct, nil)
		require.NoError(t, err)
		b, err := os.ReadFile(filepath.Join(dir, "p", ctxmgr.MPSLowEnv))
		require.NoError(t, err)
		require.Equal(t, tc.want, string(b))
		require.NoError(t, m.Stop())
	}
	_, err := ctxmgr.StartMPS(context.Background(), fakeMPS(t), t.TempDir(), 101, nil)
	require.ErrorContains(t, err, "101")
}

func TestDaemonMPSMissingProgram(t *testing.T) {
	dir := t.TempDir()
	_, err := ctxmgr.StartDaemon(context.Background(), ctxmgr.DaemonConfig{
		ControlSocket: filepath.Join(dir, "c.sock"), SwapSocket: filepath.Join(dir, "s.sock"),
		Swap: ctxmgr.Options{GPUMemory: 1 << 30}, MPS: true, MPSControl: filepath.Join(dir, "no-such-mps-control")})
	require.Error(t, err)
	require.Contains(t, err.Error(), "MPS")
	require.Contains(t, err.Error(), "no-such-mps-control")
}
