package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/migctl/migctl/internal/mps"
)

// Ranks of one job that share a whole GPU (several processes, each its own
// CUDA context) are time-sliced by the driver: a copy or kernel of one rank
// waits for the others' time slices, and every switch costs ~150 µs on an
// H200. Under one MPS server their work runs in one context, side by side,
// as MIG instances' work does. Measured on one H200, 7 ranks on GPU 0, each
// pair in one call (docs/results/collectives-h200.md, "Night"): DDP
// ResNet-18 batch 8 35.8 -> 23.0 ms per step, the small GPT batch 4 70.8 ->
// 51.5; the collectives alone 60.4 -> 48.1 ms (256 MiB) and 225 -> 94 µs
// (8 KiB) on a host that time-sliced badly, within noise on three others.
// So `migctl run` and `migctl bench` start a private MPS control daemon for
// such a job (--mps auto, the default) and stop it at the end.

// EnvMPSProbe overrides the command that checks a new MPS control daemon
// serves a GPU (default: this binary's hidden `mps-probe`), e.g. for tests
// on machines without a GPU, or a site's own check. It gets the client's
// environment and the arguments --gpu ORDINAL.
const EnvMPSProbe = "MIGCTL_MPS_PROBE"

// systemMPSDir is where CUDA clients look for an MPS control daemon when
// CUDA_MPS_PIPE_DIRECTORY is not set: a node that runs MPS for everyone has
// its control pipe there, and the ranks are its clients already.
var systemMPSDir = mps.SystemPipeDir

// mpsProbeTimeout bounds the probe: the driver's start and the MPS server's.
const mpsProbeTimeout = 30 * time.Second

// jobMPSRequest is what decides whether a job's ranks run under MPS.
type jobMPSRequest struct {
	mode    string // auto, on or off
	control string // the MPS control program ("" : mps.DefaultControl)
	backend string // gpu or host
	mig     bool   // ranks on MIG instances (leased): each has its own
	swap    bool   // under the swap shim: the daemon's --mps decides
	ipc     bool   // CUDA IPC between the ranks (not tried under MPS)
	gpus    []int  // the GPU of each local rank
	quiet   bool
	log     io.Writer
}

// mpsRequest describes the job's ranks for startJobMPS.
func (o *runOptions) mpsRequest() jobMPSRequest {
	r := jobMPSRequest{mode: o.mps, control: o.mpsControl, backend: o.backend, mig: o.profile != "",
		swap: o.swap, quiet: o.quiet, log: o.ErrOut}
	for i := 0; len(o.ords) > 0 && i < o.np; i++ {
		r.gpus = append(r.gpus, o.ords[i%len(o.ords)])
	}
	return r
}

// mpsRequest describes the local ranks for startJobMPS: rank r on GPU
// --gpu[r mod len]. CUDA IPC between ranks is left without MPS.
func (o *benchOptions) mpsRequest() jobMPSRequest {
	r := jobMPSRequest{mode: o.mps, control: o.mpsCtl, backend: o.spec.Backend, quiet: o.spec.Quiet, log: o.streams.ErrOut}
	r.ipc = o.spec.Transport == "ipc"
	for i := 0; len(o.spec.GPUs) > 0 && i < o.local; i++ {
		r.gpus = append(r.gpus, o.spec.GPUs[i%len(o.spec.GPUs)])
	}
	return r
}

// jobMPS is a started private MPS control daemon (nil: none).
type jobMPS struct {
	ctl *mps.Control
	dir string
}

// validMPSMode checks --mps.
func validMPSMode(m string) error {
	switch m {
	case "auto", "on", "off":
		return nil
	}
	return fmt.Errorf("--mps %q: want auto, on or off", m)
}

// busiestGPU returns the GPU the most ranks use and how many use it (-1, 0
// for no ranks); several on one GPU is what MPS is for.
func busiestGPU(gpus []int) (gpu, ranks int) {
	gpu, count := -1, map[int]int{}
	for _, g := range gpus {
		if count[g]++; count[g] > ranks {
			gpu, ranks = g, count[g]
		}
	}
	return gpu, ranks
}

// decide says whether the request wants MPS and, when it does not,
// why (for the log), or an error for --mps on where MPS cannot apply.
func (r jobMPSRequest) decide() (bool, string, error) {
	if r.mode == "off" {
		return false, "", nil
	}
	on := r.mode == "on"
	refuse := func(why string) (bool, string, error) {
		if on {
			return false, "", fmt.Errorf("--mps on: %s", why)
		}
		return false, why, nil
	}
	switch {
	case r.backend != "gpu":
		return refuse("the workers use no GPU (--backend " + r.backend + ")")
	case r.mig:
		return refuse("each rank has a MIG instance of its own (MPS inside MIG instances is not supported)")
	case r.ipc:
		return refuse("the ranks use CUDA IPC (--transport ipc), which is not tried under MPS")
	case r.swap:
		return refuse("--swap workers join the daemon's MPS server when it runs one (migctl daemon --mps)")
	case os.Getenv(mps.EnvPipeDir) != "":
		return refuse(mps.EnvPipeDir + " is set: the workers join that MPS server")
	case isPipe(filepath.Join(systemMPSDir, mps.ControlPipe)):
		return refuse("the node runs an MPS control daemon (" + systemMPSDir + "): the workers are its clients")
	case !on && !r.shared():
		return false, "", nil // nothing shares a GPU: nothing to gain
	}
	return true, "", nil
}

// startJobMPS starts a private MPS control daemon for the job when the
// request wants one and checks that it serves the ranks' GPU. With --mps
// auto anything that goes wrong is logged and the ranks run without it;
// with --mps on it is an error.
func startJobMPS(ctx context.Context, r jobMPSRequest) (*jobMPS, error) {
	want, why, err := r.decide()
	if err != nil || !want {
		if why != "" && r.shared() {
			r.logf("MPS: not used: %s", why)
		}
		return nil, err
	}
	fail := func(err error) (*jobMPS, error) {
		if r.mode == "on" {
			return nil, fmt.Errorf("--mps on: %w", err)
		}
		r.logf("MPS: not used (the ranks sharing a GPU time-slice it): %v", err)
		return nil, nil
	}
	dir, err := os.MkdirTemp("", "migctl-mps-")
	if err != nil {
		return fail(err)
	}
	ctl, err := mps.Start(ctx, r.control, dir, 0, nil)
	if err != nil {
		_ = os.RemoveAll(dir)
		return fail(err) // mps.ErrNoControl names a missing program
	}
	j := &jobMPS{ctl: ctl, dir: dir}
	gpu, ranks := busiestGPU(r.gpus)
	if err := j.probe(ctx, gpu); err != nil {
		j.stop()
		return fail(err)
	}
	r.logf("MPS: %d ranks share GPU %d: they run under a private MPS server (%s; --mps off to time-slice)",
		ranks, gpu, dir)
	return j, nil
}

// probe runs a CUDA client of the new server on gpu: the driver starts the
// MPS server for it, so a server that cannot run fails here, not in every
// rank.
func (j *jobMPS) probe(ctx context.Context, gpu int) error {
	ctx, cancel := context.WithTimeout(ctx, mpsProbeTimeout)
	defer cancel()
	args := []string{"--gpu", strconv.Itoa(gpu)}
	var name string
	if p := os.Getenv(EnvMPSProbe); p != "" {
		f := strings.Fields(p)
		name, args = f[0], append(f[1:], args...)
	} else {
		self, err := os.Executable()
		if err != nil {
			return fmt.Errorf("finding this executable for the MPS probe: %w", err)
		}
		name, args = self, append([]string{"mps-probe"}, args...)
	}
	c := exec.CommandContext(ctx, name, args...)
	c.Env = append(os.Environ(), j.ctl.ClientEnv()...)
	out, err := c.CombinedOutput()
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (after %v)", ctx.Err(), mpsProbeTimeout)
		}
		return fmt.Errorf("a CUDA client of the MPS server on GPU %d failed: %w: %s", gpu, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// env is what the ranks' environment needs (nil without MPS).
func (j *jobMPS) env() []string {
	if j == nil {
		return nil
	}
	return j.ctl.ClientEnv()
}

// stop quits the control daemon and its server, and removes the pipes.
func (j *jobMPS) stop() {
	if j == nil {
		return
	}
	if err := j.ctl.Stop(); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintf(os.Stderr, "migctl: stopping the job's MPS control daemon: %v\n", err)
	}
	_ = os.RemoveAll(j.dir)
}

// shared says whether two or more of the ranks use one GPU.
func (r jobMPSRequest) shared() bool {
	_, n := busiestGPU(r.gpus)
	return n > 1
}

func (r jobMPSRequest) logf(format string, args ...any) {
	if r.quiet || r.log == nil {
		return
	}
	fmt.Fprintf(r.log, "migctl: "+format+"\n", args...)
}

// isPipe says whether path is a named pipe or a socket (the real control
// daemon's "control" is a socket).
func isPipe(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode()&(os.ModeNamedPipe|os.ModeSocket) != 0
}
