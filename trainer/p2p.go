package trainer

import (
	"context"
	"fmt"

	"github.com/migctl/migctl/comm"
)

// p2pPrefix begins the names of the groups that carry point-to-point
// messages; NewGroup refuses it.
const p2pPrefix = "p2p-"

// p2pDepth is how many transfers a link queues before Send or Recv blocks
// its caller (libmigctl has at most 4096 collectives in flight).
const p2pDepth = 4096

// A p2pLink carries the messages of one direction between two ranks: a
// group of the two (formed at the first transfer, named p2p-<from>-<to>
// with ranks in the parent's numbering, the sender its rank 0) and a
// goroutine that runs the transfers one at a time in the order they were
// issued, each a broadcast from the sender. Each direction has its own, so
// two ranks that both send first and receive next do not wait on each
// other, and a transfer waits for its peer only, never for the parent's
// collectives.
type p2pLink struct {
	ops     chan *p2pOp
	stopped chan struct{} // closed when the goroutine has returned
}

type p2pOp struct {
	ctx context.Context
	buf Buffer
	w   *Work
}

type p2pKey struct {
	peer int
	send bool
}

// Send sends buf (its Count elements) to rank peer of g, whose Recv with
// this rank as its peer receives them. It returns once buf may be used
// again: the message is at peer, or in the shared memory of the link
// between them (where it waits for peer's Recv; a large message waits for
// it here). Use SendAsync to go on meanwhile.
//
// Transfers between two ranks in one direction are matched in the order
// they were issued (the k-th Send to a peer with its k-th Recv from this
// rank) and must have the same count and dtype: a mismatch fails the
// receive, the send then or at its next transfer, and every later transfer
// in that direction (g's collectives go on). Each direction between two ranks is a link
// of its own, independent of g's collectives and of other links: a rank may
// send before it receives while its peer does the same, and a transfer
// never waits for a collective of g, nor a collective for a transfer. The
// first transfer in each direction forms the link (a group of the two
// ranks, within ctx's deadline or g's timeout) when both ranks have made
// it. peer is a rank of g other than this one, on this rank's host
// (ErrUnsupported otherwise). Device buffers are read (Send) or written
// (Recv) after the work queued on their stream before the call.
func (g *Group) Send(ctx context.Context, buf Buffer, peer int) error {
	return g.wait(g.transfer(ctx, buf, peer, true))
}

// SendAsync issues Send and returns at once.
func (g *Group) SendAsync(ctx context.Context, buf Buffer, peer int) *Work {
	return g.transfer(ctx, buf, peer, true)
}

// Recv receives into buf (its Count elements) what rank peer of g sends to
// this rank with Send (see there). It returns once buf holds them.
func (g *Group) Recv(ctx context.Context, buf Buffer, peer int) error {
	return g.wait(g.transfer(ctx, buf, peer, false))
}

// RecvAsync issues Recv and returns at once.
func (g *Group) RecvAsync(ctx context.Context, buf Buffer, peer int) *Work {
	return g.transfer(ctx, buf, peer, false)
}

func (g *Group) transfer(ctx context.Context, buf Buffer, peer int, send bool) *Work {
	name, role := "recv", "receive"
	if send {
		name, role = "send", "send"
	}
	switch {
	case peer < 0 || peer >= g.size:
		return failed(name, fmt.Errorf("%s: peer %d of %d ranks: %w", name, peer, g.size, comm.ErrInvalid))
	case peer == g.rank:
		return failed(name, fmt.Errorf("%s: peer %d is this rank itself: %w", name, peer, comm.ErrInvalid))
	case g.peers[peer].Host != g.peers[g.rank].Host:
		return failed(name, fmt.Errorf("%s: rank %d is on host %s, rank %d on %s: transfers between hosts are not supported: %w",
			name, peer, g.peers[peer].Host, g.rank, g.peers[g.rank].Host, ErrUnsupported))
	}
	if err := buf.check(role); err != nil {
		return failed(name, fmt.Errorf("%s: %w", name, err))
	}
	// Ordered now, at the call: the link's goroutine reaches it later.
	buf, err := g.orderNow(buf)
	if err != nil {
		return failed(name, fmt.Errorf("%s: %w", name, err))
	}
	w := &Work{name: name, done: make(chan struct{})}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return failed(name, fmt.Errorf("%s: %w", name, ErrClosed))
	}
	k := p2pKey{peer: peer, send: send}
	l := g.links[k]
	if l == nil {
		l = &p2pLink{ops: make(chan *p2pOp, p2pDepth), stopped: make(chan struct{})}
		if g.links == nil {
			g.links = map[p2pKey]*p2pLink{}
		}
		g.links[k] = l
		go g.runLink(l, k)
	}
	l.ops <- &p2pOp{ctx: ctx, buf: buf, w: w}
	return w
}

// orderNow returns b ordered after the work queued on its stream now (a
// device buffer whose stream this call marks; others as they are).
func (g *Group) orderNow(b Buffer) (Buffer, error) {
	if !b.OnDevice() || b.ordered {
		return b, nil
	}
	events, err := g.recordStreams(b)
	if err != nil {
		return Buffer{}, err
	}
	b.ordered, b.after = true, nil
	if len(events) > 0 {
		b.after = events[0]
	}
	return b, nil
}

// runLink forms link k's group at its first transfer and runs its
// transfers in order until closeLinks closes its queue.
func (g *Group) runLink(l *p2pLink, k p2pKey) {
	defer close(l.stopped)
	from, to := g.rank, k.peer
	if !k.send {
		from, to = to, from
	}
	// The link's own errors number its ranks 0 (sender) and 1.
	what := fmt.Sprintf("send to rank %d (link ranks 0, 1 = ranks %d, %d)", to, from, to)
	if !k.send {
		what = fmt.Sprintf("receive from rank %d (link ranks 0, 1 = ranks %d, %d)", from, from, to)
	}
	var (
		pair    *Group
		err     error
		scratch Buffer // staged receives' device memory (recvStaged), grown as needed
	)
	for op := range l.ops {
		if pair == nil && err == nil {
			name := fmt.Sprintf("%s%d-%d", p2pPrefix, from, to)
			if pair, err = g.newGroup(op.ctx, name, []int{from, to}, true); err != nil {
				err = fmt.Errorf("forming the link between ranks %d and %d: %w", from, to, err)
			}
		}
		if err != nil { // the link never formed: every transfer on it fails
			op.w.finish(fmt.Errorf("%s: %w", what, err))
			continue
		}
		var e error
		switch {
		case k.send:
			e = pair.Broadcast(op.ctx, op.buf, op.buf, 0)
		case g.stageRecv(op.buf):
			e = pair.recvStaged(op.ctx, op.buf, &scratch)
		default: // the receiver has no send buffer: it receives in place
			e = pair.Broadcast(op.ctx, Buffer{}, op.buf, 0)
		}
		if e != nil {
			e = fmt.Errorf("%s: %w", what, e)
		}
		op.w.finish(e)
	}
	if pair != nil {
		if scratch.own != nil {
			_ = pair.Free(scratch)
		}
		_ = pair.Close() // its errors are the transfers'
	}
}

// stageRecv says whether a receive into b goes through scratch (see
// Tuning.RecvDirect): device memory of the caller's whose stream still had
// work to do when the call was made.
func (g *Group) stageRecv(b Buffer) bool {
	if g.cfg.tuning.RecvDirect || b.ptr == 0 || b.after == nil || b.count == 0 {
		return false
	}
	done, err := b.after.Done()
	return err == nil && !done
}

// recvStaged receives the link's next message into scratch device memory
// (g's rank 1 of a link: the receiver; grown into *scratch as needed) while
// the work queued on b's stream before the call runs, then copies it into b
// once that work has finished.
func (g *Group) recvStaged(ctx context.Context, b Buffer, scratch *Buffer) error {
	n := b.Bytes()
	if scratch.Bytes() < n {
		if scratch.own != nil {
			if err := g.Free(*scratch); err != nil {
				return err
			}
			*scratch = Buffer{}
		}
		s, err := g.Alloc(n, Uint8)
		if err != nil {
			return fmt.Errorf("scratch for a staged receive: %w", err)
		}
		*scratch = s
	}
	tmp := Buffer{own: scratch.own, count: b.count, dtype: b.dtype} // the message's type: the calls compare it
	if err := g.Broadcast(ctx, Buffer{}, tmp, 0); err != nil {
		return err
	}
	// b's after event orders the copy (issue waits for it).
	return g.wait(g.issue(ctx, true, "recv", "", 0, func(ctx context.Context) error {
		dst, _, err := g.operand(ctx, "receive", b, n, false)
		if err != nil {
			return err
		}
		if err := g.stream.CopyBuffer(dst, 0, tmp.own, 0, n); err != nil {
			return fmt.Errorf("copying the received message in: %w", err)
		}
		return g.stream.Synchronize(ctx)
	}, b))
}

// closeLinks stops the links once their queued transfers have finished
// (Close: g is closed, no transfer is issued meanwhile; one whose link had
// not formed yet fails with ErrClosed).
func (g *Group) closeLinks() {
	g.mu.Lock()
	links := g.links
	g.links = nil
	g.mu.Unlock()
	for _, l := range links {
		close(l.ops)
	}
	for _, l := range links {
		<-l.stopped
	}
}
