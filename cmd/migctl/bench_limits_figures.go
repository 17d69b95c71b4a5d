package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/migctl/migctl/allreduce"
	"github.com/migctl/migctl/internal/cuda"
	"github.com/migctl/migctl/internal/limits"
	"github.com/migctl/migctl/trainer"
)

// ensureLimits returns this host's figures from the cache at path,
// measuring and caching what is missing (everything with refresh): the
// host's reduction and memory bandwidth, and with backend gpu or auto (when
// CUDA has devices) the GPUs with these ordinals (nil: all), with host
// memory under their DMA. A cache from before the memory figures is
// measured again. It also returns the
// UUIDs of those GPUs. hostOpts shapes the host measurement. A cache that
// cannot be written is reported on progress, not fatal.
func ensureLimits(ctx context.Context, path, backend string, ordinals []int, refresh bool, hostOpts limits.HostOptions,
	progress io.Writer) (limits.Limits, []string, error) {
	host, _ := os.Hostname()
	l, err := limits.Load(path, host)
	if err != nil {
		fmt.Fprintf(progress, "bench: %v; measuring again\n", err)
		l = limits.Limits{}
	}
	changed := false
	if refresh || l.Host.ReduceThreadGiBs <= 0 || l.Host.MemoryGiBs <= 0 {
		fmt.Fprintf(progress, "bench: measuring the host's reduction and memory bandwidth (cached in %s)\n", path)
		if l.Host, err = limits.MeasureHost(ctx, hostOpts); err != nil {
			return l, nil, fmt.Errorf("measuring the host's reduction bandwidth: %w", err)
		}
		changed = true
	}
	var uuids []string
	if backend != "host" {
		api, err := openCUDA()
		switch {
		case err != nil && backend == "gpu":
			return l, nil, fmt.Errorf("measuring GPU limits: %w (without a GPU, use --backend host)", err)
		case err == nil:
			if ordinals == nil {
				n, err := api.DeviceGetCount()
				if err != nil {
					return l, nil, fmt.Errorf("counting CUDA devices: %w", err)
				}
				for i := range n {
					ordinals = append(ordinals, i)
				}
			}
			for _, ord := range ordinals {
				dev, err := api.DeviceGet(ord)
				if err != nil {
					return l, nil, fmt.Errorf("CUDA device %d: %w (see nvidia-smi -L for the ordinals)", ord, err)
				}
				uuid, err := limits.DeviceUUID(api, dev)
				if err != nil {
					return l, nil, fmt.Errorf("reading the UUID of CUDA device %d: %w", ord, err)
				}
				uuids = append(uuids, uuid)
				if g, ok := l.GPU(uuid); ok && !refresh && g.H2DGiBs > 0 && g.HostMemUnderDMAGiBs > 0 {
					continue
				}
				fmt.Fprintf(progress, "bench: measuring pinned copies of CUDA device %d (%s), alone and during CPU reductions\n", ord, uuid)
				opts := limits.GPUOptions{}
				if _, fake := api.(*cuda.Fake); fake {
					// Go memory: keep it small
					opts = limits.GPUOptions{Bytes: 1 << 20, Reps: 1, RoundTrips: 10,
						ContendFor: 100 * time.Millisecond, ContendThreads: 2, ContendBytes: 1 << 20}
				}
				g, err := limits.MeasureGPU(ctx, api, ord, opts)
				if err != nil {
					return l, nil, fmt.Errorf("measuring CUDA device %d: %w", ord, err)
				}
				l.Put(g)
				changed = true
			}
		}
	}
	if changed {
		if err := limits.Save(path, host, l); err != nil {
			fmt.Fprintf(progress, "bench: %v (the figures are not cached)\n", err)
		}
	}
	return l, uuids, nil
}

// openCUDA opens the driver with at least one device (trainer.EnvCUDAFake=1:
// the fake driver, as the ranks do).
func openCUDA() (cuda.Interface, error) {
	var api cuda.Interface
	if os.Getenv(trainer.EnvCUDAFake) == "1" {
		api = cuda.NewFake()
	} else {
		var err error
		if api, err = cuda.Open(); err != nil {
			return nil, err
		}
	}
	if err := api.Init(0); err != nil {
		return nil, fmt.Errorf("initializing CUDA: %w", err)
	}
	n, err := api.DeviceGetCount()
	if err != nil {
		return nil, fmt.Errorf("counting CUDA devices: %w", err)
	}
	if n == 0 {
		return nil, fmt.Errorf("CUDA sees no device")
	}
	return api, nil
}

// limits returns what fills the report's LIMIT column (nil with
// --limits=false): the machine from the cache, measuring what is missing.
// GPUs are measured now, before the ranks start, while they are idle; the
// host, when only it is missing, after the run, once a report exists (a
// failed run measures nothing and is not delayed). A failure to measure is
// reported and leaves the column out.
func (o *benchOptions) limits(ctx context.Context) func(*benchReport) error {
	s := o.spec
	if !s.Limits {
		return nil
	}
	progress := o.streams.ErrOut
	if s.Quiet {
		progress = io.Discard
	}
	path, err := limits.DefaultCachePath()
	if err != nil {
		fmt.Fprintf(progress, "bench: no LIMIT column: %v\n", err)
		return nil
	}
	// Smaller than `bench limits` measures: a first run should not wait.
	hostOpts := limits.HostOptions{Bytes: 32 << 20, Reps: 2, MemoryBytes: 256 << 20}
	measure := func() (allreduce.Machine, string, error) {
		var ordinals []int
		if s.Backend == "gpu" {
			ordinals = uniqueOrdinals(s.GPUs)
		}
		l, uuids, err := ensureLimits(ctx, path, s.Backend, ordinals, false, hostOpts, progress)
		if err != nil {
			return allreduce.Machine{}, "", err
		}
		source := fmt.Sprintf("measured (%s)", path)
		m := l.Machine(allreduce.H200(), uuids)
		if len(uuids) > 0 && os.Getenv(trainer.EnvCUDAFake) == "" {
			// The ranks choose their algorithm on these figures too (not on
			// a fake driver's, nor on the host's alone: no machine of those).
			o.machine = &m
		}
		if s.Backend == "gpu" && len(uuids) == 0 {
			source += "; GPU link from hw/H200.md"
			h := allreduce.H200()
			m.LinkGiBs, m.DuplexGiBs, m.RoundTrip = h.LinkGiBs, h.DuplexGiBs, h.RoundTrip
		}
		return m, source, nil
	}
	var m allreduce.Machine
	var source string
	if s.Backend == "gpu" {
		if m, source, err = measure(); err != nil {
			fmt.Fprintf(progress, "bench: no LIMIT column: %v\n", err)
			return nil
		}
	}
	return func(rep *benchReport) error {
		if s.Backend != "gpu" {
			if m, source, err = measure(); err != nil {
				return err
			}
		}
		groups := make([]int, rep.NP) // the host backend: one group
		if s.Backend == "gpu" && len(s.GPUs) > 0 {
			for r := range groups {
				groups[r] = s.GPUs[r%len(s.GPUs)]
			}
		}
		mm, src := m, source
		if os.Getenv(trainer.EnvReduceStage) == "1" && mm.LinkGiBs > 0 {
			// The device reductions' reads of host memory go through the
			// copy engines (comm.CUDAConfig.StageReduce): at the link's rate.
			mm.DeviceReadGiBs = mm.LinkGiBs
			src += "; " + trainer.EnvReduceStage + "=1: device reads at the link's rate"
		}
		return rep.setLimits(s, mm, src, groups)
	}
}

func uniqueOrdinals(gpus []int) []int {
	var out []int
	for _, g := range gpus {
		if !slices.Contains(out, g) {
			out = append(out, g)
		}
	}
	return out
}
