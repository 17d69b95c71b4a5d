package trainer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/allreduce"
	"github.com/migctl/migctl/comm"
	"github.com/migctl/migctl/internal/cuda"
)

// world runs body on n in-process ranks (host backend, 20 s deadline,
// opts(rank) on top) and returns their errors joined.
func world(t *testing.T, n int, opts func(rank int) []Option, body func(g *Group) error) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	return runLocal(ctx, n, func(r int) []Option {
		o := []Option{WithTimeout(20 * time.Second)}
		if opts != nil {
			o = append(o, opts(r)...)
		}
		return o
	}, body)
}

func requireAll(t *testing.T, err error) {
	t.Helper()
	require.NoError(t, err)
}

// input is rank r's exactly representable element i: distinct for every
// rank and position.
func input(r, i int) float32 { return float32((r+1)*1000 + i%997) }

// deviceAllReduce all-reduces send in place in a device buffer of g (Alloc,
// Write, AllReduce, Read, Free) and returns the result.
func deviceAllReduce(ctx context.Context, g *Group, send []float32, op Op) ([]float32, error) {
	dev, err := g.Alloc(len(send), Float32)
	if err != nil {
		return nil, err
	}
	if err := g.Write(ctx, dev, HostSlice(send).Host()); err != nil {
		return nil, err
	}
	if err := g.AllReduce(ctx, dev, dev, op); err != nil {
		return nil, err
	}
	got := make([]float32, len(send))
	if err := g.Read(ctx, HostSlice(got).Host(), dev); err != nil {
		return nil, err
	}
	return got, g.Free(dev)
}

func TestSingleRankWithoutLauncher(t *testing.T) {
	ctx := context.Background()
	g, err := Init(ctx, WithBackend(BackendHost), WithShmRoot(t.TempDir()))
	require.NoError(t, err)
	defer g.Close()
	require.Equal(t, 0, g.Rank())
	require.Equal(t, 1, g.Size())
	require.Equal(t, BackendHost, g.Backend())
	send := []float32{1, 2, 3}
	recv := make([]float32, 3)
	require.NoError(t, g.AllReduce(ctx, HostSlice(send), HostSlice(recv), Sum))
	require.Equal(t, send, recv)
	require.NoError(t, g.Barrier(ctx))
}

func TestCollectivesHost(t *testing.T) {
	for _, n := range []int{2, 3, 7} {
		t.Run(fmt.Sprintf("%d ranks", n), func(t *testing.T) {
			const count = 1003 // odd: not a multiple of anything
			errs := world(t, n, nil, func(g *Group) error {
				ctx := context.Background()
				r := g.Rank()
				send := make([]float32, count)
				for i := range send {
					send[i] = input(r, i)
				}
				for _, op := range []Op{Sum, Avg, Min, Max} {
					recv := make([]float32, count)
					if err := g.AllReduce(ctx, HostSlice(send), HostSlice(recv), op); err != nil {
						return err
					}
					for i, got := range recv {
						var want float64
						switch op {
						case Sum, Avg:
							for q := range n {
								want += float64(input(q, i))
							}
							if op == Avg {
								want /= float64(n)
							}
						case Min:
							want = float64(input(0, i))
						case Max:
							want = float64(input(n-1, i))
						}
						if math.Abs(float64(got)-want) > 1e-3*math.Abs(want) {
							return fmt.Errorf("allreduce %v: element %d = %v, want %v", op, i, got, want)
						}
					}
				}
				// In place, int64.
				v := []int64{int64(r), int64(10 * r)}
				if err := g.AllReduce(ctx, HostSlice(v), HostSlice(v), Sum); err != nil {
					return err
				}
				if want := int64(n * (n - 1) / 2); v[0] != want || v[1] != 10*want {
					return fmt.Errorf("in-place int64 sum = %v, want %d, %d", v, want, 10*want)
				}
				// All-gather: block q holds rank q's input.
				gath := make([]float32, n*count)
				if err := g.AllGather(ctx, HostSlice(send), HostSlice(gath)); err != nil {
					return err
				}
				for q := range n {
					for i := range count {
						if gath[q*count+i] != input(q, i) {
							return fmt.Errorf("allgather block %d element %d = %v, want %v", q, i, gath[q*count+i], input(q, i))
						}
					}
				}
				// Reduce-scatter of the gathered vectors (the same on every rank): block r times n.
				blk := make([]float32, count)
				if err := g.ReduceScatter(ctx, HostSlice(gath), HostSlice(blk), Sum); err != nil {
					return err
				}
				for i := range count {
					if want := float32(n) * input(r, i); blk[i] != want {
						return fmt.Errorf("reducescatter element %d = %v, want %v", i, blk[i], want)
					}
				}
				// Broadcast from the last rank, in place.
				b := make([]float32, count)
				copy(b, send)
				if err := g.Broadcast(ctx, HostSlice(b), HostSlice(b), n-1); err != nil {
					return err
				}
				for i := range count {
					if b[i] != input(n-1, i) {
						return fmt.Errorf("broadcast element %d = %v, want %v", i, b[i], input(n-1, i))
					}
				}
				return g.Barrier(ctx)
			})
			requireAll(t, errs)
		})
	}
}

func TestHostBytesHalfAndMisaligned(t *testing.T) {
	const n = 3
	errs := world(t, n, nil, func(g *Group) error {
		ctx := context.Background()
		// bfloat16 1.0 is 0x3f80; three ranks sum to 3.0 = 0x4040.
		raw := make([]byte, 2*5+1)
		b := raw[1:] // misaligned on purpose: staged through scratch
		for i := 0; i < len(b); i += 2 {
			b[i], b[i+1] = 0x80, 0x3f
		}
		if err := g.AllReduce(ctx, HostBytes(b, BFloat16), HostBytes(b, BFloat16), Sum); err != nil {
			return err
		}
		for i := 0; i < len(b); i += 2 {
			if b[i] != 0x40 || b[i+1] != 0x40 {
				return fmt.Errorf("bf16 element %d = %#x%02x, want 0x4040", i/2, b[i+1], b[i])
			}
		}
		return nil
	})
	requireAll(t, errs)
}

func TestAsyncKeepsOrder(t *testing.T) {
	const n, calls = 3, 20
	errs := world(t, n, nil, func(g *Group) error {
		ctx := context.Background()
		bufs := make([][]int32, calls)
		works := make([]*Work, calls)
		for k := range calls {
			bufs[k] = []int32{int32(k * (g.Rank() + 1))}
			works[k] = g.AllReduceAsync(ctx, HostSlice(bufs[k]), HostSlice(bufs[k]), Sum)
		}
		for k, w := range works {
			if err := w.Wait(ctx); err != nil {
				return err
			}
			if want := int32(k * n * (n + 1) / 2); bufs[k][0] != want {
				return fmt.Errorf("call %d = %d, want %d", k, bufs[k][0], want)
			}
		}
		return nil
	})
	requireAll(t, errs)
}

// TestMismatchedCallsFailEveryRank: a rank that all-reduces more elements
// than its peers makes every rank's call fail at once with comm.ErrMismatch
// (not a wrong result, not the deadline), and the group stays failed.
func TestMismatchedCallsFailEveryRank(t *testing.T) {
	const n = 3
	start := time.Now()
	var failed atomic.Int32
	err := world(t, n, nil, func(g *Group) error {
		ctx := context.Background()
		buf := make([]float32, 1000+g.Rank()/2*24) // rank 2 has 24 more
		err := g.AllReduce(ctx, HostSlice(buf), HostSlice(buf), Sum)
		if !errors.Is(err, comm.ErrMismatch) {
			return fmt.Errorf("rank %d: %v, want a mismatch", g.Rank(), err)
		}
		failed.Add(1)
		if err := g.Barrier(ctx); !errors.Is(err, comm.ErrMismatch) {
			return fmt.Errorf("rank %d, the next call: %v, want the mismatch again", g.Rank(), err)
		}
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, int32(n), failed.Load())
	require.Less(t, time.Since(start), 10*time.Second, "found at once, not at the 20-s deadline")
}

func TestBadOperands(t *testing.T) {
	ctx := context.Background()
	g, err := Init(ctx, WithBackend(BackendHost), WithShmRoot(t.TempDir()))
	require.NoError(t, err)
	defer g.Close()
	f := make([]float32, 4)
	tests := []struct {
		desc string
		run  func() error
		want error
	}{
		{"dtype mismatch", func() error { return g.AllReduce(ctx, HostSlice(f), HostSlice(make([]int32, 4)), Sum) }, comm.ErrInvalid},
		{"receive too short", func() error { return g.AllReduce(ctx, HostSlice(f), HostSlice(f[:2]), Sum) }, comm.ErrInvalid},
		{"odd bytes", func() error {
			return g.AllReduce(ctx, HostBytes(make([]byte, 7), Float32), HostBytes(make([]byte, 7), Float32), Sum)
		}, comm.ErrInvalid},
		{"unknown op", func() error { return g.AllReduce(ctx, HostSlice(f), HostSlice(f), Op(9)) }, comm.ErrInvalid},
		{"root out of range", func() error { return g.Broadcast(ctx, HostSlice(f), HostSlice(f), 1) }, comm.ErrInvalid},
		{"device buffer on the host backend", func() error {
			return g.AllReduce(ctx, DeviceBuffer(0x1000, 4, Float32, 0), DeviceBuffer(0x1000, 4, Float32, 0), Sum)
		}, ErrUnsupported},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			require.ErrorIs(t, tc.run(), tc.want)
		})
	}
	require.NoError(t, g.Close())
	require.ErrorIs(t, g.Barrier(ctx), ErrClosed)
}

func TestMissingRendezvous(t *testing.T) {
	t.Setenv(EnvWorldSize, "4")
	t.Setenv(EnvRank, "1")
	_, err := Init(context.Background(), WithBackend(BackendHost))
	require.ErrorIs(t, err, comm.ErrInvalid)
	require.ErrorContains(t, err, "migctl run")
}

func TestFromEnv(t *testing.T) {
	env := map[string]string{
		EnvRank: "5", EnvWorldSize: "7", EnvLocalRank: "1", EnvLocalWorldSize: "3", EnvGroupRank: "1", EnvGroupWorldSize: "2",
		EnvRestartCount: "2", EnvRendezvous: "unix:///x.sock", EnvToken: "s3", EnvJob: "j", EnvBackend: "host",
		EnvDevice: "0", EnvTimeout: "90s", EnvReduceOn: "split:0.25", EnvTuning: "chunk=4MiB, slots=16,workers=2",
	}
	var c config
	require.NoError(t, fromEnv(&c, func(k string) string { return env[k] }))
	require.Equal(t, 5, c.rank)
	require.Equal(t, 7, c.size)
	require.Equal(t, 1, c.localRank)
	require.Equal(t, 3, c.localSize)
	require.Equal(t, 1, c.nodeRank)
	require.Equal(t, 2, c.numNodes)
	require.Equal(t, 2, c.generation)
	require.Equal(t, "unix:///x.sock", c.addr)
	require.Equal(t, "s3", c.token)
	require.Equal(t, BackendHost, c.backend)
	require.Equal(t, 90*time.Second, c.timeout)
	require.Equal(t, "split:0.25", c.settings[allreduce.SettingReduceOn])
	require.Equal(t, Tuning{Chunk: 4 << 20, Slots: 16, ReduceWorkers: 2}, c.tuning)
	err := fromEnv(&c, func(k string) string { return map[string]string{EnvReduceOn: "fpga"}[k] })
	require.ErrorContains(t, err, `MIGCTL_REDUCE_ON="fpga"`)

	// The launcher's machine figures (MachineEnv) arrive as the settings the
	// algorithm choice reads.
	m := allreduce.H200()
	m.HostMemGiBs, m.LinkGiBs, m.DuplexGiBs = 147, 51.3, 94.4 // six digits: what Settings keeps
	k, v, _ := strings.Cut(MachineEnv(m), "=")
	require.Equal(t, EnvMachine, k)
	require.NoError(t, fromEnv(&c, func(x string) string { return map[string]string{EnvMachine: v}[x] }))
	got, err := allreduce.MachineFromSettings(allreduce.Machine{}, c.settings)
	require.NoError(t, err)
	require.Equal(t, m, got)

	bad := []map[string]string{
		{EnvMachine: "allreduce.host_mem_gibs=lots"},
		{EnvMachine: "allreduce.link_gibs=-3"},
		{EnvMachine: "gpu.speed=9"},
		{EnvMachine: "allreduce.link_gibs"},
		{EnvRank: "7", EnvWorldSize: "7"},
		{EnvRank: "-1"},
		{EnvWorldSize: "zero"},
		{EnvBackend: "tpu"},
		{EnvTimeout: "soon"},
		{EnvTimeout: "-1s"},
		{EnvTuning: "chunk=big"},
	}
	for _, b := range bad {
		require.ErrorIs(t, fromEnv(&c, func(k string) string { return b[k] }), comm.ErrInvalid, "%v", b)
	}
}

// MIGCTL_REDUCE_STAGE: unset the schedules that ask (the ring), 1 all, 0 none.
func TestParseReduceStage(t *testing.T) {
	for v, want := range map[string]comm.StageMode{"": comm.StageAsked, "1": comm.StageAll, "0": comm.StageNone} {
		got, err := parseReduceStage(v)
		require.NoError(t, err)
		require.Equal(t, want, got, "%q", v)
	}
	_, err := parseReduceStage("yes")
	require.ErrorIs(t, err, comm.ErrInvalid)
	require.ErrorContains(t, err, EnvReduceStage)
}

// MIGCTL_TUNING: every key, and what is refused.
func TestParseTuning(t *testing.T) {
	got, err := ParseTuning("chunk=2MiB,small=16KiB,slots=8,depth=4,workers=3,spin=300us,smallon=device")
	require.NoError(t, err)
	require.Equal(t, Tuning{Chunk: 2 << 20, SmallBytes: 16 << 10, Slots: 8, Depth: 4, ReduceWorkers: 3,
		Spin: 300 * time.Microsecond, SmallOnDevice: true}, got)
	for s, want := range map[string]Tuning{
		"smallon=cpu": {}, "bcast=device": {}, "chain=on": {}, "piece=auto": {}, "complete=cpu": {}, " ": {},
		"bcast=cpu": {BroadcastOnCPU: true}, "chain=off": {NoChain: true}, "piece=chunk": {WholeChunks: true},
		"complete=device": {CompleteOnDevice: true}, "complete=queued": {CompleteOnDevice: true, QueueCopiesBack: true},
	} {
		got, err := ParseTuning(s)
		require.NoError(t, err, s)
		require.Equal(t, want, got, s)
	}
	for _, bad := range []string{"chunk", "chunk=", "chunk=2GiB", "slots=0", "workers=-1", "depth=x",
		"spin=0s", "spin=fast", "color=red", "chunk=1MiB,,slots=2", "smallon=gpu", "bcast=gpu", "chain=yes", "piece=1MiB", "complete=gpu", "chunk=100", "chunk=1"} {
		_, err := ParseTuning(bad)
		require.ErrorIs(t, err, comm.ErrInvalid, bad)
	}
	// a chunk the executor would refuse at every all-reduce is refused when the group is made
	require.ErrorIs(t, WithTuning(Tuning{Chunk: 100})(&config{}), comm.ErrInvalid)
	require.NoError(t, WithTuning(Tuning{Chunk: 64 << 10})(&config{}))
}

func TestDeadlineNamesTimeout(t *testing.T) {
	const n = 2
	start := time.Now()
	errs := world(t, n, func(int) []Option { return []Option{WithTimeout(500 * time.Millisecond)} }, func(g *Group) error {
		ctx := context.Background()
		if g.Rank() == 1 {
			// Stay in the group (heartbeat alive) but never call: rank 0 must time out.
			time.Sleep(1500 * time.Millisecond)
			return nil
		}
		return g.Barrier(ctx)
	})
	require.ErrorIs(t, errs, ErrTimeout)
	require.ErrorContains(t, errs, "on rank 0")
	require.Less(t, time.Since(start), 15*time.Second)
}

// TestSetTimeout: a deadline set after Init (what migctl_torch does with
// init_process_group's timeout) governs the collectives issued afterwards,
// over the 20-s one the group was made with; a non-positive one is refused.
func TestSetTimeout(t *testing.T) {
	const n = 2
	start := time.Now()
	errs := world(t, n, nil, func(g *Group) error {
		ctx := context.Background()
		if err := g.SetTimeout(0); !errors.Is(err, comm.ErrInvalid) {
			return fmt.Errorf("SetTimeout(0): %v, want ErrInvalid", err)
		}
		if err := g.SetTimeout(400 * time.Millisecond); err != nil {
			return err
		}
		if got := g.Timeout(); got != 400*time.Millisecond {
			return fmt.Errorf("Timeout() = %v after SetTimeout(400ms)", got)
		}
		if g.Rank() == 1 {
			time.Sleep(1500 * time.Millisecond) // in the group, never calling
			return nil
		}
		return g.Barrier(ctx)
	})
	require.ErrorIs(t, errs, ErrTimeout)
	require.ErrorContains(t, errs, "400ms")
	require.Less(t, time.Since(start), 10*time.Second, "the new deadline, not the group's 20 s")
}

func TestHoldPausesDeadline(t *testing.T) {
	const n = 2
	errs := world(t, n, func(int) []Option { return []Option{WithTimeout(300 * time.Millisecond)} }, func(g *Group) error {
		ctx := context.Background()
		var outs, ins atomic.Int32
		g.OnSwapOut(func() { outs.Add(1) })
		g.OnSwapIn(func() { ins.Add(1) })
		release := func() { time.Sleep(1200 * time.Millisecond); g.hold.in() }
		if g.Rank() == 0 {
			// Held before it issues anything: the barrier waits for the swap-in.
			g.hold.out()
			go release()
			if err := g.Barrier(ctx); err != nil {
				return err
			}
		} else {
			// Already waiting in the barrier when the gang swap arrives; it
			// waits four deadlines for rank 0 and must not time out.
			w := g.BarrierAsync(ctx)
			time.Sleep(50 * time.Millisecond)
			g.hold.out()
			go release()
			if err := w.Wait(ctx); err != nil {
				return err
			}
		}
		// Rank 1 is still held here: its next barrier waits for the swap-in.
		if err := g.Barrier(ctx); err != nil {
			return err
		}
		if outs.Load() != 1 || ins.Load() != 1 || g.Held() {
			return fmt.Errorf("hooks ran %d out, %d in, held %v; want 1, 1, false", outs.Load(), ins.Load(), g.Held())
		}
		return nil
	})
	requireAll(t, errs)
}

func TestGPUBackendOnFakeDriver(t *testing.T) {
	const n, count = 3, 300
	errs := world(t, n, func(int) []Option {
		f := cuda.NewFake()
		comm.InstallFakeCUDAKernels(f)
		return []Option{withCUDA(f), WithBackend(BackendGPU)}
	}, func(g *Group) error {
		ctx := context.Background()
		if g.Backend() != BackendGPU {
			return fmt.Errorf("backend %s, want gpu", g.Backend())
		}
		r := g.Rank()
		// Host slices are staged through device scratch.
		send := make([]float32, count)
		for i := range send {
			send[i] = input(r, i)
		}
		recv := make([]float32, count)
		if err := g.AllReduce(ctx, HostSlice(send), HostSlice(recv), Max); err != nil {
			return err
		}
		for i := range recv {
			if recv[i] != input(n-1, i) {
				return fmt.Errorf("staged max element %d = %v, want %v", i, recv[i], input(n-1, i))
			}
		}
		// In place, staged: reduce-scatter leaves block r at its place.
		whole := make([]float32, n*count)
		for i := range whole {
			whole[i] = input(r, i)
		}
		if err := g.ReduceScatter(ctx, HostSlice(whole), HostSlice(whole), Sum); err != nil {
			return err
		}
		for i := range count {
			var want float32
			for q := range n {
				want += input(q, r*count+i)
			}
			if got := whole[r*count+i]; got != want {
				return fmt.Errorf("staged in-place reducescatter element %d = %v, want %v", i, got, want)
			}
		}
		// All-gather out of place and in place, and a broadcast out of
		// place: each rank's own data is copied on the device.
		gath := make([]float32, n*count)
		if err := g.AllGather(ctx, HostSlice(send), HostSlice(gath)); err != nil {
			return err
		}
		mine := make([]float32, n*count)
		for i := range mine {
			mine[i] = -1
		}
		copy(mine[r*count:], send)
		if err := g.AllGather(ctx, HostSlice(mine), HostSlice(mine)); err != nil {
			return err
		}
		for q := range n {
			for i := range count {
				if gath[q*count+i] != input(q, i) || mine[q*count+i] != input(q, i) {
					return fmt.Errorf("allgather block %d element %d = %v (in place %v), want %v",
						q, i, gath[q*count+i], mine[q*count+i], input(q, i))
				}
			}
		}
		got := make([]float32, count)
		if err := g.Broadcast(ctx, HostSlice(send), HostSlice(got), 1); err != nil {
			return err
		}
		for i := range got {
			if got[i] != input(1, i) {
				return fmt.Errorf("broadcast element %d = %v, want %v", i, got[i], input(1, i))
			}
		}
		// Device buffers: allocated on the group's device, and a raw
		// pointer to the same memory with the legacy default stream.
		dev, err := g.Alloc(count, Float32)
		if err != nil {
			return err
		}
		if !dev.OnDevice() {
			return errors.New("Alloc on the gpu backend returned host memory")
		}
		if err := g.Write(ctx, dev, HostSlice(send).Host()); err != nil {
			return err
		}
		raw := DeviceBuffer(uintptr(dev.own.(*comm.CUDABuffer).Ptr()), count, Float32, 0)
		if err := g.AllReduce(ctx, raw, raw, Sum); err != nil {
			return err
		}
		if err := g.Read(ctx, HostSlice(recv).Host(), dev); err != nil {
			return err
		}
		for i := range recv {
			var want float32
			for q := range n {
				want += input(q, i)
			}
			if recv[i] != want {
				return fmt.Errorf("device sum element %d = %v, want %v", i, recv[i], want)
			}
		}
		return g.Free(dev)
	})
	requireAll(t, errs)
}

// Ranks on two hosts fail at Init, every one of them, at once.
func TestGroupAcrossHostsFailsAtInit(t *testing.T) {
	start := time.Now()
	err := world(t, 3, func(r int) []Option { return []Option{withHost(fmt.Sprintf("node%d", r%2))} }, func(*Group) error {
		return errors.New("Init succeeded across hosts")
	})
	require.ErrorIs(t, err, ErrMultiNode)
	require.NotContains(t, err.Error(), "Init succeeded")
	require.ErrorContains(t, err, "2 hosts")
	require.Less(t, time.Since(start), 10*time.Second)
}

// WithTuning(SmallOnDevice): on the gpu backend (fake driver, whose streams
// wait for and write the flag words) small all-reduces reduce on the
// devices and say so; on the host backend the CPU carries the flags. Both
// give the exact sums, call after call.
func TestSmallOnDevice(t *testing.T) {
	const n, count = 3, 300
	for _, backend := range []Backend{BackendGPU, BackendHost} {
		errs := world(t, n, func(int) []Option {
			opts := []Option{WithBackend(backend), WithTuning(Tuning{SmallOnDevice: true})}
			if backend == BackendGPU {
				f := cuda.NewFake()
				comm.InstallFakeCUDAKernels(f)
				opts = append(opts, withCUDA(f))
			}
			return opts
		}, func(g *Group) error {
			want := map[Backend]string{BackendGPU: "device", BackendHost: "device, flags by the CPU"}[backend]
			if got := g.SmallOn(); got != want {
				return fmt.Errorf("%s backend: small all-reduces on %q, want %q", backend, got, want)
			}
			for call := range 4 {
				send := make([]float32, count)
				for i := range send {
					send[i] = input(g.Rank(), i+call)
				}
				recv := make([]float32, count)
				if err := g.AllReduce(context.Background(), HostSlice(send), HostSlice(recv), Sum); err != nil {
					return err
				}
				for i := range recv {
					var s float32
					for q := range n {
						s += input(q, i+call)
					}
					if recv[i] != s {
						return fmt.Errorf("%s backend, call %d: element %d = %v, want %v", backend, call, i, recv[i], s)
					}
				}
			}
			return nil
		})
		requireAll(t, errs)
	}
	// Ranks that disagree fail at the rendezvous: the two ways' float
	// results may differ in the last bit.
	errs := world(t, 2, func(r int) []Option { return []Option{WithTuning(Tuning{SmallOnDevice: r == 1})} },
		func(*Group) error { return nil })
	require.ErrorContains(t, errs, "trainer.smallon")
}

// A stream-ordered small all-reduce on the devices (DeviceBufferOrdered,
// what libmigctl passes): with every rank's fake driver held, nothing can
// run, yet the call returns — it is only queued — and the caller's stream,
// ordered after it, reads the sums once the drivers run.
func TestStreamOrderedAllReduce(t *testing.T) {
	const n, count = 3, 300
	errs := onFakeDrivers(t, n, Tuning{SmallOnDevice: true}, func(g *Group, f *cuda.Fake) error {
		ctx := context.Background()
		d, err := g.Alloc(count, Float32)
		if err != nil {
			return err
		}
		in := make([]float32, count)
		for i := range in {
			in[i] = input(g.Rank(), i)
		}
		if err := g.Write(ctx, d, HostSlice(in).Host()); err != nil {
			return err
		}
		user, err := f.StreamCreate(cuda.StreamNonBlocking)
		if err != nil {
			return err
		}
		ptr := d.own.(*comm.CUDABuffer).Ptr()
		buf := DeviceBufferOrdered(uintptr(ptr), count, Float32, uintptr(user), nil)
		f.Hold()
		if err := g.AllReduce(ctx, buf, buf, Sum); err != nil {
			f.Release()
			return err
		}
		out := make([]float32, count)
		if err := f.MemcpyDtoHAsync(unsafe.Pointer(&out[0]), ptr, 4*count, user); err != nil {
			f.Release()
			return err
		}
		time.Sleep(10 * time.Millisecond)
		if out[0] != 0 {
			f.Release()
			return errors.New("the caller's copy ran while the driver was held")
		}
		f.Release()
		if err := f.StreamSynchronize(user); err != nil {
			return err
		}
		for i := range out {
			var want float32
			for q := range n {
				want += input(q, i)
			}
			if out[i] != want {
				return fmt.Errorf("rank %d element %d = %v, want %v", g.Rank(), i, out[i], want)
			}
		}
		return nil
	})
	requireAll(t, errs)
}

// A synchronous broadcast of one chunk on DeviceBufferOrdered buffers (the C
// ABI's migctl_run: torch's broadcasts, DDP's buffers) is queued whole on
// the devices by default: with every rank's fake driver held — the data's
// producer, a copy on the caller's stream, not yet run — the root and its
// peers all return from two broadcasts in a row, and their streams, ordered
// after them, read the root's data once the drivers run (the root's copy out
// waited for its producer on the device). With Tuning.BroadcastOnCPU the
// same calls wait for the producer and the end, and are right too.
func TestStreamOrderedBroadcast(t *testing.T) {
	for _, onCPU := range []bool{false, true} {
		t.Run(fmt.Sprintf("onCPU=%v", onCPU), func(t *testing.T) {
			const n, count = 3, 300
			errs := onFakeDrivers(t, n, Tuning{BroadcastOnCPU: onCPU}, func(g *Group, f *cuda.Fake) error {
				ctx := context.Background()
				user, err := f.StreamCreate(cuda.StreamNonBlocking)
				if err != nil {
					return err
				}
				var ptrs [2]cuda.DevicePtr
				var ins [2][]float32
				for i := range ptrs {
					d, err := g.Alloc(count, Float32)
					if err != nil {
						return err
					}
					ptrs[i] = d.own.(*comm.CUDABuffer).Ptr()
					ins[i] = make([]float32, count)
					for j := range ins[i] {
						ins[i][j] = float32(1000*(g.Rank()+1) + 10*j + i)
					}
				}
				if !onCPU {
					f.Hold()
				}
				var bufs [2]Buffer
				for i := range bufs {
					// The producer: a copy on the caller's stream, then its mark.
					if err := f.MemcpyHtoDAsync(ptrs[i], unsafe.Pointer(&ins[i][0]), 4*count, user); err != nil {
						f.Release()
						return err
					}
					mark, err := g.dev.(comm.ExternalDevice).RecordStream(uintptr(user))
					if err != nil {
						f.Release()
						return err
					}
					bufs[i] = DeviceBufferOrdered(uintptr(ptrs[i]), count, Float32, uintptr(user), mark)
				}
				for i := range bufs {
					if err := g.Broadcast(ctx, bufs[i], bufs[i], 0); err != nil {
						f.Release()
						return err
					}
				}
				var out [2][]float32
				for i := range out {
					out[i] = make([]float32, count)
					if err := f.MemcpyDtoHAsync(unsafe.Pointer(&out[i][0]), ptrs[i], 4*count, user); err != nil {
						f.Release()
						return err
					}
				}
				if !onCPU {
					time.Sleep(10 * time.Millisecond)
					if out[0][0] != 0 || out[1][0] != 0 {
						f.Release()
						return errors.New("the caller's copy ran while the driver was held")
					}
					f.Release()
				}
				if err := f.StreamSynchronize(user); err != nil {
					return err
				}
				for i := range out {
					for j, v := range out[i] {
						if want := float32(1000 + 10*j + i); v != want {
							return fmt.Errorf("rank %d broadcast %d element %d = %v, want %v", g.Rank(), i, j, v, want)
						}
					}
				}
				// Then a collective on the CPU: settles the queued broadcasts.
				if v, err := allReduceOf(g, 1); err != nil || v != n {
					return fmt.Errorf("all-reduce after the broadcasts: %v, %w", v, err)
				}
				return nil
			})
			requireAll(t, errs)
		})
	}
}

// TestQueuedBroadcastBytes: what a group says it queues (the C ABI's
// migctl_queued_broadcast_bytes) is what Broadcast does: one arena chunk on
// the gpu backend by default, nothing with Tuning.BroadcastOnCPU or on the
// host backend.
func TestQueuedBroadcastBytes(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tuning Tuning
		queues bool
	}{
		{"default", Tuning{Chunk: 1 << 20}, true},
		{"bcast=cpu", Tuning{Chunk: 1 << 20, BroadcastOnCPU: true}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := onFakeDrivers(t, 2, tc.tuning, func(g *Group, f *cuda.Fake) error {
				want := 0
				if tc.queues {
					want = 1 << 20
				}
				if got := g.QueuedBroadcastBytes(); got != want {
					return fmt.Errorf("rank %d: QueuedBroadcastBytes %d, want %d", g.Rank(), got, want)
				}
				return nil
			})
			requireAll(t, errs)
		})
	}
	errs := world(t, 2, nil, func(g *Group) error {
		if got := g.QueuedBroadcastBytes(); got != 0 {
			return fmt.Errorf("host backend: QueuedBroadcastBytes %d, want 0", got)
		}
		return nil
	})
	requireAll(t, errs)
}

// laterEvent is a mark that is not a device event (a stream cannot wait for
// it): done once ready is closed.
type laterEvent struct{ ready chan struct{} }

func (e laterEvent) Done() (bool, error) {
	select {
	case <-e.ready:
		return true, nil
	default:
		return false, nil
	}
}

func (e laterEvent) Wait(ctx context.Context) error {
	select {
	case <-e.ready:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestStreamOrderedBroadcastMarks: a queued broadcast whose caller's mark is
// the idle stream's (comm.Idle, what RecordStream gives for a stream with
// nothing queued) or an event no stream can wait for runs and broadcasts the
// root's data: the first needs no wait, the second is waited for on the CPU
// before the call is published. Either used to fail the stream's wait after
// the signature went out, which aborted the job on every rank.
func TestStreamOrderedBroadcastMarks(t *testing.T) {
	for _, mark := range []string{"idle", "foreign"} {
		t.Run(mark, func(t *testing.T) {
			const n, count = 3, 256
			errs := onFakeDrivers(t, n, Tuning{}, func(g *Group, f *cuda.Fake) error {
				ctx := context.Background()
				user, err := f.StreamCreate(cuda.StreamNonBlocking)
				if err != nil {
					return err
				}
				d, err := g.Alloc(count, Float32)
				if err != nil {
					return err
				}
				ptr := d.own.(*comm.CUDABuffer).Ptr()
				in := make([]float32, count)
				for j := range in {
					in[j] = float32(1000*(g.Rank()+1) + j)
				}
				var ev comm.Event
				switch mark {
				case "idle":
					if err := f.MemcpyHtoDAsync(ptr, unsafe.Pointer(&in[0]), 4*count, user); err != nil {
						return err
					}
					if err := f.StreamSynchronize(user); err != nil {
						return err
					}
					if ev, err = g.dev.(comm.ExternalDevice).RecordStream(uintptr(user)); err != nil {
						return err
					}
					if !comm.Idle(ev) {
						return fmt.Errorf("the mark of an idle stream is %T, want an idle one", ev)
					}
				case "foreign":
					// The producer finishes 20 ms after the call: the broadcast must
					// wait for it (on the CPU) and still carry the root's data.
					ready := make(chan struct{})
					ev = laterEvent{ready}
					go func() {
						runtime.LockOSThread()
						defer runtime.UnlockOSThread()
						time.Sleep(20 * time.Millisecond)
						cctx, err := f.DevicePrimaryCtxRetain(0)
						if err == nil {
							err = f.CtxSetCurrent(cctx)
						}
						if err == nil {
							err = f.MemcpyHtoD(ptr, unsafe.Pointer(&in[0]), 4*count)
						}
						if err != nil {
							t.Errorf("the producer: %v", err)
							return
						}
						close(ready)
					}()
				}
				b := DeviceBufferOrdered(uintptr(ptr), count, Float32, uintptr(user), ev)
				if err := g.Broadcast(ctx, b, b, 0); err != nil {
					return err
				}
				out := make([]float32, count)
				if err := f.MemcpyDtoHAsync(unsafe.Pointer(&out[0]), ptr, 4*count, user); err != nil {
					return err
				}
				if err := f.StreamSynchronize(user); err != nil {
					return err
				}
				for j, v := range out {
					if want := float32(1000 + j); v != want {
						return fmt.Errorf("rank %d element %d = %v, want %v", g.Rank(), j, v, want)
					}
				}
				if v, err := allReduceOf(g, 1); err != nil || v != n {
					return fmt.Errorf("all-reduce after the broadcast: %v, %w", v, err)
				}
				return nil
			})
			requireAll(t, errs)
		})
	}
}

// onFakeDrivers runs body on n ranks of the gpu backend, each on a fake
// driver of its own (with the fake kernels) and with tuning, on a thread
// locked to the driver's primary context.
func onFakeDrivers(t *testing.T, n int, tuning Tuning, body func(g *Group, f *cuda.Fake) error) error {
	fakes := make([]*cuda.Fake, n)
	for r := range fakes {
		fakes[r] = cuda.NewFake()
		comm.InstallFakeCUDAKernels(fakes[r])
	}
	return world(t, n, func(r int) []Option {
		return []Option{withCUDA(fakes[r]), WithBackend(BackendGPU), WithTuning(tuning)}
	}, func(g *Group) error {
		f := fakes[g.Rank()]
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		cctx, err := f.DevicePrimaryCtxRetain(0)
		if err != nil {
			return err
		}
		if err := f.CtxSetCurrent(cctx); err != nil {
			return err
		}
		return body(g, f)
	})
}

// Ranks whose tunings cut all-reduces differently (whole chunks on one,
// pieces on the other) would stage into each other's slots at other
// offsets: they fail at the rendezvous, naming the setting.
func TestWholeChunksMustAgree(t *testing.T) {
	errs := world(t, 2, func(r int) []Option { return []Option{WithTuning(Tuning{WholeChunks: r == 1})} },
		func(*Group) error { return nil })
	require.ErrorContains(t, errs, "trainer.piece")
}
