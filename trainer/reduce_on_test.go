package trainer

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/allreduce"
	"github.com/migctl/migctl/comm"
	"github.com/migctl/migctl/internal/cuda"
)

// Ranks on one (fake) GPU take the host-staged all-reduce; WithReduceOn
// moves its reduction to the devices, splits it or leaves it on the CPU,
// auto takes the cost model's share (the CPU on the H200 figures: the
// devices won no row measured on the H200), and
// sums and averages are exact on host slices and device buffers, at an odd
// size (65539 elements) and a small one.
func TestReduceOnFakeGPU(t *testing.T) {
	tests := []struct {
		mode  string
		n     int
		share int
	}{
		{"cpu", 3, 0},
		{"gpu", 3, allreduce.GPUShareOne},
		{"split:0.25", 3, 250},
		{"auto", 2, 0},
		{"auto", 3, 0},
		{"", 2, 0},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%s/n%d", tc.mode, tc.n), func(t *testing.T) {
			errs := world(t, tc.n, func(int) []Option {
				f := cuda.NewFake()
				comm.InstallFakeCUDAKernels(f)
				o := []Option{withCUDA(f), WithBackend(BackendGPU), WithTuning(Tuning{Chunk: 64 << 10, Slots: 3})}
				if tc.mode != "" {
					o = append(o, WithReduceOn(tc.mode))
				}
				return o
			}, func(g *Group) error {
				ctx := context.Background()
				if g.Algorithm() != allreduce.HostStaged.String() || g.GPUShare() != tc.share {
					return fmt.Errorf("%s with GPU share %d, want hoststaged with %d", g.Algorithm(), g.GPUShare(), tc.share)
				}
				r := g.Rank()
				for _, count := range []int{65539, 1000} {
					send := make([]float32, count)
					for i := range send {
						send[i] = input(r, i)
					}
					recv := make([]float32, count)
					if err := g.AllReduce(ctx, HostSlice(send), HostSlice(recv), Sum); err != nil {
						return err
					}
					avg, err := deviceAllReduce(ctx, g, send, Avg)
					if err != nil {
						return err
					}
					for i := range recv {
						var want float32
						for q := range g.Size() {
							want += input(q, i)
						}
						if recv[i] != want || avg[i] != want/float32(g.Size()) {
							return fmt.Errorf("rank %d element %d: sum %v avg %v, want %v and %v", r, i, recv[i], avg[i], want, want/float32(g.Size()))
						}
					}
				}
				return nil
			})
			requireAll(t, errs)
		})
	}
}

func TestReduceOnSettings(t *testing.T) {
	// The host backend: auto reduces on the CPU threads, an explicit share
	// runs the split schedule (its "device" reduction on a host stream).
	for _, tc := range []struct {
		mode  string
		share int
	}{{"auto", 0}, {"gpu", allreduce.GPUShareOne}, {"split:0.5", 500}} {
		errs := world(t, 3, func(int) []Option { return []Option{WithReduceOn(tc.mode)} }, func(g *Group) error {
			if g.Backend() != BackendHost || g.GPUShare() != tc.share {
				return fmt.Errorf("%s: backend %s with GPU share %d, want host with %d", tc.mode, g.Backend(), g.GPUShare(), tc.share)
			}
			// Out of place: in place on host slices, the race detector
			// cannot see the order the flags in the shared mapping give
			// (it reports the plain host-staged schedule too); the
			// allreduce package runs the split in place with its flags in
			// Go memory.
			send, recv := make([]float32, 65539), make([]float32, 65539)
			for i := range send {
				send[i] = input(g.Rank(), i)
			}
			if err := g.AllReduce(context.Background(), HostSlice(send), HostSlice(recv), Max); err != nil {
				return err
			}
			for i, x := range recv {
				if x != input(2, i) {
					return fmt.Errorf("%s: element %d = %v, want %v", tc.mode, i, x, input(2, i))
				}
			}
			return nil
		})
		requireAll(t, errs)
	}
	// Ranks that disagree fail at the rendezvous.
	errs := world(t, 2, func(r int) []Option { return []Option{WithReduceOn([]string{"gpu", "cpu"}[r])} },
		func(*Group) error { return nil })
	require.ErrorContains(t, errs, allreduce.SettingReduceOn)
	_, err := Init(context.Background(), WithReduceOn("everywhere"))
	require.ErrorIs(t, err, allreduce.ErrUnsupported)
}
