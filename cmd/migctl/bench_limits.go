package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/migctl/migctl/allreduce"
	"github.com/migctl/migctl/internal/limits"
	"github.com/migctl/migctl/internal/printer"
)

type benchLimitsOptions struct {
	outputOption
	backend string
	gpus    string
	refresh bool
	cache   string
	streams streams
	ordinal []int              // nil: every GPU
	host    limits.HostOptions // zero: MeasureHost's defaults
}

const benchLimitsLong = `Measure, once, what bounds a collective on this machine and print it: per GPU the pinned
host-to-device and device-to-host copy bandwidth (each way alone, both at once) and the median
8 KiB round trip; for the host, the CPU's reduction bandwidth in GiB/s of input read, on one
thread and on every core (float32 sums of 4 inputs), and its memory bandwidth for the CPU alone
(a copy of 512 MiB on every core, bytes read plus bytes written per second).

Host memory under DMA: per GPU, the copies both ways at once run back to back for a second while
every core but one reduces float32 sums of 4 pageable 128 MiB buffers. It prints the copies' rate
then, the CPU's rate (GiB/s of input read), and what host memory moved in all per second: the
copies' writes and reads plus the reductions' reads and writes. A host-staged all-reduce moves
all four kinds at once ((3n+1)·S bytes for n ranks of S bytes), so with one GPU the cost model
takes that total as host memory's cap (binding "hostmem"); with several GPUs it has none (each
GPU was measured alone).

The figures are cached per host and GPU UUID in $XDG_CACHE_HOME/migctl/limits.json
(~/.cache/migctl/limits.json): later calls, and every ` + "`migctl bench`" + ` run, read them there
(--refresh measures again). ` + "`migctl bench`" + ` turns them into each row's LIMIT(US) — the time
the busiest resource needs for the chosen algorithm (docs/collectives.md) — and %LIMIT.
They also choose that algorithm: ` + "`migctl bench`" + ` (when it starts every rank) and a
single-node ` + "`migctl run`" + ` hand them to the ranks (MIGCTL_MACHINE), whose cost model then
weighs this host's link and host memory instead of hw/H200.md's (e.g. 2 ranks on one H200: the
ring where host memory binds host-staged).
Measure on an idle machine: copies and reductions of other processes lower the figures.`

func newBenchLimitsCmd(s streams) *cobra.Command {
	return newBenchLimitsCmdWith(&benchLimitsOptions{streams: s})
}

// newBenchLimitsCmdWith is newBenchLimitsCmd with o's host measurement
// options (tests measure small buffers).
func newBenchLimitsCmdWith(o *benchLimitsOptions) *cobra.Command {
	c := &cobra.Command{
		Use:   "limits",
		Short: "Measure (once, cached) the link, host-reduction and host-memory bandwidth that bound collectives",
		Long:  benchLimitsLong,
		Example: `  migctl bench limits                    # every GPU (none: the host only), cached
  migctl bench limits --gpu 0,1 --refresh  # measure GPUs 0 and 1 again
  migctl bench limits --backend host -o json`,
		Args: cobra.NoArgs,
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
	f.StringVar(&o.backend, "backend", "auto", "auto (GPUs when CUDA has any, else the host only), gpu or host")
	f.StringVar(&o.gpus, "gpu", "all", "CUDA ordinals to measure, comma-separated, or all")
	f.BoolVar(&o.refresh, "refresh", false, "measure again even when cached")
	f.StringVar(&o.cache, "cache", "", "cache file (default $XDG_CACHE_HOME/migctl/limits.json)")
	o.addOutput(c)
	return c
}

// Complete parses flag values.
func (o *benchLimitsOptions) Complete() error {
	var err error
	if o.format, err = o.output(); err != nil {
		return err
	}
	if o.cache == "" {
		if o.cache, err = limits.DefaultCachePath(); err != nil {
			return err
		}
	}
	o.ordinal = nil
	if o.gpus != "all" {
		if o.ordinal, err = parseOrdinals(o.gpus); err != nil {
			return fmt.Errorf("--gpu: %w", err)
		}
	}
	return nil
}

// Validate checks the options.
func (o *benchLimitsOptions) Validate() error {
	if o.backend != "auto" && o.backend != "gpu" && o.backend != "host" {
		return fmt.Errorf("--backend %q: want auto, gpu or host", o.backend)
	}
	return nil
}

// Run measures what is not cached (everything with --refresh) and prints it.
func (o *benchLimitsOptions) Run(ctx context.Context) error {
	if ctx == nil {
		ctx = context.Background()
	}
	l, _, err := ensureLimits(ctx, o.cache, o.backend, o.ordinal, o.refresh, o.host, o.streams.ErrOut)
	if err != nil {
		return err
	}
	return printer.Print(o.streams.Out, o.format, &limitsReport{Limits: l, Cache: o.cache, Machine: l.Machine(allreduce.H200(), nil)})
}

func parseOrdinals(s string) ([]int, error) {
	var out []int
	for _, g := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(g))
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%q: want comma-separated CUDA ordinals", s)
		}
		out = append(out, n)
	}
	return out, nil
}

// limitsReport is what `migctl bench limits` prints.
type limitsReport struct {
	Limits  limits.Limits     `json:"limits" yaml:"limits"`
	Cache   string            `json:"cache" yaml:"cache"`
	Machine allreduce.Machine `json:"machine" yaml:"machine"`
}

// Header implements printer.Tabler.
func (r *limitsReport) Header() []string {
	return []string{"resource", "device", "figure", "measured"}
}

// Rows implements printer.Tabler.
func (r *limitsReport) Rows() [][]string {
	h := r.Limits.Host
	when := h.Measured.Format("2006-01-02 15:04")
	rows := [][]string{
		{"host reduction, 1 thread", h.Hostname, fmt.Sprintf("%.1f GiB/s of input (%d inputs)", h.ReduceThreadGiBs, h.Inputs), when},
		{fmt.Sprintf("host reduction, %d threads", h.Threads), h.Hostname, fmt.Sprintf("%.1f GiB/s of input", h.ReduceHostGiBs), when},
		{fmt.Sprintf("host memory, CPU copy, %d threads", h.Threads), h.Hostname, notMeasured(h.MemoryGiBs,
			fmt.Sprintf("%.1f GiB/s read+written", h.MemoryGiBs)), when},
	}
	for _, g := range r.Limits.GPUs {
		when := g.Measured.Format("2006-01-02 15:04")
		dev := fmt.Sprintf("%d %s", g.Ordinal, g.UUID)
		rows = append(rows,
			[]string{"pinned host→device", dev, fmt.Sprintf("%.1f GiB/s", g.H2DGiBs), when},
			[]string{"pinned device→host", dev, fmt.Sprintf("%.1f GiB/s", g.D2HGiBs), when},
			[]string{"pinned both ways at once", dev, fmt.Sprintf("%.1f GiB/s", g.DuplexGiBs), when},
			[]string{"8 KiB round trip (median)", dev, fmt.Sprintf("%.1f µs", g.RoundTripUS), when},
			[]string{fmt.Sprintf("both ways during CPU reductions (%d threads)", g.ContendedThreads), dev, notMeasured(g.HostMemUnderDMAGiBs,
				fmt.Sprintf("copies %.1f GiB/s, CPU %.1f GiB/s of input", g.ContendedCopyGiBs, g.ContendedReduceGiBs)), when},
			[]string{"host memory under DMA", dev, notMeasured(g.HostMemUnderDMAGiBs,
				fmt.Sprintf("%.1f GiB/s (copies + CPU reads + writes)", g.HostMemUnderDMAGiBs)), when})
	}
	if len(r.Limits.GPUs) == 0 {
		rows = append(rows, []string{"GPU link", "-", fmt.Sprintf("not measured (no GPU); the cost model assumes %.1f GiB/s (hw/H200.md)", r.Machine.LinkGiBs), "-"})
	}
	hostMem := "none (no GPU measured with it, or several GPUs)"
	if r.Machine.HostMemGiBs > 0 {
		hostMem = fmt.Sprintf("%.1f GiB/s", r.Machine.HostMemGiBs)
	}
	return append(rows, []string{"cost model: host memory cap", "-", hostMem, "-"})
}

// notMeasured is s, or a hint when the figure is 0 (a cache from before it).
func notMeasured(figure float64, s string) string {
	if figure <= 0 {
		return "not measured (--refresh measures it)"
	}
	return s
}
