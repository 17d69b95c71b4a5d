package allreduce

import (
	"context"
	"fmt"

	"github.com/migctl/migctl/comm"
)

// Communicator runs collectives for one rank. Every rank must call the same
// collectives in the same order with matching sizes. Not safe for concurrent
// use.
type Communicator struct {
	exec   *Executor
	alg    Algorithm
	cache  map[Params]Schedule
	small  int // small-message all-reduces so far: their parity
	bcasts int // broadcasts so far: their parity (Params.Parity)
	// unpaired: every broadcast stages from slot 0 and so is fenced
	// (SetBroadcastPairs).
	unpaired bool
	// groups is the rank → GPU grouping of a Hierarchical all-reduce.
	groups Grouping
	// gpuShare is Params.GPUShare of host-staged all-reduces (split.go).
	gpuShare int
}

// NewCommunicator runs all-reduce with alg (the other collectives use the
// host-staged schedules, which is all the shm transport offers for them).
func NewCommunicator(exec *Executor, alg Algorithm) *Communicator {
	return &Communicator{exec: exec, alg: alg, cache: map[Params]Schedule{}, gpuShare: exec.opts.GPUShare}
}

// SetGPUShare sets the thousandths of every chunk of a host-staged
// all-reduce that the devices reduce (Params.GPUShare; the executor's
// Options.GPUShare until set). Every rank must set the same.
func (c *Communicator) SetGPUShare(share int) error {
	if share < 0 || share > GPUShareOne {
		return fmt.Errorf("GPU share %d: want 0..%d thousandths: %w", share, GPUShareOne, comm.ErrInvalid)
	}
	c.gpuShare = share
	return nil
}

// SetBroadcastPairs says whether consecutive broadcasts alternate their
// first slot (Params.Parity), so that a one-chunk broadcast right after a
// fenced one needs no fence (the executor's needsFenceAfter): the root of
// two such broadcasts, as DDP issues per forward pass, then waits for no
// one. On by default. Off, every broadcast waits for every rank to have
// finished the call before it, so a point-to-point sender (a broadcast of
// two ranks) learns at its next send that the receiver refused the last.
// Every rank must set the same.
func (c *Communicator) SetBroadcastPairs(on bool) { c.unpaired = !on }

// GPUShare is the thousandths of a host-staged all-reduce's chunks that
// the devices reduce.
func (c *Communicator) GPUShare() int { return c.gpuShare }

// SmallOn says where small-message all-reduces reduce: "cpu", "device"
// (every rank's stream waits for the peers' flags and reduces), or
// "device, flags by the CPU" (Options.SmallOnDevice on a device or
// transport whose streams cannot wait for the flags: the CPU waits and
// writes them, the device reduces).
func (c *Communicator) SmallOn() string {
	switch {
	case !c.exec.opts.SmallOnDevice:
		return "cpu"
	case c.exec.words != nil:
		return "device"
	}
	return "device, flags by the CPU"
}

// SetGroups sets the grouping a Hierarchical all-reduce uses: the ranks
// that share one GPU's host link (every rank must set the same). Without
// one, every rank is its own group (the schedule is then host-staged).
func (c *Communicator) SetGroups(g Grouping) error {
	if len(g) != c.World() {
		return fmt.Errorf("grouping of %d ranks for a world of %d: %w", len(g), c.World(), comm.ErrInvalid)
	}
	c.groups = g
	clear(c.cache)
	return nil
}

// Groups is the grouping of a Hierarchical all-reduce.
func (c *Communicator) Groups() Grouping {
	if len(c.groups) != c.World() {
		return ContiguousGroups(c.World(), 1)
	}
	return c.groups
}

// Rank and World of this communicator.
func (c *Communicator) Rank() int  { return c.exec.tr.Rank() }
func (c *Communicator) World() int { return c.exec.tr.World() }

// Algorithm is the all-reduce algorithm.
func (c *Communicator) Algorithm() Algorithm { return c.alg }

func (c *Communicator) schedule(p Params) (Schedule, error) {
	o := c.exec.opts
	p.World, p.Chunk, p.Slots = c.World(), o.Chunk, o.Slots
	if p.Algorithm == HostStaged && p.Coll == AllReduce && p.GPUShare == 0 && !o.WholeChunks {
		p.Piece = PieceFor(p.Bytes, p.World, p.ElemSize, p.Chunk, p.Slots)
	}
	if s, ok := c.cache[p]; ok {
		return s, nil
	}
	s, err := Build(p)
	if err != nil {
		return Schedule{}, err
	}
	if len(c.cache) > 256 {
		clear(c.cache)
	}
	c.cache[p] = s
	return s, nil
}

func need(b comm.Buffer, n int, what string) error {
	if b == nil {
		return fmt.Errorf("%s buffer is nil: %w", what, comm.ErrInvalid)
	}
	if b.Len() < n {
		return fmt.Errorf("%s buffer has %d bytes, need %d: %w", what, b.Len(), n, comm.ErrInvalid)
	}
	return nil
}

// AllReduce sets recv[0:count] = op over every rank's send[0:count]. send and
// recv may be the same buffer (in place).
func (c *Communicator) AllReduce(ctx context.Context, send, recv comm.Buffer, count int, dt comm.DType, op comm.Op) error {
	s, err := c.allReduce(send, recv, count, dt, op)
	if err != nil {
		return err
	}
	return c.exec.Run(ctx, s, Call{Send: send, Recv: recv, DType: dt, Op: op})
}

// AllReduceOrdered is AllReduce for a caller that orders its own stream
// after the returned event (Executor.RunOrdered): a small all-reduce on the
// devices returns once queued, with the event after which recv holds the
// result; any other returns when done, with a nil event.
func (c *Communicator) AllReduceOrdered(ctx context.Context, send, recv comm.Buffer, count int, dt comm.DType, op comm.Op) (comm.Event, error) {
	s, err := c.allReduce(send, recv, count, dt, op)
	if err != nil {
		return nil, err
	}
	return c.exec.RunOrdered(ctx, s, Call{Send: send, Recv: recv, DType: dt, Op: op})
}

// TakesSmallPath reports whether an all-reduce of bytes per rank through
// the shm algorithm alg goes the small-message way (HostStagedSmall) when
// the executor's SmallBytes is small: every shm algorithm hands it over
// (the ring's 2(n−1) dependent steps cost far more there: 2 ranks on one
// H200, 8 KiB 102 µs against 31–42, 64 KiB 139 against 43); the IPC ring
// has no arena for it.
func TakesSmallPath(alg Algorithm, bytes, small int) bool {
	return (alg == HostStaged || alg == Hierarchical || alg == Ring) && bytes > 0 && bytes <= small
}

// allReduce is the schedule of an all-reduce call.
func (c *Communicator) allReduce(send, recv comm.Buffer, count int, dt comm.DType, op comm.Op) (Schedule, error) {
	n := count * dt.Size()
	if err := need(send, n, "send"); err != nil {
		return Schedule{}, err
	}
	if err := need(recv, n, "receive"); err != nil {
		return Schedule{}, err
	}
	p := Params{Coll: AllReduce, Algorithm: c.alg, Bytes: n, ElemSize: dt.Size(), Avg: op == comm.Avg, InPlace: send == recv}
	if c.alg == Hierarchical {
		p.Groups = c.Groups()
	}
	if TakesSmallPath(c.alg, n, c.exec.opts.SmallBytes) {
		// Small messages: one copy each way and one flag round (every rank
		// reduces all inputs itself); consecutive calls alternate areas.
		p.Algorithm, p.Parity, p.Groups = HostStagedSmall, c.small&1, ""
		// On the devices, but not an unsigned-byte average: the device's
		// byte sum would wrap before the division (the CPU's does not).
		p.SmallOnDevice = c.exec.opts.SmallOnDevice && !(dt == comm.Uint8 && op == comm.Avg)
		c.small++
	}
	if p.Algorithm == HostStaged {
		p.GPUShare = c.gpuShare // reduced on the devices, in part or all (split.go)
	}
	return c.schedule(p)
}

// ReduceScatter sets recv[0:count] = op over every rank's block
// send[rank·count : (rank+1)·count]. In place (send == recv), the result
// lands at send[rank·count:].
func (c *Communicator) ReduceScatter(ctx context.Context, send, recv comm.Buffer, count int, dt comm.DType, op comm.Op) error {
	b := count * dt.Size()
	if err := need(send, b*c.World(), "send"); err != nil {
		return err
	}
	base := 0
	if send == recv {
		base = c.Rank() * b
	}
	if err := need(recv, base+b, "receive"); err != nil {
		return err
	}
	s, err := c.schedule(Params{Coll: ReduceScatter, Algorithm: HostStaged, Bytes: b, ElemSize: dt.Size(),
		Avg: op == comm.Avg, InPlace: send == recv})
	if err != nil {
		return err
	}
	return c.exec.Run(ctx, s, Call{Send: send, Recv: recv, RecvBase: base, DType: dt, Op: op})
}

// AllGather sets recv[q·count : (q+1)·count] = rank q's send[0:count] for
// every q. In place (send == recv), each rank's input sits at
// recv[rank·count:].
func (c *Communicator) AllGather(ctx context.Context, send, recv comm.Buffer, count int, dt comm.DType) error {
	b := count * dt.Size()
	if err := need(recv, b*c.World(), "receive"); err != nil {
		return err
	}
	call := Call{Send: send, Recv: recv, DType: dt, Op: comm.Sum}
	if send == recv {
		// The send block is this rank's block of the receive buffer.
		call.SendBase = c.Rank() * b
	} else if err := need(send, b, "send"); err != nil {
		return err
	}
	s, err := c.schedule(Params{Coll: AllGather, Algorithm: HostStaged, Bytes: b, ElemSize: dt.Size(), InPlace: send == recv})
	if err != nil {
		return err
	}
	return c.exec.Run(ctx, s, call)
}

// Broadcast sets every rank's recv[0:count] to root's send[0:count] (send
// is read on the root only; send == recv is in place).
func (c *Communicator) Broadcast(ctx context.Context, send, recv comm.Buffer, count int, dt comm.DType, root int) error {
	s, err := c.broadcast(send, recv, count, dt, root, false)
	if err != nil {
		return err
	}
	return c.exec.Run(ctx, s, Call{Send: send, Recv: recv, DType: dt, Op: comm.Sum})
}

// BroadcastOrdered is Broadcast for a caller that orders its own stream
// after the returned event (Executor.RunOrdered): a broadcast of at most one
// chunk, on streams that wait for and write the flags themselves, returns
// once queued (after the fence, where it needs one), with the event after
// which recv holds the result; any other returns when done, with a nil
// event. Its flags and slot are Broadcast's, so the ranks of one call may
// mix the two.
//
// after are events of the work that produces send and uses recv before the
// call (the caller's stream): a queued call's stream waits for them on the
// device, any other waits for them on the CPU first.
func (c *Communicator) BroadcastOrdered(ctx context.Context, send, recv comm.Buffer, count int, dt comm.DType, root int, after ...comm.Event) (comm.Event, error) {
	s, err := c.broadcast(send, recv, count, dt, root, true)
	if err != nil {
		return nil, err
	}
	return c.exec.RunOrdered(ctx, s, Call{Send: send, Recv: recv, DType: dt, Op: comm.Sum, After: after})
}

// QueuesBroadcasts reports whether BroadcastOrdered queues broadcasts of
// one chunk on the devices: Options.BroadcastOnDevice, on streams that wait
// for and write the flags themselves.
func (c *Communicator) QueuesBroadcasts() bool {
	return c.exec.opts.BroadcastOnDevice && c.exec.words != nil
}

// QueuedBroadcastBytes is the largest broadcast, in bytes, that
// BroadcastOrdered queues on the devices and returns from before it ran
// (one arena chunk), or 0 where it queues none: QueuesBroadcasts false, or
// a tracing executor (which runs every call to the end).
func (c *Communicator) QueuedBroadcastBytes() int {
	if !c.QueuesBroadcasts() || c.exec.trace != nil {
		return 0
	}
	return c.exec.opts.Chunk
}

// broadcast is the schedule of a broadcast call; onDevice asks for the
// flags on the devices where the executor can (one chunk, stream words).
func (c *Communicator) broadcast(send, recv comm.Buffer, count int, dt comm.DType, root int, onDevice bool) (Schedule, error) {
	b := count * dt.Size()
	if err := need(recv, b, "receive"); err != nil {
		return Schedule{}, err
	}
	if c.Rank() == root {
		if err := need(send, b, "send"); err != nil {
			return Schedule{}, err
		}
	}
	p := Params{Coll: Broadcast, Algorithm: HostStaged, Bytes: b, ElemSize: dt.Size(),
		InPlace: send == recv, Root: root, Parity: c.bcasts & 1}
	p.SmallOnDevice = onDevice && c.QueuesBroadcasts() && b <= c.exec.opts.Chunk
	s, err := c.schedule(p)
	if err != nil {
		return Schedule{}, err
	}
	if !c.unpaired {
		c.bcasts++
	}
	return s, nil
}

// Barrier returns once every rank has entered it.
func (c *Communicator) Barrier(ctx context.Context) error {
	s, err := c.schedule(Params{Coll: Barrier, Algorithm: HostStaged, ElemSize: 1})
	if err != nil {
		return err
	}
	return c.exec.Run(ctx, s, Call{})
}

// AllReduceIPC is AllReduce over the RingIPC schedule: prevSend and prevRecv
// are the previous rank's (rank-1 mod world) send and receive buffers, opened
// through CUDA IPC (comm.IPCDevice.OpenPeerBuffer; with one rank, this rank's
// own). The device's streams must implement comm.BufferReducer.
func (c *Communicator) AllReduceIPC(ctx context.Context, send, recv, prevSend, prevRecv comm.Buffer, count int, dt comm.DType, op comm.Op) error {
	n := count * dt.Size()
	for _, b := range []struct {
		b    comm.Buffer
		what string
	}{{send, "send"}, {recv, "receive"}, {prevSend, "previous rank's send"}, {prevRecv, "previous rank's receive"}} {
		if err := need(b.b, n, b.what); err != nil {
			return err
		}
	}
	s, err := c.schedule(Params{Coll: AllReduce, Algorithm: RingIPC, Bytes: n, ElemSize: dt.Size(),
		Avg: op == comm.Avg, InPlace: send == recv})
	if err != nil {
		return err
	}
	return c.exec.Run(ctx, s, Call{Send: send, Recv: recv, DType: dt, Op: op, PeerSend: prevSend, PeerRecv: prevRecv})
}
