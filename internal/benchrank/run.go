package benchrank

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

// DoneBarrier is the rendezvous barrier every rank enters once rank 0 has
// merged the results; a launcher that hosts the rendezvous without ranks
// waits for it (as trainer.StorePrefix+DoneBarrier).
const DoneBarrier = "bench/done"

// Join is how a rank joins its group. The zero Addr joins the group the
// environment describes (a rank started by a launcher: trainer.Init reads
// it); otherwise the rank joins the rendezvous at Addr with Token as Rank
// (-1: any).
type Join struct {
	Addr  string
	Token string
	Rank  int
}

// Report is rank 0's merge of every rank's measurements, one row per
// message size, and what the group chose (trainer.Group).
type Report struct {
	NP        int
	Backend   string
	Transport string
	Algorithm string
	// GPUShare is the thousandths of every chunk of a host-staged
	// all-reduce that the devices reduced (0: the CPU).
	GPUShare int
	// SmallOn is where small all-reduces reduced (trainer.Group.SmallOn).
	SmallOn string
	// SmallH2D is how rank 0 queued small copies in (trainer.Group.SmallH2D).
	SmallH2D string
	Rows     []Row
}

// Row is one message size.
type Row struct {
	// Bytes is the size measured; Count its elements (for reduce-scatter
	// and all-gather the whole buffer: np · the per-rank block).
	Bytes int64
	Count int64
	// TimeUS is the slowest rank's time per call, in microseconds.
	TimeUS float64
	// Wrong counts wrong elements over every rank (-1: not checked).
	Wrong int64
}

// result is one rank's measurement of one size, as it goes through the
// group's store.
type result struct {
	Seconds float64 `json:"s"`
	Wrong   int64   `json:"wrong"`
}

// Run runs one rank of the benchmark cfg, joining its group as join says.
// It blocks until every rank is done or one failed. Rank 0 returns the
// merged report; the other ranks return nil. Rank 0 writes a line per size
// to stderr (none with cfg.Quiet); the trace (cfg.Trace) goes there too.
func Run(ctx context.Context, cfg Config, join Join, stderr io.Writer) (*Report, error) {
	progress := stderr
	if cfg.Quiet {
		progress = io.Discard
	}
	coll, err := allreduce.ParseColl(cfg.Coll)
	if err != nil {
		return nil, err
	}
	dt, err := ParseDType(cfg.DType)
	if err != nil {
		return nil, err
	}
	op, err := ParseOp(cfg.Op)
	if err != nil {
		return nil, err
	}
	rank := join.Rank
	if join.Addr == "" {
		if r, err := strconv.Atoi(os.Getenv(trainer.EnvRank)); err == nil {
			rank = r
		}
	}
	opts := groupOptions(cfg, rank, stderr)
	if join.Addr != "" {
		opts = append(opts, trainer.WithRendezvous(join.Addr, join.Token), trainer.WithRank(rank, cfg.NP))
	}
	setup, cancel := context.WithTimeout(ctx, cfg.Timeout+slack)
	defer cancel()
	g, err := trainer.Init(setup, opts...)
	if err != nil {
		return nil, err
	}
	defer g.Close()
	return run(ctx, g, cfg, coll, dt, op, progress)
}

// slack is what joining, and merging the results, may take beyond the
// collectives' own deadline (a variable for the tests).
var slack = 10 * time.Second

// run runs the sweep on a joined group and merges the results, within
// cfg.Timeout+slack of the sweep's end (not of the join: a sweep may take
// longer than any deadline).
func run(ctx context.Context, g *trainer.Group, cfg Config, coll allreduce.Coll, dt comm.DType, op comm.Op,
	progress io.Writer) (*Report, error) {
	r, err := newRunner(g, cfg, coll, dt, op)
	if err != nil {
		g.Abort(err.Error())
		return nil, err
	}
	defer r.free()

	sizes := sweepSizes(cfg)
	results := make([]result, len(sizes))
	start := time.Now()
	for i, size := range sizes {
		per, _ := geometry(coll, size, dt.Size(), g.Size())
		if results[i], err = r.measure(ctx, int(per)); err != nil {
			return nil, fmt.Errorf("rank %d, %d bytes: %w", g.Rank(), size, err)
		}
		if g.Rank() == 0 {
			fmt.Fprintf(progress, "bench: %s %d/%d: %d bytes, %.1f us (%.0fs elapsed)\n",
				cfg.Coll, i+1, len(sizes), size, results[i].Seconds*1e6, time.Since(start).Seconds())
		}
	}
	mctx, cancel := context.WithTimeout(ctx, cfg.Timeout+slack)
	defer cancel()
	return merge(mctx, g, cfg, coll, dt, sizes, results)
}

// merge gathers every rank's results through the group's store; rank 0
// returns the report.
func merge(ctx context.Context, g *trainer.Group, cfg Config, coll allreduce.Coll, dt comm.DType,
	sizes []int64, results []result) (*Report, error) {
	buf, err := json.Marshal(results)
	if err != nil {
		return nil, err
	}
	st := g.Store()
	if err := st.Put(ctx, fmt.Sprintf("bench/result/%d", g.Rank()), buf); err != nil {
		return nil, err
	}
	if g.Rank() != 0 {
		return nil, st.Barrier(ctx, DoneBarrier)
	}
	n := g.Size()
	perRank := make([][]result, n)
	for q := range n {
		v, err := st.Get(ctx, fmt.Sprintf("bench/result/%d", q))
		if err != nil {
			return nil, err
		}
		var rs []result
		if err := json.Unmarshal(v, &rs); err != nil || len(rs) != len(sizes) {
			return nil, fmt.Errorf("rank %d's results: %v", q, err)
		}
		perRank[q] = rs
	}
	rep := &Report{NP: n, Backend: string(g.Backend()), Transport: string(g.Transport()),
		Algorithm: g.Algorithm(), GPUShare: g.GPUShare(), SmallOn: g.SmallOn(), SmallH2D: g.SmallH2D(), Rows: mergeRows(coll, dt, sizes, cfg.Check, perRank)}
	if err := st.Barrier(ctx, DoneBarrier); err != nil {
		return nil, err
	}
	return rep, nil
}

// mergeRows makes the rows of a sweep of sizes from every rank's results
// (perRank[q][i]: rank q's of size i): each the slowest rank's time and,
// when check, the wrong elements of every rank together (else -1).
func mergeRows(coll allreduce.Coll, dt comm.DType, sizes []int64, check bool, perRank [][]result) []Row {
	n := len(perRank)
	rows := make([]Row, 0, len(sizes))
	for _, size := range sizes {
		_, total := geometry(coll, size, dt.Size(), n)
		row := Row{Bytes: total * int64(dt.Size()), Count: total, Wrong: -1}
		if check {
			row.Wrong = 0
		}
		rows = append(rows, row)
	}
	for _, rs := range perRank {
		for i, x := range rs {
			row := &rows[i]
			row.TimeUS = max(row.TimeUS, x.Seconds*1e6)
			if check {
				row.Wrong += x.Wrong
			}
		}
	}
	return rows
}
