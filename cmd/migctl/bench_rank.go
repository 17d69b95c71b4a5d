package main

import (
	"context"
	"io"

	"github.com/migctl/migctl/internal/benchrank"
)

// runRank runs one rank of a benchmark (internal/benchrank). addr ""
// joins the group the environment describes (a rank started by the bench
// launcher); otherwise it joins the rendezvous at addr with token as rank
// (-1: any). Rank 0 returns the report; the other ranks return nil.
func runRank(ctx context.Context, spec benchrank.Config, addr, token string, rank int, stderr io.Writer) (*benchReport, error) {
	r, err := benchrank.Run(ctx, spec, benchrank.Join{Addr: addr, Token: token, Rank: rank}, stderr)
	if err != nil || r == nil {
		return nil, err
	}
	return newBenchReport(spec, r), nil
}

// newBenchReport is what `migctl bench` prints of rank 0's merged
// measurements r of spec: each row with its bandwidths.
func newBenchReport(spec benchrank.Config, r *benchrank.Report) *benchReport {
	rep := &benchReport{Coll: spec.Coll, NP: r.NP, Backend: r.Backend, Transport: r.Transport,
		Algorithm: r.Algorithm, GPUShare: r.GPUShare, InPlace: spec.InPlace, Iters: spec.Iters, SmallH2D: r.SmallH2D}
	if spec.Split > 1 {
		rep.Split = spec.Split
	}
	if spec.Chain == "off" {
		rep.Chain = "off"
	}
	if spec.Piece == "chunk" {
		rep.Piece = "chunk"
	}
	if r.SmallOn != "cpu" {
		rep.SmallOn = r.SmallOn
	}
	for _, x := range r.Rows {
		row := benchRow{Bytes: x.Bytes, Count: x.Count, Type: spec.DType, Op: spec.Op, Root: spec.Root,
			TimeUS: x.TimeUS, Wrong: x.Wrong}
		if row.TimeUS > 0 {
			row.AlgBW = float64(row.Bytes) / (row.TimeUS * 1e-6) / 1e9
			row.BusBW = row.AlgBW * busFactor(spec.Coll, r.NP)
		}
		rep.Results = append(rep.Results, row)
	}
	return rep
}
