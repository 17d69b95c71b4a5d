package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/comm"
	"github.com/migctl/migctl/internal/mps"
	"github.com/migctl/migctl/trainer"
)

// TestBenchGPUBackendOnFakeCUDA runs `migctl bench --backend gpu` across
// real processes with every rank's CUDA device on cuda.Fake: registration of
// the shared arena, async copies, events and the reduction kernels' ABI
// (both algorithms: host-staged uses copies, ring the mapped-host reduce
// kernel), every element checked.
func TestBenchGPUBackendOnFakeCUDA(t *testing.T) {
	t.Setenv(trainer.EnvCUDAFake, "1") // inherited by the rank processes
	tests := []struct {
		coll, dtype, op, algo string
		np, b                 int
	}{
		{"allreduce", "float", "sum", "hoststaged", 3, 1000},
		{"allreduce", "float", "avg", "ring", 3, 1000},
		{"allreduce", "bfloat16", "max", "ring", 2, 778},
		{"allreduce", "int64", "min", "ring", 4, 4096},
		{"allreduce", "half", "avg", "hoststaged", 2, 334},
		{"reducescatter", "uint8", "sum", "auto", 3, 999},
		{"allgather", "double", "sum", "auto", 2, 512},
	}
	shmDir := t.TempDir()
	for _, tc := range tests {
		name := fmt.Sprintf("%s/%s/%s/%s/np%d", tc.coll, tc.dtype, tc.op, tc.algo, tc.np)
		t.Run(name, func(t *testing.T) {
			args := []string{tc.coll, "--np", strconv.Itoa(tc.np), "--backend", "gpu", "--transport", "shm",
				"--dtype", tc.dtype, "--op", tc.op, "-b", strconv.Itoa(tc.b), "-e", strconv.Itoa(tc.b * 300), "-f", "17",
				"-n", "2", "-w", "1", "-c", "1", "--chunk", "64KiB", "--slots", "3", "--timeout", "60s",
				"--shm-dir", shmDir, "-q"}
			if tc.coll == "allreduce" {
				args = append(args, "--algo", tc.algo)
			}
			rep, stderr, err := runBench(t, 3*time.Minute, args...)
			require.NoError(t, err, "migctl bench %v\nstderr:\n%s", args, stderr)
			require.Equal(t, "gpu", rep.Backend)
			require.NotEmpty(t, rep.Results)
			for _, row := range rep.Results {
				require.Zero(t, row.Wrong, "row %+v", row)
			}
		})
	}
}

// TestBenchSmallH2DFollowsRanksPerDevice: small copies in go by the copy
// kernel from comm.KernelH2DRanks ranks on one CUDA device on when the
// ranks are MPS clients (the fake driver's ranks all share one device;
// CUDA_MPS_PIPE_DIRECTORY set says MPS: migctl joins it and the fake
// ignores it), by the copy engines' 2D rows below that or without MPS, and
// as MIGCTL_H2D says when it is set; every element checked, sizes below
// and above comm.SmallH2DBytes.
func TestBenchSmallH2DFollowsRanksPerDevice(t *testing.T) {
	t.Setenv(trainer.EnvCUDAFake, "1")
	shmDir := t.TempDir()
	for _, tc := range []struct {
		np   int
		mps  bool
		env  string
		want comm.H2DMode
	}{
		{comm.KernelH2DRanks, true, "", comm.H2DKernel},
		{comm.KernelH2DRanks, false, "", comm.H2D2DRows},
		{comm.KernelH2DRanks - 1, true, "", comm.H2D2DRows},
		{2, false, "kernel", comm.H2DKernel},
		{comm.KernelH2DRanks, true, "2drows", comm.H2D2DRows},
	} {
		t.Run(fmt.Sprintf("np%d/mps=%v/env=%s", tc.np, tc.mps, tc.env), func(t *testing.T) {
			t.Setenv(trainer.EnvSmallH2D, tc.env)
			if tc.mps {
				t.Setenv("CUDA_MPS_PIPE_DIRECTORY", t.TempDir())
			} else {
				if _, err := os.Stat(filepath.Join(mps.SystemPipeDir, mps.ControlPipe)); err == nil {
					t.Skip("this node runs an MPS control daemon for every process")
				}
				t.Setenv("CUDA_MPS_PIPE_DIRECTORY", "")
			}
			args := []string{"allreduce", "--np", strconv.Itoa(tc.np), "--backend", "gpu", "--transport", "shm",
				"--dtype", "float", "--op", "sum", "-b", "4", "-e", "256KiB", "-f", "8", "-n", "2", "-w", "1", "-c", "1",
				"--timeout", "60s", "--shm-dir", shmDir, "-q"}
			rep, stderr, err := runBench(t, 3*time.Minute, args...)
			require.NoError(t, err, "migctl bench %v\nstderr:\n%s", args, stderr)
			require.Equal(t, string(tc.want), rep.SmallH2D)
			require.Len(t, rep.Results, 6)
			for _, row := range rep.Results {
				require.Zero(t, row.Wrong, "row %+v", row)
			}
		})
	}
}
