package trainer

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/allreduce"
	"github.com/migctl/migctl/comm"
	"github.com/migctl/migctl/comm/rendezvous"
	"github.com/migctl/migctl/internal/cuda"
)

// chooseAlgorithm over the layouts of issue 9: ranks on MIG instances of
// one or two GPUs (shm transport), forced algorithms, the host backend, and
// machine figures from the job's settings.
func TestChooseAlgorithm(t *testing.T) {
	peers := func(perGPU ...int) []rendezvous.Peer {
		var ps []rendezvous.Peer
		for gpu, k := range perGPU {
			for i := range k {
				ps = append(ps, rendezvous.Peer{Rank: len(ps), Host: "h", MIG: true,
					GPUUUID: fmt.Sprintf("MIG-%d-%d", gpu, i), ParentGPUUUID: fmt.Sprintf("pci:%d", gpu)})
			}
		}
		return ps
	}
	tests := []struct {
		desc     string
		perGPU   []int
		backend  Backend
		algo     Algorithm
		settings map[string]string
		want     allreduce.Algorithm
		groups   int
	}{
		{"7 on 1 GPU", []int{7}, BackendGPU, AlgorithmAuto, nil, allreduce.HostStaged, 1},
		{"2 on 2 GPUs", []int{1, 1}, BackendGPU, AlgorithmAuto, nil, allreduce.Ring, 2},
		// Several ranks per GPU: host-staged (measured 19.0 and 62.0 ms on two
		// H200s; hierarchical's kernel reads of host memory measured slow on
		// one, see allreduce.Efficiency), with the ranks grouped by GPU.
		{"4 on 2 GPUs", []int{2, 2}, BackendGPU, AlgorithmAuto, nil, allreduce.HostStaged, 2},
		{"8 on 2 GPUs", []int{4, 4}, BackendGPU, AlgorithmAuto, nil, allreduce.HostStaged, 2},
		{"4 on 2 GPUs, forced hierarchical", []int{2, 2}, BackendGPU, AlgorithmHierarchical, nil, allreduce.Hierarchical, 2},
		{"8 on 2 GPUs, forced host-staged", []int{4, 4}, BackendGPU, AlgorithmHostStaged, nil, allreduce.HostStaged, 2},
		{"2 on 1 GPU, forced hierarchical", []int{2}, BackendGPU, AlgorithmHierarchical, nil, allreduce.Hierarchical, 1},
		{"host backend", []int{4}, BackendHost, AlgorithmAuto, nil, allreduce.HostStaged, 1},
		// Two ranks on one GPU: host-staged on hw/H200.md's figures (no host
		// memory figure: the link binds both); the ring, whose reductions
		// stage on the device, once the host's measured host memory
		// (MIGCTL_MACHINE from `migctl bench limits`) binds host-staged.
		{"2 on 1 GPU", []int{2}, BackendGPU, AlgorithmAuto, nil, allreduce.HostStaged, 1},
		{"2 on 1 GPU, measured host", []int{2}, BackendGPU, AlgorithmAuto, map[string]string{
			allreduce.SettingLinkGiBs: "51.3", allreduce.SettingDuplexGiBs: "94.4", allreduce.SettingHostMemGiBs: "147"},
			allreduce.Ring, 1},
		{"7 on 1 GPU, measured host", []int{7}, BackendGPU, AlgorithmAuto, map[string]string{
			allreduce.SettingLinkGiBs: "51.3", allreduce.SettingDuplexGiBs: "94.4", allreduce.SettingHostMemGiBs: "147"},
			allreduce.HostStaged, 1},
		// A host that reduces 40 GiB/s per thread: the link binds
		// host-staged at its n·S, less than hierarchical's (2−1/m)·S.
		{"8 on 2 GPUs, fast CPU", []int{4, 4}, BackendGPU, AlgorithmAuto,
			map[string]string{allreduce.SettingThreadGiBs: "40"}, allreduce.HostStaged, 2},
		// 6 threads per rank instead of 1: 48 threads reduce 2 GiB in 10 ms.
		{"8 on 2 GPUs, more reduce workers", []int{4, 4}, BackendGPU, AlgorithmAuto,
			map[string]string{allreduce.SettingReduceWorkers: "6"}, allreduce.HostStaged, 2},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			ps := peers(tc.perGPU...)
			g := &Group{cfg: config{backend: tc.backend, transport: TransportAuto, algorithm: tc.algo, settings: tc.settings},
				size: len(ps), peers: ps, topo: rendezvous.Topology{SameHost: true, SameGPU: len(tc.perGPU) == 1, AnyMIG: true},
				dev: comm.NewHostDevice(comm.HostOptions{})}
			require.NoError(t, g.chooseAlgorithm())
			require.Equal(t, TransportShm, g.transport)
			require.Equal(t, tc.want, g.alg)
			require.Equal(t, tc.groups, g.groups.Count())
		})
	}
	g := &Group{cfg: config{backend: BackendGPU, settings: map[string]string{allreduce.SettingLinkGiBs: "fast"}},
		size: 2, peers: peers(2), topo: rendezvous.Topology{SameHost: true, SameGPU: true}, dev: comm.NewHostDevice(comm.HostOptions{})}
	require.ErrorIs(t, g.chooseAlgorithm(), allreduce.ErrUnsupported)
	g.cfg.settings = map[string]string{allreduce.SettingReduceWorkers: "0"}
	require.ErrorIs(t, g.chooseAlgorithm(), comm.ErrInvalid)
}

// Four ranks on MIG instances of two (fake) GPUs, two each, with the
// hierarchical all-reduce asked for: the grouping by physical GPU reaches
// the communicator, and sums and averages are exact on the device path.
func TestHierarchicalOnFakeMIG(t *testing.T) {
	const n, count = 4, 5000
	errs := world(t, n, func(r int) []Option {
		bus := []string{"00000000:18:00.0", "00000000:19:00.0"}[r%2] // round robin, as --gpu 0,1
		f := cuda.NewFake(cuda.FakeDevice{Name: "fake MIG 1g", UUID: cuda.UUID{0x30, byte(r)}, ParentUUID: cuda.UUID{0x40, byte(r % 2)},
			PCIBusID: bus, SMs: 16, TotalMem: 1 << 30})
		comm.InstallFakeCUDAKernels(f)
		return []Option{withCUDA(f), WithBackend(BackendGPU), WithAlgorithm(AlgorithmHierarchical),
			WithTuning(Tuning{Chunk: 64 << 10, Slots: 3})}
	}, func(g *Group) error {
		ctx := context.Background()
		if g.Algorithm() != allreduce.Hierarchical.String() || g.groups.Count() != 2 || g.groups.Group(g.Rank()) != g.Rank()%2 {
			return fmt.Errorf("algorithm %s, groups %v: want hierarchical over 2 GPUs", g.Algorithm(), g.groups.Members())
		}
		r := g.Rank()
		send := make([]float32, count)
		for i := range send {
			send[i] = input(r, i)
		}
		for _, op := range []Op{Sum, Avg} {
			recv, err := deviceAllReduce(ctx, g, send, op)
			if err != nil {
				return err
			}
			for i := range recv {
				var want float32
				for q := range n {
					want += input(q, i)
				}
				if op == Avg {
					want /= n
				}
				if recv[i] != want {
					return fmt.Errorf("%v element %d = %v, want %v", op, i, recv[i], want)
				}
			}
		}
		return g.Barrier(ctx)
	})
	requireAll(t, errs)
}
