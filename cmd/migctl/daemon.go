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
	"github.com/migctl/migctl/mig"
	"github.com/migctl/migctl/mig/migsim"
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
		Use:   "daemon",
		Short: "Run the node context manager: MIG leases (created on demand), swap policy, control API",
		Long: `The node context manager. It leases MIG devices to jobs ('migctl lease', 'migctl run'),
creating them when too few are free: it plans a repartition of unleased, idle capacity with
the same planner and journalled apply as 'migctl partition' and never destroys a leased or
busy instance. A lease ends with 'migctl lease release', when the process it was taken for
exits, or (if asked) when the client's connection closes. Leases are kept in a state file
(--state) and re-adopted when the daemon restarts, as long as their processes still run.
On real GPUs it only repartitions GPUs already in MIG mode unless --enable-mig lets it turn
MIG on for an idle GPU (the default with --sim).

It also keeps a registry of the processes that run under the memory-swap shim
(libmigswap.so), decides whose GPU memory is swapped to host when a higher-priority process
needs memory, swaps it back in when memory frees, and serves 'migctl swap'.

Without a GPU, --sim h200x8 runs the daemon on a simulated node (the same one
'migctl partition ... --sim h200x8' shows and changes, state in --sim-state), exactly as on
NVML; its memory budget is then the simulated GPU's unless --gpu-memory says otherwise.

Two Unix sockets, both owner-only (a missing directory is created 0700, the sockets are
0600, and each peer's uid is checked with SO_PEERCRED: only the daemon's uid or root):
  --swap-socket  where shims connect    (default $MIGSWAP_SOCKET, else /run/migctl/migswap.sock
                 for root, $XDG_RUNTIME_DIR/migctl/migswap.sock for other users, or
                 /tmp/migctl-UID/migswap.sock without XDG_RUNTIME_DIR)
  --socket       where 'migctl swap', 'migctl lease' and 'migctl run' connect (default
                 $MIGCTL_SOCKET, else /run/migctl/control.sock for root, control.sock beside
                 the user's swap socket for other users; clients look there too)
Run the daemon and the jobs as the same user (or the daemon as root). A job started while
the daemon is not running simply runs without swapping (the shim passes every call through).

Run a job under the shim (build it with 'make shim'; it lands in bin/):
  LD_PRELOAD=/path/to/libmigswap.so \
  MIGSWAP_JOB=resnet MIGSWAP_PRIORITY=10 \
  MIGSWAP_SOCKET=/run/migctl/migswap.sock \
    python train.py
  MIGSWAP_JOB       job name shown by 'migctl swap status' (default pid-<pid>)
  MIGSWAP_PRIORITY  integer, higher wins (default 0); lower-priority jobs are swapped out
                    (lowest first, then most recently started) when a higher one needs memory
  MIGSWAP_SOCKET    the daemon's --swap-socket, if not the default
  MIGSWAP_CHECKSUM=1 checksum every allocation on swap-out, verify on swap-in
With --gate gate (or budget=N), MIGSWAP_PRIORITY also orders compute: while a process has
launches in flight on a device, the launches of lower-priority processes there wait (or at
most N of theirs stay in flight); 'migctl swap status' shows each one's class and held time.
Separate processes are separate GPU contexts, which the driver time-slices: a high-priority
kernel still waits for the other context's slice (~1.4 ms on an H200) or, at best, a context
switch (~150 us). --mps runs an MPS control daemon for the shimmed processes (pipes in
SWAP-SOCKET.mps; the shim finds it and sets CUDA_MPS_PIPE_DIRECTORY, and
CUDA_MPS_CLIENT_PRIORITY=1, below normal, for processes of priority 0 or less, unless the
process set them; MIGSWAP_MPS=0 opts a process out): their kernels share one context and
the driver dispatches a higher-priority process's blocks first. --mps-low-sm P also caps a
best-effort process at P% of the SMs (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE), so that a
higher-priority process's kernels find SMs free. Whole GPUs only (a MIG instance needs a
control daemon of its own); no GPU setting is changed.
  MIGSWAP_LOG=1     log the shim's decisions to stderr

Free memory comes from NVML (the GPU driver). On a machine without a GPU, or to declare a
smaller budget, give --gpu-memory: then free = that capacity minus what the shimmed
processes on the device report.

Metrics: --metrics-addr 127.0.0.1:9400 serves Prometheus metrics at /metrics (leases,
MIG devices per profile and state, swaps, collective calls the SDK reports); off by
default, and only on a loopback address unless --metrics-allow-remote.

A job that does not run under the shim can still make room: 'migctl swap reserve
--device D --bytes SIZE --priority P' swaps out lower-priority shimmed jobs until SIZE fits.

Scheduling policies (--policy): who is resident when the shimmed processes of a device need
more memory than it has. The others wait swapped out (the swap is the job switch: 16 GiB moved
in ~0.35 s each way on an H200; 10 ms + bytes at --swap-bandwidth in the policy's cost model).
  priority  (default; the behaviour before this flag) a process that needs memory takes it from
            strictly lower priorities, lowest first, then the most recently started; equal
            priorities never preempt each other, and an allocation that cannot fit fails.
  fair      priority between priorities; round robin within one: a process that asks for memory
            gets it from lower priorities, then from those of its own resident longest (never
            from a higher one); then each resident process
            keeps the device for a quantum (at least --quantum, and 20 x the time to swap the
            priority's largest process out and in, so switching stays under ~5%), after which
            the one that has waited longest swaps in. A big process that cannot fit between
            the others makes its priority admit nobody else after one quantum, so waits are
            bounded. Use it for equal-priority jobs that do not all fit: each gets its share.
  srf       priority between priorities; shortest remaining first within one: waiting processes
            swap in by expected time left, and a running one is swapped out for a shorter one
            only when the difference exceeds twice the switch. A process declares its run time
            with MIGSWAP_EXPECTED=90m (or seconds) in its environment; one that does not is
            ranked as a typical one and never preempted by its priority. Lowest average job
            completion time; a long job can wait behind a stream of short ones.
Under fair and srf the policy runs at every event and when a quantum ends. docs/daemon.md has
the simulated job completion times of the three on a recorded 40-job mix (context/sched).`,
		Example: `  # No GPU: a simulated H200 node, sockets in your runtime directory
  migctl daemon --sim h200x8
  migctl lease acquire --job demo --profile 1g.18gb --count 7     # in another shell

  # On a GPU node, as root (sockets in /run/migctl), with metrics:
  sudo migctl daemon --metrics-addr 127.0.0.1:9400

  # As yourself, sockets in your runtime directory, no GPU needed:
  migctl daemon --gpu-memory 80GiB \
    --swap-socket $XDG_RUNTIME_DIR/migctl/migswap.sock \
    --socket $XDG_RUNTIME_DIR/migctl/control.sock

  # Then, in other shells:
  MIGSWAP_SOCKET=$XDG_RUNTIME_DIR/migctl/migswap.sock MIGSWAP_JOB=batch MIGSWAP_PRIORITY=0 \
    LD_PRELOAD=$PWD/bin/libmigswap.so ./my-cuda-program
  migctl swap status --socket $XDG_RUNTIME_DIR/migctl/control.sock

  # Equal-priority jobs that do not fit together take turns of at least a minute:
  migctl daemon --policy fair --quantum 1m
  MIGSWAP_JOB=a LD_PRELOAD=$PWD/bin/libmigswap.so python train_a.py &
  MIGSWAP_JOB=b LD_PRELOAD=$PWD/bin/libmigswap.so python train_b.py &

  # Short jobs first (each declares how long it runs):
  migctl daemon --policy srf
  MIGSWAP_EXPECTED=5m MIGSWAP_JOB=eval LD_PRELOAD=$PWD/bin/libmigswap.so python eval.py`,
		Args: cobra.NoArgs,
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
	f.StringVar(&o.mpsControl, "mps-control", ctxmgr.DefaultMPSControl, "the MPS control program --mps runs")
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

// simSource is a MIG source over the simulated node the flags name: it
// opens the node for each call (so 'migctl partition ... --sim' can use it
// meanwhile) and journals applies where 'partition apply --sim' does. It
// opens the node once first, so a bad --sim fails here. Returns the model too
// (its memory is the default --gpu-memory).
func simSource(f *nodeFlags) (*ctxmgr.ReopeningSource, migsim.Model, error) {
	on, err := f.open()
	if err != nil {
		return nil, migsim.Model{}, err
	}
	journal := on.journal
	model := on.sim.Model()
	on.close()
	return ctxmgr.NewReopeningSource(func() (nvml.Interface, func(), error) {
		on, err := f.open()
		if err != nil {
			return nil, nil, err
		}
		return on.lib, on.close, nil
	}, mig.WithJournal(journal)), model, nil
}

func nvmlError(lib nvml.Interface, ret nvml.Return) (s string) {
	defer func() {
		if recover() != nil { // ErrorString needs the library loaded
			s = fmt.Sprintf("NVML return %d", int(ret))
		}
	}()
	return lib.ErrorString(ret)
}
