package main

import (
	"fmt"
	"runtime"
	"strconv"

	"github.com/migctl/migctl/allreduce"
	"github.com/migctl/migctl/internal/benchrank"
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
	// LimitUS is the floor of this row for the algorithm that ran: the
	// time the busiest resource (LimitBinding: link, duplex, host, hostmem, p2p,
	// latency) needs on the measured machine (allreduce.Machine.Estimate);
	// PctLimit is LimitUS / TimeUS in percent. 0: no floor (nothing moved).
	LimitUS      float64 `json:"limitUs" yaml:"limitUs"`
	PctLimit     float64 `json:"pctLimit" yaml:"pctLimit"`
	LimitBinding string  `json:"limitBinding,omitempty" yaml:"limitBinding,omitempty"`
	// RowAlgorithm is the schedule this size took (the small-message one
	// up to --small-bytes).
	RowAlgorithm string `json:"rowAlgorithm,omitempty" yaml:"rowAlgorithm,omitempty"`
}

// benchLimits is the machine the LIMIT column assumes, and where its
// figures came from.
type benchLimits struct {
	Source  string            `json:"source" yaml:"source"`
	Machine allreduce.Machine `json:"machine" yaml:"machine"`
	Groups  []int             `json:"groups" yaml:"groups"` // rank → GPU group
	Threads int               `json:"reduceThreads" yaml:"reduceThreads"`
}

// benchReport is what `migctl bench` prints.
type benchReport struct {
	Coll      string `json:"coll" yaml:"coll"`
	NP        int    `json:"np" yaml:"np"`
	Backend   string `json:"backend" yaml:"backend"`
	Transport string `json:"transport" yaml:"transport"`
	Algorithm string `json:"algorithm" yaml:"algorithm"`
	InPlace   bool   `json:"inPlace" yaml:"inPlace"`
	Iters     int    `json:"iters" yaml:"iters"`
	// Split is --split above 1 (each call as that many asynchronous
	// all-reduces of parts), Chain --chain when off, Piece --piece when
	// chunk.
	Split   int        `json:"split,omitempty" yaml:"split,omitempty"`
	Chain   string     `json:"chain,omitempty" yaml:"chain,omitempty"`
	Piece   string     `json:"piece,omitempty" yaml:"piece,omitempty"`
	Results []benchRow `json:"rows" yaml:"rows"`
	// Limits is what the LIMIT(US) column assumes (nil: not computed).
	Limits *benchLimits `json:"limits,omitempty" yaml:"limits,omitempty"`
	// GPUShare is the thousandths of every chunk of a host-staged
	// all-reduce that the devices reduced (--reduce-on; 0: the CPU).
	GPUShare int `json:"gpuShare" yaml:"gpuShare"`
	// SmallOn is where small-message all-reduces reduced (--small-on)
	// when not on the CPU: "device", or "device, flags by the CPU" where
	// the streams could not wait for the flags themselves.
	SmallOn string `json:"smallOn,omitempty" yaml:"smallOn,omitempty"`
	// SmallH2D is how small copies in were queued (gpu backend; rank 0):
	// "2drows" (the copy engines) or "kernel" (a copy kernel; the default
	// from comm.KernelH2DRanks ranks on one CUDA device; MIGCTL_H2D forces).
	SmallH2D string `json:"smallH2D,omitempty" yaml:"smallH2D,omitempty"`
	// MPS says the local ranks ran under a private MPS server (--mps).
	MPS bool `json:"mps,omitempty" yaml:"mps,omitempty"`
}

// Header implements printer.Tabler.
func (r *benchReport) Header() []string {
	return []string{"size", "count", "type", "op", "root", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong", "limit(us)", "%limit"}
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
		limit, pct := "-", "-"
		if x.LimitUS > 0 {
			limit = fmt.Sprintf("%.1f", x.LimitUS)
			if x.LimitUS < 1 {
				limit = fmt.Sprintf("%.3f", x.LimitUS)
			}
			if x.PctLimit > 0 {
				pct = fmt.Sprintf("%.0f%%", x.PctLimit)
			}
		}
		out = append(out, []string{strconv.FormatInt(x.Bytes, 10), strconv.FormatInt(x.Count, 10), x.Type, x.Op, root,
			fmt.Sprintf("%.1f", x.TimeUS), fmt.Sprintf("%.2f", x.AlgBW), fmt.Sprintf("%.2f", x.BusBW), wrong, limit, pct})
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

// setLimits fills every row's floor for the algorithm that ran, on machine
// m (figures from source), with rank r on GPU group groups[r].
func (r *benchReport) setLimits(spec benchrank.Config, m allreduce.Machine, source string, groups []int) error {
	g, err := allreduce.NewGrouping(groups)
	if err != nil {
		return err
	}
	coll, err := allreduce.ParseColl(r.Coll)
	if err != nil {
		return err
	}
	workers := spec.Workers
	if workers <= 0 {
		workers = allreduce.DefaultReduceWorkers(r.NP, runtime.NumCPU())
	}
	r.Limits = &benchLimits{Source: source, Machine: m, Groups: groups, Threads: r.NP * workers}
	small := 0
	if spec.Small > 0 {
		small = min(spec.Small, allreduce.SmallCapacity(r.NP, spec.Chunk, spec.Slots))
	}
	for i := range r.Results {
		x := &r.Results[i]
		alg := rowAlgorithm(coll, r.Algorithm, x.Bytes, small)
		bytes := int(x.Bytes)
		if coll == allreduce.ReduceScatter || coll == allreduce.AllGather {
			bytes /= r.NP
		}
		w := allreduce.Workload{Coll: coll, Algorithm: alg, Groups: g, Bytes: bytes,
			ReduceThreads: r.NP * workers, HostBackend: r.Backend == "host"}
		if coll == allreduce.AllReduce && alg == allreduce.HostStaged {
			w.GPUShare = r.GPUShare
		}
		e, err := m.Estimate(w)
		if err != nil {
			return err
		}
		x.RowAlgorithm = alg.String()
		x.LimitUS = float64(e.Limit.Nanoseconds()) / 1e3
		x.LimitBinding = e.Binding
		x.PctLimit = 0
		if x.TimeUS > 0 && x.LimitUS > 0 {
			x.PctLimit = 100 * x.LimitUS / x.TimeUS
		}
	}
	return nil
}

// reduceOnInvalid checks a --reduce-on value.
func reduceOnInvalid(s string) error {
	_, _, err := allreduce.ParseReduceOn(s)
	return err
}

// rowAlgorithm is the schedule a row of coll took under the group's
// all-reduce algorithm name (trainer.Group.Algorithm): the other
// collectives are host-staged; host-staged and hierarchical all-reduces up
// to small bytes take the small-message schedule.
func rowAlgorithm(coll allreduce.Coll, name string, bytes int64, small int) allreduce.Algorithm {
	if coll != allreduce.AllReduce {
		return allreduce.HostStaged
	}
	alg := allreduce.HostStaged
	switch name {
	case allreduce.Ring.String():
		alg = allreduce.Ring
	case allreduce.RingIPC.String():
		alg = allreduce.RingIPC
	case allreduce.Hierarchical.String():
		alg = allreduce.Hierarchical
	}
	if allreduce.TakesSmallPath(alg, int(bytes), small) {
		alg = allreduce.HostStagedSmall
	}
	return alg
}
