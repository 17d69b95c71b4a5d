package ctxmgr_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	ctxmgr "github.com/migctl/migctl/context"
	"github.com/migctl/migctl/internal/mps"
	"github.com/migctl/migctl/internal/testutil"
)

// The daemon's MPS control daemon lives next to the shim socket (where the
// shim looks), starts before shims are served and quits with the daemon.
func TestDaemonMPSStartsAndStops(t *testing.T) {
	dir := t.TempDir()
	swap := filepath.Join(dir, "s.sock")
	d, err := ctxmgr.StartDaemon(context.Background(), ctxmgr.DaemonConfig{
		ControlSocket: filepath.Join(dir, "c.sock"), SwapSocket: swap,
		Swap: ctxmgr.Options{GPUMemory: 1 << 30}, MPS: true, MPSControl: testutil.FakeMPSControl(t)})
	require.NoError(t, err)
	pipe := filepath.Join(ctxmgr.MPSPipeDir(swap), mps.ControlPipe)
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

func TestDaemonMPSMissingProgram(t *testing.T) {
	dir := t.TempDir()
	_, err := ctxmgr.StartDaemon(context.Background(), ctxmgr.DaemonConfig{
		ControlSocket: filepath.Join(dir, "c.sock"), SwapSocket: filepath.Join(dir, "s.sock"),
		Swap: ctxmgr.Options{GPUMemory: 1 << 30}, MPS: true, MPSControl: filepath.Join(dir, "no-such-mps-control")})
	require.Error(t, err)
	require.Contains(t, err.Error(), "MPS")
	require.Contains(t, err.Error(), "no-such-mps-control")
}
