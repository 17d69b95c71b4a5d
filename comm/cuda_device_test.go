package comm_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/comm"
	"github.com/migctl/migctl/internal/cuda"
)

// newFakeCUDA returns a CUDADevice on a cuda.Fake with the CPU kernels;
// extra kernels (overrides) are installed after them.
func newFakeCUDA(t *testing.T, extra map[string]cuda.FakeKernel, devs ...cuda.FakeDevice) (*cuda.Fake, *comm.CUDADevice) {
	t.Helper()
	f := cuda.NewFake(devs...)
	comm.InstallFakeCUDAKernels(f)
	for name, k := range extra {
		f.AddKernel(name, k)
	}
	d, err := comm.NewCUDADevice(f, comm.CUDAConfig{PTX: []byte("// fake module")})
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	return f, d
}

func syncCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestCUDADeviceFakeReduce(t *testing.T) {
	_, d := newFakeCUDA(t, nil)
	runReduceCases(t, d, reduceMatrix([]int{1, 37, 1027}, []int{1, 3, 8, 11}), 10*time.Second)
}

// TestCUDADeviceFakeStagedReduce: a staged reduction copies sources of
// StageReduceBytes and more into a device buffer (grown when a larger call
// comes) and gives the same results; smaller ones are read from host memory
// as before. Which reductions stage: by default those queued through
// ReduceFromHostStaged; StageAll every one, StageNone none.
func TestCUDADeviceFakeStagedReduce(t *testing.T) {
	var cases []reduceCase
	staged := 0 // sources the staging device copies
	for _, c := range reduceMatrix([]int{37, comm.StageReduceBytes/4 + 3}, []int{1, 3, 8, 11}) {
		if c.dt == comm.Float32 || c.dt == comm.Int32 || c.n == 37 { // 4-byte elements: staged at the larger n
			cases = append(cases, c)
			if c.n*c.dt.Size() >= comm.StageReduceBytes {
				staged += c.k
			}
		}
	}
	require.Positive(t, staged)
	copies := func(mode comm.StageMode, via bool) int {
		f := cuda.NewFake()
		comm.InstallFakeCUDAKernels(f)
		d, err := comm.NewCUDADevice(f, comm.CUDAConfig{PTX: []byte("// fake module"), StageReduce: mode})
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, d.Close()) }) // after runReduceCases' own cleanups
		runReduceCasesVia(t, d, cases, 30*time.Second, via)
		return f.Calls("MemcpyHtoDAsync")
	}
	plain := copies(comm.StageNone, false) // the kernels read every source
	tests := []struct {
		name   string
		mode   comm.StageMode
		via    bool // ReduceFromHostStaged
		staged bool
	}{
		{"default, ReduceFromHost", comm.StageAsked, false, false},
		{"default, ReduceFromHostStaged", comm.StageAsked, true, true},
		{"all, ReduceFromHost", comm.StageAll, false, true},
		{"all, ReduceFromHostStaged", comm.StageAll, true, true},
		{"none, ReduceFromHostStaged", comm.StageNone, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := 0
			if tt.staged {
				want = staged
			}
			require.Equal(t, want, copies(tt.mode, tt.via)-plain, "every large source, and only those, through the copy engines")
		})
	}
}

func TestCUDADeviceFakeCopies(t *testing.T) {
	_, d := newFakeCUDA(t, nil)
	arena := mmapArena(t, 1<<16)
	require.NoError(t, d.Register(arena))
	src, out := arena[:1000], arena[4096:4096+1000]
	for i := range src {
		src[i] = byte(i * 7)
	}
	a, err := d.Alloc(2000)
	require.NoError(t, err)
	b, err := d.Alloc(2000)
	require.NoError(t, err)
	require.Equal(t, 2000, a.Len())
	st, err := d.NewStream()
	require.NoError(t, err)
	require.NoError(t, st.CopyFromHost(a, 500, src))
	require.NoError(t, st.CopyBuffer(b, 3, a, 500, 1000))
	require.NoError(t, st.CopyToHost(out, b, 3))
	require.NoError(t, st.Synchronize(syncCtx(t)))
	require.Equal(t, src, out)

	tests := []struct {
		name string
		call func() error
	}{
		{"copy from host past the end", func() error { return st.CopyFromHost(a, 1500, src) }},
		{"copy to host past the end", func() error { return st.CopyToHost(out, a, 1001) }},
		{"negative offset", func() error { return st.CopyToHost(out, a, -1) }},
		{"device copy past the end", func() error { return st.CopyBuffer(a, 0, b, 1500, 501) }},
		{"foreign buffer", func() error { return st.CopyToHost(out, fakeBuffer(10), 0) }},
		{"reduce from unregistered memory", func() error {
			return st.ReduceFromHost(a, 0, [][]byte{make([]byte, 8)}, comm.Float32, comm.Sum)
		}},
		{"reduce with sources of different lengths", func() error {
			return st.ReduceFromHost(a, 0, [][]byte{arena[:8], arena[8:12]}, comm.Float32, comm.Sum)
		}},
		{"reduce with no sources", func() error { return st.ReduceFromHost(a, 0, nil, comm.Float32, comm.Sum) }},
		{"reduce of a partial element", func() error {
			return st.ReduceFromHost(a, 0, [][]byte{arena[:6]}, comm.Float32, comm.Sum)
		}},
		{"reduce at a misaligned offset", func() error {
			return st.ReduceFromHost(a, 2, [][]byte{arena[:8]}, comm.Float32, comm.Sum)
		}},
		{"reduce a misaligned source", func() error {
			return st.ReduceFromHost(a, 0, [][]byte{arena[2:10]}, comm.Float32, comm.Sum)
		}},
		{"unknown op", func() error { return st.ReduceFromHost(a, 0, [][]byte{arena[:8]}, comm.Float32, comm.Op(9)) }},
		{"unknown dtype", func() error { return st.ReduceFromHost(a, 0, [][]byte{arena[:8]}, comm.DType(9), comm.Sum) }},
		{"scale by zero", func() error { return st.Scale(a, 0, 8, comm.Float32, 0) }},
		{"zero-byte alloc", func() error { _, err := d.Alloc(0); return err }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.ErrorIs(t, tc.call(), comm.ErrInvalid)
		})
	}
	require.NoError(t, st.Close())
	require.ErrorIs(t, st.CopyToHost(out, a, 0), comm.ErrClosed)
}

type fakeBuffer int

func (b fakeBuffer) Len() int { return int(b) }

// slowKernel wraps a kernel so it runs late: work queued behind it on the
// same stream waits, work on other streams does not.
func slowKernel(k cuda.FakeKernel, delay time.Duration) cuda.FakeKernel {
	return func(m cuda.FakeMemory, g, b cuda.Dim3, a *cuda.Args) error {
		time.Sleep(delay)
		return k(m, g, b, a)
	}
}

func TestCUDADeviceFakeEvents(t *testing.T) {
	f, d := newFakeCUDA(t, nil)
	arena := mmapArena(t, 8192)
	require.NoError(t, d.Register(arena))
	buf, err := d.Alloc(4096)
	require.NoError(t, err)
	st, err := d.NewStream()
	require.NoError(t, err)

	t.Run("an event is not done while the work before it is held", func(t *testing.T) {
		f.Hold()
		require.NoError(t, st.CopyFromHost(buf, 0, arena[:4096]))
		ev, err := st.Record()
		require.NoError(t, err)
		done, err := ev.Done()
		require.NoError(t, err)
		require.False(t, done)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		require.ErrorIs(t, ev.Wait(ctx), context.DeadlineExceeded)
		require.ErrorIs(t, st.Synchronize(ctx), context.DeadlineExceeded)
		f.Release()
		require.NoError(t, ev.Wait(syncCtx(t)))
		done, err = ev.Done()
		require.NoError(t, err)
		require.True(t, done)
	})

	t.Run("a canceled context ends Synchronize", func(t *testing.T) {
		f.Hold()
		require.NoError(t, st.CopyFromHost(buf, 0, arena[:16]))
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		require.ErrorIs(t, st.Synchronize(ctx), context.Canceled)
		f.Release()
		require.NoError(t, st.Synchronize(syncCtx(t)), "the copy still completes")
	})
}

func TestCUDADeviceFakeStreamOrdering(t *testing.T) {
	// Stream A copies and then scales slowly; stream B waits for A's event
	// before reading: it must see the scaled data.
	probe := cuda.NewFake()
	comm.InstallFakeCUDAKernels(probe)
	scale := fakeKernelOf(t, probe, "mig_scale_u8")
	_, d := newFakeCUDA(t, map[string]cuda.FakeKernel{"mig_scale_u8": slowKernel(scale, 50*time.Millisecond)})
	arena := mmapArena(t, 8192)
	require.NoError(t, d.Register(arena))
	in, out := arena[:256], arena[4096:4096+256]
	for i := range in {
		in[i] = byte(2 * (i % 100))
	}
	buf, err := d.Alloc(256)
	require.NoError(t, err)
	a, err := d.NewStream()
	require.NoError(t, err)
	b, err := d.NewStream()
	require.NoError(t, err)
	require.NoError(t, a.CopyFromHost(buf, 0, in))
	require.NoError(t, a.Scale(buf, 0, 256, comm.Uint8, 2))
	ev, err := a.Record()
	require.NoError(t, err)
	require.NoError(t, b.(comm.EventStream).WaitEvent(ev))
	require.NoError(t, b.CopyToHost(out, buf, 0))
	require.NoError(t, b.Synchronize(syncCtx(t)))
	for i := range out {
		require.Equal(t, byte(i%100), out[i], "byte %d", i)
	}
	done, err := ev.Done()
	require.NoError(t, err)
	require.True(t, done)
}

// fakeKernelOf fetches a kernel the CPU kernels registered, by launching
// nothing: it reads the registry through a module lookup on a probe Fake.
func fakeKernelOf(t *testing.T, probe *cuda.Fake, name string) cuda.FakeKernel {
	t.Helper()
	k, ok := probe.Kernel(name)
	require.True(t, ok, name)
	return k
}

func TestCUDADeviceFakeStickyKernelError(t *testing.T) {
	bad := func(cuda.FakeMemory, cuda.Dim3, cuda.Dim3, *cuda.Args) error { return cuda.ErrIllegalAddress }
	_, d := newFakeCUDA(t, map[string]cuda.FakeKernel{"mig_scale_f32": bad})
	buf, err := d.Alloc(64)
	require.NoError(t, err)
	st, err := d.NewStream()
	require.NoError(t, err)
	require.NoError(t, st.Scale(buf, 0, 64, comm.Float32, 3))
	require.ErrorIs(t, st.Synchronize(syncCtx(t)), cuda.ErrIllegalAddress)
	_, err = st.Record()
	require.ErrorIs(t, err, cuda.ErrIllegalAddress, "the error sticks, as on a GPU")
}

func TestCUDADeviceFakeRegister(t *testing.T) {
	f, d := newFakeCUDA(t, nil)
	arena := mmapArena(t, 1<<14)
	require.NoError(t, d.Register(arena[:8192]))
	require.ErrorIs(t, d.Register(arena[4096:]), cuda.ErrHostMemoryAlreadyRegistered)
	require.NoError(t, d.Register(arena[8192:]))
	require.ErrorIs(t, d.Unregister(arena[100:200]), comm.ErrInvalid)
	require.ErrorIs(t, d.Register(nil), comm.ErrInvalid)

	buf, err := d.Alloc(4096)
	require.NoError(t, err)
	st, err := d.NewStream()
	require.NoError(t, err)
	// A source spanning the two registrations is not one mapped range.
	require.ErrorIs(t, st.ReduceFromHost(buf, 0, [][]byte{arena[8000:8400]}, comm.Float32, comm.Sum), comm.ErrInvalid)
	require.NoError(t, st.ReduceFromHost(buf, 0, [][]byte{arena[8192:8592]}, comm.Float32, comm.Sum))
	require.NoError(t, st.Synchronize(syncCtx(t)))
	require.NoError(t, d.Unregister(arena[:8192]))
	require.ErrorIs(t, st.ReduceFromHost(buf, 0, [][]byte{arena[:400]}, comm.Float32, comm.Sum), comm.ErrInvalid)
	_, regs, _, _ := f.Live()
	require.Equal(t, 1, regs)
}

func TestCUDADeviceFakeLaunchBatches(t *testing.T) {
	f, d := newFakeCUDA(t, nil)
	arena := mmapArena(t, 1<<16)
	require.NoError(t, d.Register(arena))
	buf, err := d.Alloc(1024)
	require.NoError(t, err)
	st, err := d.NewStream()
	require.NoError(t, err)
	srcs := make([][]byte, 17)
	for i := range srcs {
		srcs[i] = arena[i*1024 : (i+1)*1024]
	}
	before := f.Calls("LaunchKernel")
	require.NoError(t, st.ReduceFromHost(buf, 0, srcs, comm.Int32, comm.Max))
	require.Equal(t, 3, f.Calls("LaunchKernel")-before, "17 sources = 3 launches of at most 8")
	require.NoError(t, st.Synchronize(syncCtx(t)))
}

func TestCUDADeviceFakeIPC(t *testing.T) {
	_, a := newFakeCUDA(t, nil) // two Fakes stand for two processes
	_, b := newFakeCUDA(t, nil)
	arenaA, arenaB := mmapArena(t, 8192), mmapArena(t, 8192)
	require.NoError(t, a.Register(arenaA))
	require.NoError(t, b.Register(arenaB))
	for i := 0; i < 256; i++ {
		putInt(comm.Int32, arenaA, i, int64(i))
		putInt(comm.Int32, arenaB, i, int64(1000*i))
	}
	bufA, err := a.Alloc(1024)
	require.NoError(t, err)
	stA, err := a.NewStream()
	require.NoError(t, err)
	require.NoError(t, stA.CopyFromHost(bufA, 0, arenaA[:1024]))
	shared, err := a.NewSharedEvent()
	require.NoError(t, err)
	require.NoError(t, stA.(comm.EventStream).RecordEvent(shared))
	memHandle, err := a.ExportBuffer(bufA)
	require.NoError(t, err)
	evHandle, err := a.ExportEvent(shared)
	require.NoError(t, err)

	_, err = a.OpenPeerBuffer(memHandle)
	require.ErrorIs(t, err, cuda.ErrInvalidContext, "a process cannot open its own handle")
	_, err = a.ExportEvent(mustRecord(t, stA))
	require.ErrorIs(t, err, comm.ErrInvalid, "only shared events export")

	peerBuf, err := b.OpenPeerBuffer(memHandle)
	require.NoError(t, err)
	require.Equal(t, 1024, peerBuf.Len())
	peerEv, err := b.OpenPeerEvent(evHandle)
	require.NoError(t, err)
	bufB, err := b.Alloc(1024)
	require.NoError(t, err)
	stB, err := b.NewStream()
	require.NoError(t, err)
	require.NoError(t, stB.(comm.EventStream).WaitEvent(peerEv))
	require.NoError(t, stB.CopyFromHost(bufB, 0, arenaB[:1024]))
	require.NoError(t, stB.(comm.BufferReducer).ReduceBuffers(bufB, 0, []comm.BufferSpan{{Buf: peerBuf}}, 1024, comm.Int32, comm.Sum))
	require.NoError(t, stB.CopyToHost(arenaB[4096:5120], bufB, 0))
	require.NoError(t, stB.Synchronize(syncCtx(t)))
	for i := 0; i < 256; i++ {
		require.Equal(t, int64(1001*i), getInt(comm.Int32, arenaB[4096:], i), "element %d", i)
	}
	require.NoError(t, peerEv.Wait(syncCtx(t)))
	require.ErrorIs(t, b.ClosePeerBuffer(bufB), comm.ErrInvalid, "a local buffer is not a peer's")
	require.NoError(t, b.ClosePeerBuffer(peerBuf))
	_, err = b.OpenPeerBuffer(memHandle[:10])
	require.ErrorIs(t, err, comm.ErrInvalid)
}

func mustRecord(t *testing.T, st comm.Stream) comm.Event {
	ev, err := st.Record()
	require.NoError(t, err)
	return ev
}

func TestCUDADeviceFakeTopology(t *testing.T) {
	gpu := cuda.UUID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	mig := cuda.UUID{0xaa, 2, 3}
	tests := []struct {
		name     string
		dev      cuda.FakeDevice
		visible  string
		wantMIG  bool
		wantUUID string
	}{
		{"whole GPU", cuda.FakeDevice{UUID: gpu, ParentUUID: gpu, PCIBusID: "00000000:19:00.0", SMs: 132}, "", false,
			"GPU-01020304-0506-0708-090a-0b0c0d0e0f10"},
		{"MIG instance: the v2 UUID differs", cuda.FakeDevice{UUID: mig, ParentUUID: gpu, PCIBusID: "00000000:19:00.0", SMs: 16}, "", true,
			"MIG-aa020300-0000-0000-0000-000000000000"},
		{"MIG instance named by CUDA_VISIBLE_DEVICES", cuda.FakeDevice{UUID: gpu, ParentUUID: gpu, PCIBusID: "00000000:19:00.0", SMs: 16},
			"MIG-01020304-0506-0708-090a-0b0c0d0e0f10", true, "MIG-01020304-0506-0708-090a-0b0c0d0e0f10"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("CUDA_VISIBLE_DEVICES", tc.visible)
			tc.dev.Name, tc.dev.TotalMem = "fake", 1<<30
			_, d := newFakeCUDA(t, nil, tc.dev)
			var td comm.TopologyDevice = d
			topo := td.Topology()
			require.Equal(t, tc.wantMIG, topo.MIG)
			require.Equal(t, tc.wantUUID, topo.UUID)
			require.Equal(t, "GPU-01020304-0506-0708-090a-0b0c0d0e0f10", topo.ParentUUID)
			require.Equal(t, "00000000:19:00.0", topo.PCIBusID)
			require.Equal(t, tc.dev.SMs, topo.SMs)
		})
	}
}

func TestCUDADeviceFakeOpenErrors(t *testing.T) {
	f := cuda.NewFake()
	_, err := comm.NewCUDADevice(f, comm.CUDAConfig{})
	require.ErrorIs(t, err, comm.ErrInvalid, "no PTX")
	_, err = comm.NewCUDADevice(f, comm.CUDAConfig{PTX: []byte("x")})
	require.ErrorIs(t, err, cuda.ErrNotFound, "a module without the kernels")
	_, err = comm.NewCUDADevice(f, comm.CUDAConfig{PTX: []byte("x"), Ordinal: 3})
	require.ErrorIs(t, err, cuda.ErrInvalidDevice)
}

func TestCUDADeviceFakeCloseReleasesEverything(t *testing.T) {
	f, d := newFakeCUDA(t, nil)
	arena := mmapArena(t, 8192)
	require.NoError(t, d.Register(arena))
	buf, err := d.Alloc(100)
	require.NoError(t, err)
	st, err := d.NewStream()
	require.NoError(t, err)
	_, err = st.Record()
	require.NoError(t, err)
	_, err = d.NewSharedEvent()
	require.NoError(t, err)
	_, err = d.NewStream()
	require.NoError(t, err)
	allocs, regs, streams, events := f.Live()
	require.Equal(t, []int{1, 1, 2, 2}, []int{allocs, regs, streams, events})
	require.NoError(t, d.Close())
	allocs, regs, streams, events = f.Live()
	require.Equal(t, []int{0, 0, 0, 0}, []int{allocs, regs, streams, events})
	require.NoError(t, d.Close(), "idempotent")
	_, err = d.Alloc(10)
	require.ErrorIs(t, err, comm.ErrClosed)
	require.ErrorIs(t, st.CopyToHost(arena[:10], buf, 0), comm.ErrClosed)
	require.NoError(t, st.Close())
}

func TestCUDADeviceFakeCallsFromManyGoroutines(t *testing.T) {
	// Every call must make the context current on whatever OS thread runs
	// it; the Fake fails calls on threads without it.
	_, d := newFakeCUDA(t, nil)
	arena := mmapArena(t, 1<<16)
	require.NoError(t, d.Register(arena))
	errs := make(chan error, 8)
	for g := 0; g < 8; g++ {
		go func() {
			errs <- func() error {
				st, err := d.NewStream()
				if err != nil {
					return err
				}
				defer st.Close()
				buf, err := d.Alloc(1024)
				if err != nil {
					return err
				}
				part := arena[g*4096 : g*4096+1024]
				for i := range part {
					part[i] = byte(g)
				}
				out := arena[g*4096+2048 : g*4096+3072]
				if err := st.CopyFromHost(buf, 0, part); err != nil {
					return err
				}
				if err := st.ReduceFromHost(buf, 0, [][]byte{part}, comm.Uint8, comm.Sum); err != nil {
					return err
				}
				if err := st.CopyToHost(out, buf, 0); err != nil {
					return err
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if err := st.Synchronize(ctx); err != nil {
					return err
				}
				if strings.Count(string(out), string([]byte{byte(2 * g)})) != len(out) {
					return errors.New("wrong result")
				}
				return d.Free(buf)
			}()
		}()
	}
	for g := 0; g < 8; g++ {
		require.NoError(t, <-errs)
	}
}

func TestCUDADeviceFakeRecordRecyclesEvents(t *testing.T) {
	// Events that became unreachable go back to a pool: recording in a loop
	// does not create a driver event per call.
	f, d := newFakeCUDA(t, nil)
	st, err := d.NewStream()
	require.NoError(t, err)
	const n = 200
	for i := 0; i < n; i++ {
		ev, err := st.Record()
		require.NoError(t, err)
		require.NoError(t, ev.Wait(syncCtx(t)))
		if i%10 == 9 {
			runtime.GC()
			time.Sleep(time.Millisecond) // cleanups run on their own goroutine
		}
	}
	created := f.Calls("EventCreate")
	require.Less(t, created, n/2, "%d events created for %d recordings", created, n)
	require.Positive(t, created)
}

// RecordStream of a caller's stream: Idle (no event to poll) when nothing is
// queued on it, an event that completes with the queued work otherwise; a
// context of the caller's own stays current on its thread either way.
func TestRecordStreamIdle(t *testing.T) {
	release := make(chan struct{})
	gpu := func(n byte) cuda.FakeDevice {
		return cuda.FakeDevice{UUID: cuda.UUID{n}, ParentUUID: cuda.UUID{n}, PCIBusID: fmt.Sprintf("00000000:%02x:00.0", n), SMs: 8}
	}
	f, d := newFakeCUDA(t, map[string]cuda.FakeKernel{"caller_block": func(cuda.FakeMemory, cuda.Dim3, cuda.Dim3, *cuda.Args) error {
		<-release
		return nil
	}}, gpu(1), gpu(2))
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	primary := func(ordinal int) cuda.Context {
		dev, err := f.DeviceGet(ordinal)
		require.NoError(t, err)
		c, err := f.DevicePrimaryCtxRetain(dev)
		require.NoError(t, err)
		return c
	}
	c0, mine := primary(0), primary(1) // the device's context, and one of the caller's own
	require.NoError(t, f.CtxSetCurrent(c0))
	s, err := f.StreamCreate(0)
	require.NoError(t, err)
	mod, err := f.ModuleLoadData([]byte("caller"))
	require.NoError(t, err)
	fn, err := f.ModuleGetFunction(mod, "caller_block")
	require.NoError(t, err)
	require.NoError(t, f.CtxSetCurrent(mine))

	ev, err := d.RecordStream(uintptr(s))
	require.NoError(t, err)
	require.True(t, comm.Idle(ev), "a stream with nothing queued")
	require.Equal(t, mine, f.Current(), "RecordStream changed the caller's current context")

	require.NoError(t, f.CtxSetCurrent(c0))
	require.NoError(t, f.LaunchKernel(fn, cuda.Dim3{X: 1, Y: 1, Z: 1}, cuda.Dim3{X: 1, Y: 1, Z: 1}, 0, s, &cuda.Args{}))
	require.NoError(t, f.CtxSetCurrent(mine))
	ev, err = d.RecordStream(uintptr(s))
	require.NoError(t, err)
	require.False(t, comm.Idle(ev), "a stream with a kernel queued")
	require.Equal(t, mine, f.Current(), "RecordStream changed the caller's current context")
	close(release)
	require.NoError(t, ev.Wait(syncCtx(t)))
}
