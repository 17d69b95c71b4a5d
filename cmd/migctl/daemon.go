package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/spf13/cobra"

	ctxmgr "github.com/migctl/migctl/context"
	"github.com/migctl/migctl/context/sched"
	"github.com/migctl/migctl/internal/bytesize"
	"github.com/migctl/migctl/internal/mps"
	"github.com/migctl/migctl/mig"
)

// Environment variables naming the daemon's sockets (the shim reads
// $MIGSWAP_SOCKET too).
const (
	envSwapSocket    = ctxmgr.EnvSwapSocket
	envControlSocket = ctxmgr.EnvControlSocket
)

type daemonOptions struct {
	controlSocket      string
	swapSocket         string
	gpuMemory          string
	headroom           string
	swapTimeout        time.Duration
	rebalanceEvery     time.Duration
	logLevel           string
	node               nodeFlags
	stateFile          string
	metricsAddr        string
	metricsAllowRemote bool
	enableMIG          bool
	gate               string
	policy             string
	quantum            time.Duration
	swapBandwidth      string
	mps                bool
	mpsControl         string
	mpsLowSM           int

	capacity    int64
	bandwidth   int64
	gatePolicy  ctxmgr.GatePolicy
	headroomSet bool
	headroomB   int64
	level       slog.Level
	errOut      io.Writer
}

func newDaemonCmd(s streams) *cobra.Command {
	o := &daemonOptions{errOut: s.ErrOut}
	ctlDefault, swapDefault := ctxmgr.DaemonSockets()
	cmd := &cobra.Command{
		Use:     "daemon",
		Short:   "Run the node context manager: MIG leases (created on demand), swap policy, control API",
		Long:    daemonLong,
		Example: daemonExamples,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.headroomSet = cmd.Flags().Changed("headroom")
			if !cmd.Flags().Changed("enable-mig") {
				o.enableMIG = o.node.sim != "" // a simulated node is yours to reconfigure; a real GPU's mode is the admin's
			}
			if err := o.Complete(); err != nil {
				return err
			}
			if err := o.Validate(); err != nil {
				return err
			}
			return o.Run(cmd.Context())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.controlSocket, "socket", ctlDefault, "control socket for 'migctl swap', 'lease' and 'run' (gRPC; env "+envControlSocket+")")
	f.StringVar(&o.swapSocket, "swap-socket", swapDefault, "socket the shims connect to (env "+envSwapSocket+")")
	f.StringVar(&o.gpuMemory, "gpu-memory", "", "declared memory per device, e.g. 80GiB, instead of NVML (no GPU needed; "+bytesize.Units+")")
	f.StringVar(&o.headroom, "headroom", "256MiB", "memory kept free beyond each need so that a granted allocation really fits (with --gpu-memory: 0 unless given; "+bytesize.Units+")")
	f.DurationVar(&o.swapTimeout, "swap-timeout", 90*time.Second, "longest a swap started by the policy may take before its need is denied")
	f.DurationVar(&o.rebalanceEvery, "rebalance-every", 5*time.Second, "how often to retry swapping jobs back in (0: only on events)")
	f.StringVar(&o.logLevel, "log-level", "info", "debug|info|warn|error")
	o.node.add(cmd)
	f.StringVar(&o.stateFile, "state", "", "lease state file, re-adopted at start (default <sim-state>.leases.json with --sim, else "+
		defaultLeaseState+" for root, $XDG_STATE_HOME/migctl/leases.json for others)")
	f.StringVar(&o.metricsAddr, "metrics-addr", "", "serve Prometheus metrics at http://ADDR/metrics, e.g. 127.0.0.1:9400 (off by default)")
	f.BoolVar(&o.metricsAllowRemote, "metrics-allow-remote", false, "allow a --metrics-addr that is not loopback (the metrics name your jobs)")
	f.BoolVar(&o.mps, "mps", false, "run an MPS control daemon for the shimmed processes, so that their kernels share one GPU context and a higher-priority process's blocks are dispatched first (needs nvidia-cuda-mps-control; whole GPUs, not MIG instances)")
	f.StringVar(&o.mpsControl, "mps-control", mps.DefaultControl, "the MPS control program --mps runs")
	f.IntVar(&o.mpsLowSM, "mps-low-sm", 0, "with --mps: the percentage (1-99) of the SMs a best-effort process (priority 0 or less) may use, so that a higher-priority process's kernels find SMs free (0: no cap)")
	f.StringVar(&o.gate, "gate", "off", "priority launch gating of shimmed processes on one device: off, gate (a lower-priority process's launches wait while a higher one has work in flight) or budget=N (at most N of them in flight meanwhile); add ,depth=M to keep at most M of a lower-priority process's launches in flight at any time (e.g. gate,depth=8)")
	f.StringVar(&o.policy, "policy", sched.NamePriority, "who is resident when shimmed processes do not all fit: "+strings.Join(sched.Names(), "|")+" (see above)")
	f.DurationVar(&o.quantum, "quantum", 10*time.Second, "fair: the shortest turn a process keeps the device (a turn is also at least 20 x its priority's largest swap out and in)")
	f.StringVar(&o.swapBandwidth, "swap-bandwidth", "47GiB", "bytes per second the fair and srf policies assume a swap moves, for a switch's cost ("+bytesize.Units+")")
	f.BoolVar(&o.enableMIG, "enable-mig", false, "let leasing turn MIG on for an idle GPU whose MIG is off, after the GPUs already in MIG mode (default: on with --sim, off on real GPUs)")
	return cmd
}

// defaultLeaseState is root's lease state file.
const defaultLeaseState = "/var/lib/migctl/leases.json"

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func (o *daemonOptions) Complete() error {
	if o.gpuMemory != "" {
		n, err := bytesize.Parse(o.gpuMemory)
		if err != nil {
			return fmt.Errorf("--gpu-memory: %w", err)
		}
		o.capacity = n
	}
	switch {
	case o.headroomSet:
		n, err := bytesize.Parse(o.headroom)
		if err != nil {
			return fmt.Errorf("--headroom: %w", err)
		}
		o.headroomB = n
	case o.gpuMemory == "":
		o.headroomB, _ = bytesize.Parse(o.headroom)
	}
	bw, err := bytesize.Parse(o.swapBandwidth)
	if err != nil {
		return fmt.Errorf("--swap-bandwidth: %w", err)
	}
	o.bandwidth = bw
	if err := o.level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	gp, err := ctxmgr.ParseGatePolicy(o.gate)
	if err != nil {
		return fmt.Errorf("--gate: %w", err)
	}
	o.gatePolicy = gp
	if o.mpsLowSM != 0 && (!o.mps || o.mpsLowSM < 1 || o.mpsLowSM > 99) {
		return fmt.Errorf("--mps-low-sm %d: want a percentage of 1 to 99, with --mps", o.mpsLowSM)
	}
	if o.stateFile == "" {
		switch {
		case o.node.sim != "":
			p, err := o.node.statePath()
			if err != nil {
				return err
			}
			o.stateFile = p + ".leases.json"
		case os.Geteuid() == 0:
			o.stateFile = defaultLeaseState
		default:
			dir := os.Getenv("XDG_STATE_HOME")
			if dir == "" {
				home, err := os.UserHomeDir()
				if err != nil {
					return fmt.Errorf("finding a place for the lease state (set --state): %w", err)
				}
				dir = filepath.Join(home, ".local", "state")
			}
			o.stateFile = filepath.Join(dir, "migctl", "leases.json")
		}
	}
	return nil
}

func (o *daemonOptions) Validate() error {
	switch {
	case o.controlSocket == "" || o.swapSocket == "":
		return errors.New("--socket and --swap-socket must not be empty")
	case o.controlSocket == o.swapSocket:
		return errors.New("--socket and --swap-socket must differ")
	case o.gpuMemory != "" && o.capacity <= 0:
		return errors.New("--gpu-memory must be positive")
	case o.swapTimeout <= 0:
		return errors.New("--swap-timeout must be positive")
	case o.rebalanceEvery < 0:
		return errors.New("--rebalance-every must not be negative")
	case !slices.Contains(sched.Names(), o.policy):
		return fmt.Errorf("--policy %q: want one of %s", o.policy, strings.Join(sched.Names(), ", "))
	case o.quantum <= 0:
		return errors.New("--quantum must be positive")
	case o.bandwidth <= 0:
		return errors.New("--swap-bandwidth must be positive")
	}
	return nil
}

func (o *daemonOptions) Run(ctx context.Context) error {
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(o.errOut, &slog.HandlerOptions{Level: o.level}))

	cfg := ctxmgr.DaemonConfig{
		ControlSocket: o.controlSocket,
		SwapSocket:    o.swapSocket,
		Leases:        ctxmgr.LeaseOptions{StatePath: o.stateFile, EnableMIG: o.enableMIG},
		Swap: ctxmgr.Options{GPUMemory: o.capacity, Headroom: o.headroomB, SwapTimeout: o.swapTimeout,
			RebalanceEvery: o.rebalanceEvery, Gate: o.gatePolicy},
		MetricsAddr:        o.metricsAddr,
		MetricsAllowRemote: o.metricsAllowRemote,
		MPS:                o.mps,
		MPSControl:         o.mpsControl,
		MPSLowSM:           o.mpsLowSM,
		Logger:             log,
	}
	if o.rebalanceEvery == 0 {
		cfg.Swap.RebalanceEvery = -1
	}
	if o.policy != sched.NamePriority {
		p, err := sched.New(o.policy, sched.Config{Quantum: o.quantum,
			Cost: sched.Cost{Bandwidth: float64(o.bandwidth), Fixed: sched.DefaultCost.Fixed}})
		if err != nil {
			return fmt.Errorf("--policy: %w", err)
		}
		cfg.Swap.Sched = ctxmgr.NewScheduler(p)
	}
	memSource := fmt.Sprintf("declared %s per device", ctxmgr.FormatBytes(o.capacity))
	migSource := "none (leasing off)"
	switch {
	case o.node.sim != "":
		src, model, err := simSource(&o.node)
		if err != nil {
			return err
		}
		sock, _ := filepath.Abs(o.controlSocket)
		unlock, err := simLeaseLock(&o.node, "daemon", sock)
		if err != nil {
			return err
		}
		defer unlock()
		cfg.MIG = src
		migSource = "simulated " + o.node.sim
		if o.gpuMemory == "" {
			cfg.Swap.GPUMemory = int64(model.MemoryBytes)
			memSource = fmt.Sprintf("declared %s per device (the simulated %s)", ctxmgr.FormatBytes(cfg.Swap.GPUMemory), model.Name)
		}
	default:
		lib := nvml.New()
		ret := lib.Init()
		if ret != nvml.SUCCESS && o.gpuMemory == "" {
			return fmt.Errorf("NVML is not available (%s): on a machine without a GPU, run 'migctl daemon --sim h200x8' (a simulated node) or declare the memory with --gpu-memory SIZE", nvmlError(lib, ret))
		}
		if ret == nvml.SUCCESS {
			defer lib.Shutdown()
			journal := o.node.journal
			if journal == "" {
				journal = mig.DefaultJournalPath
			}
			cfg.MIG = mig.NewManager(lib, mig.WithJournal(journal))
			migSource = "NVML"
			if o.gpuMemory == "" {
				cfg.Swap.Memory = ctxmgr.NewNVMLMemory(lib)
				memSource = "NVML"
			}
		}
	}
	d, err := ctxmgr.StartDaemon(ctx, cfg)
	if err != nil {
		return err
	}
	args := []any{"swap-socket", d.SwapSocket(), "control-socket", d.ControlSocket(), "mig", migSource, "memory", memSource,
		"headroom", ctxmgr.FormatBytes(o.headroomB), "policy", o.policy}
	if cfg.MIG != nil {
		args = append(args, "lease-state", o.stateFile, "leases", len(d.Leases().List()), "enable-mig", o.enableMIG)
	}
	if a := d.MetricsAddr(); a != "" {
		args = append(args, "metrics", "http://"+a+"/metrics")
	}
	if p := d.MPSPipeDir(); p != "" {
		args = append(args, "mps", p)
	}
	log.Info("migctl daemon ready", args...)
	select {
	case <-ctx.Done():
	case <-d.Done():
	}
	err = d.Close()
	log.Info("migctl daemon stopped")
	return err
}
