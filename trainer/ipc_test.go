//go:build !race

// The race detector cannot see the synchronisation of this test: two
// in-process ranks read each other's fake device memory (Go heap) ordered
// by flags in a shared-memory segment that each rank maps at its own
// address, which the detector does not track. `make test` runs it without
// -race (see the Makefile).

package trainer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/migctl/migctl/comm"
	"github.com/migctl/migctl/internal/cuda"
)

// The IPC ring on the fake driver: scratch-staged host slices, raw device
// pointers, and registered buffers all give the exact sum.
func TestIPCRingOnFakeDriver(t *testing.T) {
	const n, count = 2, 5000
	errs := world(t, n, func(int) []Option {
		f := cuda.NewFake()
		comm.InstallFakeCUDAKernels(f)
		return []Option{withCUDA(f), WithBackend(BackendGPU), WithTransport(TransportIPC)}
	}, func(g *Group) error {
		ctx := context.Background()
		if g.Algorithm() != "ring-ipc" {
			return fmt.Errorf("algorithm %s, want ring-ipc", g.Algorithm())
		}
		if g.exec.Options().BroadcastOnDevice {
			return errors.New("broadcasts on the device asked for on the IPC transport (which never queues them)")
		}
		r := g.Rank()
		send := make([]float32, count)
		for i := range send {
			send[i] = input(r, i)
		}
		want := make([]float32, count)
		for i := range want {
			for q := range n {
				want[i] += input(q, i)
			}
		}
		recv := make([]float32, count)
		if err := g.AllReduce(ctx, HostSlice(send), HostSlice(recv), Sum); err != nil {
			return fmt.Errorf("staged: %w", err)
		}
		if !slices.Equal(recv, want) {
			return errors.New("staged all-reduce over IPC is wrong")
		}
		a, err := g.Alloc(count, Float32)
		if err != nil {
			return err
		}
		b, err := g.Alloc(count, Float32)
		if err != nil {
			return err
		}
		if err := g.RegisterIPC(ctx, a, b); err != nil {
			return err
		}
		for _, tc := range []struct {
			name       string
			send, recv Buffer
		}{{"registered", a, b}, {"raw pointers", DeviceBuffer(a.ptr, count, Float32, 0), DeviceBuffer(b.ptr, count, Float32, 0)}} {
			clear(recv)
			if err := g.Write(ctx, a, HostSlice(send).Host()); err != nil {
				return err
			}
			if err := g.AllReduce(ctx, tc.send, tc.recv, Sum); err != nil {
				return fmt.Errorf("%s: %w", tc.name, err)
			}
			if err := g.Read(ctx, HostSlice(recv).Host(), b); err != nil {
				return err
			}
			if !slices.Equal(recv, want) {
				return fmt.Errorf("%s all-reduce over IPC is wrong", tc.name)
			}
		}
		return nil
	})
	requireAll(t, errs)
}
