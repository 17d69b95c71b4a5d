package trainer

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/comm"
	ctxmgr "github.com/migctl/migctl/context"
	"github.com/migctl/migctl/context/fakeshim"
	"github.com/migctl/migctl/internal/cuda"
)

// startDaemon runs a node daemon with declared memory on private sockets.
func startDaemon(t *testing.T) *ctxmgr.Daemon {
	t.Helper()
	dir, err := os.MkdirTemp("", "migctl-trainer-d-") // short: socket paths are bounded
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	d, err := ctxmgr.StartDaemon(context.Background(), ctxmgr.DaemonConfig{
		ControlSocket: filepath.Join(dir, "control.sock"),
		SwapSocket:    filepath.Join(dir, "swap.sock"),
		Swap:          ctxmgr.Options{GPUMemory: 80 << 30, RebalanceEvery: -1},
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	return d
}

func swapJob(t *testing.T, d *ctxmgr.Daemon, dir ctxmgr.Direction, job string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := ctxmgr.Dial(ctx, d.ControlSocket())
	require.NoError(t, err)
	defer c.Close()
	res, err := c.Swap(ctx, dir, ctxmgr.Target{Job: job}, nil)
	require.NoError(t, err)
	require.NotEmpty(t, res)
	for _, r := range res {
		require.True(t, r.OK, "swap of pid %d: %s", r.PID, r.Error)
	}
}

func eventually(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		require.True(t, time.Now().Before(deadline), "timed out waiting until %s", what)
		time.Sleep(10 * time.Millisecond)
	}
}

// A host-backend rank registers with the daemon itself; swapping its job
// out holds its collectives (they wait, past their deadline) until the job
// is swapped back in.
func TestHostRankIsSwappedAsPartOfItsJob(t *testing.T) {
	d := startDaemon(t)
	t.Setenv(EnvSwapSocket, d.SwapSocket())
	t.Setenv(EnvSwapJob, "gang")
	ctx := context.Background()
	g, err := Init(ctx, WithBackend(BackendHost), WithShmRoot(t.TempDir()), WithTimeout(200*time.Millisecond))
	require.NoError(t, err)
	defer g.Close()
	require.NotNil(t, g.swap, "the rank did not register with the daemon")

	swapJob(t, d, ctxmgr.SwapOut, "gang")
	require.True(t, g.Held())
	x := []float32{2}
	w := g.AllReduceAsync(ctx, HostSlice(x), HostSlice(x), Sum)
	time.Sleep(600 * time.Millisecond) // three deadlines
	select {
	case <-w.Done():
		t.Fatalf("a collective ran while the job was swapped out (err %v)", w.Err())
	default:
	}
	swapJob(t, d, ctxmgr.SwapIn, "gang")
	require.NoError(t, w.Wait(ctx))
	require.Equal(t, []float32{2}, x)
	require.False(t, g.Held())
}

// A gpu-backend rank (its memory handled by the shim) follows its job's
// swaps through the daemon's event stream.
func TestGPURankFollowsItsJobsSwaps(t *testing.T) {
	d := startDaemon(t)
	ctx := context.Background()
	shim, err := fakeshim.Dial(ctx, d.SwapSocket(), fakeshim.Hello{PID: os.Getpid(), Job: "gang", Device: "0", Bytes: 1 << 20}, fakeshim.Behavior{})
	require.NoError(t, err)
	defer shim.Close()
	t.Setenv(EnvSocket, d.ControlSocket())
	t.Setenv(EnvSwapJob, "gang")
	f := cuda.NewFake()
	comm.InstallFakeCUDAKernels(f)
	g, err := Init(ctx, withCUDA(f), WithBackend(BackendGPU), WithShmRoot(t.TempDir()))
	require.NoError(t, err)
	defer g.Close()
	require.NotNil(t, g.daemon)

	var outs, ins int
	g.OnSwapOut(func() { outs++ })
	g.OnSwapIn(func() { ins++ })
	swapJob(t, d, ctxmgr.SwapOut, "gang")
	eventually(t, g.Held, "the rank is held")
	swapJob(t, d, ctxmgr.SwapIn, "gang")
	eventually(t, func() bool { return !g.Held() }, "the rank is released")
	require.NoError(t, g.Barrier(ctx))
	require.Equal(t, 1, outs)
	require.Equal(t, 1, ins)
}
