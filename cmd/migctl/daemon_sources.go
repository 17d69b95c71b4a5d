package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	ctxmgr "github.com/migctl/migctl/context"
	"github.com/migctl/migctl/mig"
	"github.com/migctl/migctl/mig/migsim"
)

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

// simLeaser is who holds a simulated node's lease lock (simLeaseLock).
type simLeaser struct {
	kind    string // "daemon" or "run"
	socket  string // its control socket
	release func()
}

// simLeaseLock makes this process the one lease registry of the simulated
// node the flags name, for as long as it runs: two registries (two
// 'migctl run --sim' with daemons of their own, or one of them beside
// 'migctl daemon --sim') would each see the other's leased instances as
// free, grant them again, and reshape them away under a running job. The
// lock is an flock on <sim-state>.leases.lock (the kernel drops it when the
// process dies, SIGKILL included), whose content names the holder for the
// error the next one gets. kind and socket describe this holder; release
// lets it go.
func simLeaseLock(f *nodeFlags, kind, socket string) (func(), error) {
	state, err := f.statePath()
	if err != nil {
		return nil, err
	}
	path := state + ".leases.lock"
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("locking the simulated node's leases: %w", err)
	}
	lf, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("locking the simulated node's leases: %w", err)
	}
	if err := syscall.Flock(int(lf.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder, _ := io.ReadAll(lf)
		lf.Close()
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("locking the simulated node's leases (%s): %w", path, err)
		}
		return nil, simLeasedError(f, strings.TrimSpace(string(holder)))
	}
	_ = lf.Truncate(0)
	_, _ = fmt.Fprintf(lf, "%d %s %s\n", os.Getpid(), kind, socket)
	return func() { lf.Close() }, nil
}

// simLeasedError says who leases the simulated node already (holder: the
// lock file's "PID KIND SOCKET") and what to do.
func simLeasedError(f *nodeFlags, holder string) error {
	var pid, kind, socket string
	parts := strings.Fields(holder)
	if len(parts) == 3 {
		pid, kind, socket = parts[0], parts[1], parts[2]
	}
	switch kind {
	case "daemon":
		return fmt.Errorf("--sim %s: a 'migctl daemon' (pid %s) leases this simulated node's MIG devices: "+
			"use it with --socket %s (or %s=%s), or give this one another node with --sim-state", f.sim, pid, socket, envControlSocket, socket)
	case "run":
		return fmt.Errorf("--sim %s: another 'migctl run' (pid %s) leases this simulated node's MIG devices with a daemon of its own, "+
			"and two would grant the same ones: start one daemon for both ('migctl daemon --sim %s &', then --socket), "+
			"wait for that run to end, or give this one another node with --sim-state", f.sim, pid, f.sim)
	}
	return fmt.Errorf("--sim %s: another process leases this simulated node's MIG devices (%s): use its daemon with --socket, or give this one another node with --sim-state", f.sim, holder)
}
