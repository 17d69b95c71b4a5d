package trainer

import (
	"context"
	"fmt"

	"github.com/migctl/migctl/allreduce"
	"github.com/migctl/migctl/comm"
)

// AllReduce sets recv to op over every rank's send (send.Count elements;
// recv may be send itself: in place). It blocks until recv holds the result.
func (g *Group) AllReduce(ctx context.Context, send, recv Buffer, op Op) error {
	return g.wait(g.allReduce(ctx, true, send, recv, op))
}

// AllReduceAsync issues AllReduce and returns at once.
func (g *Group) AllReduceAsync(ctx context.Context, send, recv Buffer, op Op) *Work {
	return g.allReduce(ctx, false, send, recv, op)
}

func (g *Group) allReduce(ctx context.Context, inline bool, send, recv Buffer, op Op) *Work {
	const name = "allreduce"
	n := send.count
	if err := checkOperands(send, recv, n, n); err != nil {
		return failed(name, fmt.Errorf("%s: %w", name, err))
	}
	if op < Sum || op > Max {
		return failed(name, fmt.Errorf("%s: op %d: %w", name, op, comm.ErrInvalid))
	}
	w := &Work{name: name, op: "all_reduce", bytes: send.Bytes(), ctx: ctx, chains: g.chains(send, recv), run: func(ctx context.Context) error {
		if g.transport == TransportIPC && n > 0 {
			return g.allReduceIPC(ctx, send, recv, op)
		}
		if stream, ok := g.orderedOn(send, recv); ok {
			return g.allReduceOrdered(ctx, stream, send, recv, op)
		}
		return g.withOperands(ctx, send, recv, n, n, func(s, r comm.Buffer) error {
			return g.cm.AllReduce(ctx, s, r, n, send.dtype, op)
		})
	}}
	return g.submit(inline, w, send, recv)
}

// Chains reports whether an asynchronous all-reduce of send into recv lets
// the collective issued after it start before it has finished (once its
// copies out are done; Tuning.NoChain: never). Results and the order in
// which Works finish are those of one call after the other.
func (g *Group) Chains(send, recv Buffer) bool { return g.chains(send, recv) }

// chains reports whether an all-reduce of send into recv may let the next
// collective start before it has ended (Work.chains): the node's
// communicator chains it (a host-staged all-reduce above the small-message
// size), and both buffers are used where they are, not staged through the
// group's scratch buffers (which the next call would use too).
func (g *Group) chains(send, recv Buffer) bool {
	if g.cfg.tuning.NoChain || g.transport == TransportIPC {
		return false
	}
	cm, ok := g.cm.(*allreduce.Communicator)
	if !ok || !cm.Chains(send.Bytes()) {
		return false
	}
	return !g.staged(send) && !g.staged(recv)
}

// ReduceScatter reduces every rank's send (Size()·recv.Count elements) with
// op and leaves block Rank() of the result (recv.Count elements) in recv. If
// recv is send itself, the block stays at its place in send.
func (g *Group) ReduceScatter(ctx context.Context, send, recv Buffer, op Op) error {
	return g.wait(g.reduceScatter(ctx, true, send, recv, op))
}

// ReduceScatterAsync issues ReduceScatter and returns at once.
func (g *Group) ReduceScatterAsync(ctx context.Context, send, recv Buffer, op Op) *Work {
	return g.reduceScatter(ctx, false, send, recv, op)
}

func (g *Group) reduceScatter(ctx context.Context, inline bool, send, recv Buffer, op Op) *Work {
	const name = "reducescatter"
	block := recv.count
	if same(send, recv) {
		block = send.count / g.size
	}
	if err := checkOperands(send, recv, block*g.size, block); err != nil {
		return failed(name, fmt.Errorf("%s: %w", name, err))
	}
	if op < Sum || op > Max {
		return failed(name, fmt.Errorf("%s: op %d: %w", name, op, comm.ErrInvalid))
	}
	return g.issue(ctx, inline, name, "reduce_scatter", block*g.size*send.dtype.Size(), func(ctx context.Context) error {
		return g.withOperands(ctx, send, recv, block*g.size, block, func(s, r comm.Buffer) error {
			return g.cm.ReduceScatter(ctx, s, r, block, send.dtype, op)
		})
	}, send, recv)
}

// AllGather concatenates every rank's send (send.Count elements) in rank
// order into recv (Size()·send.Count elements). If send is recv itself,
// this rank's input is block Rank() of recv.
func (g *Group) AllGather(ctx context.Context, send, recv Buffer) error {
	return g.wait(g.allGather(ctx, true, send, recv))
}

// AllGatherAsync issues AllGather and returns at once.
func (g *Group) AllGatherAsync(ctx context.Context, send, recv Buffer) *Work {
	return g.allGather(ctx, false, send, recv)
}

func (g *Group) allGather(ctx context.Context, inline bool, send, recv Buffer) *Work {
	const name = "allgather"
	block := send.count
	if same(send, recv) {
		block = recv.count / g.size
	}
	if err := checkOperands(send, recv, block, block*g.size); err != nil {
		return failed(name, fmt.Errorf("%s: %w", name, err))
	}
	return g.issue(ctx, inline, name, "all_gather", block*g.size*send.dtype.Size(), func(ctx context.Context) error {
		return g.withOperands(ctx, send, recv, block, block*g.size, func(s, r comm.Buffer) error {
			return g.cm.AllGather(ctx, s, r, block, send.dtype)
		})
	}, send, recv)
}

// Broadcast sets every rank's recv to root's send (recv.Count elements).
// send is read on root only (other ranks may pass the zero Buffer); pass the
// same buffer twice to broadcast in place.
func (g *Group) Broadcast(ctx context.Context, send, recv Buffer, root int) error {
	return g.wait(g.broadcast(ctx, true, send, recv, root))
}

// BroadcastAsync issues Broadcast and returns at once.
func (g *Group) BroadcastAsync(ctx context.Context, send, recv Buffer, root int) *Work {
	return g.broadcast(ctx, false, send, recv, root)
}

func (g *Group) broadcast(ctx context.Context, inline bool, send, recv Buffer, root int) *Work {
	const name = "broadcast"
	if root < 0 || root >= g.size {
		return failed(name, fmt.Errorf("%s: root %d of %d ranks: %w", name, root, g.size, comm.ErrInvalid))
	}
	n := recv.count
	if g.rank != root && send.count == 0 && !send.OnDevice() && send.host == nil {
		send = recv
	}
	if err := checkOperands(send, recv, n, n); err != nil {
		return failed(name, fmt.Errorf("%s: %w", name, err))
	}
	if stream, ok := g.broadcastOrderedOn(send, recv); ok {
		// No buffers for the issue to wait for on the CPU: the call's
		// stream waits for the caller's on the device (broadcastOrdered).
		return g.issue(ctx, inline, name, "broadcast", recv.Bytes(), func(ctx context.Context) error {
			return g.broadcastOrdered(ctx, stream, send, recv, root)
		})
	}
	return g.issue(ctx, inline, name, "broadcast", recv.Bytes(), func(ctx context.Context) error {
		return g.withOperands(ctx, send, recv, n, n, func(s, r comm.Buffer) error {
			return g.cm.Broadcast(ctx, s, r, n, recv.dtype, root)
		})
	}, send, recv)
}

// Barrier returns once every rank has entered it.
func (g *Group) Barrier(ctx context.Context) error { return g.wait(g.barrier(ctx, true)) }

// BarrierAsync issues Barrier and returns at once.
func (g *Group) BarrierAsync(ctx context.Context) *Work { return g.barrier(ctx, false) }

func (g *Group) barrier(ctx context.Context, inline bool) *Work {
	return g.issue(ctx, inline, "barrier", "barrier", 0, func(ctx context.Context) error { return g.cm.Barrier(ctx) })
}

// wait is Wait for the synchronous calls: they return when the collective
// has finished (it is bounded by its own context and deadline).
func (g *Group) wait(w *Work) error {
	<-w.done
	return w.err
}

// checkOperands validates the buffers of a collective: whole elements, one
// dtype, and room for sendN and recvN elements (in place: one buffer, as
// large as the larger).
func checkOperands(send, recv Buffer, sendN, recvN int) error {
	if err := send.check("send"); err != nil {
		return err
	}
	if err := recv.check("receive"); err != nil {
		return err
	}
	if send.dtype != recv.dtype {
		return fmt.Errorf("send is %v, receive %v: %w", send.dtype, recv.dtype, comm.ErrInvalid)
	}
	if same(send, recv) {
		if have, need := min(send.count, recv.count), max(sendN, recvN); have < need {
			return fmt.Errorf("in-place buffer has %d elements, need %d: %w", have, need, comm.ErrInvalid)
		}
		return nil
	}
	if send.count < sendN {
		return fmt.Errorf("send buffer has %d elements, need %d: %w", send.count, sendN, comm.ErrInvalid)
	}
	if recv.count < recvN {
		return fmt.Errorf("receive buffer has %d elements, need %d: %w", recv.count, recvN, comm.ErrInvalid)
	}
	return nil
}
