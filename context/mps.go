package ctxmgr

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// MPS runs an NVIDIA MPS control daemon for the shimmed processes of one
// migctl daemon, so that their kernels run in one GPU context: the driver
// then schedules them block by block with the clients' priorities
// (CUDA_MPS_CLIENT_PRIORITY) instead of time-slicing separate contexts,
// whose switch alone costs a high-priority kernel ~150 µs and whose time
// slice ~1.4 ms on an H200 (docs/results/priority-h200-2026-12-01.md).
//
// The control daemon is private to this migctl daemon: its pipe directory is
// MPSPipeDir(swap socket), and only processes that are told it
// (CUDA_MPS_PIPE_DIRECTORY; the shim sets it when it finds the directory next
// to its socket) join it. Nothing on the GPU is reconfigured: MPS runs in
// the default compute mode and stops with the daemon. MIG instances need one
// control daemon each (a CUDA_VISIBLE_DEVICES of one instance); this one
// serves whole GPUs.
type MPS struct {
	bin     string
	pipeDir string
	logDir  string
	log     func(msg string, args ...any)
}

// MPSPipeDir is the pipe directory of the MPS control daemon of the migctl
// daemon whose shim socket is swapSocket: the shim looks there.
func MPSPipeDir(swapSocket string) string { return swapSocket + ".mps" }

// MPSControlPipe is the named pipe the MPS control daemon creates in its pipe
// directory; its presence is what the shim checks.
const MPSControlPipe = "control"

// DefaultMPSControl is the MPS control program looked up in PATH.
const DefaultMPSControl = "nvidia-cuda-mps-control"

// mpsStartTimeout bounds the wait for the control pipe after `-d`.
const mpsStartTimeout = 10 * time.Second

// StartMPS starts the MPS control daemon bin (DefaultMPSControl when "")
// with its pipes in pipeDir and its log in pipeDir/log, and returns once its
// control pipe exists. A stale pipe directory (a previous daemon killed
// without stopping MPS) is asked to quit first.
func StartMPS(ctx context.Context, bin, pipeDir string, logf func(string, ...any)) (*MPS, error) {
	if bin == "" {
		bin = DefaultMPSControl
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		return nil, fmt.Errorf("MPS: %w (install the NVIDIA compute utilities, or give the program's path)", err)
	}
	if logf == nil {
		logf = func(string, ...any) {}
	}
	m := &MPS{bin: path, pipeDir: pipeDir, logDir: filepath.Join(pipeDir, "log"), log: logf}
	if _, err := os.Stat(filepath.Join(pipeDir, MPSControlPipe)); err == nil {
		logf("MPS: a control pipe is already there; asking it to quit first", "dir", pipeDir)
		_ = m.quit(ctx)
	}
	if err := os.MkdirAll(m.logDir, 0o700); err != nil {
		return nil, fmt.Errorf("MPS: %w", err)
	}
	cmd := exec.CommandContext(ctx, path, "-d")
	cmd.Env = m.env()
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("MPS: %s -d: %w: %s", path, err, strings.TrimSpace(string(out)))
	}
	deadline := time.Now().Add(mpsStartTimeout)
	for {
		if _, err := os.Stat(filepath.Join(pipeDir, MPSControlPipe)); err == nil {
			break
		}
		if time.Now().After(deadline) {
			_ = m.quit(ctx)
			return nil, fmt.Errorf("MPS: %s started but %s did not appear within %v (its log: %s)",
				path, filepath.Join(pipeDir, MPSControlPipe), mpsStartTimeout, m.logDir)
		}
		select {
		case <-ctx.Done():
			_ = m.quit(context.Background())
			return nil, fmt.Errorf("MPS: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	logf("MPS control daemon started", "program", path, "pipe_dir", pipeDir)
	return m, nil
}

// PipeDir is where clients find the control daemon (CUDA_MPS_PIPE_DIRECTORY).
func (m *MPS) PipeDir() string { return m.pipeDir }

// Stop asks the control daemon (and its server) to quit and waits for its
// control pipe to go, up to 10 s.
func (m *MPS) Stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := m.quit(ctx); err != nil {
		return err
	}
	for {
		if _, err := os.Stat(filepath.Join(m.pipeDir, MPSControlPipe)); errors.Is(err, os.ErrNotExist) {
			m.log("MPS control daemon stopped", "pipe_dir", m.pipeDir)
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("MPS: the control daemon in %s did not quit: %w", m.pipeDir, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (m *MPS) quit(ctx context.Context) error {
	cmd := exec.CommandContext(ctx, m.bin)
	cmd.Env = m.env()
	cmd.Stdin = strings.NewReader("quit\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("MPS: %s quit: %w: %s", m.bin, err, strings.TrimSpace(string(out)))
	}
	return nil
}

func (m *MPS) env() []string {
	env := make([]string, 0, len(os.Environ())+2)
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "CUDA_MPS_PIPE_DIRECTORY=") && !strings.HasPrefix(e, "CUDA_MPS_LOG_DIRECTORY=") {
			env = append(env, e)
		}
	}
	return append(env, "CUDA_MPS_PIPE_DIRECTORY="+m.pipeDir, "CUDA_MPS_LOG_DIRECTORY="+m.logDir)
}
