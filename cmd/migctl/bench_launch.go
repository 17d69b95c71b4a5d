package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/migctl/migctl/comm/rendezvous"
)

// listenRendezvous opens the rendezvous listener: addr as given ("unix:///p"
// or host:port), or a private Unix socket in a fresh temporary directory.
func listenRendezvous(addr string) (lis net.Listener, dial string, cleanup func(), err error) {
	cleanup = func() {}
	if addr == "" {
		dir, err := os.MkdirTemp("", "migctl-bench-")
		if err != nil {
			return nil, "", nil, fmt.Errorf("making a socket directory: %w", err)
		}
		cleanup = func() { _ = os.RemoveAll(dir) }
		addr = "unix://" + filepath.Join(dir, "rendezvous.sock")
	}
	if p, ok := strings.CutPrefix(addr, "unix://"); ok {
		lis, err = net.Listen("unix", p)
	} else {
		lis, err = net.Listen("tcp", addr)
		if err == nil {
			addr = lis.Addr().String()
		}
	}
	if err != nil {
		cleanup()
		return nil, "", nil, fmt.Errorf("listening for the rendezvous on %s: %w", addr, err)
	}
	return lis, addr, cleanup, nil
}

// launchBench hosts the rendezvous and starts local ranks as separate
// processes (this binary's hidden `bench worker`). It returns rank 0's
// report when rank 0 is local.
func launchBench(ctx context.Context, spec benchSpec, listen, token string, local int, s streams) (*benchReport, error) {
	srv, err := rendezvous.NewServer(token, spec.NP)
	if err != nil {
		return nil, err
	}
	lis, addr, cleanup, err := listenRendezvous(listen)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	if listen != "" && !spec.Quiet {
		fmt.Fprintf(s.ErrOut, "bench: rendezvous at %s, token %s, %d ranks (%d started here)\n", addr, token, spec.NP, local)
	}
	if local == 0 {
		// Host only: wait until the joined ranks finish.
		return nil, srv.WaitBarrier(ctx, "bench/done")
	}
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("finding this executable to start ranks: %w", err)
	}
	specJSON, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	type proc struct {
		cmd *exec.Cmd
		out bytes.Buffer
		err error
	}
	procs := make([]*proc, local)
	for r := range local {
		p := &proc{}
		p.cmd = exec.CommandContext(ctx, self, "bench", "worker", "--spec", string(specJSON),
			"--rendezvous", addr, "--token", token, "--rank", strconv.Itoa(r))
		p.cmd.Stdout = &p.out
		p.cmd.Stderr = s.ErrOut
		// A rank never outlives the launcher.
		p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := p.cmd.Start(); err != nil {
			for _, q := range procs[:r] {
				_ = q.cmd.Process.Kill()
				_ = q.cmd.Wait()
			}
			return nil, fmt.Errorf("starting rank %d: %w", r, err)
		}
		if !spec.Quiet {
			fmt.Fprintf(s.ErrOut, "bench: started rank %d (pid %d)\n", r, p.cmd.Process.Pid)
		}
		procs[r] = p
	}
	// Wait for every rank. Once one fails, the others get the collective
	// deadline plus a grace period to fail on their own, then are killed.
	var wg sync.WaitGroup
	failed := make(chan struct{})
	var once sync.Once
	for _, p := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.err = p.cmd.Wait()
			if p.err != nil {
				srv.AbortJob(fmt.Sprintf("a rank exited: %v", p.err))
				once.Do(func() { close(failed) })
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-failed:
		select {
		case <-done:
		case <-time.After(spec.Timeout + 30*time.Second):
			for _, p := range procs {
				_ = p.cmd.Process.Kill()
			}
			<-done
		}
	}
	var errs []error
	for r, p := range procs {
		if p.err != nil {
			errs = append(errs, fmt.Errorf("rank %d: %w", r, p.err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("bench %s failed: %w", spec.Coll, err)
	}
	var rep benchReport
	if err := json.Unmarshal(procs[0].out.Bytes(), &rep); err != nil {
		return nil, fmt.Errorf("reading rank 0's report: %w", err)
	}
	return &rep, nil
}
