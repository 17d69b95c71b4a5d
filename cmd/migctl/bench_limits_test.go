package main

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/allreduce"
	"github.com/migctl/migctl/internal/benchrank"
	"github.com/migctl/migctl/internal/limits"
	"github.com/migctl/migctl/trainer"
)

func TestBenchAlgoFlag(t *testing.T) {
	o, err := benchValidate(t, allreduce.AllReduce, "--algo", "hierarchical")
	require.NoError(t, err)
	require.Equal(t, "hierarchical", o.spec.Algorithm)
	require.True(t, o.spec.Limits)
	_, err = benchValidate(t, allreduce.AllReduce, "--algo", "tree")
	require.ErrorContains(t, err, "want auto, hoststaged, ring or hierarchical")
}

// The LIMIT column of issue 9's rows on the H200 figures: the floor of the
// algorithm each row ran, and the fraction of it reached.
func TestBenchReportLimits(t *testing.T) {
	spec := benchrank.Config{Small: 64 << 10, Chunk: 4 << 20, Slots: 8}
	tests := []struct {
		desc    string
		np      int
		alg     string
		backend string
		groups  []int
		bytes   int64
		timeUS  float64
		rowAlg  string
		limitUS float64
		bind    string
	}{
		// 7 ranks on one GPU: 7·S each way, both at once at 97 GB/s.
		{"7 on 1 GPU", 7, "hoststaged", "gpu", []int{0, 0, 0, 0, 0, 0, 0}, 256 << 20, 43_300, "hoststaged", 38_781, "duplex"},
		{"8 KiB on 7 ranks", 7, "hoststaged", "gpu", []int{0, 0, 0, 0, 0, 0, 0}, 8 << 10, 65, "hoststaged-small", 29.5, "latency"},
		// 8 on 2 GPUs: per GPU 7·S in, 3·S of it read by kernels at 24 GiB/s.
		{"8 on 2 GPUs, hierarchical", 8, "hierarchical", "gpu", []int{0, 0, 0, 0, 1, 1, 1, 1}, 256 << 20, 60_000, "hierarchical", 50_690, "link"},
		{"2 on 2 GPUs, IPC ring", 2, "ring-ipc", "gpu", []int{0, 1}, 256 << 20, 957, "ring-ipc", 687, "p2p"},
		{"host backend", 4, "hoststaged", "host", []int{0, 0, 0, 0}, 64 << 20, 20_000, "hoststaged", 256.0 / 1024 / (4 * 3 * 4.1) * 1e6, "host"},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			rep := &benchReport{Coll: "allreduce", NP: tc.np, Backend: tc.backend, Algorithm: tc.alg,
				Results: []benchRow{{Bytes: tc.bytes, TimeUS: tc.timeUS}}}
			s := spec
			s.Workers = max(1, 14/tc.np) // the executor's default on a large host
			require.NoError(t, rep.setLimits(s, allreduce.H200(), "test", tc.groups))
			x := rep.Results[0]
			require.Equal(t, tc.rowAlg, x.RowAlgorithm)
			require.InDelta(t, tc.limitUS, x.LimitUS, tc.limitUS/100, "%+v", x)
			require.Equal(t, tc.bind, x.LimitBinding)
			require.InDelta(t, 100*x.LimitUS/tc.timeUS, x.PctLimit, 1e-9)
			rows := rep.Rows()
			require.Len(t, rows[0], len(rep.Header()))
			var buf bytes.Buffer
			require.NoError(t, json.NewEncoder(&buf).Encode(rep))
			require.Contains(t, buf.String(), `"limitUs":`)
			require.Contains(t, buf.String(), `"pctLimit":`)
		})
	}
	// Reduce-scatter rows: the floor of one rank's block.
	rep := &benchReport{Coll: "reducescatter", NP: 2, Backend: "host", Algorithm: "hoststaged",
		Results: []benchRow{{Bytes: 2 << 30, TimeUS: 1e6}, {Bytes: 0}}}
	require.NoError(t, rep.setLimits(benchrank.Config{Workers: 1}, allreduce.Machine{ReduceThreadGiBs: 1}, "test", []int{0, 0}))
	require.InDelta(t, 2e6, rep.Results[0].LimitUS, 1) // 2² · 1 GiB read by 2 threads at 1 GiB/s
	require.Zero(t, rep.Results[1].LimitUS)
	require.Equal(t, []string{"-", "-"}, rep.Rows()[1][9:])
}

// smallHost keeps the command tests' host measurement small (CI: 2 cores).
var smallHost = limits.HostOptions{Bytes: 1 << 20, Reps: 1, MemoryBytes: 8 << 20}

func TestBenchLimitsCommand(t *testing.T) {
	cache := filepath.Join(t.TempDir(), "limits.json")
	run := func(args ...string) string {
		var out, errOut bytes.Buffer
		cmd := newBenchLimitsCmdWith(&benchLimitsOptions{streams: streams{In: &bytes.Buffer{}, Out: &out, ErrOut: &errOut}, host: smallHost})
		cmd.SetArgs(append([]string{"--cache", cache, "--backend", "host"}, args...))
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		require.NoError(t, cmd.ExecuteContext(ctx), errOut.String())
		return out.String() + errOut.String()
	}
	first := run()
	require.Contains(t, first, "measuring the host's reduction and memory bandwidth")
	require.Contains(t, first, "host reduction, 1 thread")
	require.Regexp(t, `host memory, CPU copy, \d+ threads +\S+ +[0-9.]+ GiB/s read\+written`, first)
	require.Contains(t, first, "cost model: host memory cap")
	second := run("-o", "json")
	require.NotContains(t, second, "measuring", "the second call reads the cache")
	var rep limitsReport
	require.NoError(t, json.Unmarshal([]byte(second), &rep))
	require.Positive(t, rep.Limits.Host.ReduceThreadGiBs)
	require.Positive(t, rep.Limits.Host.MemoryGiBs)
	require.Contains(t, second, `"memoryGiBs":`)
	require.Contains(t, run("-o", "yaml"), "memoryGiBs:")
	l, err := limits.Load(cache, rep.Limits.Host.Hostname)
	require.NoError(t, err)
	require.Equal(t, rep.Limits.Host.ReduceThreadGiBs, l.Host.ReduceThreadGiBs)

	// A cache from before the memory figure: the host is measured again.
	l.Host.MemoryGiBs = 0
	require.NoError(t, limits.Save(cache, rep.Limits.Host.Hostname, l))
	require.Contains(t, run(), "measuring the host's")

	cmd := newBenchLimitsCmd(streams{In: &bytes.Buffer{}, Out: &bytes.Buffer{}, ErrOut: &bytes.Buffer{}})
	cmd.SetArgs([]string{"--backend", "tpu"})
	require.ErrorContains(t, cmd.Execute(), "--backend")
	cmd = newBenchLimitsCmd(streams{In: &bytes.Buffer{}, Out: &bytes.Buffer{}, ErrOut: &bytes.Buffer{}})
	cmd.SetArgs([]string{"--gpu", "x"})
	require.ErrorContains(t, cmd.Execute(), "--gpu")
}

// On the fake driver: the GPU's figures, host memory under its DMA among
// them, in the table and the JSON, and the cost model's cap from it.
func TestBenchLimitsCommandFakeGPU(t *testing.T) {
	t.Setenv(trainer.EnvCUDAFake, "1")
	cache := filepath.Join(t.TempDir(), "limits.json")
	run := func(args ...string) string {
		var out, errOut bytes.Buffer
		cmd := newBenchLimitsCmdWith(&benchLimitsOptions{streams: streams{In: &bytes.Buffer{}, Out: &out, ErrOut: &errOut}, host: smallHost})
		cmd.SetArgs(append([]string{"--cache", cache, "--backend", "gpu"}, args...))
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		require.NoError(t, cmd.ExecuteContext(ctx), errOut.String())
		return out.String() + errOut.String()
	}
	table := run()
	require.Contains(t, table, "during CPU reductions")
	require.Regexp(t, `host memory under DMA +0 GPU-\S+ +[0-9.]+ GiB/s \(copies \+ CPU reads \+ writes\)`, table)
	require.Regexp(t, `cost model: host memory cap +- +[0-9.]+ GiB/s`, table)
	var rep limitsReport
	require.NoError(t, json.Unmarshal([]byte(run("-o", "json")), &rep))
	require.Len(t, rep.Limits.GPUs, 1)
	g := rep.Limits.GPUs[0]
	require.Positive(t, g.ContendedCopyGiBs)
	require.Positive(t, g.ContendedReduceGiBs)
	require.Positive(t, g.HostMemUnderDMAGiBs)
	require.Equal(t, g.HostMemUnderDMAGiBs, rep.Machine.HostMemGiBs)
}
