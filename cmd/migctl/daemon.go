package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	ctxmgr "github.com/migctl/migctl/context"
	"github.com/migctl/migctl/internal/bytesize"
)

// Default socket paths of the daemon; the shim reads $MIGSWAP_SOCKET.
const (
	defaultControlSocket = "/run/migctl/control.sock"
	defaultSwapSocket    = "/run/migctl/migswap.sock"
	envSwapSocket        = "MIGSWAP_SOCKET"
	envControlSocket     = "MIGCTL_SOCKET"
)

type daemonOptions struct {
	controlSocket  string
	swapSocket     string
	gpuMemory      string
	headroom       string
	swapTimeout    time.Duration
	rebalanceEvery time.Duration
	logLevel       string

	capacity    int64
	headroomSet bool
	headroomB   int64
	level       slog.Level
	errOut      io.Writer
}

func newDaemonCmd(s streams) *cobra.Command {
	o := &daemonOptions{errOut: s.ErrOut}
	cmd := &cobra.Command{
		Use:   "daemon",
		Short: "Run the node context manager: registry of shimmed processes, swap policy, control API",
		Long: `The node context manager. It keeps a registry of the processes that run under the
memory-swap shim (libmigswap.so), decides whose GPU memory is swapped to host when a
higher-priority process needs memory, swaps it back in when memory frees, and serves
'migctl swap' on its control socket.

Two Unix sockets, both owner-only (a missing directory is created 0700, the sockets are
0600, and each peer's uid is checked with SO_PEERCRED: only the daemon's uid or root):
  --swap-socket  where shims connect    (default $MIGSWAP_SOCKET, else /run/migctl/migswap.sock)
  --socket       where 'migctl swap' connects (default $MIGCTL_SOCKET, else /run/migctl/control.sock)
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
  MIGSWAP_LOG=1     log the shim's decisions to stderr

Free memory comes from NVML (the GPU driver). On a machine without a GPU, or to declare a
smaller budget, give --gpu-memory: then free = that capacity minus what the shimmed
processes on the device report.

A job that does not run under the shim can still make room: 'migctl swap reserve
--device D --bytes SIZE --priority P' swaps out lower-priority shimmed jobs until SIZE fits.`,
		Example: `  # On a GPU node, as root (sockets in /run/migctl):
  sudo migctl daemon

  # As yourself, sockets in your runtime directory, no GPU needed:
  migctl daemon --gpu-memory 80GiB \
    --swap-socket $XDG_RUNTIME_DIR/migctl/migswap.sock \
    --socket $XDG_RUNTIME_DIR/migctl/control.sock

  # Then, in other shells:
  MIGSWAP_SOCKET=$XDG_RUNTIME_DIR/migctl/migswap.sock MIGSWAP_JOB=batch MIGSWAP_PRIORITY=0 \
    LD_PRELOAD=$PWD/bin/libmigswap.so ./my-cuda-program
  migctl swap status --socket $XDG_RUNTIME_DIR/migctl/control.sock`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.headroomSet = cmd.Flags().Changed("headroom")
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
	f.StringVar(&o.controlSocket, "socket", envOr(envControlSocket, defaultControlSocket), "control socket for 'migctl swap' (gRPC; env "+envControlSocket+")")
	f.StringVar(&o.swapSocket, "swap-socket", envOr(envSwapSocket, defaultSwapSocket), "socket the shims connect to (env "+envSwapSocket+")")
	f.StringVar(&o.gpuMemory, "gpu-memory", "", "declared memory per device, e.g. 80GiB, instead of NVML (no GPU needed; "+bytesize.Units+")")
	f.StringVar(&o.headroom, "headroom", "256MiB", "memory kept free beyond each need so that a granted allocation really fits (with --gpu-memory: 0 unless given; "+bytesize.Units+")")
	f.DurationVar(&o.swapTimeout, "swap-timeout", 90*time.Second, "longest a swap started by the policy may take before its need is denied")
	f.DurationVar(&o.rebalanceEvery, "rebalance-every", 5*time.Second, "how often to retry swapping jobs back in (0: only on events)")
	f.StringVar(&o.logLevel, "log-level", "info", "debug|info|warn|error")
	return cmd
}

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
	if err := o.level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
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

	opts := ctxmgr.Options{GPUMemory: o.capacity, Headroom: o.headroomB, SwapTimeout: o.swapTimeout, RebalanceEvery: o.rebalanceEvery, Logger: log}
	if o.rebalanceEvery == 0 {
		opts.RebalanceEvery = -1
	}
	memSource := fmt.Sprintf("declared %s per device", ctxmgr.FormatBytes(o.capacity))
	if o.gpuMemory == "" {
		lib := nvml.New()
		if ret := lib.Init(); ret != nvml.SUCCESS {
			return fmt.Errorf("NVML is not available (%s): on a machine without a GPU, declare the memory with --gpu-memory SIZE", nvmlError(lib, ret))
		}
		defer lib.Shutdown()
		opts.Memory = ctxmgr.NewNVMLMemory(lib)
		memSource = "NVML"
	}
	m := ctxmgr.NewManager(opts)

	swapLn, err := ctxmgr.ListenUnix(o.swapSocket, nil)
	if err != nil {
		return fmt.Errorf("shim socket: %w", err)
	}
	ctlLn, err := ctxmgr.ListenUnix(o.controlSocket, nil)
	if err != nil {
		swapLn.Close()
		return fmt.Errorf("control socket: %w", err)
	}
	srv := grpc.NewServer()
	ctxmgr.NewControlServer(m).Register(srv)
	grpcErr := make(chan error, 1)
	go func() { grpcErr <- srv.Serve(ctlLn) }()
	log.Info("migctl daemon ready", "swap-socket", o.swapSocket, "control-socket", o.controlSocket, "memory", memSource, "headroom", ctxmgr.FormatBytes(o.headroomB))

	serveErr := make(chan error, 1)
	go func() { serveErr <- m.Serve(ctx, swapLn) }()
	var runErr error
	served := false
	select {
	case runErr = <-serveErr:
		served = true
	case err := <-grpcErr:
		runErr = fmt.Errorf("control server: %w", err)
	}
	stop()
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(2 * time.Second):
		srv.Stop()
	}
	if !served {
		<-serveErr
	}
	log.Info("migctl daemon stopped")
	return runErr
}

func nvmlError(lib nvml.Interface, ret nvml.Return) (s string) {
	defer func() {
		if recover() != nil { // ErrorString needs the library loaded
			s = fmt.Sprintf("NVML return %d", int(ret))
		}
	}()
	return lib.ErrorString(ret)
}
