package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/migctl/migctl/allreduce"
	"github.com/migctl/migctl/comm"
	"github.com/migctl/migctl/internal/benchrank"
	"github.com/migctl/migctl/internal/bytesize"
	"github.com/migctl/migctl/internal/mps"
	"github.com/migctl/migctl/internal/numa"
	"github.com/migctl/migctl/internal/printer"
	"github.com/migctl/migctl/trainer"
)

type benchOptions struct {
	spec      benchrank.Config
	numa      string
	dtype     string
	sizeMin   string
	sizeMax   string
	check     int
	gpus      string
	chunk     string
	small     string
	rdvAddr   string
	token     string
	rank      int
	listen    string
	local     int
	output    func() (printer.Format, error)
	format    printer.Format
	dt        comm.DType
	streams   streams
	launchNew bool
	mps       string
	mpsCtl    string
	// machine: the figures limits read or measured for the gpu backend,
	// handed to the ranks (trainer.EnvMachine) when they all start here.
	machine *allreduce.Machine
}

func newBenchCmd(s streams) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "bench",
		Short:   "Measure collectives between processes and check their results",
		Long:    benchLong,
		Example: benchExamples,
	}
	for _, c := range []allreduce.Coll{allreduce.AllReduce, allreduce.ReduceScatter, allreduce.AllGather,
		allreduce.Broadcast, allreduce.Barrier} {
		cmd.AddCommand(newBenchCollCmd(s, c))
	}
	cmd.AddCommand(newBenchWorkerCmd(s), newBenchLimitsCmd(s))
	return cmd
}

func newBenchCollCmd(s streams, coll allreduce.Coll) *cobra.Command {
	return benchCollCmd(&benchOptions{streams: s}, coll)
}

// benchCollCmd builds the command of one collective around o, which its
// flags fill (tests parse flags into o and call Complete and Validate
// without running anything).
func benchCollCmd(o *benchOptions, coll allreduce.Coll) *cobra.Command {
	o.spec.Coll = coll.String()
	c := &cobra.Command{
		Use:     coll.String(),
		Short:   fmt.Sprintf("Benchmark %s between N processes", coll),
		Long:    benchLong,
		Example: benchExamples,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.Complete(); err != nil {
				return err
			}
			if err := o.Validate(); err != nil {
				return err
			}
			return o.Run(cmd.Context())
		},
	}
	f := c.Flags()
	f.IntVar(&o.spec.NP, "np", 2, "number of ranks (processes)")
	f.StringVar(&o.spec.Backend, "backend", "host", "where buffers live: host (CPU only) or gpu (CUDA)")
	f.StringVar(&o.spec.Transport, "transport", "auto", "auto, shm (shared host memory, the MIG path) or ipc (CUDA IPC between non-MIG GPUs)")
	f.StringVar(&o.spec.Algorithm, "algo", "auto", "all-reduce algorithm over shm: auto (the cost model's pick from the ranks' GPUs and this host's figures from migctl bench limits, hw/H200.md's with --limits=false), hoststaged, ring or hierarchical")
	f.StringVar(&o.spec.ReduceOn, "reduce-on", "auto", "where host-staged all-reduces reduce: cpu (every rank's CPU threads), gpu (every rank's device, reading the peers' staged inputs from mapped host memory), split:F (the fraction F of every chunk on the devices, the rest on the CPU), split (the cost model's split) or auto (the cost model's pick)")
	f.StringVarP(&o.dtype, "dtype", "d", "float", "element type: float|float32, half|float16, bfloat16|bf16, double|float64, int32, int64, uint8")
	f.StringVar(&o.spec.Op, "op", "sum", "reduction: sum, avg, min, max")
	f.StringVarP(&o.sizeMin, "minbytes", "b", "", "smallest message size, a multiple of the element size (default 8, for reduce-scatter and all-gather at least one element per rank; "+bytesize.Units+")")
	f.StringVarP(&o.sizeMax, "maxbytes", "e", "64MiB", "largest message size, a multiple of the element size (same units as -b)")
	f.IntVarP(&o.spec.Factor, "stepfactor", "f", 2, "multiply the size by this between rows")
	f.IntVarP(&o.spec.Iters, "iters", "n", 20, "timed iterations per size")
	f.IntVarP(&o.spec.Warmup, "warmup_iters", "w", 5, "untimed iterations per size")
	f.IntVarP(&o.check, "check", "c", 0, "1: check every element of every result (one extra call per size)")
	f.BoolVar(&o.spec.InPlace, "inplace", false, "run in place (send buffer = receive buffer)")
	f.IntVar(&o.spec.Split, "split", 1, "all-reduce: time each call as this many asynchronous all-reduces of consecutive parts of the message, issued back to back and then waited for (as DDP issues its gradient buckets)")
	f.StringVar(&o.spec.Chain, "chain", "on", "on: an asynchronous host-staged all-reduce lets the next one start once its copies out are done (its copies back overlap the next one's copies out); off: one at a time (MIGCTL_TUNING=chain=off)")
	f.StringVar(&o.spec.Piece, "piece", "auto", "auto: a host-staged all-reduce of at most slots/4 chunks moves quarter chunks (its copies out, reductions and copies back overlap); chunk: whole chunks always (MIGCTL_TUNING=piece=chunk)")
	f.IntVar(&o.spec.Root, "root", 0, "root rank of broadcast")
	f.StringVar(&o.gpus, "gpu", "0", "CUDA ordinals for the gpu backend, rank r uses entry r mod len (\"0\": every rank on device 0)")
	f.DurationVar(&o.spec.Timeout, "timeout", 60*time.Second, "deadline of each collective call (a dead or stuck rank fails every rank within it)")
	f.StringVar(&o.chunk, "chunk", "auto", "shared-memory slot size (pipeline chunk), a multiple of 4KiB (same units as -b); auto: with --backend gpu 16MiB/np within 1-8MiB (what measured best on H200s), else 4MiB; halved (down to 256KiB) while the arena, (np+1)·slots·chunk, would take over half of --shm-dir")
	f.IntVar(&o.spec.Slots, "slots", 8, "slots per rank in shared memory (pipeline depth)")
	f.StringVar(&o.small, "small-bytes", "64KiB", "all-reduces through shared memory (host-staged, ring, hierarchical) up to this size take the small-message path (one copy each way, one flag round); 0: never (same units as -b)")
	f.StringVar(&o.spec.SmallOn, "small-on", "cpu", "where small-message all-reduces reduce: cpu (every rank sums the staged inputs and copies the result in) or device (every rank's stream waits for the peers' flags itself and reduces their staged inputs from mapped host memory: no CPU step between the copies)")
	f.IntVar(&o.spec.Depth, "depth", 2, "asynchronous copies in flight per lane")
	f.IntVar(&o.spec.Workers, "reduce-workers", 0, "CPU goroutines per rank for host reductions (0: cores / np)")
	f.DurationVar(&o.spec.Spin, "spin", 0, "how long waits poll before they sleep (0: defaults, 20µs for flags, 30µs for device events, 300µs in small messages and barriers when the ranks are at most half the cores)")
	f.StringVar(&o.spec.ShmRoot, "shm-dir", "/dev/shm", "directory of POSIX shared memory")
	f.StringVar(&o.rdvAddr, "rendezvous", "", "join this rendezvous (host:port or unix:///path) as --rank instead of starting ranks")
	f.StringVar(&o.token, "token", "", "job token for --rendezvous / --listen (default: random)")
	f.IntVar(&o.rank, "rank", -1, "rank to take when joining a rendezvous (-1: any)")
	f.StringVar(&o.listen, "listen", "", "host the rendezvous at this address (host:port or unix:///path) instead of a private socket")
	f.IntVar(&o.local, "local", -1, "ranks to start here (-1: all --np); the others join with --rendezvous")
	f.StringVar(&o.mps, "mps", "auto", "ranks sharing a GPU (gpu backend, shm) run under a private MPS server: auto (when it works), on (or fail), off (time-sliced contexts)")
	f.StringVar(&o.mpsCtl, "mps-control", mps.DefaultControl, "the MPS control program --mps runs")
	f.StringVar(&o.numa, "numa", "auto", "place each rank near its GPU on hosts of several NUMA nodes, as migctl run --numa does: auto, on or off")
	f.BoolVarP(&o.spec.Quiet, "quiet", "q", false, "no progress on stderr")
	f.BoolVar(&o.spec.Limits, "limits", true, "print each row's floor for its algorithm, LIMIT(US), and %LIMIT, from the figures of migctl bench limits (measured once, cached; they also choose --algo auto)")
	o.output = outputFlag(c)
	return c
}

// Complete parses flag values.
func (o *benchOptions) Complete() error {
	var err error
	if o.format, err = o.output(); err != nil {
		return err
	}
	if o.dt, err = benchrank.ParseDType(o.dtype); err != nil {
		return err
	}
	o.spec.DType = benchrank.DTypeName(o.dt)
	if _, err = benchrank.ParseOp(o.spec.Op); err != nil {
		return err
	}
	if o.sizeMin == "" {
		// 8 bytes, or one element per rank where each size is split in np
		o.spec.MinBytes = 8
		if o.spec.Coll == allreduce.ReduceScatter.String() || o.spec.Coll == allreduce.AllGather.String() {
			o.spec.MinBytes = max(8, int64(o.dt.Size()*o.spec.NP))
		}
	} else if o.spec.MinBytes, err = bytesize.Parse(o.sizeMin); err != nil {
		return fmt.Errorf("-b: %w", err)
	}
	if o.spec.MaxBytes, err = bytesize.Parse(o.sizeMax); err != nil {
		return fmt.Errorf("-e: %w", err)
	}
	if o.chunk == "auto" {
		// the SDK's default for the backend (trainer: allreduce.Staged
		// for device buffers), stated here so the report can use it
		shmBytes := comm.ShmCapacity(o.spec.ShmRoot)
		if o.spec.Backend == "gpu" {
			o.spec.Chunk, _ = allreduce.Staged(o.spec.NP, shmBytes)
		} else {
			o.spec.Chunk = allreduce.FitShm(o.spec.NP, 4<<20, o.spec.Slots, shmBytes)
		}
	} else {
		chunk, err := bytesize.Parse(o.chunk)
		if err != nil {
			return fmt.Errorf("--chunk: %w", err)
		}
		if chunk > 1<<30 {
			return fmt.Errorf("--chunk %s: at most 1GiB", o.chunk)
		}
		o.spec.Chunk = int(chunk)
	}
	small, err := bytesize.Parse(o.small)
	if err != nil {
		return fmt.Errorf("--small-bytes: %w", err)
	}
	if small > 1<<30 {
		return fmt.Errorf("--small-bytes %s: at most 1GiB", o.small)
	}
	o.spec.Small = int(small)
	o.spec.Trace = os.Getenv("MIGCTL_TRACE")
	o.spec.Check = o.check != 0
	o.spec.GPUs = nil
	for _, g := range strings.Split(o.gpus, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(g))
		if err != nil || n < 0 {
			return fmt.Errorf("--gpu %q: want comma-separated CUDA ordinals", o.gpus)
		}
		o.spec.GPUs = append(o.spec.GPUs, n)
	}
	if o.local < 0 {
		o.local = o.spec.NP
	}
	o.launchNew = o.rdvAddr == ""
	if o.token == "" {
		if !o.launchNew {
			return fmt.Errorf("--rendezvous needs --token")
		}
		b := make([]byte, 16)
		if _, err := rand.Read(b); err != nil {
			return fmt.Errorf("making a job token: %w", err)
		}
		o.token = hex.EncodeToString(b)
	}
	if o.spec.Job == "" {
		// A name of its own, never a piece of the token: job names show in
		// leases, logs and other users' views.
		b := make([]byte, 4)
		if _, err := rand.Read(b); err != nil {
			return fmt.Errorf("making a job name: %w", err)
		}
		o.spec.Job = "bench-" + hex.EncodeToString(b)
	}
	return nil
}

// Validate checks the options before anything starts: every message size
// a rank would be given is whole elements (a size that is not would be
// measured silently smaller), and every rank of a reduce-scatter or
// all-gather gets at least one element.
func (o *benchOptions) Validate() error {
	s := o.spec
	es := int64(o.dt.Size())
	blocked := s.Coll == allreduce.ReduceScatter.String() || s.Coll == allreduce.AllGather.String()
	switch {
	case s.NP < 1 || s.NP > 256:
		return fmt.Errorf("--np %d: want 1..256", s.NP)
	case s.Backend != "host" && s.Backend != "gpu":
		return fmt.Errorf("--backend %q: want host or gpu", s.Backend)
	case s.Transport != "auto" && s.Transport != "shm" && s.Transport != "ipc":
		return fmt.Errorf("--transport %q: want auto, shm or ipc", s.Transport)
	case s.Algorithm != "auto" && s.Algorithm != "hoststaged" && s.Algorithm != "ring" && s.Algorithm != "hierarchical":
		return fmt.Errorf("--algo %q: want auto, hoststaged, ring or hierarchical", s.Algorithm)
	case numa.CheckMode(o.numa) != nil:
		return fmt.Errorf("--numa: %w", numa.CheckMode(o.numa))
	case s.SmallOn != "cpu" && s.SmallOn != "device":
		return fmt.Errorf("--small-on %q: want cpu or device", s.SmallOn)
	case reduceOnInvalid(s.ReduceOn) != nil:
		return fmt.Errorf("--reduce-on: %w", reduceOnInvalid(s.ReduceOn))
	case s.MinBytes < 0 || s.MaxBytes < s.MinBytes:
		return fmt.Errorf("sizes -b %d -e %d: want 0 <= b <= e", s.MinBytes, s.MaxBytes)
	case s.MaxBytes > 64<<30:
		return fmt.Errorf("-e %d: at most 64GiB", s.MaxBytes)
	case s.Coll != allreduce.Barrier.String() && (s.MinBytes%es != 0 || s.MaxBytes%es != 0):
		return fmt.Errorf("sizes -b %d -e %d: want multiples of the %s element size, %d bytes (e.g. -b %d -e %d)",
			s.MinBytes, s.MaxBytes, s.DType, es, roundUp(s.MinBytes, es), roundUp(s.MaxBytes, es))
	case blocked && s.MinBytes > 0 && s.MinBytes < es*int64(s.NP):
		return fmt.Errorf("-b %d: %s splits each size into %d blocks of whole %s elements; want at least %d bytes (one element per rank)",
			s.MinBytes, s.Coll, s.NP, s.DType, es*int64(s.NP))
	case s.Factor < 2 && s.MinBytes != s.MaxBytes:
		return fmt.Errorf("-f %d: want at least 2", s.Factor)
	case s.Split < 1 || s.Split > 1 && s.Coll != allreduce.AllReduce.String():
		return fmt.Errorf("--split %d: want 1, or more for allreduce", s.Split)
	case s.Chain != "on" && s.Chain != "off":
		return fmt.Errorf("--chain %q: want on or off", s.Chain)
	case s.Piece != "auto" && s.Piece != "chunk":
		return fmt.Errorf("--piece %q: want auto or chunk", s.Piece)
	case s.Iters < 1 || s.Warmup < 0:
		return fmt.Errorf("-n %d -w %d: want n >= 1 and w >= 0", s.Iters, s.Warmup)
	case s.Root < 0 || s.Root >= s.NP:
		return fmt.Errorf("--root %d of %d ranks", s.Root, s.NP)
	case s.Timeout <= 0:
		return fmt.Errorf("--timeout %v: want > 0", s.Timeout)
	case s.Chunk < 4096 || s.Chunk%4096 != 0 || s.Chunk < 64*s.NP*8:
		return fmt.Errorf("--chunk %d: want a multiple of 4096 (4KiB) and at least 512·np, e.g. --chunk 4MiB", s.Chunk)
	case s.Slots < 1 || s.Depth < 1:
		return fmt.Errorf("--slots %d --depth %d: want >= 1", s.Slots, s.Depth)
	case s.Backend == "host" && s.Transport == "ipc":
		return fmt.Errorf("--transport ipc needs --backend gpu")
	case !o.launchNew && (o.rank < -1 || o.rank >= s.NP):
		return fmt.Errorf("--rank %d of %d ranks", o.rank, s.NP)
	case o.local < 0 || o.local > s.NP:
		return fmt.Errorf("--local %d of %d ranks", o.local, s.NP)
	case o.local < s.NP && o.listen == "" && o.launchNew:
		return fmt.Errorf("--local %d < --np %d needs --listen so that the other ranks can join", o.local, s.NP)
	case validMPSMode(o.mps) != nil:
		return validMPSMode(o.mps)
	}
	return checkShmDir("--shm-dir", s.ShmRoot)
}

// Run launches (or joins) the ranks, prints the report, and fails if any
// rank failed or any element was wrong.
func (o *benchOptions) Run(ctx context.Context) error {
	if ctx == nil {
		ctx = context.Background()
	}
	defer outliveClosedOutput()()
	var rep *benchReport
	var err error
	var lim func(*benchReport) error
	if o.launchNew || o.rank == 0 {
		lim = o.limits(ctx) // before the ranks start: measuring needs the GPUs idle
	}
	if o.launchNew {
		var j *jobMPS
		if j, err = startJobMPS(ctx, o.mpsRequest()); err != nil {
			return err
		}
		env := j.env()
		if o.machine != nil && o.local == o.spec.NP {
			// Every rank starts here, so every rank sees the same figures
			// (a rank joining from elsewhere would bring none, and the
			// rendezvous would refuse the difference).
			env = append(env, trainer.MachineEnv(*o.machine))
		}
		if o.numa == "off" {
			env = append(env, numa.EnvPlace+"=off")
		}
		l := benchLaunch{listen: o.listen, token: o.token, local: o.local, env: env}
		if gpus := o.spec.GPUs; len(gpus) > 0 {
			var warn string
			l.place, warn = numaPlacer(&nodeFlags{}, o.numa, o.spec.Backend, func(local int) int { return gpus[local%len(gpus)] })
			if warn != "" {
				fmt.Fprintf(o.streams.ErrOut, "bench: warning: %s\n", warn)
			}
		}
		rep, err = launchBench(ctx, o.spec, l, o.streams)
		j.stop()
		if rep != nil {
			rep.MPS = j != nil
		}
	} else {
		rep, err = runRank(ctx, o.spec, o.rdvAddr, o.token, o.rank, o.streams.ErrOut)
	}
	if err != nil {
		return err
	}
	if rep == nil { // a joining rank other than 0, or a launcher without rank 0
		return nil
	}
	if lim != nil {
		if err := lim(rep); err != nil {
			fmt.Fprintf(o.streams.ErrOut, "bench: no LIMIT column: %v\n", err)
		}
	}
	if err := printer.Print(o.streams.Out, o.format, rep); err != nil {
		return err
	}
	return rep.verdict()
}

// roundUp is n rounded up to a multiple of m.
func roundUp(n, m int64) int64 { return (n + m - 1) / m * m }
