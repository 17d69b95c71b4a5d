package main

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/allreduce"
	"github.com/migctl/migctl/trainer"
)

// TestBenchReduceOnFakeCUDA runs `migctl bench --backend gpu --reduce-on`
// across real processes, every rank's CUDA device on cuda.Fake: the
// host-staged all-reduce with its reduction on the devices (the kernels
// reading the shared arena through its mapped address), split, and on the
// CPU; every element checked, the share reported, and the LIMIT column's
// floor for that share. The host backend runs the same schedule when asked
// (its "device" reduction on a host stream).
func TestBenchReduceOnFakeCUDA(t *testing.T) {
	t.Setenv(trainer.EnvCUDAFake, "1") // inherited by the rank processes
	tests := []struct {
		reduceOn, dtype, op string
		np, b, share        int
		backend             string
	}{
		{"gpu", "float", "sum", 3, 262156, allreduce.GPUShareOne, "gpu"}, // 65539 elements
		{"split:0.5", "bfloat16", "avg", 2, 778, 500, "gpu"},
		{"split:0.25", "int32", "max", 7, 4096, 250, "gpu"},
		{"cpu", "half", "min", 3, 334, 0, "gpu"},
		{"gpu", "double", "avg", 4, 262152, allreduce.GPUShareOne, "host"},
	}
	shmDir := t.TempDir()
	for _, tc := range tests {
		name := fmt.Sprintf("%s/%s/%s/%s/np%d", tc.backend, tc.reduceOn, tc.dtype, tc.op, tc.np)
		t.Run(name, func(t *testing.T) {
			args := []string{"allreduce", "--np", strconv.Itoa(tc.np), "--backend", tc.backend, "--transport", "shm",
				"--algo", "hoststaged", "--reduce-on", tc.reduceOn, "--dtype", tc.dtype, "--op", tc.op,
				"-b", strconv.Itoa(tc.b), "-e", strconv.Itoa(tc.b * 8), "-f", "7", "-n", "2", "-w", "1", "-c", "1",
				"--chunk", "64KiB", "--slots", "3", "--small-bytes", "1KiB", "--timeout", "60s", "--shm-dir", shmDir, "-q"}
			rep, stderr, err := runBench(t, 3*time.Minute, args...)
			require.NoError(t, err, "migctl bench %v\nstderr:\n%s", args, stderr)
			require.Equal(t, "hoststaged", rep.Algorithm)
			require.Equal(t, tc.share, rep.GPUShare)
			require.NotEmpty(t, rep.Results)
			for _, row := range rep.Results {
				require.Zero(t, row.Wrong, "row %+v", row)
			}
		})
	}
}

func TestBenchReduceOnValidate(t *testing.T) {
	for _, bad := range []string{"split:2", "split:0", "gpu:0.5", "dram"} {
		_, err := benchValidate(t, allreduce.AllReduce, "--reduce-on", bad)
		require.ErrorContains(t, err, "--reduce-on", bad)
	}
	for _, good := range []string{"auto", "cpu", "gpu", "split", "split:0.125"} {
		o, err := benchValidate(t, allreduce.AllReduce, "--reduce-on", good)
		require.NoError(t, err, good)
		require.Equal(t, good, o.spec.ReduceOn)
	}
	o, err := benchValidate(t, allreduce.AllReduce)
	require.NoError(t, err)
	require.Equal(t, "auto", o.spec.ReduceOn, "default")
}
