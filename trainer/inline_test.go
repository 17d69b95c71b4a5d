package trainer

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/migctl/migctl/comm"
	"github.com/migctl/migctl/internal/cuda"
)

// goid is the calling goroutine's id (from its stack header).
func goid() uint64 {
	var b [64]byte
	s := b[:runtime.Stack(b[:], false)]
	s = bytes.TrimPrefix(s, []byte("goroutine "))
	id, _ := strconv.ParseUint(string(s[:bytes.IndexByte(s, ' ')]), 10, 64)
	return id
}

// A synchronous call with nothing queued runs on its caller's goroutine; one
// issued while work is queued or running waits for that work on the worker
// (order of calls kept); work issued while an inline call runs waits for it;
// Close waits for a call running inline before it releases the group.
func TestSyncCallsRunInlineInOrder(t *testing.T) {
	requireAll(t, world(t, 1, nil, func(g *Group) error {
		ctx := context.Background()
		var mu sync.Mutex
		var order []string
		note := func(s string) {
			mu.Lock()
			order = append(order, s)
			mu.Unlock()
		}

		// Nothing pending: inline, done on return.
		me, ran := goid(), uint64(0)
		w := g.issue(ctx, true, "probe", "", 0, func(context.Context) error { ran = goid(); return nil })
		select {
		case <-w.Done():
		default:
			return fmt.Errorf("inline call returned not done")
		}
		if ran != me {
			return fmt.Errorf("idle group: the synchronous call ran on goroutine %d, not its caller's %d", ran, me)
		}

		// Every blocked run is let go on the way out, so a failure here
		// ends instead of hanging the group's Close.
		var opened []chan struct{}
		gate := func() chan struct{} { c := make(chan struct{}); opened = append(opened, c); return c }
		open := func(c chan struct{}) {
			select {
			case <-c:
			default:
				close(c)
			}
		}
		defer func() {
			for _, c := range opened {
				open(c)
			}
		}()

		// Queued work first: the synchronous call runs after it, on the worker.
		release := gate()
		first := g.issue(ctx, false, "first", "", 0, func(context.Context) error { <-release; note("first"); return nil })
		syncDone := make(chan uint64, 1)
		go func() {
			var on uint64
			_ = g.wait(g.issue(ctx, true, "second", "", 0, func(context.Context) error { on = goid(); note("second"); return nil }))
			syncDone <- on
		}()
		select {
		case <-syncDone:
			return fmt.Errorf("the synchronous call finished before the queued one it follows")
		case <-time.After(50 * time.Millisecond):
		}
		open(release)
		if err := first.Wait(ctx); err != nil {
			return err
		}
		if on := <-syncDone; on == me || on == 0 {
			return fmt.Errorf("queued behind work, the synchronous call ran on goroutine %d (caller side)", on)
		}

		// An inline call running: what is issued meanwhile waits for it.
		hold, inRun := gate(), make(chan struct{})
		inlineDone := make(chan struct{})
		go func() {
			defer close(inlineDone)
			_ = g.wait(g.issue(ctx, true, "third", "", 0, func(context.Context) error {
				close(inRun)
				<-hold
				note("third")
				return nil
			}))
		}()
		<-inRun
		after := g.issue(ctx, false, "fourth", "", 0, func(context.Context) error { note("fourth"); return nil })
		select {
		case <-after.Done():
			return fmt.Errorf("work issued during an inline call ran before it ended")
		case <-time.After(50 * time.Millisecond):
		}
		open(hold)
		<-inlineDone
		if err := after.Wait(ctx); err != nil {
			return err
		}
		mu.Lock()
		got := fmt.Sprint(order)
		mu.Unlock()
		if got != "[first second third fourth]" {
			return fmt.Errorf("order %s", got)
		}

		// Close waits for a call running inline.
		hold, inRun = gate(), make(chan struct{})
		go func() {
			_ = g.wait(g.issue(ctx, true, "last", "", 0, func(context.Context) error { close(inRun); <-hold; return nil }))
		}()
		<-inRun
		closed := make(chan error, 1)
		go func() { closed <- g.Close() }()
		select {
		case <-closed:
			return fmt.Errorf("Close returned while a call ran inline")
		case <-time.After(50 * time.Millisecond):
		}
		open(hold)
		return <-closed
	}))
}

// A caller locked to its OS thread with no CUDA context current (or one of
// its own) finds the same after a synchronous collective, which runs on its
// goroutine and makes the device's context current for its driver calls;
// and after an asynchronous one (found in review).
func TestSyncCallKeepsCallerContext(t *testing.T) {
	f := cuda.NewFake()
	comm.InstallFakeCUDAKernels(f)
	requireAll(t, world(t, 1, func(int) []Option {
		return []Option{withCUDA(f), WithBackend(BackendGPU)}
	}, func(g *Group) error {
		ctx := context.Background()
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		buf := make([]float32, 256)
		for _, sync := range []bool{false, true} {
			if err := f.CtxSetCurrent(0); err != nil {
				return err
			}
			var err error
			if sync {
				err = g.AllReduce(ctx, HostSlice(buf), HostSlice(buf), Sum)
			} else {
				err = g.AllReduceAsync(ctx, HostSlice(buf), HostSlice(buf), Sum).Wait(ctx)
			}
			if err != nil {
				return err
			}
			if c := f.Current(); c != 0 {
				return fmt.Errorf("sync=%v: the caller's thread now has context %#x current (had none)", sync, c)
			}
		}
		return nil
	}))
}
