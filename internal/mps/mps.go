package mps

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

// Control is a running MPS control daemon with private pipes.
type Control struct {
	bin     string
	pipeDir string
	logDir  string
	log     func(msg string, args ...any)
}

// ControlPipe is the named pipe the MPS control daemon creates in its pipe
// directory; its presence is what a client (and the swap shim) checks.
const ControlPipe = "control"

// LowEnv is the file in the pipe directory whose KEY=VALUE lines the swap
// shim adds to the environment of processes of priority 0 or less (best
// effort) before the driver starts, unless they set the variable
// themselves: e.g. CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, the share of the SMs
// such a client may use (Start's lowSM).
const LowEnv = "low.env"

// DefaultControl is the MPS control program looked up in PATH.
const DefaultControl = "nvidia-cuda-mps-control"

// ErrNoControl is Start's error when the control program is not there.
var ErrNoControl = errors.New("no MPS control program")

// EnvPipeDir is the variable that makes a CUDA process a client of the
// control daemon whose pipes are in its value.
const EnvPipeDir = "CUDA_MPS_PIPE_DIRECTORY"

// SystemPipeDir is where CUDA clients look for an MPS control daemon when
// EnvPipeDir is not set: a node that runs MPS for everyone has its control
// pipe (ControlPipe) there, and every CUDA process is its client.
const SystemPipeDir = "/tmp/nvidia-mps"

// mpsStartTimeout bounds the wait for the control pipe after `-d`.
const mpsStartTimeout = 10 * time.Second

// Start starts the MPS control daemon bin (DefaultControl when "")
// with its pipes in pipeDir and its log in pipeDir/log, and returns once its
// control pipe exists. A stale pipe directory (a previous daemon killed
// without stopping MPS) is asked to quit first. lowSM, when in 1..99, is the
// percentage of the GPU's SMs a best-effort client may use
// (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE through LowEnv): the rest stay free
// for higher-priority clients, whose kernels then start without waiting for
// best-effort blocks to drain; 0 (or 100) caps nothing.
func Start(ctx context.Context, bin, pipeDir string, lowSM int, logf func(string, ...any)) (*Control, error) {
	if lowSM < 0 || lowSM > 100 {
		return nil, fmt.Errorf("MPS: the best-effort SM share %d%% is not in 0..100", lowSM)
	}
	if bin == "" {
		bin = DefaultControl
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		return nil, fmt.Errorf("MPS: %w: %w (install the NVIDIA compute utilities, or give the program's path)", ErrNoControl, err)
	}
	if logf == nil {
		logf = func(string, ...any) {}
	}
	m := &Control{bin: path, pipeDir: pipeDir, logDir: filepath.Join(pipeDir, "log"), log: logf}
	if _, err := os.Stat(filepath.Join(pipeDir, ControlPipe)); err == nil {
		logf("MPS: a control pipe is already there; asking it to quit first", "dir", pipeDir)
		_ = m.quit(ctx)
	}
	if err := os.MkdirAll(m.logDir, 0o700); err != nil {
		return nil, fmt.Errorf("MPS: %w", err)
	}
	low := ""
	if lowSM > 0 && lowSM < 100 {
		low = fmt.Sprintf("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=%d\n", lowSM)
	}
	if err := os.WriteFile(filepath.Join(pipeDir, LowEnv), []byte(low), 0o644); err != nil {
		return nil, fmt.Errorf("MPS: %w", err)
	}
	cmd := exec.CommandContext(ctx, path, "-d")
	cmd.Env = m.env()
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("MPS: %s -d: %w: %s", path, err, strings.TrimSpace(string(out)))
	}
	deadline := time.Now().Add(mpsStartTimeout)
	for {
		if _, err := os.Stat(filepath.Join(pipeDir, ControlPipe)); err == nil {
			break
		}
		if time.Now().After(deadline) {
			_ = m.quit(ctx)
			return nil, fmt.Errorf("MPS: %s started but %s did not appear within %v (its log: %s)",
				path, filepath.Join(pipeDir, ControlPipe), mpsStartTimeout, m.logDir)
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
func (m *Control) PipeDir() string { return m.pipeDir }

// ClientEnv is what a process's environment needs to be a client.
func (m *Control) ClientEnv() []string { return []string{EnvPipeDir + "=" + m.pipeDir} }

// Stop asks the control daemon (and its server) to quit, within 10 s. The
// control program answers once the daemon has taken the command; the real
// one leaves its pipe files behind (the next start asks them to quit again,
// which a stopped daemon does not answer: harmless).
func (m *Control) Stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := m.quit(ctx); err != nil {
		return err
	}
	m.log("MPS control daemon stopped", "pipe_dir", m.pipeDir)
	return nil
}

func (m *Control) quit(ctx context.Context) error {
	cmd := exec.CommandContext(ctx, m.bin)
	cmd.Env = m.env()
	cmd.Stdin = strings.NewReader("quit\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("MPS: %s quit: %w: %s", m.bin, err, strings.TrimSpace(string(out)))
	}
	return nil
}

func (m *Control) env() []string {
	env := make([]string, 0, len(os.Environ())+2)
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, EnvPipeDir+"=") && !strings.HasPrefix(e, "CUDA_MPS_LOG_DIRECTORY=") {
			env = append(env, e)
		}
	}
	return append(env, EnvPipeDir+"="+m.pipeDir, "CUDA_MPS_LOG_DIRECTORY="+m.logDir)
}
