package limits

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/allreduce"
	"github.com/migctl/migctl/internal/cuda"
)

func TestMeasureHost(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h, err := MeasureHost(ctx, HostOptions{Bytes: 1 << 20, Inputs: 3, Threads: 2, Reps: 1})
	require.NoError(t, err)
	require.Positive(t, h.ReduceThreadGiBs)
	require.Positive(t, h.ReduceHostGiBs)
	require.Equal(t, 3, h.Inputs)
	require.NotEmpty(t, h.Hostname)
	_, err = MeasureHost(ctx, HostOptions{Bytes: 8})
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
	g, err := MeasureGPU(ctx, f, 0, GPUOptions{Bytes: 1 << 20, Reps: 1, RoundTrips: 5})
	require.NoError(t, err)
	require.Equal(t, cuda.UUID{1}.String("GPU"), g.UUID)
	require.Positive(t, g.H2DGiBs)
	require.Positive(t, g.D2HGiBs)
	require.Positive(t, g.DuplexGiBs)
	require.Positive(t, g.RoundTripUS)
	g2, err := MeasureGPU(ctx, f, 1, GPUOptions{Bytes: 1 << 16, Reps: 1, RoundTrips: 3})
	require.NoError(t, err)
	require.Equal(t, cuda.UUID{7}.String("MIG"), g2.UUID)
	_, err = MeasureGPU(ctx, f, 5, GPUOptions{Bytes: 1 << 16})
	require.Error(t, err)
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
	// Nothing measured: the base.
	require.Equal(t, allreduce.H200(), Limits{}.Machine(allreduce.H200(), nil))

	require.NoError(t, os.WriteFile(path, []byte("{"), 0o644))
	_, err = Load(path, "h1")
	require.ErrorIs(t, err, ErrInvalid)
	require.NoError(t, Save(path, "h1", l)) // a broken cache is replaced
	got, err = Load(path, "h1")
	require.NoError(t, err)
	require.Equal(t, l, got)
}
