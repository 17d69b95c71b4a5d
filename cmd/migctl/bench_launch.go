package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"time"

	"github.com/migctl/migctl/comm/rendezvous"
	"github.com/migctl/migctl/internal/benchrank"
	"github.com/migctl/migctl/internal/launcher"
	"github.com/migctl/migctl/internal/numa"
	"github.com/migctl/migctl/trainer"
)

// benchGrace is the time a bench rank gets between SIGTERM and SIGKILL once
// another rank failed: with the launcher's 1 s settle, a bench with a
// stalled rank ends within --timeout + 3 s (issue 8 item 1).
const benchGrace = 2 * time.Second

// listenRendezvous opens the rendezvous listener of a host-only bench
// (--local 0): addr as given ("unix:///p" or host:port).
func listenRendezvous(addr string) (lis net.Listener, dial string, err error) {
	if p, ok := strings.CutPrefix(addr, "unix://"); ok {
		lis, err = net.Listen("unix", p)
	} else {
		lis, err = net.Listen("tcp", addr)
		if err == nil {
			addr = lis.Addr().String()
		}
	}
	if err != nil {
		return nil, "", fmt.Errorf("listening for the rendezvous on %s: %w", addr, err)
	}
	return lis, addr, nil
}

// hostBench hosts the rendezvous only (--local 0) and waits until the ranks
// that joined it finish.
func hostBench(ctx context.Context, spec benchrank.Config, listen, token string, s streams) error {
	srv, err := rendezvous.NewServer(token, spec.NP)
	if err != nil {
		return err
	}
	lis, addr, err := listenRendezvous(listen)
	if err != nil {
		return err
	}
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	if !spec.Quiet {
		fmt.Fprintf(s.ErrOut, "bench: rendezvous at %s, token %s, %d ranks (0 started here)\n", addr, token, spec.NP)
	}
	return srv.WaitBarrier(ctx, trainer.StorePrefix+benchrank.DoneBarrier)
}

// benchLaunch is how launchBench starts the ranks: the rendezvous to host
// (--listen; "": a private socket), the job token, how many ranks start here,
// what their environment adds, and where they run (nil: anywhere).
type benchLaunch struct {
	listen, token string
	local         int
	env           []string
	place         func([]launcher.Device) []numa.Placement
}

// launchBench starts local ranks (this binary's hidden `bench worker`)
// through the launcher, which hosts the rendezvous (a private socket, or
// --listen so that other ranks can join) and hands each rank the job token
// in its environment, plus env. It returns rank 0's report.
func launchBench(ctx context.Context, spec benchrank.Config, l benchLaunch, s streams) (*benchReport, error) {
	listen, token, local, env := l.listen, l.token, l.local, l.env
	if local == 0 {
		return nil, hostBench(ctx, spec, listen, token, s)
	}
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("finding this executable to start ranks: %w", err)
	}
	specJSON, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "migctl-bench-")
	if err != nil {
		return nil, fmt.Errorf("making a directory for the report: %w", err)
	}
	defer os.RemoveAll(dir)
	report := filepath.Join(dir, "report.json")
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, runSignals...)
	defer signal.Stop(sigs)
	cfg := launcher.Config{
		Command: []string{self, "bench", "worker", "--spec", string(specJSON), "--report", report},
		NProc:   local, World: spec.NP, Listen: listen, Job: spec.Job, Token: token,
		Backend: spec.Backend, Timeout: spec.Timeout, Grace: benchGrace, Env: env,
		// Rank output goes to stderr: stdout is the report's.
		Stdout: s.ErrOut, Stderr: s.ErrOut, Signals: sigs, Place: l.place,
	}
	if !spec.Quiet {
		cfg.OnStart = func(rank, pid int) { fmt.Fprintf(s.ErrOut, "bench: started rank %d (pid %d)\n", rank, pid) }
		if listen != "" {
			fmt.Fprintf(s.ErrOut, "bench: rendezvous at %s, token %s, %d ranks (%d started here)\n", listen, token, spec.NP, local)
		}
	}
	if _, err := launcher.Run(ctx, cfg); err != nil {
		return nil, fmt.Errorf("bench %s failed: %w", spec.Coll, err)
	}
	b, err := os.ReadFile(report)
	if err != nil {
		return nil, fmt.Errorf("rank 0 wrote no report: %w", err)
	}
	var rep benchReport
	if err := json.Unmarshal(b, &rep); err != nil {
		return nil, fmt.Errorf("reading rank 0's report: %w", err)
	}
	return &rep, nil
}
