package main

import (
	"fmt"
	"strconv"
)

// benchRow is one message size of a benchmark.
type benchRow struct {
	Bytes int64 `json:"bytes" yaml:"bytes"`
	// Count is the number of elements of the message (for reduce-scatter
	// and all-gather the whole buffer: np · the per-rank block).
	Count  int64   `json:"count" yaml:"count"`
	Type   string  `json:"type" yaml:"type"`
	Op     string  `json:"op" yaml:"op"`
	Root   int     `json:"root" yaml:"root"`
	TimeUS float64 `json:"timeUs" yaml:"timeUs"`
	// AlgBW is Bytes / time; BusBW scales it by the collective's factor
	// (nccl-tests): all-reduce 2(n-1)/n, reduce-scatter and all-gather
	// (n-1)/n, broadcast 1. GB/s (1e9 bytes).
	AlgBW float64 `json:"algbwGBs" yaml:"algbwGBs"`
	BusBW float64 `json:"busbwGBs" yaml:"busbwGBs"`
	// Wrong counts wrong elements over every rank (-1: not checked).
	Wrong int64 `json:"wrong" yaml:"wrong"`
}

// benchReport is what `migctl bench` prints.
type benchReport struct {
	Coll      string     `json:"coll" yaml:"coll"`
	NP        int        `json:"np" yaml:"np"`
	Backend   string     `json:"backend" yaml:"backend"`
	Transport string     `json:"transport" yaml:"transport"`
	Algorithm string     `json:"algorithm" yaml:"algorithm"`
	InPlace   bool       `json:"inPlace" yaml:"inPlace"`
	Iters     int        `json:"iters" yaml:"iters"`
	Results   []benchRow `json:"rows" yaml:"rows"`
}

// Header implements printer.Tabler.
func (r *benchReport) Header() []string {
	return []string{"size", "count", "type", "op", "root", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong"}
}

// Rows implements printer.Tabler.
func (r *benchReport) Rows() [][]string {
	out := make([][]string, 0, len(r.Results))
	for _, x := range r.Results {
		wrong := "N/A"
		if x.Wrong >= 0 {
			wrong = strconv.FormatInt(x.Wrong, 10)
		}
		root := "-1"
		if r.Coll == "broadcast" {
			root = strconv.Itoa(x.Root)
		}
		out = append(out, []string{strconv.FormatInt(x.Bytes, 10), strconv.FormatInt(x.Count, 10), x.Type, x.Op, root,
			fmt.Sprintf("%.1f", x.TimeUS), fmt.Sprintf("%.2f", x.AlgBW), fmt.Sprintf("%.2f", x.BusBW), wrong})
	}
	return out
}

// verdict fails if any element was wrong.
func (r *benchReport) verdict() error {
	var wrong int64
	for _, x := range r.Results {
		if x.Wrong > 0 {
			wrong += x.Wrong
		}
	}
	if wrong > 0 {
		return fmt.Errorf("bench %s: %d wrong elements", r.Coll, wrong)
	}
	return nil
}

// busFactor is nccl-tests' bus bandwidth factor.
func busFactor(coll string, n int) float64 {
	if n <= 1 && coll != "broadcast" {
		return 0 // one rank moves nothing
	}
	switch coll {
	case "allreduce":
		return 2 * float64(n-1) / float64(n)
	case "reducescatter", "allgather":
		return float64(n-1) / float64(n)
	case "broadcast":
		return 1
	}
	return 0
}
