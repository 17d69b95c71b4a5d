package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/migctl/migctl/allreduce"
	"github.com/migctl/migctl/comm"
	"github.com/migctl/migctl/comm/rendezvous"
	"github.com/migctl/migctl/comm/shm"
)

// errIPCNotImplemented: what the IPC transport cannot do (here).
var errIPCNotImplemented = errors.New("not available over CUDA IPC")

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

func openBenchDevice(spec benchSpec, rank int) (comm.Device, rendezvous.Peer, error) {
	host, _ := os.Hostname()
	self := rendezvous.Peer{Host: host, PID: os.Getpid()}
	if spec.Backend == "host" {
		self.GPUUUID = "host:" + host // every host-backend rank shares one virtual GPU
		self.ParentGPUUUID = self.GPUUUID
		return comm.NewHostDevice(comm.HostOptions{ReduceWorkers: spec.Workers}), self, nil
	}
	ord := spec.GPUs[rank%len(spec.GPUs)]
	dev, err := openGPUDevice(ord)
	if err != nil {
		return nil, self, fmt.Errorf("opening CUDA device %d for rank %d: %w", ord, rank, err)
	}
	self.GPUUUID = fmt.Sprintf("cuda:%d", ord)
	self.ParentGPUUUID = self.GPUUUID
	if td, ok := dev.(comm.TopologyDevice); ok {
		t := td.Topology()
		self.GPUUUID, self.MIG = t.UUID, t.MIG
		self.ParentGPUUUID = t.ParentUUID
		if t.PCIBusID != "" {
			self.ParentGPUUUID = "pci:" + t.PCIBusID
		}
	}
	return dev, self, nil
}

// chooseAlgorithm picks the transport and all-reduce algorithm from the
// topology the rendezvous reported.
func chooseAlgorithm(spec benchSpec, dev comm.Device, top rendezvous.Topology) (transport string, alg allreduce.Algorithm, err error) {
	transport = spec.Transport
	if transport == "auto" {
		transport = "shm"
		if _, ok := dev.(comm.IPCDevice); ok && spec.Backend == "gpu" && !top.AnyMIG && !top.SameGPU && top.SameHost {
			transport = "ipc"
		}
	}
	if transport == "ipc" {
		if _, ok := dev.(comm.IPCDevice); !ok {
			return "", 0, fmt.Errorf("--transport ipc: the %s device cannot share buffers through CUDA IPC: %w", spec.Backend, errIPCNotImplemented)
		}
		if top.AnyMIG {
			return "", 0, fmt.Errorf("--transport ipc: CUDA IPC does not work between MIG instances; use --transport shm")
		}
		if spec.Coll != "allreduce" && spec.Coll != "barrier" {
			return "", 0, fmt.Errorf("--transport ipc runs allreduce only; use --transport shm for %s: %w", spec.Coll, errIPCNotImplemented)
		}
		if !top.SameHost {
			return "", 0, fmt.Errorf("--transport ipc needs every rank on one host")
		}
		return transport, allreduce.RingIPC, nil
	}
	if !top.SameHost {
		return "", 0, fmt.Errorf("the shm transport needs every rank on one host")
	}
	switch spec.Algorithm {
	case "ring":
		alg = allreduce.Ring
	case "hoststaged":
		alg = allreduce.HostStaged
	default:
		alg = allreduce.Ring
		if top.SameGPU || spec.Backend == "host" {
			alg = allreduce.HostStaged
		}
	}
	return transport, alg, nil
}

// runRank runs one rank of a benchmark. Rank 0 returns the merged report;
// the other ranks return nil.
func runRank(ctx context.Context, spec benchSpec, addr, token string, rank int, progress io.Writer) (rep *benchReport, err error) {
	errOut := progress
	if spec.Quiet {
		progress = io.Discard
	}
	setup, cancel := context.WithTimeout(ctx, spec.Timeout+30*time.Second)
	defer cancel()
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
	client, err := rendezvous.Dial(addr, token)
	if err != nil {
		return nil, err
	}
	defer client.Close()
	defer func() {
		if err != nil {
			// Release ranks blocked in the rendezvous (say, waiting for a
			// segment this rank failed to create).
			actx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_ = client.Abort(actx, err.Error())
		}
	}()
	dev, self, err := openBenchDevice(spec, max(rank, 0))
	if err != nil {
		return nil, err
	}
	defer dev.Close()
	m, err := client.Register(setup, rank, self)
	if err != nil {
		return nil, err
	}
	rank, n := m.Rank, m.World
	transport, alg, err := chooseAlgorithm(spec, dev, m.Topology)
	if err != nil {
		return nil, fmt.Errorf("rank %d: %w", rank, err)
	}
	opts := allreduce.Options{Chunk: spec.Chunk, Slots: spec.Slots, Depth: spec.Depth, ReduceWorkers: spec.Workers, EventSpin: spec.Spin,
		SmallBytes: spec.Small}
	if spec.Small <= 0 {
		opts.SmallBytes = -1
	}
	if spec.Trace != "" && spec.Trace != "0" && (rank == 0 || spec.Trace == "all") {
		opts.Trace = errOut
	}
	layout := shm.Layout{World: n, Flags: n * allreduce.FlagsPerRank, DataBytes: allreduce.ArenaBytes(n, spec.Chunk, spec.Slots)}
	job, err := comm.JoinShm(setup, client, rank, spec.Job, spec.ShmRoot, layout)
	if err != nil {
		return nil, fmt.Errorf("rank %d: %w", rank, err)
	}
	defer job.Close()
	tr, err := comm.NewShmTransport(job.Control, rank, comm.ShmOptions{Spin: spec.Spin})
	if err != nil {
		return nil, err
	}
	defer tr.Close()
	exec, err := allreduce.NewExecutor(dev, tr, opts)
	if err != nil {
		return nil, fmt.Errorf("rank %d: %w", rank, err)
	}
	defer exec.Close()
	cm := allreduce.NewCommunicator(exec, alg)

	sizes := benchSizes(spec)
	es := dt.Size()
	maxPer, _ := geometry(coll, sizes[len(sizes)-1], es, n)
	sendBytes := int(allreduce.InputLen(coll, n, int(maxPer))) * es
	recvBytes := int(allreduce.OutputLen(coll, n, int(maxPer))) * es
	if spec.InPlace {
		sendBytes = max(sendBytes, recvBytes)
	}
	send, err := dev.Alloc(max(sendBytes, 1))
	if err != nil {
		return nil, fmt.Errorf("rank %d: allocating %d bytes: %w", rank, sendBytes, err)
	}
	recv := send
	if !spec.InPlace {
		if recv, err = dev.Alloc(max(recvBytes, 1)); err != nil {
			return nil, fmt.Errorf("rank %d: allocating %d bytes: %w", rank, recvBytes, err)
		}
	}
	stream, err := dev.NewStream()
	if err != nil {
		return nil, err
	}
	defer stream.Close()
	r := &rankRunner{spec: spec, cm: cm, stream: stream, send: send, recv: recv, coll: coll, dt: dt, op: op, rank: rank, n: n}
	if alg == allreduce.RingIPC {
		ipc := dev.(comm.IPCDevice) // chooseAlgorithm checked
		peers, err := comm.ExchangeIPC(setup, client, ipc, rank, n, "bench", send, recv)
		if err != nil {
			return nil, fmt.Errorf("rank %d: %w", rank, err)
		}
		defer peers.Close()
		r.prevSend, r.prevRecv = peers.Bufs[0], peers.Bufs[1]
		// Everyone has opened everyone's buffers before anyone frees theirs.
		defer func() { _ = client.Barrier(setup, "bench/ipc-closed") }()
	}

	results := make([]rankResult, len(sizes))
	start := time.Now()
	for i, size := range sizes {
		per, _ := geometry(coll, size, es, n)
		if results[i], err = r.measure(ctx, int(per)); err != nil {
			return nil, fmt.Errorf("rank %d, %d bytes: %w", rank, size, err)
		}
		if rank == 0 {
			fmt.Fprintf(progress, "bench: %s %d/%d: %d bytes, %.1f us (%.0fs elapsed)\n",
				spec.Coll, i+1, len(sizes), size, results[i].Seconds*1e6, time.Since(start).Seconds())
		}
	}
	// Merge: the slowest rank's time, every rank's wrong elements.
	buf, err := json.Marshal(results)
	if err != nil {
		return nil, err
	}
	if err := client.Put(setup, fmt.Sprintf("bench/result/%d", rank), buf); err != nil {
		return nil, err
	}
	if rank != 0 {
		return nil, client.Barrier(setup, "bench/done")
	}
	rep = &benchReport{Coll: spec.Coll, NP: n, Backend: spec.Backend, Transport: transport, Algorithm: alg.String(),
		InPlace: spec.InPlace, Iters: spec.Iters}
	for i, size := range sizes {
		_, total := geometry(coll, size, es, n)
		bytes := total * int64(es)
		rep.Results = append(rep.Results, benchRow{Bytes: bytes, Count: total, Type: spec.DType, Op: spec.Op, Root: spec.Root, Wrong: -1})
		if spec.Check {
			rep.Results[i].Wrong = 0
		}
	}
	for q := range n {
		v, err := client.Get(setup, fmt.Sprintf("bench/result/%d", q))
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
	if err := client.Barrier(setup, "bench/done"); err != nil {
		return nil, err
	}
	return rep, nil
}

type rankRunner struct {
	spec       benchSpec
	cm         *allreduce.Communicator
	stream     comm.Stream
	send, recv comm.Buffer
	coll       allreduce.Coll
	prevSend   comm.Buffer // the previous rank's buffers (IPC ring only)
	prevRecv   comm.Buffer
	dt         comm.DType
	op         comm.Op
	rank, n    int
}

func (r *rankRunner) call(ctx context.Context, count int) error {
	ctx, cancel := context.WithTimeout(ctx, r.spec.Timeout)
	defer cancel()
	switch r.coll {
	case allreduce.AllReduce:
		if r.prevSend != nil {
			return r.cm.AllReduceIPC(ctx, r.send, r.recv, r.prevSend, r.prevRecv, count, r.dt, r.op)
		}
		return r.cm.AllReduce(ctx, r.send, r.recv, count, r.dt, r.op)
	case allreduce.ReduceScatter:
		return r.cm.ReduceScatter(ctx, r.send, r.recv, count, r.dt, r.op)
	case allreduce.AllGather:
		return r.cm.AllGather(ctx, r.send, r.recv, count, r.dt)
	case allreduce.Broadcast:
		return r.cm.Broadcast(ctx, r.send, r.recv, count, r.dt, r.spec.Root)
	default:
		return r.cm.Barrier(ctx)
	}
}

// fill writes this rank's exactly predictable input (in place: where the
// collective reads it) and poisons the receive buffer.
func (r *rankRunner) fill(ctx context.Context, count int) error {
	in := allreduce.Input(r.coll, r.dt, r.op, r.n, r.rank, count)
	es := r.dt.Size()
	outBytes := allreduce.OutputLen(r.coll, r.n, count) * es
	if !r.spec.InPlace && outBytes > 0 {
		poison := make([]byte, outBytes)
		for i := range poison {
			poison[i] = 0xA5
		}
		if err := r.stream.CopyFromHost(r.recv, 0, poison); err != nil {
			return err
		}
	}
	off := 0
	if r.spec.InPlace && r.coll == allreduce.AllGather {
		off = r.rank * count * es
	}
	if len(in) > 0 {
		if err := r.stream.CopyFromHost(r.send, off, in); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, r.spec.Timeout)
	defer cancel()
	return r.stream.Synchronize(ctx)
}

// wrong reads the result back and counts wrong elements.
func (r *rankRunner) wrong(ctx context.Context, count int) (int64, error) {
	if r.coll == allreduce.Barrier {
		return 0, nil
	}
	es := r.dt.Size()
	want := allreduce.Expected(r.coll, r.dt, r.op, r.n, r.rank, r.spec.Root, count)
	off := 0
	if r.spec.InPlace && r.coll == allreduce.ReduceScatter {
		off = r.rank * count * es
	}
	got := make([]byte, len(want))
	if len(got) > 0 {
		if err := r.stream.CopyToHost(got, r.recv, off); err != nil {
			return 0, err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, r.spec.Timeout)
	defer cancel()
	if err := r.stream.Synchronize(ctx); err != nil {
		return 0, err
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
	if err := r.barrier(ctx); err != nil {
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

func (r *rankRunner) barrier(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, r.spec.Timeout)
	defer cancel()
	return r.cm.Barrier(ctx)
}
