package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/migctl/migctl/allreduce"
	"github.com/migctl/migctl/comm"
	"github.com/migctl/migctl/trainer"
)

// rankResult is one rank's measurement of one size.
type rankResult struct {
	Seconds float64 `json:"s"`
	Wrong   int64   `json:"wrong"`
}

// benchSizes lists the message sizes of a sweep.
func benchSizes(s benchSpec) []int64 {
	if s.Coll == "barrier" {
		return []int64{0}
	}
	var out []int64
	for b := s.MinBytes; b <= s.MaxBytes; b *= int64(s.Factor) {
		out = append(out, b)
		if b == 0 || s.Factor < 2 {
			break
		}
	}
	return out
}

// geometry returns, for a row of size bytes, the count passed to the
// collective (elements per rank for all-reduce and broadcast, the per-rank
// block for reduce-scatter and all-gather) and the total element count.
func geometry(coll allreduce.Coll, size int64, es, n int) (perCall, total int64) {
	c := size / int64(es)
	switch coll {
	case allreduce.ReduceScatter, allreduce.AllGather:
		return c / int64(n), c / int64(n) * int64(n)
	case allreduce.Barrier:
		return 0, 0
	}
	return c, c
}

// benchGroupOptions turns a spec into the trainer options of one rank. The
// settings every rank must share go to the rendezvous, which fails the job
// when a rank joins with others.
func benchGroupOptions(spec benchSpec, rank int) []trainer.Option {
	opts := []trainer.Option{
		trainer.WithBackend(trainer.Backend(spec.Backend)),
		trainer.WithTransport(trainer.Transport(spec.Transport)),
		trainer.WithAlgorithm(trainer.Algorithm(spec.Algorithm)),
		trainer.WithTuning(trainer.Tuning{Chunk: spec.Chunk, Slots: spec.Slots, Depth: spec.Depth,
			ReduceWorkers: spec.Workers, Spin: spec.Spin, SmallBytes: smallBytes(spec.Small)}),
		trainer.WithTimeout(spec.Timeout),
		trainer.WithShmRoot(spec.ShmRoot),
		trainer.WithJob(spec.Job),
		trainer.WithSettings(map[string]string{
			"bench.coll": spec.Coll, "bench.dtype": spec.DType, "bench.op": spec.Op,
			"bench.minbytes": strconv.FormatInt(spec.MinBytes, 10), "bench.maxbytes": strconv.FormatInt(spec.MaxBytes, 10),
			"bench.factor": strconv.Itoa(spec.Factor), "bench.iters": strconv.Itoa(spec.Iters),
			"bench.warmup": strconv.Itoa(spec.Warmup), "bench.check": strconv.FormatBool(spec.Check),
			"bench.inplace": strconv.FormatBool(spec.InPlace), "bench.root": strconv.Itoa(spec.Root),
			"bench.backend": spec.Backend,
		}),
	}
	if spec.Backend == "gpu" && len(spec.GPUs) > 0 {
		opts = append(opts, trainer.WithDevice(spec.GPUs[max(rank, 0)%len(spec.GPUs)]))
	}
	if spec.ReduceOn != "" {
		opts = append(opts, trainer.WithReduceOn(spec.ReduceOn))
	}
	if spec.Trace != "" && spec.Trace != "0" {
		opts = append(opts, trainer.WithTrace(os.Stderr, spec.Trace == "all"))
	}
	return opts
}

// smallBytes maps --small-bytes (0: never) to the trainer's (negative: never).
func smallBytes(small int) int {
	if small <= 0 {
		return -1
	}
	return small
}

// runRank runs one rank of a benchmark through the trainer SDK. addr ""
// joins the group the environment describes (a rank started by the bench
// launcher); otherwise it joins the rendezvous at addr with token as rank
// (-1: any). Rank 0 returns the merged report; the other ranks return nil.
func runRank(ctx context.Context, spec benchSpec, addr, token string, rank int, progress io.Writer) (*benchReport, error) {
	if spec.Quiet {
		progress = io.Discard
	}
	coll, err := allreduce.ParseColl(spec.Coll)
	if err != nil {
		return nil, err
	}
	dt, err := parseDType(spec.DType)
	if err != nil {
		return nil, err
	}
	op, err := parseOp(spec.Op)
	if err != nil {
		return nil, err
	}
	if addr == "" {
		if r, err := strconv.Atoi(os.Getenv(trainer.EnvRank)); err == nil {
			rank = r
		}
	}
	opts := benchGroupOptions(spec, rank)
	if addr != "" {
		opts = append(opts, trainer.WithRendezvous(addr, token), trainer.WithRank(rank, spec.NP))
	}
	setup, cancel := context.WithTimeout(ctx, spec.Timeout+10*time.Second)
	defer cancel()
	g, err := trainer.Init(setup, opts...)
	if err != nil {
		return nil, err
	}
	defer g.Close()
	r, err := newRankRunner(g, spec, coll, dt, op)
	if err != nil {
		g.Abort(err.Error())
		return nil, err
	}
	defer r.free()

	sizes := benchSizes(spec)
	results := make([]rankResult, len(sizes))
	start := time.Now()
	for i, size := range sizes {
		per, _ := geometry(coll, size, dt.Size(), g.Size())
		if results[i], err = r.measure(ctx, int(per)); err != nil {
			return nil, fmt.Errorf("rank %d, %d bytes: %w", g.Rank(), size, err)
		}
		if g.Rank() == 0 {
			fmt.Fprintf(progress, "bench: %s %d/%d: %d bytes, %.1f us (%.0fs elapsed)\n",
				spec.Coll, i+1, len(sizes), size, results[i].Seconds*1e6, time.Since(start).Seconds())
		}
	}
	return mergeResults(setup, g, spec, coll, dt, sizes, results)
}

// mergeResults gathers every rank's results through the group's store;
// rank 0 returns the report (the slowest rank's time, every rank's wrong
// elements).
func mergeResults(ctx context.Context, g *trainer.Group, spec benchSpec, coll allreduce.Coll, dt comm.DType,
	sizes []int64, results []rankResult) (*benchReport, error) {
	buf, err := json.Marshal(results)
	if err != nil {
		return nil, err
	}
	st := g.Store()
	if err := st.Put(ctx, fmt.Sprintf("bench/result/%d", g.Rank()), buf); err != nil {
		return nil, err
	}
	if g.Rank() != 0 {
		return nil, st.Barrier(ctx, benchDone)
	}
	n := g.Size()
	rep := &benchReport{Coll: spec.Coll, NP: n, Backend: string(g.Backend()), Transport: string(g.Transport()),
		Algorithm: g.Algorithm(), GPUShare: g.GPUShare(), InPlace: spec.InPlace, Iters: spec.Iters}
	for _, size := range sizes {
		_, total := geometry(coll, size, dt.Size(), n)
		row := benchRow{Bytes: total * int64(dt.Size()), Count: total, Type: spec.DType, Op: spec.Op, Root: spec.Root, Wrong: -1}
		if spec.Check {
			row.Wrong = 0
		}
		rep.Results = append(rep.Results, row)
	}
	for q := range n {
		v, err := st.Get(ctx, fmt.Sprintf("bench/result/%d", q))
		if err != nil {
			return nil, err
		}
		var rs []rankResult
		if err := json.Unmarshal(v, &rs); err != nil || len(rs) != len(sizes) {
			return nil, fmt.Errorf("rank %d's results: %v", q, err)
		}
		for i, x := range rs {
			row := &rep.Results[i]
			row.TimeUS = max(row.TimeUS, x.Seconds*1e6)
			if spec.Check {
				row.Wrong += x.Wrong
			}
		}
	}
	for i := range rep.Results {
		row := &rep.Results[i]
		if row.TimeUS > 0 {
			row.AlgBW = float64(row.Bytes) / (row.TimeUS * 1e-6) / 1e9
			row.BusBW = row.AlgBW * busFactor(spec.Coll, n)
		}
	}
	if err := st.Barrier(ctx, benchDone); err != nil {
		return nil, err
	}
	return rep, nil
}

// benchDone is the rendezvous barrier every rank enters once rank 0 has
// merged the results; a launcher that hosts the rendezvous without ranks
// waits for it (as trainer.StorePrefix+benchDone).
const benchDone = "bench/done"

// rankRunner runs one rank's calls of a sweep on buffers of the group's
// device, sized for the largest row.
type rankRunner struct {
	g          *trainer.Group
	spec       benchSpec
	send, recv trainer.Buffer
	coll       allreduce.Coll
	dt         comm.DType
	op         comm.Op
}

func newRankRunner(g *trainer.Group, spec benchSpec, coll allreduce.Coll, dt comm.DType, op comm.Op) (*rankRunner, error) {
	sizes := benchSizes(spec)
	n := g.Size()
	maxPer, _ := geometry(coll, sizes[len(sizes)-1], dt.Size(), n)
	sendN := allreduce.InputLen(coll, n, int(maxPer))
	recvN := allreduce.OutputLen(coll, n, int(maxPer))
	if spec.InPlace {
		sendN = max(sendN, recvN)
	}
	r := &rankRunner{g: g, spec: spec, coll: coll, dt: dt, op: op}
	var err error
	if r.send, err = g.Alloc(sendN, dt); err != nil {
		return nil, fmt.Errorf("allocating %d elements: %w", sendN, err)
	}
	r.recv = r.send
	if !spec.InPlace {
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

func (r *rankRunner) free() {
	_ = r.g.Free(r.send)
	if !r.spec.InPlace {
		_ = r.g.Free(r.recv)
	}
}

// operands are the buffers of a call of count elements per rank.
func (r *rankRunner) operands(count int) (send, recv trainer.Buffer) {
	n := r.g.Size()
	sendN, recvN := allreduce.InputLen(r.coll, n, count), allreduce.OutputLen(r.coll, n, count)
	if r.spec.InPlace {
		m := max(sendN, recvN)
		return r.send.Slice(m), r.send.Slice(m)
	}
	return r.send.Slice(sendN), r.recv.Slice(recvN)
}

func (r *rankRunner) call(ctx context.Context, count int) error {
	send, recv := r.operands(count)
	switch r.coll {
	case allreduce.AllReduce:
		return r.g.AllReduce(ctx, send, recv, r.op)
	case allreduce.ReduceScatter:
		return r.g.ReduceScatter(ctx, send, recv, r.op)
	case allreduce.AllGather:
		return r.g.AllGather(ctx, send, recv)
	case allreduce.Broadcast:
		return r.g.Broadcast(ctx, send, recv, r.spec.Root)
	default:
		return r.g.Barrier(ctx)
	}
}

// fill writes this rank's exactly predictable input (in place: where the
// collective reads it) and poisons the receive buffer.
func (r *rankRunner) fill(ctx context.Context, count int) error {
	n, rank := r.g.Size(), r.g.Rank()
	in := allreduce.Input(r.coll, r.dt, r.op, n, rank, count)
	es := r.dt.Size()
	outBytes := allreduce.OutputLen(r.coll, n, count) * es
	if !r.spec.InPlace && outBytes > 0 {
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
	if r.spec.InPlace && r.coll == allreduce.AllGather {
		dst = dst.Offset(rank * count)
	}
	return r.g.Write(ctx, dst, in)
}

// wrong reads the result back and counts wrong elements.
func (r *rankRunner) wrong(ctx context.Context, count int) (int64, error) {
	if r.coll == allreduce.Barrier {
		return 0, nil
	}
	n, rank := r.g.Size(), r.g.Rank()
	want := allreduce.Expected(r.coll, r.dt, r.op, n, rank, r.spec.Root, count)
	src := r.recv
	if r.spec.InPlace && r.coll == allreduce.ReduceScatter {
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

func (r *rankRunner) measure(ctx context.Context, count int) (rankResult, error) {
	var res rankResult
	if r.spec.Check {
		if err := r.fill(ctx, count); err != nil {
			return res, fmt.Errorf("filling inputs: %w", err)
		}
	}
	for range r.spec.Warmup {
		if err := r.call(ctx, count); err != nil {
			return res, fmt.Errorf("warm-up: %w", err)
		}
	}
	if err := r.g.Barrier(ctx); err != nil {
		return res, err
	}
	t0 := time.Now()
	for range r.spec.Iters {
		if err := r.call(ctx, count); err != nil {
			return res, err
		}
	}
	res.Seconds = time.Since(t0).Seconds() / float64(r.spec.Iters)
	if r.spec.Check {
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
