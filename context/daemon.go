package ctxmgr

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"google.golang.org/grpc"

	"github.com/migctl/migctl/internal/mps"
	"github.com/migctl/migctl/mig"
)

// DaemonConfig configures StartDaemon. ControlSocket and SwapSocket are
// required; everything else has a working zero value.
type DaemonConfig struct {
	// ControlSocket is where the gRPC control API listens (swap, lease, run).
	ControlSocket string
	// SwapSocket is where shims connect (MIGSWAP_SOCKET).
	SwapSocket string
	// Peers decides who may connect to either socket; nil is the daemon's
	// uid and root.
	Peers PeerPolicy

	// MIG is where leases come from; nil runs without leasing (Acquire
	// fails with ErrNoMIG). Use a *mig.Manager over NVML, or
	// NewReopeningSource over a simulated node.
	MIG MIGSource
	// Leases tune the lease registry (state file, EnableMIG). Its OnEvent
	// and Logger are set by the daemon.
	Leases LeaseOptions
	// ReapEvery is how often leases are checked against their processes
	// (default 500 ms) and, every 20th time, against the MIG devices.
	ReapEvery time.Duration

	// Swap configures the shim registry and swap policy (memory source,
	// headroom, timeouts). Its OnSwapStart/OnSwapDone and Logger are set by
	// the daemon.
	Swap Options

	// MetricsAddr serves Prometheus metrics at http://ADDR/metrics ("": off).
	// It must be a loopback address unless MetricsAllowRemote.
	MetricsAddr        string
	MetricsAllowRemote bool

	// MPS runs an MPS control daemon for the shimmed processes (internal/mps):
	// their kernels share one GPU context and the driver dispatches the
	// higher-priority process's blocks first. MPSControl is its program
	// (default nvidia-cuda-mps-control in PATH).
	MPS        bool
	MPSControl string
	// MPSLowSM, when in 1..99, caps a best-effort (priority <= 0) client's
	// share of the SMs at that percentage (mps.Start).
	MPSLowSM int

	// Logger receives the daemon's log; nil discards it.
	Logger *slog.Logger
}

// Daemon is a running context manager: the shim server, the control API,
// the lease registry and its reaper, and the metrics endpoint. Close stops
// it.
type Daemon struct {
	cfg     DaemonConfig
	log     *slog.Logger
	m       *Manager
	leases  *Leases
	hub     *EventHub
	metrics *Metrics
	srv     *grpc.Server
	ctl     *ControlServer
	httpSrv *http.Server
	metAddr string
	mps     *mps.Control

	cancel context.CancelFunc
	wg     sync.WaitGroup
	done   chan struct{}

	closeOnce sync.Once
	mu        sync.Mutex
	err       error
}

// StartDaemon starts the daemon and returns once both sockets (and the
// metrics address) listen and the leases of the state file are re-adopted.
// It runs until ctx ends or Close; Done tells when it has stopped.
func StartDaemon(ctx context.Context, cfg DaemonConfig) (*Daemon, error) {
	switch {
	case cfg.ControlSocket == "" || cfg.SwapSocket == "":
		return nil, errors.New("starting the daemon: the control and swap sockets must be given")
	case cfg.ControlSocket == cfg.SwapSocket:
		return nil, errors.New("starting the daemon: the control and swap sockets must differ")
	}
	if cfg.ReapEvery <= 0 {
		cfg.ReapEvery = 500 * time.Millisecond
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	d := &Daemon{cfg: cfg, log: log, hub: NewEventHub(0), done: make(chan struct{})}
	var discover func(context.Context) (*mig.Node, error)
	if cfg.MIG != nil {
		discover = cfg.MIG.Discover
		lo := cfg.Leases
		lo.Logger = log
		lo.OnEvent = d.publish
		d.leases = NewLeases(cfg.MIG, lo)
	}
	d.metrics = NewMetrics(d.leases, discover)
	so := cfg.Swap
	so.Logger = log
	so.OnSwapStart = func(r Result) { d.publish(Event{Type: EventSwapStarted, Job: r.Job, Time: time.Now(), Swap: &r}) }
	so.OnSwapDone = func(r Result) { d.publish(Event{Type: EventSwapDone, Job: r.Job, Time: time.Now(), Swap: &r}) }
	d.m = NewManager(so)
	d.metrics.SetProcesses(func(ctx context.Context) ([]Process, error) {
		ps, _, err := d.m.Status(ctx)
		return ps, err
	})

	// The control socket first: a second daemon fails there, before it
	// touches the MPS pipes; then MPS, so that its control pipe exists
	// before the shim socket appears (a shim looks for it at process start).
	ctlLn, err := ListenUnix(cfg.ControlSocket, cfg.Peers, WithLogger(log))
	if err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	if cfg.MPS {
		if d.mps, err = mps.Start(ctx, cfg.MPSControl, MPSPipeDir(cfg.SwapSocket), cfg.MPSLowSM, log.Info); err != nil {
			ctlLn.Close()
			return nil, fmt.Errorf("starting the daemon: %w", err)
		}
	}
	swapLn, err := ListenUnix(cfg.SwapSocket, cfg.Peers, WithLogger(log))
	if err != nil {
		ctlLn.Close()
		if d.mps != nil {
			_ = d.mps.Stop()
		}
		return nil, fmt.Errorf("shim socket: %w", err)
	}
	var metLn net.Listener
	if cfg.MetricsAddr != "" {
		if metLn, err = listenMetrics(cfg.MetricsAddr, cfg.MetricsAllowRemote); err != nil {
			swapLn.Close()
			ctlLn.Close()
			if d.mps != nil {
				_ = d.mps.Stop()
			}
			return nil, err
		}
		d.metAddr = metLn.Addr().String()
	}
	// Re-adopt leases once the sockets are ours (a second daemon fails
	// above without touching the state file), before anyone is served.
	if d.leases != nil {
		kept, dropped, err := d.leases.Restore(ctx)
		if err != nil {
			swapLn.Close()
			ctlLn.Close()
			if metLn != nil {
				metLn.Close()
			}
			if d.mps != nil {
				_ = d.mps.Stop()
			}
			return nil, fmt.Errorf("starting the daemon: %w", err)
		}
		if len(kept)+len(dropped) > 0 {
			log.Info("leases re-adopted", "kept", len(kept), "dropped", len(dropped), "state", cfg.Leases.StatePath)
		}
	}

	ctl := NewControlServer(d.m, WithEvents(d.hub), WithMetrics(d.metrics))
	if d.leases != nil {
		WithLeases(d.leases)(ctl)
	}
	d.ctl = ctl
	d.srv = grpc.NewServer(ctl.ServerOptions()...)
	ctl.Register(d.srv)

	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	d.cancel = cancel
	d.wg.Add(2)
	go func() {
		defer d.wg.Done()
		// ErrServerStopped: Close came before Serve (a daemon stopped as
		// soon as it started), not a failure
		if err := d.srv.Serve(ctlLn); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			d.fail(fmt.Errorf("control server: %w", err))
		}
	}()
	go func() {
		defer d.wg.Done()
		if err := d.m.Serve(rctx, swapLn); err != nil {
			d.fail(fmt.Errorf("shim server: %w", err))
		}
	}()
	if metLn != nil {
		mux := http.NewServeMux()
		mux.Handle("/metrics", d.metrics.Handler())
		d.httpSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			if err := d.httpSrv.Serve(metLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
				d.fail(fmt.Errorf("metrics server: %w", err))
			}
		}()
	}
	if d.leases != nil {
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			d.reapLoop(rctx)
		}()
	}
	go func() {
		select {
		case <-ctx.Done():
		case <-rctx.Done():
		}
		d.Close()
	}()
	return d, nil
}

// listenMetrics listens on addr, which must be loopback unless allowRemote:
// the metrics name jobs.
func listenMetrics(addr string, allowRemote bool) (net.Listener, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("metrics address %q: %w (want e.g. 127.0.0.1:9400)", addr, err)
	}
	loopback := host == "localhost"
	if ip := net.ParseIP(host); ip != nil {
		loopback = ip.IsLoopback()
	}
	if !loopback && !allowRemote {
		return nil, fmt.Errorf("metrics address %q is not a loopback address (the metrics name your jobs): use 127.0.0.1:PORT, or allow it explicitly (--metrics-allow-remote)", addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics address: %w", err)
	}
	return ln, nil
}

// publish sends an event to watchers and metrics.
func (d *Daemon) publish(e Event) {
	d.hub.Publish(e)
	d.metrics.ObserveEvent(e)
}

// reapLoop ends leases whose process exited, and (less often) those whose
// MIG device vanished.
func (d *Daemon) reapLoop(ctx context.Context) {
	t := time.NewTicker(d.cfg.ReapEvery)
	defer t.Stop()
	for n := 1; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		d.leases.Reap()
		if n%20 == 0 {
			if _, err := d.leases.Prune(ctx); err != nil && ctx.Err() == nil {
				d.log.Warn("checking leased MIG devices", "err", err)
			}
		}
	}
}

func (d *Daemon) fail(err error) {
	d.mu.Lock()
	if d.err == nil {
		d.err = err
	}
	d.mu.Unlock()
	d.cancel()
}

// Close stops the daemon: no new connections, control RPCs given 2 s to
// finish, shim connections closed, sockets removed. Leases stay in the
// state file for the next start. It returns the error that stopped the
// daemon, if any. Safe to call more than once.
func (d *Daemon) Close() error {
	d.closeOnce.Do(func() {
		d.ctl.Drain()
		d.cancel()
		stopped := make(chan struct{})
		go func() { d.srv.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(2 * time.Second):
			d.srv.Stop()
		}
		if d.httpSrv != nil {
			sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_ = d.httpSrv.Shutdown(sctx)
			cancel()
		}
		d.wg.Wait()
		if d.mps != nil {
			if err := d.mps.Stop(); err != nil {
				d.log.Warn("stopping MPS", "err", err)
			}
		}
		close(d.done)
	})
	return d.Err()
}

// Done is closed once the daemon has stopped (Close, its ctx, or a failure).
func (d *Daemon) Done() <-chan struct{} { return d.done }

// Err is the error that stopped the daemon (nil for a normal stop).
func (d *Daemon) Err() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.err
}

// ControlSocket is the control API's socket (for Dial, MIGCTL_SOCKET).
func (d *Daemon) ControlSocket() string { return d.cfg.ControlSocket }

// SwapSocket is the shims' socket (MIGSWAP_SOCKET).
func (d *Daemon) SwapSocket() string { return d.cfg.SwapSocket }

// MPSPipeDir is the pipe directory of the daemon's MPS control daemon ("" when
// it runs none): MPSPipeDir(SwapSocket()) when it runs one.
func (d *Daemon) MPSPipeDir() string {
	if d.mps == nil {
		return ""
	}
	return d.mps.PipeDir()
}

// MetricsAddr is the address the metrics listen on ("" if off), with the
// port chosen when the configured one was 0.
func (d *Daemon) MetricsAddr() string { return d.metAddr }

// Leases is the lease registry (nil without a MIG source).
func (d *Daemon) Leases() *Leases { return d.leases }

// Manager is the shim registry and swap driver.
func (d *Daemon) Manager() *Manager { return d.m }

// Metrics are the daemon's metrics.
func (d *Daemon) Metrics() *Metrics { return d.metrics }

// ReopeningSource is a MIGSource that opens the node for each call and
// closes it after: a simulated node (mig/migsim) holds a lock on its state
// file while open, so reopening lets `migctl partition ... --sim` share the
// node with a running daemon, and see what the other changed, as on NVML.
type ReopeningSource struct {
	open func() (nvml.Interface, func(), error)
	opts []mig.Option
}

var _ MIGSource = (*ReopeningSource)(nil)

// NewReopeningSource returns a source over open, which returns an
// initialised node and how to close it; opts configure the mig.Manager
// built for each call (use mig.WithJournal: applies are journalled).
func NewReopeningSource(open func() (nvml.Interface, func(), error), opts ...mig.Option) *ReopeningSource {
	return &ReopeningSource{open: open, opts: opts}
}

// Discover opens the node, reads it and closes it.
func (s *ReopeningSource) Discover(ctx context.Context) (*mig.Node, error) {
	lib, closeLib, err := s.open()
	if err != nil {
		return nil, err
	}
	defer closeLib()
	return mig.NewManager(lib, s.opts...).Discover(ctx)
}

// Apply opens the node, applies reqs with a journalled mig.Manager and
// closes it.
func (s *ReopeningSource) Apply(ctx context.Context, reqs map[int]mig.Request, opts mig.ApplyOptions) (*mig.ApplyResult, error) {
	lib, closeLib, err := s.open()
	if err != nil {
		return nil, err
	}
	defer closeLib()
	return mig.NewManager(lib, s.opts...).Apply(ctx, reqs, opts)
}

// MPSPipeDir is the pipe directory of the MPS control daemon of the migctl
// daemon whose shim socket is swapSocket: the shim looks there.
func MPSPipeDir(swapSocket string) string { return swapSocket + ".mps" }
