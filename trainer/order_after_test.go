package trainer

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

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
		buf, err := g.Alloc(count, Float32)
		if err != nil {
			return err
		}
		in := make([]float32, count)
		for j := range in {
			in[j] = input(g.Rank(), j)
		}
		if err := g.Write(ctx, buf, HostSlice(in).Host()); err != nil {
			return err
		}
		ptr := uintptr(buf.own.(*comm.CUDABuffer).Ptr())
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
		if g.Rank() == 0 {
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
		for j := range got {
			var want float32
			for q := range n {
				want += input(q, j)
			}
			if got[j] != want*n {
				return fmt.Errorf("element %d = %v, want %v", j, got[j], want*n)
			}
		}
		return nil
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
