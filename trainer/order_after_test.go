package trainer

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/comm"
	"github.com/migctl/migctl/internal/cuda"
)

// Group.RecordStream marks a stream at the call and DeviceBufferAfter hands
// the mark to a collective issued later (libmigctl's dispatcher does): the
// collective waits for the work queued before the mark and not for work
// queued after it; a mark of an idle stream is complete at once.
func TestDeviceBufferAfterWaitsForTheMarkOnly(t *testing.T) {
	const n, count = 2, 129
	fakes := make([]*cuda.Fake, n)
	unblock := []chan struct{}{make(chan struct{}), make(chan struct{})}
	release := func(i int) {
		select {
		case <-unblock[i]:
		default:
			close(unblock[i])
		}
	}
	defer release(0)
	defer release(1)
	blocks := map[string]chan struct{}{}
	for i, ch := range unblock {
		blocks[fmt.Sprintf("test_block%d", i)] = ch
	}
	checked := make(chan struct{}, n)
	errs := world(t, n, blockingFakes(fakes, blocks), func(g *Group) error {
		ctx := context.Background()
		f := fakes[g.Rank()]
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		c, mod, releaseCtx, err := fakePrimaryModule(f)
		if err != nil {
			return err
		}
		defer releaseCtx()
		stream, err := f.StreamCreate(cuda.StreamNonBlocking)
		if err != nil {
			return err
		}
		block := func(i int) error {
			fn, err := f.ModuleGetFunction(mod, fmt.Sprintf("test_block%d", i))
			if err != nil {
				return err
			}
			return f.LaunchKernel(fn, cuda.Dim3{X: 1, Y: 1, Z: 1}, cuda.Dim3{X: 1, Y: 1, Z: 1}, 0, stream, &cuda.Args{})
		}
		buf, ptr, err := deviceInput(ctx, g, count)
		if err != nil {
			return err
		}
		// An idle stream: the mark is complete.
		idle, err := g.RecordStream(uintptr(stream))
		if err != nil {
			return err
		}
		if done, err := idle.Done(); err != nil || !done {
			return fmt.Errorf("mark of an idle stream: done %v, %v; want complete", done, err)
		}
		if cur, err := f.CtxGetCurrent(); err != nil || cur != c {
			return fmt.Errorf("current context after RecordStream %v (%v), want %v", cur, err, c)
		}
		// Work queued before the mark: the collective waits for it.
		if err := block(0); err != nil {
			return err
		}
		busy, err := g.RecordStream(uintptr(stream))
		if err != nil {
			return err
		}
		w := g.AllReduceAsync(ctx, DeviceBufferAfter(ptr, count, Float32, busy), DeviceBufferAfter(ptr, count, Float32, busy), Sum)
		select {
		case <-w.Done():
			return fmt.Errorf("the collective finished before the work before its mark: %v", w.Err())
		case <-time.After(200 * time.Millisecond):
		}
		if checkedAll(checked, g.Rank(), n) {
			release(0)
		}
		if err := w.Wait(ctx); err != nil {
			return err
		}
		// Work queued after the mark (blocked until the end): not waited for.
		mark, err := g.RecordStream(uintptr(stream))
		if err != nil {
			return err
		}
		if err := block(1); err != nil {
			return err
		}
		if err := g.AllReduce(ctx, DeviceBufferAfter(ptr, count, Float32, mark), DeviceBufferAfter(ptr, count, Float32, nil), Sum); err != nil {
			return fmt.Errorf("collective ordered after work queued after its mark: %w", err)
		}
		got := make([]float32, count)
		if err := g.Read(ctx, HostSlice(got).Host(), buf); err != nil {
			return err
		}
		return checkInputSums(got, n, n)
	})
	release(1)
	requireAll(t, errs)
}

func TestRecordStreamOnHostBackend(t *testing.T) {
	g, err := Init(context.Background(), WithBackend(BackendHost), WithShmRoot(t.TempDir()))
	require.NoError(t, err)
	defer g.Close()
	_, err = g.RecordStream(0)
	require.ErrorIs(t, err, ErrUnsupported)
}

// A chainable all-reduce (host-staged, above the small-message size) of a
// buffer whose producer is still queued on the caller's stream: its copies
// out wait for the producer on the device (the out lane's stream waits for
// the mark: StreamWaitEvent), not on the CPU, and it reduces what the
// producer wrote, not what the buffer held at the call.
func TestChainedAllReduceWaitsForTheMarkOnTheDevice(t *testing.T) {
	const n, count = 2, 40000 // 160 KB: 10 chunks of 16 KiB
	fakes := make([]*cuda.Fake, n)
	unblock := make(chan struct{})
	released := false
	defer func() {
		if !released {
			close(unblock)
		}
	}()
	tuning := Tuning{Chunk: 16 << 10, Slots: 4, SmallBytes: 1 << 10}
	fakeOpts := blockingFakes(fakes, map[string]chan struct{}{"test_block": unblock})
	opts := func(r int) []Option {
		return append(fakeOpts(r), WithTuning(tuning), WithAlgorithm(AlgorithmHostStaged))
	}
	var waits [n]int
	checked := make(chan struct{}, n)
	errs := world(t, n, opts, func(g *Group) error {
		ctx := context.Background()
		f := fakes[g.Rank()]
		stream, launch, done, err := fakeKernelStream(f)
		if err != nil {
			return err
		}
		defer done()
		buf, err := g.Alloc(count, Float32)
		if err != nil {
			return err
		}
		stale := make([]float32, count) // what the buffer holds at the call: zeros
		if err := g.Write(ctx, buf, HostSlice(stale).Host()); err != nil {
			return err
		}
		ptr := uintptr(buf.own.(*comm.CUDABuffer).Ptr())
		if !g.Chains(DeviceBufferAfter(ptr, count, Float32, nil), DeviceBufferAfter(ptr, count, Float32, nil)) {
			return fmt.Errorf("an all-reduce of %d floats does not chain with %+v", count, tuning)
		}
		// The producer: a kernel held until released, then the input written.
		if err := launch("test_block"); err != nil {
			return err
		}
		in := make([]float32, count)
		for j := range in {
			in[j] = input(g.Rank(), j)
		}
		if err := f.MemcpyHtoDAsync(cuda.DevicePtr(ptr), unsafe.Pointer(&in[0]), uint64(4*count), stream); err != nil {
			return err
		}
		mark, err := g.RecordStream(uintptr(stream))
		if err != nil {
			return err
		}
		before := f.Calls("StreamWaitEvent")
		b := DeviceBufferAfter(ptr, count, Float32, mark)
		w := g.AllReduceAsync(ctx, b, b, Sum)
		select {
		case <-w.Done():
			return fmt.Errorf("the all-reduce finished before its input was written: %v", w.Err())
		case <-time.After(200 * time.Millisecond):
		}
		waits[g.Rank()] = f.Calls("StreamWaitEvent") - before
		if checkedAll(checked, g.Rank(), n) {
			released = true
			close(unblock)
		}
		if err := w.Wait(ctx); err != nil {
			return err
		}
		got := make([]float32, count)
		if err := g.Read(ctx, HostSlice(got).Host(), buf); err != nil {
			return err
		}
		runtime.KeepAlive(in)
		if err := checkInputSums(got, n, 1); err != nil {
			return fmt.Errorf("the input's producer not waited for: %w", err)
		}
		return nil
	})
	requireAll(t, errs)
	for r, c := range waits {
		require.Positive(t, c, "rank %d: the chained all-reduce's stream did not wait for the caller's mark on the device", r)
	}
}

// checkedAll records that rank has checked its collective is still waiting
// and reports whether it is rank 0 and every rank has (rank 0 then
// releases the producers: released earlier, a slower rank's collective
// could finish before that rank looked). A rank that failed before it
// checked holds rank 0 up for 10 s at most.
func checkedAll(checked chan struct{}, rank, n int) bool {
	checked <- struct{}{}
	if rank != 0 {
		return false
	}
	for range n {
		select {
		case <-checked:
		case <-time.After(10 * time.Second):
			return true
		}
	}
	return true
}

// checkInputSums checks that got[j] is times the sum over n ranks of
// input(q, j): an all-reduce of the inputs (times 1), or of that result
// again (times n).
func checkInputSums(got []float32, n int, times float32) error {
	for j := range got {
		var want float32
		for q := range n {
			want += input(q, j)
		}
		if got[j] != want*times {
			return fmt.Errorf("element %d = %v, want %v", j, got[j], want*times)
		}
	}
	return nil
}

// A chained all-reduce of device buffers hands its result over on the
// device before it ends (Work.OnReady): the event comes while copies back
// still run (the Work not done), and a stream ordered after it
// (Group.OrderStream) reads the whole result, its last chunk included. With
// Tuning.CompleteOnDevice off (the default) no event comes, before the end
// or after.
func TestChainedAllReduceReadiesOnTheDevice(t *testing.T) {
	const n, count = 2, 40000 // 160 KB: 10 chunks of 16 KiB
	for _, onDevice := range []bool{true, false} {
		t.Run(fmt.Sprintf("complete_on_device=%v", onDevice), func(t *testing.T) {
			fakes := make([]*cuda.Fake, n)
			tuning := Tuning{Chunk: 16 << 10, Slots: 4, SmallBytes: 1 << 10, CompleteOnDevice: onDevice}
			fakeOpts := blockingFakes(fakes, nil)
			opts := func(r int) []Option {
				return append(fakeOpts(r), WithTuning(tuning), WithAlgorithm(AlgorithmHostStaged))
			}
			errs := world(t, n, opts, func(g *Group) error {
				ctx := context.Background()
				f := fakes[g.Rank()]
				stream, ptr, b, done, err := callerInput(ctx, g, f, count)
				if err != nil {
					return err
				}
				defer done()
				if !g.Chains(b, b) {
					return fmt.Errorf("an all-reduce of %d floats does not chain with %+v", count, tuning)
				}
				if g.CompletesEarly() != onDevice {
					return fmt.Errorf("CompletesEarly %v with CompleteOnDevice %v", g.CompletesEarly(), onDevice)
				}
				f.SetCopyToDeviceTime(3 * time.Millisecond) // the copies back: 30 ms in all
				type readied struct {
					ev   comm.Event
					done bool
				}
				got := make(chan readied, 2)
				w := g.AllReduceAsync(ctx, b, b, Sum)
				w.OnReady(func(ev comm.Event) { got <- readied{ev, isDone(w)} })
				if !onDevice {
					if err := w.Wait(ctx); err != nil {
						return err
					}
					w.OnReady(func(ev comm.Event) { got <- readied{ev, true} })
					if len(got) != 0 {
						return fmt.Errorf("the all-reduce readied early without Tuning.CompleteOnDevice")
					}
					return nil
				}
				var r readied
				select {
				case r = <-got:
				case <-w.Done():
					return fmt.Errorf("the all-reduce ended without readying early: %v", w.Err())
				}
				if r.done {
					return fmt.Errorf("the all-reduce readied once it had ended, not before")
				}
				// What the caller's stream reads after the event: the result,
				// though copies back may still run.
				if err := readAfterReady(g, f, stream, r.ev, ptr, count); err != nil {
					return err
				}
				return w.Wait(ctx)
			})
			requireAll(t, errs)
		})
	}
}

// callerInput makes a caller's stream on rank g's fake driver f (done
// releases it) and count floats of device memory holding input(rank, j), as
// a buffer ordered after nothing.
func callerInput(ctx context.Context, g *Group, f *cuda.Fake, count int) (cuda.Stream, uintptr, Buffer, func(), error) {
	stream, _, done, err := fakeKernelStream(f)
	if err != nil {
		return 0, 0, Buffer{}, nil, err
	}
	_, ptr, err := deviceInput(ctx, g, count)
	if err != nil {
		done()
		return 0, 0, Buffer{}, nil, err
	}
	return stream, ptr, DeviceBufferAfter(ptr, count, Float32, nil), done, nil
}

// readAfterReady orders stream after ev (Work.OnReady's event), reads the
// count floats at ptr through it and checks that they are the sums of every
// rank's input.
func readAfterReady(g *Group, f *cuda.Fake, stream cuda.Stream, ev comm.Event, ptr uintptr, count int) error {
	if err := g.OrderStream(uintptr(stream), ev); err != nil {
		return err
	}
	out := make([]float32, count)
	if err := f.MemcpyDtoHAsync(unsafe.Pointer(&out[0]), cuda.DevicePtr(ptr), uint64(4*count), stream); err != nil {
		return err
	}
	if err := f.StreamSynchronize(stream); err != nil {
		return err
	}
	runtime.KeepAlive(out)
	if err := checkInputSums(out, g.Size(), 1); err != nil {
		return fmt.Errorf("read after the ready event: %w", err)
	}
	return nil
}

// deviceInput allocates count floats on g's device holding input(rank, j)
// and returns the buffer and its device pointer.
func deviceInput(ctx context.Context, g *Group, count int) (Buffer, uintptr, error) {
	buf, err := g.Alloc(count, Float32)
	if err != nil {
		return Buffer{}, 0, err
	}
	in := make([]float32, count)
	for j := range in {
		in[j] = input(g.Rank(), j)
	}
	if err := g.Write(ctx, buf, HostSlice(in).Host()); err != nil {
		return Buffer{}, 0, err
	}
	return buf, uintptr(buf.own.(*comm.CUDABuffer).Ptr()), nil
}

func isDone(w *Work) bool {
	select {
	case <-w.Done():
		return true
	default:
		return false
	}
}
