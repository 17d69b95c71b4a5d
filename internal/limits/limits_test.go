package limits

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/allreduce"
	"github.com/migctl/migctl/internal/cuda"
)

func TestMeasureHost(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h, err := MeasureHost(ctx, HostOptions{Bytes: 1 << 20, Inputs: 3, Threads: 2, Reps: 1, MemoryBytes: 4<<20 + 100})
	require.NoError(t, err)
	require.Positive(t, h.ReduceThreadGiBs)
	require.Positive(t, h.ReduceHostGiBs)
	require.Equal(t, 3, h.Inputs)
	require.NotEmpty(t, h.Hostname)
	// The memory copy: cut to 64 bytes, and a rate no host is beyond
	// (this one's buffers fit in a cache: not a figure to trust).
	require.Equal(t, 4<<20+64, h.MemoryBytes)
	require.Positive(t, h.MemoryGiBs)
	require.Less(t, h.MemoryGiBs, 10_000.0)
	_, err = MeasureHost(ctx, HostOptions{Bytes: 8})
	require.ErrorIs(t, err, ErrInvalid)
	_, err = MeasureHost(ctx, HostOptions{Bytes: 1 << 16, MemoryBytes: 63})
	require.ErrorIs(t, err, ErrInvalid)
	cancel()
	_, err = MeasureHost(ctx, HostOptions{Bytes: 1 << 16})
	require.ErrorIs(t, err, context.Canceled)
}

func TestMeasureGPUOnTheFakeDriver(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	mig := cuda.FakeDevice{Name: "fake MIG", UUID: cuda.UUID{7}, ParentUUID: cuda.UUID{8}, PCIBusID: "00000000:19:00.0", SMs: 16, TotalMem: 1 << 30}
	f := cuda.NewFake(cuda.FakeDevice{Name: "fake", UUID: cuda.UUID{1}, ParentUUID: cuda.UUID{1}, PCIBusID: "00000000:18:00.0", SMs: 132, TotalMem: 1 << 30}, mig)
	start := time.Now()
	g, err := MeasureGPU(ctx, f, 0, GPUOptions{Bytes: 1 << 20, Reps: 1, RoundTrips: 5,
		ContendFor: 100 * time.Millisecond, ContendThreads: 2, ContendBytes: 1 << 20})
	require.NoError(t, err)
	require.Less(t, time.Since(start), 10*time.Second)
	require.Equal(t, cuda.UUID{1}.String("GPU"), g.UUID)
	require.Positive(t, g.H2DGiBs)
	require.Positive(t, g.D2HGiBs)
	require.Positive(t, g.DuplexGiBs)
	require.Positive(t, g.RoundTripUS)
	// The contended figures: copies and reductions both moved, and the
	// host-memory total is their bytes (a quarter more for the CPU's
	// writes).
	require.Equal(t, 2, g.ContendedThreads)
	require.Equal(t, 1<<20, g.ContendedBytes)
	require.Positive(t, g.ContendedCopyGiBs)
	require.Positive(t, g.ContendedReduceGiBs)
	require.InDelta(t, g.ContendedCopyGiBs+1.25*g.ContendedReduceGiBs, g.HostMemUnderDMAGiBs, 1e-9)

	g2, err := MeasureGPU(ctx, f, 1, GPUOptions{Bytes: 1 << 16, Reps: 1, RoundTrips: 3, ContendFor: -1})
	require.NoError(t, err)
	require.Equal(t, cuda.UUID{7}.String("MIG"), g2.UUID)
	require.Zero(t, g2.HostMemUnderDMAGiBs, "skipped")
	require.Zero(t, g2.ContendedThreads)
	_, err = MeasureGPU(ctx, f, 5, GPUOptions{Bytes: 1 << 16})
	require.Error(t, err)

	// The contended measurement stops when the context is done.
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancelShort()
	start = time.Now()
	_, err = MeasureGPU(short, f, 0, GPUOptions{Bytes: 1 << 16, Reps: 1, RoundTrips: 3,
		ContendFor: time.Hour, ContendThreads: 2, ContendBytes: 1 << 20})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Less(t, time.Since(start), 5*time.Second)
}

func TestCacheAndMachine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "migctl", "limits.json")
	l, err := Load(path, "h1")
	require.NoError(t, err)
	require.Zero(t, l.Host.ReduceThreadGiBs)

	l = Limits{Host: Host{Hostname: "h1", ReduceThreadGiBs: 5, ReduceHostGiBs: 40}}
	l.Put(GPU{Ordinal: 1, UUID: "GPU-b", H2DGiBs: 50, D2HGiBs: 48, DuplexGiBs: 90, RoundTripUS: 30})
	l.Put(GPU{Ordinal: 0, UUID: "GPU-a", H2DGiBs: 40, D2HGiBs: 45, DuplexGiBs: 80, RoundTripUS: 20})
	l.Put(GPU{Ordinal: 0, UUID: "GPU-a", H2DGiBs: 52, D2HGiBs: 51, DuplexGiBs: 95, RoundTripUS: 25})
	require.Len(t, l.GPUs, 2)
	require.Equal(t, "GPU-a", l.GPUs[0].UUID)
	require.NoError(t, Save(path, "h1", l))
	require.NoError(t, Save(path, "h2", Limits{Host: Host{Hostname: "h2", ReduceThreadGiBs: 1}}))
	got, err := Load(path, "h1")
	require.NoError(t, err)
	require.Equal(t, l, got)

	m := got.Machine(allreduce.H200(), []string{"GPU-a"})
	require.Equal(t, 51.0, m.LinkGiBs)
	require.Equal(t, 95.0, m.DuplexGiBs)
	require.Equal(t, 25*time.Microsecond, m.RoundTrip)
	require.Equal(t, 5.0, m.ReduceThreadGiBs)
	require.Equal(t, 40.0, m.ReduceHostGiBs)
	require.Equal(t, allreduce.H200().P2PGiBs, m.P2PGiBs)
	m = got.Machine(allreduce.H200(), nil) // the slowest GPU binds
	require.Equal(t, 48.0, m.LinkGiBs)
	require.Equal(t, 30*time.Microsecond, m.RoundTrip)
	require.Zero(t, m.HostMemGiBs, "not measured: base's")
	// Nothing measured: the base.
	require.Equal(t, allreduce.H200(), Limits{}.Machine(allreduce.H200(), nil))

	// Host memory under DMA: one GPU's figure for that GPU; for several
	// GPUs (measured one at a time) base's.
	c := got
	c.GPUs = slices.Clone(got.GPUs)
	c.GPUs[0].HostMemUnderDMAGiBs, c.GPUs[1].HostMemUnderDMAGiBs = 120, 150
	require.NoError(t, Save(path, "h1", c))
	c, err = Load(path, "h1")
	require.NoError(t, err)
	require.Equal(t, 120.0, c.Machine(allreduce.H200(), []string{"GPU-a"}).HostMemGiBs)
	require.Equal(t, 150.0, c.Machine(allreduce.H200(), []string{"GPU-b"}).HostMemGiBs)
	require.Zero(t, c.Machine(allreduce.H200(), nil).HostMemGiBs)
	base := allreduce.H200()
	base.HostMemGiBs = 99
	require.Equal(t, 99.0, c.Machine(base, []string{"GPU-a", "GPU-b"}).HostMemGiBs)

	// The host's reduction: the best figure seen, alone (40) or beside a
	// GPU's copies (a disturbed alone run measured less than that).
	c.GPUs[0].ContendedReduceGiBs = 30
	require.Equal(t, 40.0, c.Machine(allreduce.H200(), []string{"GPU-a"}).ReduceHostGiBs)
	c.GPUs[0].ContendedReduceGiBs = 58.7
	require.Equal(t, 58.7, c.Machine(allreduce.H200(), []string{"GPU-a"}).ReduceHostGiBs)

	require.NoError(t, os.WriteFile(path, []byte("{"), 0o644))
	_, err = Load(path, "h1")
	require.ErrorIs(t, err, ErrInvalid)
	require.NoError(t, Save(path, "h1", l)) // a broken cache is replaced
	got, err = Load(path, "h1")
	require.NoError(t, err)
	require.Equal(t, l, got)
}

func TestCacheBeforeHostMemory(t *testing.T) {
	// A cache written before the memory figures existed loads; they read
	// as 0 (not measured), and the machine keeps base's host-memory cap.
	path := filepath.Join(t.TempDir(), "limits.json")
	old := `{"version": 1, "hosts": {"h1": {
  "host": {"hostname": "h1", "cpus": 16, "inputs": 4, "bytes": 67108864, "threads": 16,
    "reduceThreadGiBs": 7.98, "reduceHostGiBs": 70.38, "measured": "2026-12-01T14:40:00Z"},
  "gpus": [{"ordinal": 0, "uuid": "GPU-a", "name": "NVIDIA H200", "bytes": 268435456, "h2dGiBs": 51.45,
    "d2hGiBs": 51.5, "duplexGiBs": 94.47, "roundTripUs": 9.588, "measured": "2026-12-01T14:40:00Z"}]}}}`
	require.NoError(t, os.WriteFile(path, []byte(old), 0o644))
	l, err := Load(path, "h1")
	require.NoError(t, err)
	require.Equal(t, 70.38, l.Host.ReduceHostGiBs)
	require.Zero(t, l.Host.MemoryGiBs)
	require.Len(t, l.GPUs, 1)
	require.Zero(t, l.GPUs[0].HostMemUnderDMAGiBs)
	m := l.Machine(allreduce.H200(), []string{"GPU-a"})
	require.Equal(t, 94.47, m.DuplexGiBs)
	require.Zero(t, m.HostMemGiBs)
	// Saved again, the missing figures stay missing (omitted).
	require.NoError(t, Save(path, "h1", l))
	buf, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NotContains(t, string(buf), "hostMemUnderDMAGiBs")
	require.NotContains(t, string(buf), "memoryGiBs")
}

// NodeMachine gives the cached figures of the GPUs of this node that the
// job uses, and nothing when the cache describes none of them.
func TestNodeMachine(t *testing.T) {
	gpu := func(uuid string, link, hostMem float64) GPU {
		return GPU{UUID: uuid, H2DGiBs: link, D2HGiBs: link, DuplexGiBs: 2 * link, RoundTripUS: 11,
			HostMemUnderDMAGiBs: hostMem}
	}
	l := Limits{Host: Host{ReduceThreadGiBs: 8.9, ReduceHostGiBs: 73},
		GPUs: []GPU{gpu("GPU-a", 51.3, 147), gpu("GPU-b", 40, 120), gpu("GPU-elsewhere", 60, 200)}}
	base := allreduce.H200()
	tests := []struct {
		desc          string
		node, chosen  []string
		ok            bool
		link, hostMem float64
	}{
		{"a job on GPU a", []string{"GPU-a", "GPU-b"}, []string{"GPU-a"}, true, 51.3, 147},
		// Two GPUs: the slower link; no host-memory cap (each GPU was measured alone).
		{"a job on both", []string{"GPU-a", "GPU-b"}, []string{"GPU-b", "GPU-a"}, true, 40, base.HostMemGiBs},
		{"leased MIG instances: the node's GPUs", []string{"GPU-b"}, nil, true, 40, 120},
		{"the cached GPU is not on this node", []string{"GPU-c"}, nil, false, 0, 0},
		{"no driver (a simulated node, CI)", nil, nil, false, 0, 0},
		{"a chosen GPU the node does not report", []string{"GPU-a"}, []string{"GPU-elsewhere"}, false, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			m, ok := l.NodeMachine(base, tc.node, tc.chosen)
			require.Equal(t, tc.ok, ok)
			if !ok {
				require.Equal(t, base, m)
				return
			}
			require.Equal(t, tc.link, m.LinkGiBs)
			require.Equal(t, tc.hostMem, m.HostMemGiBs)
			require.Equal(t, 8.9, m.ReduceThreadGiBs)
		})
	}
	_, ok := Limits{Host: l.Host}.NodeMachine(base, []string{"GPU-a"}, nil)
	require.False(t, ok, "the host's figures alone: none")
}
