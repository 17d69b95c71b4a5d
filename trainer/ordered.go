package trainer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/migctl/migctl/allreduce"
	"github.com/migctl/migctl/comm"
)

// DeviceBufferOrdered is DeviceBufferAfter for a caller that orders its own
// work after the collective on stream instead of waiting for it (as NCCL's
// callers do): the collective may complete — its Work done, the blocking
// call returned — as soon as it is queued on the device, the result then
// being there for the work queued on stream afterwards (for the host or
// other streams only once they synchronize with stream). A small
// all-reduce on the devices (Tuning.SmallOnDevice) and a broadcast of at
// most one chunk (unless Tuning.BroadcastOnCPU) do so, outside a swap job,
// when send and receive buffer are both such buffers of one stream; every
// other collective completes as for DeviceBufferAfter.
func DeviceBufferOrdered(ptr uintptr, count int, dt DType, stream uintptr, after comm.Event) Buffer {
	b := DeviceBufferAfter(ptr, count, dt, after)
	b.stream, b.streamDone = stream, true
	return b
}

// orderedAllReducer is the communicator's stream-ordered all-reduce
// (allreduce.Communicator).
type orderedAllReducer interface {
	AllReduceOrdered(ctx context.Context, send, recv comm.Buffer, count int, dt comm.DType, op comm.Op) (comm.Event, error)
}

// orderedOn returns the stream an all-reduce of send into recv may
// complete on (DeviceBufferOrdered for both, one stream), and whether it
// may: the group's communicator and device support it and no swap daemon
// may hold the job (a hold between queued and finished work could leave a
// peer's stream waiting for a held rank).
func (g *Group) orderedOn(send, recv Buffer) (uintptr, bool) {
	if !g.cfg.tuning.SmallOnDevice {
		return 0, false
	}
	if _, ok := any(g.cm).(orderedAllReducer); !ok {
		return 0, false
	}
	return g.streamOf(send, recv)
}

// streamOf is orderedOn's part common to the collectives: the one stream of
// send and recv, if both are DeviceBufferOrdered buffers of it, the device
// orders streams, and neither a swap daemon nor the IPC transport is in the
// way.
func (g *Group) streamOf(send, recv Buffer) (uintptr, bool) {
	if !send.streamDone || !recv.streamDone || send.stream != recv.stream || !g.ordersStreams() {
		return 0, false
	}
	return send.stream, true
}

// ordersStreams says whether this group may leave a collective queued on
// the device: the device orders streams, and neither a swap daemon nor the
// IPC transport is in the way.
func (g *Group) ordersStreams() bool {
	if g.cfg.swapSocket != "" || g.transport == TransportIPC {
		return false
	}
	_, ok := g.dev.(comm.StreamOrderer)
	return ok
}

// CompletesEarly reports whether this group's chained all-reduces (Chains)
// ready their result on the device before they have finished (Work.OnReady):
// Tuning.CompleteOnDevice on a device that orders streams, outside a swap
// job and the IPC transport. A binding asks it once, so that it tracks
// streams only where the group will use them (the C ABI's
// migctl_completes_early).
func (g *Group) CompletesEarly() bool {
	return g.cfg.tuning.CompleteOnDevice && g.ordersStreams()
}

// QueuedBackCalls is how many all-reduces of this process, in every group,
// have queued their copies back at once behind device-side waits for their
// reductions (Tuning.QueueCopiesBack), for diagnosis.
func QueuedBackCalls() uint64 { return allreduce.QueuedBackCalls() }

// OrderStream makes the work queued on the caller's CUDA stream from now on
// wait for ev (from Work.OnReady) on the device, without blocking the
// calling thread; callable from any thread, as RecordStream.
func (g *Group) OrderStream(stream uintptr, ev comm.Event) error {
	so, ok := g.dev.(comm.StreamOrderer)
	if !ok {
		return fmt.Errorf("ordering a stream: the %s device orders no streams: %w", g.cfg.backend, comm.ErrInvalid)
	}
	return so.OrderStream(stream, ev)
}

// orderedBroadcaster is the communicator's stream-ordered broadcast
// (allreduce.Communicator).
type orderedBroadcaster interface {
	BroadcastOrdered(ctx context.Context, send, recv comm.Buffer, count int, dt comm.DType, root int, after ...comm.Event) (comm.Event, error)
	QueuesBroadcasts() bool
	QueuedBroadcastBytes() int
}

// broadcastOrderedOn is orderedOn for a broadcast: where the communicator
// queues broadcasts (connect asks it to unless Tuning.BroadcastOnCPU, on a
// link or on the host backend; it then queues one of one chunk).
func (g *Group) broadcastOrderedOn(send, recv Buffer) (uintptr, bool) {
	if ob, ok := any(g.cm).(orderedBroadcaster); !ok || !ob.QueuesBroadcasts() {
		return 0, false
	}
	return g.streamOf(send, recv)
}

// QueuedBroadcastBytes is the largest broadcast, in bytes, of
// DeviceBufferOrdered buffers that Broadcast queues whole on the devices
// and returns from before it ran (the caller's stream ordered after it), or
// 0 where it queues none: Tuning.BroadcastOnCPU, the host backend, the IPC
// transport, a swap job, a group across nodes, a tracing rank. Elsewhere a
// synchronous broadcast waits for its peers. Callers that must not wait
// for peers (an asynchronous broadcast through the C ABI's migctl_run)
// ask it first.
func (g *Group) QueuedBroadcastBytes() int {
	ob, ok := any(g.cm).(orderedBroadcaster)
	if !ok || !g.ordersStreams() {
		return 0
	}
	return ob.QueuedBroadcastBytes()
}

// broadcastOrdered is allReduceOrdered for a broadcast, except that the
// CPU does not wait for the caller's stream first: the marks of send and
// recv (their after events) go with the call, whose stream waits for them
// on the device (the issue leaves them out of the Work: Group.broadcast).
func (g *Group) broadcastOrdered(ctx context.Context, stream uintptr, send, recv Buffer, root int) error {
	var after []comm.Event
	for _, b := range []Buffer{send, recv} {
		if b.after != nil && (len(after) == 0 || after[0] != b.after) {
			after = append(after, b.after)
		}
	}
	n := recv.count
	return g.runOrdered(ctx, stream, "broadcast", send, recv, n, func(ctx context.Context, s, r comm.Buffer) (comm.Event, error) {
		return any(g.cm).(orderedBroadcaster).BroadcastOrdered(ctx, s, r, n, recv.dtype, root, after...)
	})
}

// allReduceOrdered runs the all-reduce through the communicator's
// stream-ordered call (runOrdered).
func (g *Group) allReduceOrdered(ctx context.Context, stream uintptr, send, recv Buffer, op Op) error {
	n := send.count
	return g.runOrdered(ctx, stream, "all-reduce", send, recv, n, func(ctx context.Context, s, r comm.Buffer) (comm.Event, error) {
		return any(g.cm).(orderedAllReducer).AllReduceOrdered(ctx, s, r, n, send.dtype, op)
	})
}

// runOrdered runs a stream-ordered call of n elements each way on the
// operands of send and recv and, when it returned queued (an event), orders
// the caller's stream after it. The call's deadline is the group's timeout
// from now (the executor's watchdog enforces it after this returns).
func (g *Group) runOrdered(ctx context.Context, stream uintptr, what string, send, recv Buffer, n int,
	call func(ctx context.Context, s, r comm.Buffer) (comm.Event, error)) error {
	dctx, cancel := context.WithDeadline(ctx, time.Now().Add(g.Timeout()))
	defer cancel()
	var ev comm.Event
	err := g.withOperands(dctx, send, recv, n, n, func(s, r comm.Buffer) (err error) {
		ev, err = call(dctx, s, r)
		return err
	})
	if err != nil || ev == nil {
		return err
	}
	if err := g.OrderStream(stream, ev); err != nil {
		// The caller's stream is not ordered after the call: wait for it
		// here, so that a caller who handles the error does not find the
		// call still writing its receive buffer later.
		if werr := ev.Wait(dctx); werr != nil {
			err = errors.Join(err, werr)
		}
		return fmt.Errorf("ordering the caller's stream after the %s: %w", what, err)
	}
	return nil
}
