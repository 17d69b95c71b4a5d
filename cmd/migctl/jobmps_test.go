package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/internal/testutil"
)

// When a job's ranks get a private MPS server: only whole GPUs shared by
// several ranks, never MIG instances, swap-shimmed jobs, CUDA IPC or a
// server the user already chose; --mps on turns each "no" into an error.
func TestJobMPSDecide(t *testing.T) {
	t.Setenv("CUDA_MPS_PIPE_DIRECTORY", "")
	for _, tc := range []struct {
		name string
		req  jobMPSRequest
		want bool
		why  string // "" : none given
		err  string
	}{
		{"7 ranks on GPU 0", jobMPSRequest{mode: "auto", backend: "gpu", gpus: []int{0, 0, 0, 0, 0, 0, 0}}, true, "", ""},
		{"4 ranks on 2 GPUs", jobMPSRequest{mode: "auto", backend: "gpu", gpus: []int{0, 1, 0, 1}}, true, "", ""},
		{"1 rank per GPU", jobMPSRequest{mode: "auto", backend: "gpu", gpus: []int{0, 1}}, false, "", ""},
		{"1 rank per GPU, on", jobMPSRequest{mode: "on", backend: "gpu", gpus: []int{0, 1}}, true, "", ""},
		{"off", jobMPSRequest{mode: "off", backend: "gpu", gpus: []int{0, 0}}, false, "", ""},
		{"host backend", jobMPSRequest{mode: "auto", backend: "host", gpus: []int{0, 0}}, false, "no GPU", ""},
		{"host backend, on", jobMPSRequest{mode: "on", backend: "host", gpus: []int{0, 0}}, false, "", "no GPU"},
		{"MIG", jobMPSRequest{mode: "auto", backend: "gpu", mig: true}, false, "MIG instance", ""},
		{"MIG, on", jobMPSRequest{mode: "on", backend: "gpu", mig: true}, false, "", "MIG instance"},
		{"swap", jobMPSRequest{mode: "auto", backend: "gpu", swap: true, gpus: []int{0, 0}}, false, "daemon --mps", ""},
		{"ipc", jobMPSRequest{mode: "auto", backend: "gpu", ipc: true, gpus: []int{0, 0}}, false, "CUDA IPC", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, why, err := tc.req.decide()
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				require.ErrorContains(t, err, "--mps on")
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
			if tc.why == "" {
				require.Empty(t, why)
			} else {
				require.Contains(t, why, tc.why)
			}
		})
	}
	t.Run("the node's own MPS control daemon", func(t *testing.T) {
		dir := t.TempDir()
		old := systemMPSDir
		systemMPSDir = dir
		t.Cleanup(func() { systemMPSDir = old })
		req := jobMPSRequest{mode: "auto", backend: "gpu", gpus: []int{0, 0}}
		got, _, err := req.decide()
		require.NoError(t, err)
		require.True(t, got, "no control pipe yet")
		require.NoError(t, syscall.Mkfifo(filepath.Join(dir, "control"), 0o600))
		got, why, err := req.decide()
		require.NoError(t, err)
		require.False(t, got)
		require.Contains(t, why, dir)
	})
	t.Run("a server chosen by the user", func(t *testing.T) {
		t.Setenv("CUDA_MPS_PIPE_DIRECTORY", "/tmp/theirs")
		got, why, err := jobMPSRequest{mode: "auto", backend: "gpu", gpus: []int{0, 0}}.decide()
		require.NoError(t, err)
		require.False(t, got)
		require.Contains(t, why, "CUDA_MPS_PIPE_DIRECTORY")
	})
}

// migctl run with ranks sharing a GPU: a private MPS control daemon (the
// fake program) is up while the workers run, every worker has its pipe
// directory, and it is stopped and removed at the end; a probe that fails
// falls back to time-slicing under auto and fails the run under on.
func TestRunMPS(t *testing.T) {
	if isPipe(filepath.Join(systemMPSDir, "control")) {
		t.Skip("this node runs an MPS control daemon in " + systemMPSDir + ": auto leaves the ranks to it")
	}
	bin := testutil.MigctlBin(t)
	fake := testutil.FakeMPSControl(t)
	// each worker: its pipe directory, and whether the control pipe is there
	const script = `d="$CUDA_MPS_PIPE_DIRECTORY"; p=no; [ -n "$d" ] && [ -p "$d/control" ] && p=yes; echo "$d $p" > "$T_DIR/mps-$RANK"`
	read := func(t *testing.T, dir string, rank int) (string, string) {
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("mps-%d", rank)))
		require.NoError(t, err)
		f := strings.Fields(string(b))
		if len(f) == 1 {
			return "", f[0]
		}
		return f[0], f[1]
	}
	base := []string{"--gpus", "0", "--backend", "gpu", "--mps-control", fake, "-o", "json"}
	// the probe: a client that finds the control daemon up
	okProbe := filepath.Join(t.TempDir(), "probe")
	require.NoError(t, os.WriteFile(okProbe, []byte("#!/bin/sh\ntest -p \"$CUDA_MPS_PIPE_DIRECTORY/control\"\n"), 0o755))
	probe := func(ok bool) []string {
		if ok {
			return []string{"CUDA_MPS_PIPE_DIRECTORY=", "MIGCTL_MPS_PROBE=" + okProbe}
		}
		return []string{"CUDA_MPS_PIPE_DIRECTORY=", "MIGCTL_MPS_PROBE=false"}
	}

	t.Run("auto, 3 ranks on GPU 0", func(t *testing.T) {
		r := newRunCLI(t, bin)
		_, stderr, err := r.run(t, probe(true), append(base, "--np", "3", "--", "sh", "-c", script)...)
		require.NoError(t, err, stderr)
		require.Contains(t, stderr, "MPS: 3 ranks share GPU 0")
		dir0, pipe0 := read(t, r.dir, 0)
		require.True(t, strings.HasPrefix(dir0, r.tmp), dir0)
		for rank := range 3 {
			dir, pipe := read(t, r.dir, rank)
			require.Equal(t, dir0, dir)
			require.Equal(t, "yes", pipe, "rank %d ran without the control daemon", rank)
		}
		require.Equal(t, "yes", pipe0)
		r.requireClean(t) // the pipe directory is gone
	})

	t.Run("auto, the probe fails: time-sliced", func(t *testing.T) {
		r := newRunCLI(t, bin)
		_, stderr, err := r.run(t, probe(false), append(base, "--np", "2", "--", "sh", "-c", script)...)
		require.NoError(t, err, stderr)
		require.Contains(t, stderr, "MPS: not used")
		for rank := range 2 {
			dir, pipe := read(t, r.dir, rank)
			require.Empty(t, dir)
			require.Equal(t, "no", pipe)
		}
		r.requireClean(t)
	})

	t.Run("on, the probe fails: no worker starts", func(t *testing.T) {
		r := newRunCLI(t, bin)
		_, stderr, err := r.run(t, probe(false), append(base, "--np", "2", "--mps", "on", "--", "sh", "-c", script)...)
		require.Error(t, err)
		require.Contains(t, stderr, "--mps on")
		require.Contains(t, stderr, "failed")
		_, err = os.Stat(filepath.Join(r.dir, "mps-0"))
		require.ErrorIs(t, err, os.ErrNotExist)
		r.requireClean(t)
	})

	t.Run("on, no control program", func(t *testing.T) {
		r := newRunCLI(t, bin)
		_, stderr, err := r.run(t, probe(true), "--gpus", "0", "--backend", "gpu", "--np", "2", "--mps", "on",
			"--mps-control", filepath.Join(t.TempDir(), "nope"), "--", "true")
		require.Error(t, err)
		require.Contains(t, stderr, "no MPS control program")
	})

	t.Run("one rank per GPU, off, bad value", func(t *testing.T) {
		r := newRunCLI(t, bin)
		_, stderr, err := r.run(t, probe(true), append(base, "--np", "2", "--gpus", "0,1", "--", "sh", "-c", script)...)
		require.NoError(t, err, stderr)
		require.NotContains(t, stderr, "MPS")
		dir, _ := read(t, r.dir, 1)
		require.Empty(t, dir)
		_, stderr, err = r.run(t, probe(true), append(base, "--np", "2", "--mps", "off", "--", "sh", "-c", script)...)
		require.NoError(t, err, stderr)
		dir, _ = read(t, r.dir, 0)
		require.Empty(t, dir)
		_, stderr, err = r.run(t, nil, append(base, "--np", "2", "--mps", "yes", "--", "true")...)
		require.Error(t, err)
		require.Contains(t, stderr, `--mps "yes": want auto, on or off`)
	})
}
