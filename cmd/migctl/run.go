package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/migctl/migctl/comm"
	"github.com/migctl/migctl/comm/shm"
	ctxmgr "github.com/migctl/migctl/context"
	"github.com/migctl/migctl/internal/launcher"
	"github.com/migctl/migctl/internal/mps"
	"github.com/migctl/migctl/internal/numa"
	"github.com/migctl/migctl/internal/printer"
	"github.com/migctl/migctl/internal/supervisor"
	"github.com/migctl/migctl/mig"
)

// runOptions are `migctl run`'s flags.
type runOptions struct {
	np           int
	profile      string
	gpus         string
	gpu          int
	node         nodeFlags
	nnodes       int
	nodeRank     int
	rdzvEndpoint string
	maxRestarts  int
	grace        time.Duration
	logDir       string
	tee          string
	job          string
	timeout      time.Duration
	socket       string
	swapSocket   string
	swap         bool
	swapLib      string
	priority     int
	backend      string
	numa         string
	mps          string
	mpsControl   string
	quiet        bool
	outputOption
	streams

	command     []string
	socketGiven bool
	shmDir      string
	prioritySet bool
	gpusSet     bool // --gpus given: an empty value is then an error
	teeV        supervisor.Tee
	ords        []int
}

func newRunCmd(s streams) *cobra.Command {
	o := &runOptions{streams: s}
	cmd := &cobra.Command{
		Use:     "run [flags] -- PROGRAM [ARGS...]",
		Short:   "Launch and supervise the workers of a training job (torchrun's contract, MIG leases)",
		Long:    runLong,
		Example: runExamples,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return errors.New("no program to run: put it after --, e.g. migctl run --np 2 --backend host -- python train.py")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			o.command = args
			o.socketGiven = cmd.Flags().Changed("socket") || os.Getenv(ctxmgr.EnvControlSocket) != ""
			o.prioritySet = cmd.Flags().Changed("priority")
			o.gpusSet = cmd.Flags().Changed("gpus")
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
	f.SetInterspersed(false)
	f.IntVar(&o.np, "np", 1, "workers on this node (torchrun's --nproc-per-node)")
	f.StringVar(&o.profile, "profile", "", "lease one MIG device of this profile per worker from the daemon (e.g. 1g.18gb)")
	f.StringVar(&o.gpus, "gpus", "", "whole GPUs without MIG, by CUDA ordinal (\"0,1\"): workers spread round-robin")
	f.IntVar(&o.gpu, "lease-gpu", -1, "with --profile: lease on this GPU index only (-1: any)")
	o.node.add(cmd)
	f.IntVar(&o.nnodes, "nnodes", 1, "nodes in the job")
	f.IntVar(&o.nodeRank, "node-rank", 0, "this node's rank, 0..nnodes-1")
	f.StringVar(&o.rdzvEndpoint, "rdzv-endpoint", "", "host:port where node 0 hosts the rendezvous (needed with --nnodes > 1)")
	f.IntVar(&o.maxRestarts, "max-restarts", 0, "restart every worker up to this many times after a failure")
	f.DurationVar(&o.grace, "grace", launcher.DefaultGrace, "time between SIGTERM and SIGKILL when workers are stopped")
	f.StringVar(&o.logDir, "log-dir", "", "keep each worker's stdout.log, stderr.log and error.json under DIR/attempt_N/LOCAL_RANK")
	f.StringVar(&o.tee, "tee", "all", "with --log-dir, what still reaches the terminal: none, stdout, stderr or all")
	f.StringVar(&o.shmDir, "shm-dir", "/dev/shm", "directory of the workers' shared-memory segments (MIGCTL_SHM_ROOT; a tmpfs)")
	f.StringVar(&o.job, "job", "", "job name (leases, MIGSWAP_JOB, TORCHELASTIC_RUN_ID; default run-<random>)")
	f.DurationVar(&o.timeout, "timeout", launcher.DefaultTimeout, "collective deadline of the workers (MIGCTL_TIMEOUT)")
	f.StringVar(&o.socket, "socket", os.Getenv(ctxmgr.EnvControlSocket), "the daemon's control socket (env "+ctxmgr.EnvControlSocket+"; default: the user's or root's daemon)")
	f.StringVar(&o.swapSocket, "swap-socket", os.Getenv(ctxmgr.EnvSwapSocket), "with --swap and an external daemon: its shim socket (env "+ctxmgr.EnvSwapSocket+")")
	f.BoolVar(&o.swap, "swap", false, "run the workers under libmigswap.so so the daemon can swap the job out and in as a gang")
	f.StringVar(&o.swapLib, "swap-lib", "", "libmigswap.so to preload (default: next to the migctl binary)")
	f.IntVar(&o.priority, "priority", 0, "with --swap: the job's priority (MIGSWAP_PRIORITY; higher wins)")
	f.StringVar(&o.backend, "backend", "auto", "MIGCTL_BACKEND for the workers: gpu, host, or auto (host with --sim, else gpu)")
	f.StringVar(&o.mps, "mps", "auto", "ranks sharing a whole GPU run under a private MPS server: auto (when the MPS control program is there and works), on (or fail), off (the driver time-slices them)")
	f.StringVar(&o.mpsControl, "mps-control", mps.DefaultControl, "the MPS control program --mps runs")
	f.StringVar(&o.numa, "numa", "auto", "place each worker near its GPU on hosts of several NUMA nodes: auto (memory on the GPU's node; "+
		"CPUs bound to the GPU's too when the job's GPUs span nodes), on (both, always), off")
	f.BoolVarP(&o.quiet, "quiet", "q", false, "no progress lines from migctl itself")
	o.addOutput(cmd)
	return cmd
}

// Complete parses flag values.
func (o *runOptions) Complete() error {
	if err := o.outputOption.Complete(); err != nil {
		return err
	}
	var err error
	if o.teeV, err = supervisor.ParseTee(o.tee); err != nil {
		return err
	}
	if o.gpusSet && strings.TrimSpace(o.gpus) == "" {
		return errors.New("--gpus is empty: give CUDA ordinals like 0,1, or leave --gpus out")
	}
	if o.gpus != "" {
		for _, g := range strings.Split(o.gpus, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(g))
			if err != nil || n < 0 {
				return fmt.Errorf("--gpus %q: want comma-separated CUDA ordinals like 0,1", o.gpus)
			}
			o.ords = append(o.ords, n)
		}
	}
	if o.backend == "auto" {
		o.backend = "gpu"
		if o.node.sim != "" {
			o.backend = "host"
		}
	}
	if o.swap && o.swapLib == "" {
		if self, err := os.Executable(); err == nil {
			o.swapLib = filepath.Join(filepath.Dir(self), "libmigswap.so")
		}
	}
	if o.swapLib != "" {
		if o.swapLib, err = filepath.Abs(o.swapLib); err != nil {
			return fmt.Errorf("--swap-lib: %w", err)
		}
	}
	return nil
}

// Validate checks the flags and the worker program before anything is
// leased or started.
func (o *runOptions) Validate() error {
	switch {
	case o.np < 1:
		return fmt.Errorf("--np %d: give at least 1 worker", o.np)
	case o.profile != "" && o.gpus != "":
		return errors.New("--profile (MIG devices from the daemon) and --gpus (whole GPUs) exclude each other: give one")
	case o.profile == "" && o.gpus == "" && o.backend != "host":
		return errors.New("no devices: give --profile P (MIG devices leased from the daemon), --gpus 0,1 (whole GPUs) or --backend host (none)")
	case o.backend != "gpu" && o.backend != "host":
		return fmt.Errorf("--backend %q: want auto, gpu or host", o.backend)
	case numa.CheckMode(o.numa) != nil:
		return fmt.Errorf("--numa: %w", numa.CheckMode(o.numa))
	case validMPSMode(o.mps) != nil:
		return validMPSMode(o.mps)
	case o.node.sim != "" && o.gpus != "":
		return errors.New("--sim simulates MIG GPUs: use --profile with it, not --gpus")
	case o.nnodes < 1 || o.nodeRank < 0 || o.nodeRank >= o.nnodes:
		return fmt.Errorf("--node-rank %d of --nnodes %d: want 0 <= node-rank < nnodes", o.nodeRank, o.nnodes)
	case o.nnodes > 1 && o.rdzvEndpoint == "":
		return fmt.Errorf("--nnodes %d needs --rdzv-endpoint host:port (where node 0 hosts the rendezvous)", o.nnodes)
	case o.nnodes > 1 && os.Getenv(launcher.EnvJobToken) == "":
		return fmt.Errorf("--nnodes %d needs the same job token on every node: export %s=$(openssl rand -hex 16) before migctl run", o.nnodes, launcher.EnvJobToken)
	case o.maxRestarts < 0:
		return fmt.Errorf("--max-restarts %d: want 0 or more", o.maxRestarts)
	case o.grace <= 0:
		return fmt.Errorf("--grace %v: want a positive duration", o.grace)
	case o.timeout <= 0:
		return fmt.Errorf("--timeout %v: want a positive duration", o.timeout)
	case o.prioritySet && !o.swap:
		return errors.New("--priority is the swap priority: give --swap with it")
	case o.gpu != -1 && o.profile == "":
		return fmt.Errorf("--lease-gpu %d picks the GPU of the MIG devices leased with --profile: give --profile with it", o.gpu)
	case o.rdzvEndpoint != "" && o.nnodes == 1:
		return errors.New("--rdzv-endpoint is where node 0 hosts the rendezvous of a job over several nodes: give --nnodes N with it (one node's rendezvous is a private socket)")
	case o.logDir == "" && o.tee != "all":
		return errors.New("--tee picks what reaches the terminal besides the --log-dir files: give --log-dir with it")
	}
	if err := checkShmDir("--shm-dir", o.shmDir); err != nil {
		return err
	}
	if o.backend == "gpu" {
		// Known to fail in every worker: say so once, before starting them
		// (a directory that cannot be read is left to the workers' errors).
		if fs, err := shm.FSOf(o.shmDir); err == nil && !fs.Memory {
			return fmt.Errorf("--shm-dir %s is on %s: GPU workers pin their shared memory for the copy engines, "+
				"which Linux allows only on a memory file system: give a tmpfs (the default, /dev/shm) or hugetlbfs directory",
				o.shmDir, fs.Name)
		}
	}
	if o.profile != "" {
		if _, err := mig.ParseProfileName(o.profile); err != nil {
			return fmt.Errorf("--profile %q is not a MIG profile name (like 1g.18gb or 3g.71gb): see 'migctl partition profiles'", o.profile)
		}
	}
	if o.swap {
		if _, err := os.Stat(o.swapLib); err != nil {
			return fmt.Errorf("--swap: no %s: build it with 'make shim' or give --swap-lib", o.swapLib)
		}
	}
	if o.rdzvEndpoint != "" {
		if _, _, err := splitHostPort(o.rdzvEndpoint); err != nil {
			return err
		}
	}
	return launcher.CheckCommand(o.command[0], "")
}

func splitHostPort(s string) (string, int, error) {
	i := strings.LastIndex(s, ":")
	if i <= 0 {
		return "", 0, fmt.Errorf("--rdzv-endpoint %q: want host:port", s)
	}
	p, err := strconv.Atoi(s[i+1:])
	if err != nil || p < 1 || p > 65534 {
		return "", 0, fmt.Errorf("--rdzv-endpoint %q: want a port in 1..65534", s)
	}
	return s[:i], p, nil
}

// outliveClosedOutput keeps a launcher (run, bench) alive when the reader of
// its output goes away (migctl run ... | head), so that it still stops its
// workers and removes its sockets and directories: SIGPIPE is caught (not
// ignored, which the workers would inherit), so writes to a closed stdout or
// stderr fail with EPIPE instead of killing migctl. It returns the undo.
func outliveClosedOutput() func() {
	pipe := make(chan os.Signal, 1)
	signal.Notify(pipe, syscall.SIGPIPE)
	return func() { signal.Stop(pipe) }
}

// runSignals are the signals migctl run forwards to its workers.
var runSignals = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2}

// Run obtains the devices (through a daemon, an embedded one with --sim),
// runs the job and prints the summary.
func (o *runOptions) Run(ctx context.Context) error {
	if ctx == nil {
		ctx = context.Background()
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, runSignals...)
	defer signal.Stop(sigs)
	defer outliveClosedOutput()()

	cfg := launcher.Config{
		Command: o.command, NProc: o.np, NNodes: o.nnodes, NodeRank: o.nodeRank, RdzvEndpoint: o.rdzvEndpoint,
		Job: o.job, Token: os.Getenv(launcher.EnvJobToken), Backend: o.backend, Timeout: o.timeout,
		MaxRestarts: o.maxRestarts, Grace: o.grace, LogDir: o.logDir, Tee: o.teeV,
		Stdout: o.Out, Stderr: o.ErrOut, Signals: sigs, ShmRoot: o.shmDir,
	}
	if !o.quiet {
		cfg.Log = o.ErrOut
	}
	var swapSocket string
	var gpus launcher.RoundRobin // the GPUs of --gpus (nil: leased MIG instances)
	switch {
	case o.gpus != "":
		devs, err := gpuDevices(o.ords, o.backend)
		if err != nil {
			return err
		}
		cfg.Devices, gpus = devs, devs
		// No leases, but a daemon may still be there to preempt the job:
		// the workers follow its swaps (and report to it) through the socket.
		if o.socketGiven {
			cfg.DaemonSocket = o.socket
		}
		_, swapSocket = ctxmgr.DaemonSockets()
	case o.profile != "":
		d, err := openRunDaemon(ctx, o)
		if err != nil {
			return err
		}
		defer d.close()
		cfg.Devices = &launcher.Leases{Client: d.leaser, Profile: o.profile, GPU: o.gpu, PID: os.Getpid()}
		cfg.DaemonSocket = d.control
		swapSocket = d.swap
	}
	if o.swap {
		if o.swapSocket != "" {
			swapSocket = o.swapSocket
		}
		cfg.Swap = &launcher.Swap{Library: o.swapLib, Socket: swapSocket, Priority: o.priority}
	}
	j, err := startJobMPS(ctx, o.mpsRequest())
	if err != nil {
		return err
	}
	defer j.stop()
	cfg.Env = append(cfg.Env, j.env()...)
	if o.numa == "off" { // the SDK then leaves its arena to the kernel too
		cfg.Env = append(cfg.Env, numa.EnvPlace+"=off")
	}
	if place, warn := numaPlacer(&o.node, o.numa, o.backend, nil); place != nil {
		cfg.Place = place
	} else if warn != "" {
		cfg.Warnings = append(cfg.Warnings, warn)
	}
	if a := shmAdvice(o.shmDir, o.np, o.backend, comm.ShmCapacity(o.shmDir)); a != "" {
		cfg.Warnings = append(cfg.Warnings, a) // not quiet-able: the job runs, but slower than it could
	}
	if o.nnodes == 1 {
		e, err := runMachine(gpus)
		switch {
		case err != nil:
			// not quiet-able: the job runs, but slower than it could
			fmt.Fprintf(o.ErrOut, "run: warning: %v; the workers choose their all-reduce algorithm without this host's figures\n", err)
		case e != "":
			cfg.Env = append(cfg.Env, e)
			if !o.quiet {
				fmt.Fprintf(o.ErrOut, "run: the workers choose their all-reduce algorithm on this host's measured figures (migctl bench limits)\n")
			}
		}
	}
	res, err := launcher.Run(ctx, cfg)
	if res != nil && (len(res.Workers) > 0 || res.Interrupted != "") {
		if perr := printer.Print(o.Out, o.format, runSummary{*res}); perr != nil && err == nil {
			err = perr
		}
	}
	return err
}

// runSummary prints a launcher.Result: one row for the job.
type runSummary struct {
	launcher.Result `yaml:",inline"`
}

func (r runSummary) Header() []string {
	return []string{"job", "ranks", "restarts", "duration", "status", "root cause", "error file"}
}

func (r runSummary) Rows() [][]string {
	status := "ok"
	switch {
	case r.Interrupted != "":
		status = "interrupted (" + r.Interrupted + ")"
	case r.Error != "":
		status = "failed"
	}
	cause, file := "-", "-"
	if rc := r.RootCause; rc != nil {
		cause = rc.String()
		if r.Blame != "" {
			cause += "; rendezvous: " + r.Blame
		}
		if rc.ErrorFile != "" {
			file = rc.ErrorFile
		}
	} else if r.Error != "" {
		cause = r.Error
	}
	ranks := strconv.Itoa(r.Local)
	if r.World != r.Local {
		ranks = fmt.Sprintf("%d of %d", r.Local, r.World)
	}
	return [][]string{{r.Job, ranks, strconv.Itoa(r.Restarts), r.Duration.String(), status, cause, file}}
}
