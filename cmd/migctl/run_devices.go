package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	ctxmgr "github.com/migctl/migctl/context"
	"github.com/migctl/migctl/internal/launcher"
	"github.com/migctl/migctl/mig"
	"github.com/migctl/migctl/mig/migsim"
)

// gpuDevices spreads ranks over whole GPUs: by UUID when NVML answers (the
// gpu backend), by ordinal otherwise.
func gpuDevices(ords []int, backend string) (launcher.RoundRobin, error) {
	rr := launcher.GPUOrdinals(ords)
	if backend != "gpu" {
		return rr, nil
	}
	lib := nvml.New()
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return rr, nil // no driver here: the ordinals go as they are
	}
	defer lib.Shutdown()
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return rr, nil
	}
	for i, o := range ords {
		if o >= n {
			return nil, fmt.Errorf("--gpus: there is no GPU %d on this node (it has %d: 0..%d)", o, n, n-1)
		}
		dev, ret := lib.DeviceGetHandleByIndex(o)
		if ret != nvml.SUCCESS {
			continue
		}
		if uuid, ret := dev.GetUUID(); ret == nvml.SUCCESS {
			rr[i].Visible = uuid
		}
	}
	return rr, nil
}

// runDaemon is the daemon a run leases from: an external one, or one
// embedded in this process for --sim.
type runDaemon struct {
	leaser  launcher.Leaser
	control string
	swap    string
	close   func()
}

// openRunDaemon dials the daemon, or with --sim and no --socket /
// MIGCTL_SOCKET starts one inside this process with its sockets in a
// private directory (removed by close).
func openRunDaemon(ctx context.Context, o *runOptions) (*runDaemon, error) {
	if o.node.sim == "" || o.socketGiven {
		c, err := ctxmgr.Dial(ctx, o.socket)
		if err != nil {
			return nil, err
		}
		_, swap := ctxmgr.DaemonSockets()
		return &runDaemon{leaser: clientLeaser{c}, control: c.Socket(), swap: swap, close: func() { c.Close() }}, nil
	}
	// Open the simulated node once: a bad --sim fails here, before anything
	// is made, and this gives the journal's path.
	on, err := o.node.open()
	if err != nil {
		return nil, err
	}
	journal := on.journal
	on.close()
	model, _, _ := migsim.ParseSpec(o.node.sim)
	unlock, err := simLeaseLock(&o.node, "run", "-")
	if err != nil {
		return nil, err
	}
	dir, err := launcher.SocketDir("migctl-daemon-")
	if err != nil {
		unlock()
		return nil, fmt.Errorf("making a private directory for the embedded daemon: %w", err)
	}
	src := ctxmgr.NewReopeningSource(func() (nvml.Interface, func(), error) {
		on, err := o.node.open()
		if err != nil {
			return nil, nil, err
		}
		return on.lib, on.close, nil
	}, mig.WithJournal(journal))
	logOut := io.Discard
	if os.Getenv("MIGCTL_DAEMON_LOG") != "" {
		logOut = o.ErrOut
	}
	d, err := ctxmgr.StartDaemon(ctx, ctxmgr.DaemonConfig{
		ControlSocket: filepath.Join(dir, "control.sock"),
		SwapSocket:    filepath.Join(dir, "migswap.sock"),
		MIG:           src,
		// A simulated node is this run's own: turning MIG on where it is
		// off is what a newcomer's first run needs.
		Leases: ctxmgr.LeaseOptions{EnableMIG: true},
		Swap:   ctxmgr.Options{GPUMemory: int64(model.MemoryBytes)},
		Logger: slog.New(slog.NewTextHandler(logOut, nil)),
	})
	if err != nil {
		_ = os.RemoveAll(dir)
		unlock()
		return nil, fmt.Errorf("starting the embedded daemon for --sim %s: %w", o.node.sim, err)
	}
	c, err := ctxmgr.Dial(ctx, d.ControlSocket())
	if err != nil {
		_ = d.Close()
		_ = os.RemoveAll(dir)
		unlock()
		return nil, err
	}
	return &runDaemon{leaser: clientLeaser{c}, control: d.ControlSocket(), swap: d.SwapSocket(), close: func() {
		c.Close()
		_ = d.Close()
		_ = os.RemoveAll(dir)
		unlock()
	}}, nil
}

// clientLeaser is launcher.Leaser over the daemon's client.
type clientLeaser struct{ c *ctxmgr.Client }

var _ launcher.Leaser = clientLeaser{}

func (l clientLeaser) Acquire(ctx context.Context, job, profile string, count, gpu, pid int) ([]launcher.Lease, error) {
	ls, err := l.c.Acquire(ctx, ctxmgr.AcquireRequest{Job: job, Profile: profile, Count: count, GPU: gpu, PID: pid,
		BindToConnection: true})
	if err != nil {
		return nil, err
	}
	out := make([]launcher.Lease, len(ls))
	for i, le := range ls {
		out[i] = launcher.Lease{UUID: le.UUID, GPU: le.GPU, Profile: le.Profile}
	}
	return out, nil
}

// Release ends job's leases of uuids one device at a time (the daemon's
// Release by job would also end those of another run under the same
// --job); a device no longer leased to job is left alone.
func (l clientLeaser) Release(ctx context.Context, job string, uuids []string) error {
	ls, err := l.c.Leases(ctx)
	if err != nil {
		return err
	}
	ours := map[string]bool{}
	for _, le := range ls {
		if le.Job == job {
			ours[le.UUID] = true
		}
	}
	var errs []error
	for _, u := range uuids {
		if !ours[u] {
			continue
		}
		if _, err := l.c.ReleaseUUID(ctx, u); err != nil && !errors.Is(err, ctxmgr.ErrNoLease) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
