package comm_test

// GPU tests of the CUDA Device: they skip where libcuda.so.1 cannot be
// loaded or no device is visible, and run on the H200 (bin/comm.test
// -test.run CUDADeviceGPU). MIGCTL_PTX=path overrides the embedded PTX.

import (
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/allreduce/kernels"
	"github.com/migctl/migctl/comm"
	"github.com/migctl/migctl/internal/cuda"
)

func gpuDevice(t *testing.T) *comm.CUDADevice {
	t.Helper()
	return gpuDeviceWith(t, comm.CUDAConfig{})
}

// gpuDeviceWith is gpuDevice with cfg (its PTX is the embedded or
// MIGCTL_PTX's).
func gpuDeviceWith(t *testing.T, cfg comm.CUDAConfig) *comm.CUDADevice {
	t.Helper()
	api, err := cuda.Open()
	if err != nil {
		t.Skipf("no CUDA driver: %v", err)
	}
	if err := api.Init(0); err != nil {
		t.Skipf("CUDA driver does not initialise: %v", err)
	}
	if n, err := api.DeviceGetCount(); err != nil || n == 0 {
		t.Skipf("no CUDA device (%d, %v)", n, err)
	}
	ptx := kernels.PTX
	if p := os.Getenv("MIGCTL_PTX"); p != "" {
		ptx, err = os.ReadFile(p)
		require.NoError(t, err)
	}
	start := time.Now()
	cfg.PTX = ptx
	d, err := comm.NewCUDADevice(api, cfg)
	require.NoError(t, err)
	t.Logf("device opened (module JIT included) in %v", time.Since(start))
	t.Cleanup(func() { require.NoError(t, d.Close()) })
	return d
}

func TestCUDADeviceGPUReduce(t *testing.T) {
	d := gpuDevice(t)
	runReduceCases(t, d, reduceMatrix([]int{1, 37, 4099, 1<<20 + 3}, []int{1, 7, 8, 11}), time.Minute)
}

// TestCUDADeviceGPUStagedReduce: staged, sources of 256 KiB and more reach
// the kernel through the copy engines and a device buffer; the same
// results (StageAll through ReduceFromHost, by default through
// ReduceFromHostStaged).
func TestCUDADeviceGPUStagedReduce(t *testing.T) {
	cases := reduceMatrix([]int{37, 1<<18 + 3, 1<<20 + 3}, []int{1, 7, 8, 11})
	t.Run("all", func(t *testing.T) {
		runReduceCases(t, gpuDeviceWith(t, comm.CUDAConfig{StageReduce: comm.StageAll}), cases, time.Minute)
	})
	t.Run("asked", func(t *testing.T) {
		runReduceCasesVia(t, gpuDeviceWith(t, comm.CUDAConfig{}), cases, time.Minute, true)
	})
}

func TestCUDADeviceGPUTopology(t *testing.T) {
	d := gpuDevice(t)
	topo := d.Topology()
	t.Logf("topology: %+v", topo)
	require.True(t, strings.HasPrefix(topo.UUID, "GPU-") || strings.HasPrefix(topo.UUID, "MIG-"), topo.UUID)
	require.Equal(t, topo.MIG, strings.HasPrefix(topo.UUID, "MIG-"))
	require.NotEmpty(t, topo.PCIBusID)
	require.Positive(t, topo.SMs)
	require.Positive(t, topo.TotalMem)
}

func TestCUDADeviceGPUStreamOrdering(t *testing.T) {
	d := gpuDevice(t)
	const n = 64 << 20
	arena := mmapArena(t, 2*n)
	require.NoError(t, d.Register(arena))
	defer func() { require.NoError(t, d.Unregister(arena)) }()
	in, out := arena[:n], arena[n:]
	for i := 0; i < n/4; i++ {
		put(comm.Float32, in, i, 2*float64(i%1000))
	}
	buf, err := d.Alloc(n)
	require.NoError(t, err)
	a, err := d.NewStream()
	require.NoError(t, err)
	b, err := d.NewStream()
	require.NoError(t, err)
	require.NoError(t, a.CopyFromHost(buf, 0, in))
	require.NoError(t, a.Scale(buf, 0, n, comm.Float32, 2))
	ev, err := a.Record()
	require.NoError(t, err)
	require.NoError(t, b.(comm.EventStream).WaitEvent(ev))
	require.NoError(t, b.CopyToHost(out, buf, 0))
	require.NoError(t, b.Synchronize(syncCtx(t)))
	done, err := ev.Done()
	require.NoError(t, err)
	require.True(t, done)
	wrong := 0
	for i := 0; i < n/4; i++ {
		if get(comm.Float32, out, i) != float64(i%1000) {
			wrong++
		}
	}
	require.Zero(t, wrong)
	require.NoError(t, a.Close())
	require.NoError(t, b.Close())
	require.NoError(t, d.Free(buf))
}

// TestCUDADeviceGPUIPC shares a buffer and an event with a child process
// (this test binary again) through CUDA IPC.
func TestCUDADeviceGPUIPC(t *testing.T) {
	d := gpuDevice(t)
	if d.Topology().MIG {
		t.Skip("CUDA IPC does not work on a MIG instance")
	}
	const n = 1 << 20 // int32 elements
	arena := mmapArena(t, 4*n)
	require.NoError(t, d.Register(arena))
	defer func() { require.NoError(t, d.Unregister(arena)) }()
	for i := 0; i < n; i++ {
		putInt(comm.Int32, arena, i, int64(i))
	}
	buf, err := d.Alloc(4 * n)
	require.NoError(t, err)
	st, err := d.NewStream()
	require.NoError(t, err)
	require.NoError(t, st.CopyFromHost(buf, 0, arena))
	ev, err := d.NewSharedEvent()
	require.NoError(t, err)
	require.NoError(t, st.(comm.EventStream).RecordEvent(ev))
	require.NoError(t, st.Synchronize(syncCtx(t)))
	mh, err := d.ExportBuffer(buf)
	require.NoError(t, err)
	eh, err := d.ExportEvent(ev)
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestCUDADeviceGPUIPCChild$", "-test.v")
	cmd.Env = append(os.Environ(), "MIGCTL_IPC_MEM="+hex.EncodeToString(mh), "MIGCTL_IPC_EVENT="+hex.EncodeToString(eh))
	out, err := cmd.CombinedOutput()
	t.Logf("child:\n%s", out)
	require.NoError(t, err)
	require.Contains(t, string(out), "--- PASS: TestCUDADeviceGPUIPCChild")
	// The child added 1000*i into our buffer through its mapping.
	require.NoError(t, st.CopyToHost(arena, buf, 0))
	require.NoError(t, st.Synchronize(syncCtx(t)))
	wrong := 0
	for i := 0; i < n; i++ {
		if getInt(comm.Int32, arena, i) != int64(1001*i) {
			wrong++
		}
	}
	require.Zero(t, wrong)
}

func TestCUDADeviceGPUIPCChild(t *testing.T) {
	mh, eh := os.Getenv("MIGCTL_IPC_MEM"), os.Getenv("MIGCTL_IPC_EVENT")
	if mh == "" {
		t.Skip("run by TestCUDADeviceGPUIPC")
	}
	d := gpuDevice(t)
	memHandle, err := hex.DecodeString(mh)
	require.NoError(t, err)
	evHandle, err := hex.DecodeString(eh)
	require.NoError(t, err)
	peer, err := d.OpenPeerBuffer(memHandle)
	require.NoError(t, err)
	peerEv, err := d.OpenPeerEvent(evHandle)
	require.NoError(t, err)
	n := peer.Len() / 4
	arena := mmapArena(t, peer.Len())
	require.NoError(t, d.Register(arena))
	for i := 0; i < n; i++ {
		putInt(comm.Int32, arena, i, int64(1000*i))
	}
	local, err := d.Alloc(peer.Len())
	require.NoError(t, err)
	st, err := d.NewStream()
	require.NoError(t, err)
	require.NoError(t, st.(comm.EventStream).WaitEvent(peerEv))
	require.NoError(t, st.CopyFromHost(local, 0, arena))
	// peer += local, on the device, through the IPC mapping.
	require.NoError(t, st.(comm.BufferReducer).ReduceBuffers(peer, 0, []comm.BufferSpan{{Buf: local}}, peer.Len(), comm.Int32, comm.Sum))
	require.NoError(t, st.CopyToHost(arena, peer, 0))
	require.NoError(t, st.Synchronize(syncCtx(t)))
	for i := 0; i < n; i++ {
		require.Equal(t, int64(1001*i), getInt(comm.Int32, arena, i), "element %d", i)
	}
	require.NoError(t, d.ClosePeerBuffer(peer))
}

// TestCUDADeviceGPUBandwidth measures what the collectives are built from:
// copies on registered memory, the mapped-host reduce kernel, and the cost of
// a small reduce + synchronize. Figures are logged; the floor only catches a
// path that fell off the fast track (e.g. pageable staging).
func TestCUDADeviceGPUBandwidth(t *testing.T) {
	d := gpuDevice(t)
	const n = 256 << 20
	arena := mmapArena(t, 2*n)
	require.NoError(t, d.Register(arena))
	defer func() { require.NoError(t, d.Unregister(arena)) }()
	for i := 0; i < len(arena); i += 4096 {
		arena[i] = 1
	}
	buf, err := d.Alloc(n)
	require.NoError(t, err)
	a, err := d.NewStream()
	require.NoError(t, err)
	b, err := d.NewStream()
	require.NoError(t, err)
	ctx := syncCtx(t)
	timeit := func(name string, bytes float64, queue func() error) float64 {
		best := 0.0
		for rep := 0; rep < 3; rep++ {
			start := time.Now()
			require.NoError(t, queue())
			require.NoError(t, a.Synchronize(ctx))
			require.NoError(t, b.Synchronize(ctx))
			gbs := bytes / time.Since(start).Seconds() / 1e9
			best = max(best, gbs)
		}
		t.Logf("%-44s %7.1f GB/s", name, best)
		return best
	}
	h2d := timeit("H2D 256 MiB (registered)", n, func() error { return a.CopyFromHost(buf, 0, arena[:n]) })
	d2h := timeit("D2H 256 MiB (registered)", n, func() error { return a.CopyToHost(arena[n:], buf, 0) })
	both := timeit("H2D + D2H 128 MiB each, two streams (total)", n, func() error {
		if err := a.CopyFromHost(buf, 0, arena[:n/2]); err != nil {
			return err
		}
		return b.CopyToHost(arena[n:n+n/2], buf, n/2)
	})
	for _, k := range []int{1, 2, 7} {
		per := (n / k) &^ 4095
		srcs := make([][]byte, k)
		for j := range srcs {
			srcs[j] = arena[j*per : (j+1)*per]
		}
		gbs := timeit(fmt.Sprintf("reduce f32 from mapped host, k=%d (host bytes read)", k), float64(per*k), func() error {
			return a.ReduceFromHost(buf, 0, srcs, comm.Float32, comm.Sum)
		})
		require.Greater(t, gbs, 1.0)
	}
	require.Greater(t, h2d, 1.0)
	require.Greater(t, d2h, 1.0)
	require.Greater(t, both, 1.0)

	// Latency of a small step: 8 KiB reduce of 7 mapped sources + sync.
	small := make([][]byte, 7)
	for j := range small {
		small[j] = arena[j*8192 : (j+1)*8192]
	}
	const reps = 2000
	start := time.Now()
	for i := 0; i < reps; i++ {
		require.NoError(t, a.ReduceFromHost(buf, 0, small, comm.Float32, comm.Sum))
		require.NoError(t, a.Synchronize(ctx))
	}
	t.Logf("8 KiB reduce of 7 mapped sources + Synchronize: %v each", time.Since(start)/reps)
	start = time.Now()
	for i := 0; i < reps; i++ {
		require.NoError(t, a.CopyToHost(arena[n:n+8192], buf, 0))
		ev, err := a.Record()
		require.NoError(t, err)
		require.NoError(t, ev.Wait(ctx))
	}
	t.Logf("8 KiB D2H + Record + Event.Wait: %v each", time.Since(start)/reps)
	allocs := testing.AllocsPerRun(100, func() {
		_ = a.ReduceFromHost(buf, 0, small, comm.Float32, comm.Sum)
	})
	require.NoError(t, a.Synchronize(ctx))
	require.Zero(t, allocs, "queueing a reduce allocates")
}

// TestCUDADeviceGPUGridSweep measures the mapped-host reduce kernel (k=7,
// 256 MiB read) at several grid caps, to choose CUDAConfig.MaxBlocks.
func TestCUDADeviceGPUGridSweep(t *testing.T) {
	base := gpuDevice(t)
	sms := base.Topology().SMs
	api, err := cuda.Open()
	require.NoError(t, err)
	ptx := kernels.PTX
	if p := os.Getenv("MIGCTL_PTX"); p != "" {
		ptx, err = os.ReadFile(p)
		require.NoError(t, err)
	}
	const n = 256 << 20
	arena := mmapArena(t, n)
	for i := 0; i < len(arena); i += 4096 {
		arena[i] = 1
	}
	for _, perSM := range []int{1, 2, 4, 8, 16, 32} {
		d, err := comm.NewCUDADevice(api, comm.CUDAConfig{PTX: ptx, MaxBlocks: perSM * sms})
		require.NoError(t, err)
		require.NoError(t, d.Register(arena))
		buf, err := d.Alloc(n / 7)
		require.NoError(t, err)
		st, err := d.NewStream()
		require.NoError(t, err)
		per := (n / 7) &^ 4095
		srcs := make([][]byte, 7)
		for j := range srcs {
			srcs[j] = arena[j*per : (j+1)*per]
		}
		best := 0.0
		for rep := 0; rep < 3; rep++ {
			start := time.Now()
			require.NoError(t, st.ReduceFromHost(buf, 0, srcs, comm.Float32, comm.Sum))
			require.NoError(t, st.Synchronize(syncCtx(t)))
			best = max(best, float64(7*per)/time.Since(start).Seconds()/1e9)
		}
		t.Logf("reduce f32 k=7 from mapped host, %2d blocks/SM x 256 threads: %5.1f GB/s", perSM, best)
		require.Greater(t, best, 1.0)
		require.NoError(t, d.Close())
	}
}
