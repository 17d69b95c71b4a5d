package allreduce

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/comm"
	"github.com/migctl/migctl/internal/cuda"
)

// TestSmallOnDeviceFakeCUDA runs small all-reduces reduced on the devices
// (each rank its own fake driver, whose streams wait for and write the
// shared flag words themselves) and requires every rank's result to equal
// the expected values and, byte for byte, the CPU path's: every dtype and
// op, odd sizes, in place or not, calls back to back (the parity areas
// alternate) and mixed with large host-staged ones. With more than 9 ranks
// the device adds in two kernel launches (at most 8 sources each), so
// half-precision results may round differently from the CPU's single
// rounding there: only the expected values are required.
func TestSmallOnDeviceFakeCUDA(t *testing.T) {
	rng := rand.New(rand.NewPCG(41, 42))
	for _, world := range []int{1, 2, 3, 7, 10} {
		opts := Options{Chunk: 16 << 10, Slots: 3, SmallBytes: 4 << 10}
		cpu := newCUDAGroup(t, world, opts)
		opts.SmallOnDevice = true
		dev := newCUDAGroup(t, world, opts)
		for r := range world {
			require.NotNil(t, dev.comms[r].exec.words, "the fake driver's streams wait for the flags themselves")
			require.Nil(t, cpu.comms[r].exec.words)
		}
		for _, dt := range allDTypes {
			for _, op := range allOps {
				for call := range 3 {
					limit := min(4<<10, SmallCapacity(world, 16<<10, 3)) / dt.Size()
					count := 1 + rng.IntN(limit)
					if call == 1 && dt == comm.Float32 {
						count = 3000 // past SmallBytes: a host-staged call between two small ones
					}
					inPlace := rng.IntN(2) == 0
					name := fmt.Sprintf("n%d/dt%d/op%d/call%d/count%d/inplace=%v", world, dt, op, call, count, inPlace)
					want := Expected(AllReduce, dt, op, world, 0, 0, count)
					gotCPU := cpu.allReduce(t, dt, op, count, inPlace)
					gotDev := dev.allReduce(t, dt, op, count, inPlace)
					for r := range world {
						require.Zero(t, Wrong(gotDev[r], want, dt), "%s rank %d", name, r)
						if world <= 9 || dt != comm.Float16 && dt != comm.BFloat16 {
							require.Equal(t, gotCPU[r], gotDev[r], "%s rank %d: differs from the CPU path", name, r)
						}
						require.Equal(t, gotDev[0], gotDev[r], "%s rank %d: differs from rank 0", name, r)
					}
				}
			}
		}
	}
}

// TestSmallOnDeviceHostBackend: on the host backend, whose streams cannot
// wait for flags, the same schedule runs with the CPU waiting and writing
// the flags and the host stream reducing: every collective still right.
func TestSmallOnDeviceHostBackend(t *testing.T) {
	for _, world := range []int{1, 2, 5} {
		g := newGroup(t, world, HostStaged, Options{Chunk: 16 << 10, Slots: 2, SmallBytes: 2 << 10, SmallOnDevice: true})
		for r := range world {
			require.Nil(t, g.comms[r].exec.words, "host streams are not comm.WordStreams")
		}
		for _, dt := range allDTypes {
			for _, op := range allOps {
				for _, count := range []int{1, 129, 2048 / dt.Size(), 5000} {
					g.check(t, AllReduce, dt, op, count, count%2 == 1, 0)
				}
			}
		}
		// Every small schedule ran on the devices but the byte averages.
		small := 0
		for p := range g.comms[0].cache {
			if p.Algorithm == HostStagedSmall {
				small++
				require.Equal(t, !(p.ElemSize == 1 && p.Avg), p.SmallOnDevice, "%+v", p)
			}
		}
		require.Positive(t, small)
	}
}

// TestSmallOnDeviceFailures: the device waits for the peers' flags, so the
// CPU's wait for the device must notice what a flag wait would: a rank that
// never comes (the deadline) and a rank that aborts. Either way every
// waiting rank fails, releases the device waits on the flags it awaited
// (largest value: the streams drain instead of hanging), and is broken.
func TestSmallOnDeviceFailures(t *testing.T) {
	for _, tc := range []struct {
		name  string
		late  func(g *cudaGroup)
		cause error
	}{
		{"deadline", func(*cudaGroup) {}, context.DeadlineExceeded},
		{"abort", func(g *cudaGroup) { g.comms[2].exec.tr.Abort() }, comm.ErrAborted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, bufs := smallDeviceGroup(t)
			timeout := 30 * time.Second
			if tc.cause == context.DeadlineExceeded {
				timeout = 300 * time.Millisecond
			}
			errs := make([]error, 2)
			var wg sync.WaitGroup
			start := time.Now()
			for r := range 2 { // rank 2 never calls
				wg.Add(1)
				go func() {
					defer wg.Done()
					ctx, cancel := context.WithTimeout(context.Background(), timeout)
					defer cancel()
					errs[r] = g.comms[r].AllReduce(ctx, bufs[r], bufs[r], 256, comm.Float32, comm.Sum)
				}()
			}
			time.Sleep(50 * time.Millisecond)
			tc.late(g)
			wg.Wait()
			require.Less(t, time.Since(start), 10*time.Second)
			for r := range 2 {
				require.Error(t, errs[r], "rank %d", r)
				require.True(t, errors.Is(errs[r], tc.cause) || errors.Is(errs[r], comm.ErrAborted), "rank %d: %v", r, errs[r])
			}
			require.GreaterOrEqual(t, g.comms[0].exec.tr.Flag(FlagOf(2, roleA)), uint64(1<<62), "the awaited flag is released")
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			for r := range 2 {
				require.NoError(t, g.comms[r].exec.streams[LaneIn].Synchronize(ctx), "rank %d: its stream drained", r)
				require.Error(t, g.comms[r].AllReduce(ctx, bufs[r], bufs[r], 256, comm.Float32, comm.Sum), "rank %d is broken", r)
			}
		})
	}
}

// TestSmallOnDeviceSameBitsEverywhere: on inputs whose sums round (random
// float32), every rank's result on the devices is the same bits: rank 0's
// input plus every other rank's in rank order, one by one, as the kernels
// (and the fake drivers, which follow them) add.
func TestSmallOnDeviceSameBitsEverywhere(t *testing.T) {
	const world, count = 7, 1000
	g := newCUDAGroup(t, world, Options{Chunk: 16 << 10, Slots: 3, SmallOnDevice: true})
	rng := rand.New(rand.NewPCG(9, 10))
	inputs := make([][]float32, world)
	bufs := make([]comm.Buffer, world)
	for r := range world {
		inputs[r] = make([]float32, count)
		for i := range inputs[r] {
			inputs[r][i] = float32(rng.NormFloat64() * math.Pow(10, float64(rng.IntN(8)-4)))
		}
		var err error
		bufs[r], err = g.devs[r].Alloc(4 * count)
		require.NoError(t, err)
		mem, err := g.fakes[r].Memory(bufs[r].(*comm.CUDABuffer).Ptr(), 4*count)
		require.NoError(t, err)
		copy(mem, unsafe.Slice((*byte)(unsafe.Pointer(&inputs[r][0])), 4*count))
	}
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := range world {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			errs[r] = g.comms[r].AllReduce(ctx, bufs[r], bufs[r], count, comm.Float32, comm.Sum)
		}()
	}
	wg.Wait()
	differ := 0
	for i := range count {
		want := inputs[0][i]
		pairs := (inputs[0][i] + inputs[1][i]) + (inputs[2][i] + inputs[3][i])
		for r := 1; r < world; r++ {
			want += inputs[r][i]
		}
		pairs = (pairs + inputs[4][i]) + (inputs[5][i] + inputs[6][i])
		if pairs != want {
			differ++
		}
		for r := range world {
			require.NoError(t, errs[r])
			mem, err := g.fakes[r].Memory(bufs[r].(*comm.CUDABuffer).Ptr()+cuda.DevicePtr(4*i), 4)
			require.NoError(t, err)
			require.Equal(t, math.Float32bits(want), binary.LittleEndian.Uint32(mem), "rank %d element %d", r, i)
		}
	}
	require.Positive(t, differ, "the inputs must be ones where the association matters")
}

// TestSmallOnDeviceOrdered: a stream-ordered small all-reduce on the devices
// returns once queued — with every fake driver held, nothing has run yet —
// and its event completes with the result in place once the drivers run;
// calls back to back queue up to maxPending and settle in order (the
// end-of-call flag follows), and a host-staged call settles what is left.
func TestSmallOnDeviceOrdered(t *testing.T) {
	const world, count = 3, 500
	g := newCUDAGroup(t, world, Options{Chunk: 16 << 10, Slots: 3, SmallOnDevice: true})
	bufs := make([]comm.Buffer, world)
	big := make([]comm.Buffer, world)
	fill := func(r, call int) {
		mem, err := g.fakes[r].Memory(bufs[r].(*comm.CUDABuffer).Ptr(), 4*count)
		require.NoError(t, err)
		for i := range count {
			binary.LittleEndian.PutUint32(mem[4*i:], math.Float32bits(float32((r+1)*1000+i+call)))
		}
	}
	check := func(r, call int) {
		mem, err := g.fakes[r].Memory(bufs[r].(*comm.CUDABuffer).Ptr(), 4*count)
		require.NoError(t, err)
		for i := range count {
			want := float32(0)
			for q := range world {
				want += float32((q+1)*1000 + i + call)
			}
			require.Equal(t, want, math.Float32frombits(binary.LittleEndian.Uint32(mem[4*i:])), "rank %d call %d element %d", r, call, i)
		}
	}
	for r := range world {
		var err error
		bufs[r], err = g.devs[r].Alloc(4 * count)
		require.NoError(t, err)
		big[r], err = g.devs[r].Alloc(64 << 10)
		require.NoError(t, err)
		require.NoError(t, g.fakes[r].MemsetD8(big[r].(*comm.CUDABuffer).Ptr(), 0, 64<<10))
		fill(r, 0)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	onAll := func(f func(r int) error) { onAllRanks(t, world, f) }

	// Held drivers: every rank returns with an unfinished event.
	for _, f := range g.fakes {
		f.Hold()
	}
	evs := make([]comm.Event, world)
	onAll(func(r int) (err error) {
		evs[r], err = g.comms[r].AllReduceOrdered(ctx, bufs[r], bufs[r], count, comm.Float32, comm.Sum)
		return err
	})
	for r := range world {
		require.NotNil(t, evs[r], "rank %d: queued, not run", r)
		done, err := evs[r].Done()
		require.NoError(t, err)
		require.False(t, done, "rank %d: nothing runs while the drivers are held", r)
	}
	for _, f := range g.fakes {
		f.Release()
	}
	for r := range world {
		require.NoError(t, evs[r].Wait(ctx))
		check(r, 0)
	}

	// Back to back, twice maxPending: each call's input is the previous
	// call's result plus nothing else, so wait for each before refilling.
	for call := 1; call <= 2*maxPending; call++ {
		onAll(func(r int) error {
			if err := evs[r].Wait(ctx); err != nil {
				return err
			}
			fill(r, call)
			var err error
			evs[r], err = g.comms[r].AllReduceOrdered(ctx, bufs[r], bufs[r], count, comm.Float32, comm.Sum)
			return err
		})
		for r := range world {
			g.comms[r].exec.ord.mu.Lock()
			n := len(g.comms[r].exec.ord.pending)
			g.comms[r].exec.ord.mu.Unlock()
			require.LessOrEqual(t, n, maxPending)
		}
	}
	for r := range world {
		require.NoError(t, evs[r].Wait(ctx))
		check(r, 2*maxPending)
	}
	// A host-staged call settles every outstanding one first.
	onAll(func(r int) error {
		return g.comms[r].AllReduce(ctx, big[r], big[r], 16<<10, comm.Float32, comm.Sum)
	})
	for r := range world {
		require.Empty(t, g.comms[r].exec.ord.pending)
		require.Equal(t, epochOf(g.comms[r].exec.calls)|1, g.comms[r].exec.tr.Flag(FlagOf(r, RoleFin)), "rank %d: end-of-call flag", r)
	}
}

// TestSmallOnDeviceOrderedWatchdog: stream-ordered calls that cannot
// finish (rank 2 never comes) are found by the watchdog within their
// deadline, which raises the abort flag and releases the device waits: the
// queued work drains, and the next call fails.
func TestSmallOnDeviceOrderedWatchdog(t *testing.T) {
	g, bufs := smallDeviceGroup(t)
	start := time.Now()
	evs := make([]comm.Event, 2)
	for r := range 2 {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		var err error
		evs[r], err = g.comms[r].AllReduceOrdered(ctx, bufs[r], bufs[r], 256, comm.Float32, comm.Sum)
		cancel()
		require.NoError(t, err)
		require.NotNil(t, evs[r])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for r := range 2 {
		require.NoError(t, evs[r].Wait(ctx), "rank %d: released", r)
	}
	require.Less(t, time.Since(start), 5*time.Second)
	require.Error(t, g.comms[0].exec.tr.Aborted())
	for r := range 2 {
		_, err := g.comms[r].AllReduceOrdered(ctx, bufs[r], bufs[r], 256, comm.Float32, comm.Sum)
		require.ErrorIs(t, err, comm.ErrAborted, "rank %d", r)
	}
}

// smallDeviceGroup is 3 ranks on fake drivers with small all-reduces on the
// devices, and a 1-KiB device buffer each.
func smallDeviceGroup(t *testing.T) (*cudaGroup, []comm.Buffer) {
	g := newCUDAGroup(t, 3, Options{Chunk: 16 << 10, Slots: 3, SmallOnDevice: true})
	bufs := make([]comm.Buffer, 3)
	for r := range 3 {
		var err error
		bufs[r], err = g.devs[r].Alloc(1024)
		require.NoError(t, err)
	}
	return g, bufs
}

// TestBroadcastOrdered: one-chunk broadcasts through BroadcastOrdered on
// fake drivers whose streams wait for and write the flags. With the drivers
// held every rank returns at once with an unfinished event, the root's
// first call after a fenced one included (DDP's pair of buffer broadcasts:
// the root never waits); released, every rank holds the root's data. Calls
// that need the fence (a third broadcast, one after an all-reduce) wait for
// it and are queued after it; ranks may mix ordered and plain calls; a
// broadcast of more than a chunk runs to the end (nil event).
func TestBroadcastOrdered(t *testing.T) {
	const world, count = 3, 300
	g := newCUDAGroup(t, world, Options{Chunk: 16 << 10, Slots: 2, BroadcastOnDevice: true})
	bufs := make([][2]comm.Buffer, world)
	big := make([]comm.Buffer, world)
	mem := func(r int, b comm.Buffer, n int) []byte {
		m, err := g.fakes[r].Memory(b.(*comm.CUDABuffer).Ptr(), uint64(n))
		require.NoError(t, err)
		return m
	}
	fill := func(call int) {
		for r := range world {
			for i := range 2 {
				m := mem(r, bufs[r][i], 4*count)
				for j := range m {
					m[j] = byte(r + 1) // wrong everywhere but on the root
					if r == call%world {
						m[j] = byte(j*3 + i + call)
					}
				}
			}
		}
	}
	check := func(call int) {
		root := call % world
		for r := range world {
			for i := range 2 {
				require.Equal(t, mem(root, bufs[root][i], 4*count), mem(r, bufs[r][i], 4*count), "call %d rank %d buffer %d", call, r, i)
			}
		}
	}
	for r := range world {
		require.NotNil(t, g.comms[r].exec.words)
		for i := range 2 {
			var err error
			bufs[r][i], err = g.devs[r].Alloc(4 * count)
			require.NoError(t, err)
		}
		var err error
		big[r], err = g.devs[r].Alloc(64 << 10)
		require.NoError(t, err)
		require.NoError(t, g.fakes[r].MemsetD8(big[r].(*comm.CUDABuffer).Ptr(), 0, 64<<10))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	onAll := func(f func(r int) error) { onAllRanks(t, world, f) }
	for call := range 4 {
		fill(call)
		root := call % world
		// Even calls: held drivers, a pair of broadcasts queued everywhere
		// returns at once. Odd calls: rank 1 runs its pair on the CPU.
		held := call%2 == 0
		if held {
			for _, f := range g.fakes {
				f.Hold()
			}
		}
		evs := make([][2]comm.Event, world)
		onAll(func(r int) error {
			for i := range 2 {
				var err error
				if r == 1 && !held {
					err = g.comms[r].Broadcast(ctx, bufs[r][i], bufs[r][i], count, comm.Float32, root)
				} else {
					evs[r][i], err = g.comms[r].BroadcastOrdered(ctx, bufs[r][i], bufs[r][i], count, comm.Float32, root)
				}
				if err != nil {
					return err
				}
			}
			return nil
		})
		for r := range world {
			for i := range 2 {
				if r == 1 && !held {
					continue
				}
				require.NotNil(t, evs[r][i], "call %d rank %d broadcast %d: queued, not run", call, r, i)
				if held {
					done, err := evs[r][i].Done()
					require.NoError(t, err)
					require.False(t, done, "call %d rank %d: nothing runs while the drivers are held", call, r)
				}
			}
		}
		if held {
			for _, f := range g.fakes {
				f.Release()
			}
		}
		for r := range world {
			for i := range 2 {
				if evs[r][i] != nil {
					require.NoError(t, evs[r][i].Wait(ctx))
				}
			}
		}
		check(call)
		// A third broadcast needs the fence: each rank settles its pair
		// first (the fence waits for its own end-of-call flag too).
		onAll(func(r int) error {
			ev, err := g.comms[r].BroadcastOrdered(ctx, bufs[r][0], bufs[r][0], count, comm.Float32, root)
			if err == nil && ev != nil {
				err = ev.Wait(ctx)
			}
			return err
		})
		check(call)
		// A host-staged all-reduce: settles the broadcasts, fences the next.
		onAll(func(r int) error {
			return g.comms[r].AllReduce(ctx, big[r], big[r], 16<<10, comm.Float32, comm.Sum)
		})
		for r := range world {
			require.Empty(t, g.comms[r].exec.ord.pending)
			require.Equal(t, make([]byte, 64<<10), mem(r, big[r], 64<<10), "rank %d: the all-reduce of zeros", r)
		}
	}
	// More than a chunk: run to the end.
	onAll(func(r int) error {
		ev, err := g.comms[r].BroadcastOrdered(ctx, big[r], big[r], 4<<10+1, comm.Float32, 0)
		if err == nil && ev != nil {
			err = fmt.Errorf("a broadcast of more than a chunk returned an event")
		}
		return err
	})
}

// onAllRanks runs f for every rank concurrently and requires no error.
func onAllRanks(t *testing.T, world int, f func(r int) error) {
	t.Helper()
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := range world {
		wg.Add(1)
		go func() { defer wg.Done(); errs[r] = f(r) }()
	}
	wg.Wait()
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
}

// TestBroadcastOrderedWatchdog: broadcasts queued on the devices whose root
// never comes (rank 0) are found by the watchdog within their deadline,
// which raises the abort flag and releases the peers' device waits: their
// queued work drains, and the next call fails.
func TestBroadcastOrderedWatchdog(t *testing.T) {
	g := newCUDAGroup(t, 3, Options{Chunk: 16 << 10, Slots: 3, BroadcastOnDevice: true})
	start := time.Now()
	evs := make([]comm.Event, 3)
	bufs := make([]comm.Buffer, 3)
	for r := 1; r < 3; r++ {
		var err error
		bufs[r], err = g.devs[r].Alloc(1024)
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		evs[r], err = g.comms[r].BroadcastOrdered(ctx, bufs[r], bufs[r], 256, comm.Float32, 0)
		cancel()
		require.NoError(t, err)
		require.NotNil(t, evs[r], "rank %d: queued", r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for r := 1; r < 3; r++ {
		require.NoError(t, evs[r].Wait(ctx), "rank %d: released", r)
	}
	require.Less(t, time.Since(start), 5*time.Second)
	for r := 1; r < 3; r++ {
		_, err := g.comms[r].BroadcastOrdered(ctx, bufs[r], bufs[r], 256, comm.Float32, 0)
		require.ErrorIs(t, err, comm.ErrAborted, "rank %d", r)
	}
}
