package trainer

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

// A collective on device memory waits for the work its caller queued on the
// buffer's stream before the call, and not for work queued after it (a
// backward pass goes on queueing kernels while its gradient buckets are
// reduced). The second all-reduce's stream gets a kernel that blocks until
// the end of the test right after the call: the collective must finish
// anyway. Recording the ordering event when the worker reaches the
// collective (instead of at the call) orders it after the blocking kernel,
// and it fails on its deadline.
func TestDeviceCollectiveOrderedAtCall(t *testing.T) {
	const n, count = 2, 257
	fakes := make([]*cuda.Fake, n)
	unblock := make(chan struct{})
	defer func() {
		select {
		case <-unblock:
		default:
			close(unblock)
		}
	}()
	errs := world(t, n, blockingFakes(fakes, map[string]chan struct{}{"test_block": unblock}), func(g *Group) error {
		ctx := context.Background()
		f := fakes[g.Rank()]
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		_, mod, release, err := fakePrimaryModule(f)
		if err != nil {
			return err
		}
		defer release()
		block, err := f.ModuleGetFunction(mod, "test_block")
		if err != nil {
			return err
		}
		stream, err := f.StreamCreate(cuda.StreamNonBlocking)
		if err != nil {
			return err
		}
		bufs := make([]Buffer, 2)
		for i := range bufs {
			if bufs[i], err = g.Alloc(count, Float32); err != nil {
				return err
			}
			in := make([]float32, count)
			for j := range in {
				in[j] = input(g.Rank(), j+i)
			}
			if err := g.Write(ctx, bufs[i], HostSlice(in).Host()); err != nil {
				return err
			}
		}
		raw := func(b Buffer) Buffer {
			return DeviceBuffer(uintptr(b.own.(*comm.CUDABuffer).Ptr()), count, Float32, uintptr(stream))
		}
		w := g.AllReduceAsync(ctx, raw(bufs[0]), raw(bufs[0]), Sum)
		// Queued after the call: the collective must not wait for it.
		if err := f.LaunchKernel(block, cuda.Dim3{X: 1, Y: 1, Z: 1}, cuda.Dim3{X: 1, Y: 1, Z: 1}, 0, stream, &cuda.Args{}); err != nil {
			return err
		}
		if err := w.Wait(ctx); err != nil {
			return fmt.Errorf("all-reduce ordered after work queued after the call: %w", err)
		}
		got := make([]float32, count)
		if err := g.Read(ctx, HostSlice(got).Host(), bufs[0]); err != nil {
			return err
		}
		return checkInputSums(got, n, 1)
	})
	close(unblock)
	requireAll(t, errs)
}

// fakePrimaryModule makes the fake's primary context current on this (locked)
// thread and loads its test module: the state a program such as PyTorch is in
// when it calls a collective on its own stream. release undoes the retain.
// blockingFakes makes each rank's fake driver (into fakes[rank]), with the
// reduction kernels and one kernel per entry of blocks that returns once its
// channel is closed, and the options of a gpu-backend rank on it.
func blockingFakes(fakes []*cuda.Fake, blocks map[string]chan struct{}) func(r int) []Option {
	return func(r int) []Option {
		f := cuda.NewFake()
		comm.InstallFakeCUDAKernels(f)
		for name, ch := range blocks {
			f.AddKernel(name, func(cuda.FakeMemory, cuda.Dim3, cuda.Dim3, *cuda.Args) error {
				<-ch
				return nil
			})
		}
		fakes[r] = f
		return []Option{withCUDA(f), WithBackend(BackendGPU), WithTimeout(5 * time.Second)}
	}
}

func fakePrimaryModule(f *cuda.Fake) (cuda.Context, cuda.Module, func(), error) {
	dev, err := f.DeviceGet(0)
	if err != nil {
		return 0, 0, nil, err
	}
	c, err := f.DevicePrimaryCtxRetain(dev)
	if err != nil {
		return 0, 0, nil, err
	}
	release := func() { _ = f.DevicePrimaryCtxRelease(dev) }
	if err := f.CtxSetCurrent(c); err != nil {
		release()
		return 0, 0, nil, err
	}
	mod, err := f.ModuleLoadData([]byte("test"))
	if err != nil {
		release()
		return 0, 0, nil, err
	}
	return c, mod, release, nil
}

// capturingFake is the fake driver with one stream that is being captured
// into a CUDA graph: the driver refuses a query of it.
type capturingFake struct {
	*cuda.Fake
	capturing cuda.Stream
}

func (c capturingFake) StreamQuery(s cuda.Stream) error {
	if s == c.capturing {
		return cuda.ErrStreamCaptureUnsupported
	}
	return c.Fake.StreamQuery(s)
}

// TestCollectiveInGraphCapture: a collective on a stream being captured
// into a CUDA graph (PyTorch's torch.cuda.graph) fails at the call with
// ErrUnsupported and a text that says why, and the group goes on working
// (nothing was issued).
func TestCollectiveInGraphCapture(t *testing.T) {
	const count = 64
	const captured = cuda.Stream(0x7e57)
	err := world(t, 1, func(int) []Option {
		f := cuda.NewFake()
		comm.InstallFakeCUDAKernels(f)
		return []Option{withCUDA(capturingFake{f, captured}), WithBackend(BackendGPU)}
	}, func(g *Group) error {
		ctx := context.Background()
		b, err := g.Alloc(count, Float32)
		if err != nil {
			return err
		}
		raw := DeviceBuffer(uintptr(b.own.(*comm.CUDABuffer).Ptr()), count, Float32, uintptr(captured))
		err = g.AllReduce(ctx, raw, raw, Sum)
		if !errors.Is(err, ErrUnsupported) || !errors.Is(err, cuda.ErrStreamCaptureUnsupported) ||
			!strings.Contains(fmt.Sprint(err), "captured into a CUDA graph") {
			return fmt.Errorf("all-reduce on a capturing stream: %v, want ErrUnsupported naming the capture", err)
		}
		if _, err := g.RecordStream(uintptr(captured)); !errors.Is(err, ErrUnsupported) {
			return fmt.Errorf("RecordStream of a capturing stream: %v, want ErrUnsupported", err)
		}
		return g.AllReduce(ctx, b, b, Sum) // the group still works
	})
	require.NoError(t, err)
}
