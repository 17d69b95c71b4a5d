package trainer

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/migctl/migctl/comm"
	"github.com/migctl/migctl/internal/cuda"
	"github.com/stretchr/testify/require"
)

// message is the k-th message from rank `from`, n elements, each distinct.
func message(from, k, n int) []float32 {
	m := make([]float32, n)
	for i := range m {
		m[i] = float32(from*100000+k*1000) + float32(i%997)
	}
	return m
}

func sameFloats(got, want []float32) error {
	if len(got) != len(want) {
		return fmt.Errorf("%d elements, want %d", len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			return fmt.Errorf("element %d = %v, want %v", i, got[i], want[i])
		}
	}
	return nil
}

// Every rank sends to the next and receives from the previous, all sending
// first: each direction is a link of its own, so nobody waits on anybody.
// Sizes include an empty message and one larger than the arena's slot.
func TestSendRecvRingAllSendFirst(t *testing.T) {
	const n = 4
	sizes := []int{1, 0, 1<<20 + 7, 33}
	err := world(t, n, nil, func(g *Group) error {
		ctx := context.Background()
		r := g.Rank()
		next, prev := (r+1)%n, (r+n-1)%n
		for k, size := range sizes {
			w := g.SendAsync(ctx, HostSlice(message(r, k, size)), next)
			got := make([]float32, size)
			if err := g.Recv(ctx, HostSlice(got), prev); err != nil {
				return fmt.Errorf("rank %d message %d: %w", r, k, err)
			}
			if err := w.Wait(ctx); err != nil {
				return fmt.Errorf("rank %d message %d: %w", r, k, err)
			}
			if err := sameFloats(got, message(prev, k, size)); err != nil {
				return fmt.Errorf("rank %d message %d from %d: %w", r, k, prev, err)
			}
		}
		return nil
	})
	requireAll(t, err)
}

// Messages between two ranks arrive in the order they were sent, each in
// the receive that matches it by position; both directions at once; and a
// pending transfer waits neither for the group's collectives nor they for
// it.
func TestSendRecvOrderAndIndependence(t *testing.T) {
	const n, msgs, size = 3, 6, 515
	err := world(t, n, nil, func(g *Group) error {
		ctx := context.Background()
		r := g.Rank()
		switch r {
		case 0:
			var ws []*Work
			for k := range msgs {
				ws = append(ws, g.SendAsync(ctx, HostSlice(message(0, k, size)), 1))
			}
			// Rank 1 receives only after this all-reduce: the sends are
			// pending while it runs.
			if v, err := allReduceOf(g, 1); err != nil || v != n {
				return fmt.Errorf("all-reduce beside pending sends: %v, %v", v, err)
			}
			for k, w := range ws {
				if err := w.Wait(ctx); err != nil {
					return fmt.Errorf("send %d: %w", k, err)
				}
			}
			got := make([]float32, size)
			if err := g.Recv(ctx, HostSlice(got), 1); err != nil {
				return err
			}
			return sameFloats(got, message(1, 0, size))
		case 1:
			// A receive pending from rank 2, which sends after the
			// all-reduce below: the all-reduce does not wait for it.
			fromTwo := make([]float32, size)
			w2 := g.RecvAsync(ctx, HostSlice(fromTwo), 2)
			if v, err := allReduceOf(g, 1); err != nil || v != n {
				return fmt.Errorf("all-reduce beside a pending receive: %v, %v", v, err)
			}
			bufs := make([][]float32, msgs)
			var ws []*Work
			for k := range bufs {
				bufs[k] = make([]float32, size)
				ws = append(ws, g.RecvAsync(ctx, HostSlice(bufs[k]), 0))
			}
			if err := g.Send(ctx, HostSlice(message(1, 0, size)), 0); err != nil {
				return err
			}
			for k, w := range ws {
				if err := w.Wait(ctx); err != nil {
					return fmt.Errorf("receive %d: %w", k, err)
				}
				if err := sameFloats(bufs[k], message(0, k, size)); err != nil {
					return fmt.Errorf("receive %d: %w", k, err)
				}
			}
			if err := w2.Wait(ctx); err != nil {
				return err
			}
			return sameFloats(fromTwo, message(2, 0, size))
		default:
			if v, err := allReduceOf(g, 1); err != nil || v != n {
				return fmt.Errorf("all-reduce: %v, %v", v, err)
			}
			return g.Send(ctx, HostSlice(message(2, 0, size)), 1)
		}
	})
	requireAll(t, err)
}

// Transfers within a group of some of the ranks address its ranks.
func TestSendRecvInSubgroup(t *testing.T) {
	err := world(t, 4, nil, func(g *Group) error {
		ctx := context.Background()
		if g.Rank() == 0 || g.Rank() == 2 {
			return nil
		}
		sub, err := g.NewGroup(ctx, "odd", []int{3, 1}) // rank 3 is the subgroup's 0
		if err != nil {
			return err
		}
		defer sub.Close()
		if sub.Rank() == 0 {
			return sub.Send(ctx, HostSlice(message(3, 0, 10)), 1)
		}
		got := make([]float32, 10)
		if err := sub.Recv(ctx, HostSlice(got), 0); err != nil {
			return err
		}
		return sameFloats(got, message(3, 0, 10))
	})
	requireAll(t, err)
}

func TestSendRecvBadArguments(t *testing.T) {
	err := world(t, 2, nil, func(g *Group) error {
		ctx := context.Background()
		buf := HostSlice(make([]float32, 4))
		for _, peer := range []int{-1, 2, g.Rank()} {
			if err := g.Send(ctx, buf, peer); !errors.Is(err, comm.ErrInvalid) {
				return fmt.Errorf("send to %d: %v, want ErrInvalid", peer, err)
			}
			if err := g.Recv(ctx, buf, peer); !errors.Is(err, comm.ErrInvalid) {
				return fmt.Errorf("recv from %d: %v, want ErrInvalid", peer, err)
			}
		}
		if err := g.Send(ctx, HostBytes(make([]byte, 5), Float32), 1-g.Rank()); !errors.Is(err, comm.ErrInvalid) {
			return fmt.Errorf("send of a partial element: %v, want ErrInvalid", err)
		}
		if _, err := g.NewGroup(ctx, "p2p-0-1", []int{0, 1}); !errors.Is(err, comm.ErrInvalid) {
			return fmt.Errorf("NewGroup with a link's name: %v, want ErrInvalid", err)
		}
		// still usable after the refusals
		if g.Rank() == 0 {
			if err := g.Send(ctx, HostSlice([]float32{7}), 1); err != nil {
				return err
			}
		}
		if g.Rank() == 1 {
			got := []float32{0}
			if err := g.Recv(ctx, HostSlice(got), 0); err != nil {
				return err
			}
			if got[0] != 7 {
				return fmt.Errorf("received %v, want 7", got[0])
			}
		}
		if err := g.Barrier(ctx); err != nil {
			return err
		}
		if err := g.Close(); err != nil {
			return err
		}
		if err := g.Send(ctx, buf, 1-g.Rank()); !errors.Is(err, ErrClosed) {
			return fmt.Errorf("send after Close: %v, want ErrClosed", err)
		}
		return nil
	})
	requireAll(t, err)
}

// A receive of another size than the send fails, saying so, instead of
// writing past the buffer or reading a short message; the sender fails
// then or at its next transfer (its message may have been left in shared
// memory before the receiver compared the calls). The link stays failed,
// the group does not.
func TestSendRecvSizeMismatch(t *testing.T) {
	err := world(t, 2, nil, func(g *Group) error {
		ctx := context.Background()
		if g.Rank() == 0 {
			err := g.Send(ctx, HostSlice(make([]float32, 8)), 1)
			if err == nil {
				err = g.Send(ctx, HostSlice(make([]float32, 6)), 1)
			}
			if err == nil {
				return errors.New("rank 0: both sends on a link whose receiver refused the first succeeded")
			}
		} else {
			err := g.Recv(ctx, HostSlice(make([]float32, 6)), 0)
			if !errors.Is(err, comm.ErrInvalid) {
				return fmt.Errorf("rank 1: a receive of 6 elements from a send of 8: %v, want ErrInvalid", err)
			}
			if err := g.Recv(ctx, HostSlice(make([]float32, 6)), 0); err == nil {
				return errors.New("rank 1: a receive on the failed link succeeded")
			}
		}
		if v, err := allReduceOf(g, 1); err != nil || v != 2 {
			return fmt.Errorf("rank %d: all-reduce after the failed transfer: %v, %w", g.Rank(), v, err)
		}
		return nil
	})
	requireAll(t, err)
}

// Device buffers on the gpu backend: the send reads its buffer after the
// kernel queued on its stream before the call, and not after one queued
// after the call; the receiver's device buffer gets the message.
func TestSendRecvDeviceBuffersStreamOrder(t *testing.T) {
	const n, count = 2, 300
	fakes := make([]*cuda.Fake, n)
	before, after := make(chan struct{}), make(chan struct{})
	defer func() {
		for _, ch := range []chan struct{}{before, after} {
			select {
			case <-ch:
			default:
				close(ch)
			}
		}
	}()
	errs := world(t, n, blockingFakes(fakes, map[string]chan struct{}{"test_before": before, "test_after": after}),
		func(g *Group) error {
			ctx := context.Background()
			f := fakes[g.Rank()]
			buf, err := g.Alloc(count, Float32)
			if err != nil {
				return err
			}
			defer g.Free(buf)
			if g.Rank() == 1 {
				if err := g.Recv(ctx, buf, 0); err != nil {
					return err
				}
				got := make([]float32, count)
				if err := g.Read(ctx, HostSlice(got).Host(), buf); err != nil {
					return err
				}
				return sameFloats(got, message(0, 0, count))
			}
			if err := g.Write(ctx, buf, HostSlice(message(0, 0, count)).Host()); err != nil {
				return err
			}
			stream, launch, done, err := fakeKernelStream(f)
			if err != nil {
				return err
			}
			defer done()
			if err := launch("test_before"); err != nil {
				return err
			}
			ptr := uintptr(buf.own.(*comm.CUDABuffer).Ptr())
			w := g.SendAsync(ctx, DeviceBuffer(ptr, count, Float32, uintptr(stream)), 1)
			if err := launch("test_after"); err != nil {
				return err
			}
			select {
			case <-w.Done():
				return fmt.Errorf("the send finished before the kernel queued before it: %v", w.Err())
			case <-time.After(200 * time.Millisecond):
			}
			close(before)
			if err := w.Wait(ctx); err != nil {
				return fmt.Errorf("send ordered after the kernel before it (the one after it still blocked): %w", err)
			}
			close(after)
			return nil
		})
	requireAll(t, errs)
}

// A receive into device memory whose stream is busy at the call takes the
// message in meanwhile (a sender of more than the link's shared memory
// holds finishes while the receiver's kernel still runs) and writes the
// buffer only after that kernel; with Tuning.RecvDirect it receives
// nothing before the kernel has finished.
func TestRecvStagedOverlapsTheStream(t *testing.T) {
	for _, direct := range []bool{false, true} {
		t.Run(fmt.Sprintf("direct=%v", direct), func(t *testing.T) {
			const n, count = 2, 256 << 10 // 1 MiB: 8 times the link's shared memory per rank
			fakes := make([]*cuda.Fake, n)
			block := make(chan struct{})
			var once sync.Once
			release := func() { once.Do(func() { close(block) }) }
			defer release()
			base := blockingFakes(fakes, map[string]chan struct{}{"test_block": block})
			opts := func(r int) []Option {
				return append(base(r), WithTuning(Tuning{Chunk: 64 << 10, Slots: 2, RecvDirect: direct}))
			}
			errs := world(t, n, opts, func(g *Group) error {
				ctx := context.Background()
				if g.Rank() == 0 {
					if err := g.Send(ctx, HostSlice(message(0, 0, count)), 1); err != nil {
						return err
					}
					return g.Barrier(ctx) // tells rank 1 the send has finished
				}
				f := fakes[1]
				stream, launch, done, err := fakeKernelStream(f)
				if err != nil {
					return err
				}
				defer done()
				buf, err := g.Alloc(count, Float32)
				if err != nil {
					return err
				}
				defer g.Free(buf)
				if err := launch("test_block"); err != nil {
					return err
				}
				ptr := uintptr(buf.own.(*comm.CUDABuffer).Ptr())
				w := g.RecvAsync(ctx, DeviceBuffer(ptr, count, Float32, uintptr(stream)), 0)
				// Staged: the whole message arrives while the kernel runs (the
				// sender's Send returns; its barrier below then passes).
				// Direct: nothing moves until the kernel ends.
				pass := make(chan error, 1)
				go func() { pass <- g.Barrier(ctx) }()
				select {
				case err := <-pass:
					if direct {
						return fmt.Errorf("direct: the sender finished while the receiver's kernel ran (%v)", err)
					}
					if err != nil {
						return err
					}
				case <-time.After(500 * time.Millisecond):
					if !direct {
						return errors.New("staged: the sender did not finish while the receiver's kernel ran")
					}
				}
				select {
				case <-w.Done():
					return fmt.Errorf("the receive finished before the kernel queued before it: %v", w.Err())
				default:
				}
				release()
				if err := w.Wait(ctx); err != nil {
					return err
				}
				got := make([]float32, count)
				if err := g.Read(ctx, HostSlice(got).Host(), buf); err != nil {
					return err
				}
				if err := sameFloats(got, message(0, 0, count)); err != nil {
					return err
				}
				if direct {
					return <-pass
				}
				return nil
			})
			requireAll(t, errs)
		})
	}
}

// fakeKernelStream locks the calling goroutine to its thread, makes f's
// primary context current there and creates a stream in it; launch queues
// one of f's kernels by name on the stream; done undoes the rest.
func fakeKernelStream(f *cuda.Fake) (stream cuda.Stream, launch func(name string) error, done func(), err error) {
	runtime.LockOSThread()
	_, mod, releaseCtx, err := fakePrimaryModule(f)
	if err != nil {
		runtime.UnlockOSThread()
		return 0, nil, nil, err
	}
	done = func() {
		releaseCtx()
		runtime.UnlockOSThread()
	}
	if stream, err = f.StreamCreate(cuda.StreamNonBlocking); err != nil {
		done()
		return 0, nil, nil, err
	}
	launch = func(name string) error {
		fn, err := f.ModuleGetFunction(mod, name)
		if err != nil {
			return err
		}
		return f.LaunchKernel(fn, cuda.Dim3{X: 1, Y: 1, Z: 1}, cuda.Dim3{X: 1, Y: 1, Z: 1}, 0, stream, &cuda.Args{})
	}
	return stream, launch, done, nil
}

// OnDone's function runs once with the work's result: at once for work
// that has finished, else when it finishes (a transfer's link finishes it).
func TestWorkOnDone(t *testing.T) {
	w := failed("x", comm.ErrInvalid)
	var got error
	w.OnDone(func(err error) { got = err })
	require.ErrorIs(t, got, comm.ErrInvalid)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, runLocal(ctx, 2, func(int) []Option { return nil }, func(g *Group) error {
		buf := HostSlice(make([]float32, 16))
		if g.Rank() == 1 {
			time.Sleep(50 * time.Millisecond) // rank 0's receive is pending when it asks
			return g.Send(ctx, buf, 0)
		}
		w := g.RecvAsync(ctx, buf, 1)
		calls := make(chan error, 2)
		w.OnDone(func(err error) { calls <- err })
		select {
		case err := <-calls:
			return fmt.Errorf("OnDone ran before the message came (%v)", err)
		default:
		}
		if err := <-calls; err != nil {
			return err
		}
		if w.Err() != nil || len(calls) != 0 {
			return fmt.Errorf("after OnDone: err %v, %d more calls", w.Err(), len(calls))
		}
		return nil
	}))
}

// A receive nobody sends to holds Close until its deadline; Abort ends it at
// once (Close's doc says so): here rank 1 gives up on a message rank 0
// never sends, on a link that already carried one.
func TestAbortEndsAPendingReceive(t *testing.T) {
	done := make(chan struct{}) // rank 0 stays in the job until rank 1 has checked
	err := world(t, 2, nil, func(g *Group) error {
		ctx := context.Background()
		first := make([]float32, 5)
		if g.Rank() == 0 {
			err := g.Send(ctx, HostSlice(message(0, 0, 5)), 1)
			<-done
			return err
		}
		defer close(done)
		if err := g.Recv(ctx, HostSlice(first), 0); err != nil {
			return err
		}
		w := g.RecvAsync(ctx, HostSlice(make([]float32, 5)), 0)
		time.Sleep(100 * time.Millisecond) // the link is waiting for the message
		start := time.Now()
		g.Abort("rank 1 gives up")
		if err := w.Wait(ctx); err == nil {
			return errors.New("the pending receive succeeded without a sender")
		}
		_ = g.Close()
		if d := time.Since(start); d > 2*time.Second {
			return fmt.Errorf("Abort and Close took %v with a 20-s deadline", d)
		}
		return nil
	})
	require.NoError(t, err)
}
