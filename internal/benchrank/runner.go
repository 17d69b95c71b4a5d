package benchrank

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/migctl/migctl/allreduce"
	"github.com/migctl/migctl/comm"
	"github.com/migctl/migctl/trainer"
)

// runner runs one rank's calls of a sweep on buffers of the group's
// device, sized for the largest row.
type runner struct {
	g          *trainer.Group
	cfg        Config
	send, recv trainer.Buffer
	coll       allreduce.Coll
	dt         comm.DType
	op         comm.Op
}

func newRunner(g *trainer.Group, cfg Config, coll allreduce.Coll, dt comm.DType, op comm.Op) (*runner, error) {
	sizes := sweepSizes(cfg)
	n := g.Size()
	maxPer, _ := geometry(coll, sizes[len(sizes)-1], dt.Size(), n)
	sendN := allreduce.InputLen(coll, n, int(maxPer))
	recvN := allreduce.OutputLen(coll, n, int(maxPer))
	if cfg.InPlace {
		sendN = max(sendN, recvN)
	}
	r := &runner{g: g, cfg: cfg, coll: coll, dt: dt, op: op}
	var err error
	if r.send, err = g.Alloc(sendN, dt); err != nil {
		return nil, fmt.Errorf("allocating %d elements: %w", sendN, err)
	}
	r.recv = r.send
	if !cfg.InPlace {
		if r.recv, err = g.Alloc(recvN, dt); err != nil {
			_ = g.Free(r.send)
			return nil, fmt.Errorf("allocating %d elements: %w", recvN, err)
		}
	}
	// The IPC ring runs on these buffers directly (no-op on other transports).
	if coll == allreduce.AllReduce {
		if err := g.RegisterIPC(context.Background(), r.send, r.recv); err != nil {
			r.free()
			return nil, err
		}
	}
	return r, nil
}

func (r *runner) free() {
	_ = r.g.Free(r.send)
	if !r.cfg.InPlace {
		_ = r.g.Free(r.recv)
	}
}

// operands are the buffers of a call of count elements per rank.
func (r *runner) operands(count int) (send, recv trainer.Buffer) {
	n := r.g.Size()
	sendN, recvN := allreduce.InputLen(r.coll, n, count), allreduce.OutputLen(r.coll, n, count)
	if r.cfg.InPlace {
		m := max(sendN, recvN)
		return r.send.Slice(m), r.send.Slice(m)
	}
	return r.send.Slice(sendN), r.recv.Slice(recvN)
}

func (r *runner) call(ctx context.Context, count int) error {
	send, recv := r.operands(count)
	switch r.coll {
	case allreduce.AllReduce:
		if r.cfg.Split > 1 {
			return r.splitAllReduce(ctx, send, recv, count)
		}
		return r.g.AllReduce(ctx, send, recv, r.op)
	case allreduce.ReduceScatter:
		return r.g.ReduceScatter(ctx, send, recv, r.op)
	case allreduce.AllGather:
		return r.g.AllGather(ctx, send, recv)
	case allreduce.Broadcast:
		return r.g.Broadcast(ctx, send, recv, r.cfg.Root)
	default:
		return r.g.Barrier(ctx)
	}
}

// splitAllReduce all-reduces send into recv as Config.Split asynchronous
// calls of consecutive parts, issued back to back, then waits for them all.
func (r *runner) splitAllReduce(ctx context.Context, send, recv trainer.Buffer, count int) error {
	k := r.cfg.Split
	works := make([]*trainer.Work, 0, k)
	for i := range k {
		lo, hi := count*i/k, count*(i+1)/k
		if hi == lo {
			continue
		}
		works = append(works, r.g.AllReduceAsync(ctx, send.Offset(lo).Slice(hi-lo), recv.Offset(lo).Slice(hi-lo), r.op))
	}
	var errs []error
	for _, w := range works {
		if err := w.Wait(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// fill writes this rank's exactly predictable input (in place: where the
// collective reads it) and poisons the receive buffer.
func (r *runner) fill(ctx context.Context, count int) error {
	n, rank := r.g.Size(), r.g.Rank()
	in := allreduce.Input(r.coll, r.dt, r.op, n, rank, count)
	es := r.dt.Size()
	outBytes := allreduce.OutputLen(r.coll, n, count) * es
	if !r.cfg.InPlace && outBytes > 0 {
		poison := make([]byte, outBytes)
		for i := range poison {
			poison[i] = 0xA5
		}
		if err := r.g.Write(ctx, r.recv, poison); err != nil {
			return err
		}
	}
	if len(in) == 0 {
		return nil
	}
	dst := r.send
	if r.cfg.InPlace && r.coll == allreduce.AllGather {
		dst = dst.Offset(rank * count)
	}
	return r.g.Write(ctx, dst, in)
}

// wrong reads the result back and counts wrong elements.
func (r *runner) wrong(ctx context.Context, count int) (int64, error) {
	if r.coll == allreduce.Barrier {
		return 0, nil
	}
	n, rank := r.g.Size(), r.g.Rank()
	want := allreduce.Expected(r.coll, r.dt, r.op, n, rank, r.cfg.Root, count)
	src := r.recv
	if r.cfg.InPlace && r.coll == allreduce.ReduceScatter {
		src = src.Offset(rank * count)
	}
	got := make([]byte, len(want))
	if len(got) > 0 {
		if err := r.g.Read(ctx, got, src); err != nil {
			return 0, err
		}
	}
	return int64(allreduce.Wrong(got, want, r.dt)), nil
}

func (r *runner) measure(ctx context.Context, count int) (result, error) {
	var res result
	if r.cfg.Check {
		if err := r.fill(ctx, count); err != nil {
			return res, fmt.Errorf("filling inputs: %w", err)
		}
	}
	for range r.cfg.Warmup {
		if err := r.call(ctx, count); err != nil {
			return res, fmt.Errorf("warm-up: %w", err)
		}
	}
	if err := r.g.Barrier(ctx); err != nil {
		return res, err
	}
	t0 := time.Now()
	for range r.cfg.Iters {
		if err := r.call(ctx, count); err != nil {
			return res, err
		}
	}
	res.Seconds = time.Since(t0).Seconds() / float64(r.cfg.Iters)
	if r.cfg.Check {
		if err := r.fill(ctx, count); err != nil {
			return res, fmt.Errorf("filling inputs: %w", err)
		}
		if err := r.call(ctx, count); err != nil {
			return res, fmt.Errorf("checked call: %w", err)
		}
		w, err := r.wrong(ctx, count)
		if err != nil {
			return res, fmt.Errorf("reading results: %w", err)
		}
		res.Wrong = w
	}
	return res, nil
}
