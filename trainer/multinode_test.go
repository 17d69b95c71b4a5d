package trainer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/comm"
	"github.com/migctl/migctl/internal/cuda"
	"github.com/migctl/migctl/internal/nccl"
)

// collectiveResults runs a fixed series of collectives (every kind, in
// place and not, sizes that split evenly among a node's ranks and sizes
// that do not) and returns what this rank received, in order. ref (the
// one-node reference) runs the in-place reduce-scatter and all-gather out
// of place: the race detector cannot follow a one-node in-place
// reduce-scatter or all-gather of in-process ranks (see
// multinode_norace_test.go), and the results are the same.
func collectiveResults(ctx context.Context, g *Group, counts []int, ref bool) ([][]float32, error) {
	var out [][]float32
	r, n := g.Rank(), g.Size()
	in := func(count int) []float32 {
		v := make([]float32, count)
		for i := range v {
			v[i] = input(r, i)
		}
		return v
	}
	for _, count := range counts {
		for _, op := range []Op{Sum, Avg, Min, Max} {
			send, recv := in(count), make([]float32, count)
			if err := g.AllReduce(ctx, HostSlice(send), HostSlice(recv), op); err != nil {
				return nil, err
			}
			out = append(out, recv)
			buf := in(count)
			if err := g.AllReduce(ctx, HostSlice(buf), HostSlice(buf), op); err != nil {
				return nil, err
			}
			out = append(out, buf)
		}
		block := count
		rs := make([]float32, block)
		if err := g.ReduceScatter(ctx, HostSlice(in(block*n)), HostSlice(rs), Sum); err != nil {
			return nil, err
		}
		rsIn, rsRes := in(block*n), make([]float32, block)
		if ref {
			if err := g.ReduceScatter(ctx, HostSlice(rsIn), HostSlice(rsRes), Avg); err != nil {
				return nil, err
			}
		} else {
			if err := g.ReduceScatter(ctx, HostSlice(rsIn), HostSlice(rsIn), Avg); err != nil {
				return nil, err
			}
			rsRes = rsIn[r*block : (r+1)*block]
		}
		ag := make([]float32, block*n)
		if err := g.AllGather(ctx, HostSlice(in(block)), HostSlice(ag)); err != nil {
			return nil, err
		}
		agIn := make([]float32, block*n)
		copy(agIn[r*block:], in(block))
		agSend := HostSlice(agIn)
		if ref {
			agSend = HostSlice(in(block))
		}
		if err := g.AllGather(ctx, agSend, HostSlice(agIn)); err != nil {
			return nil, err
		}
		bc := make([]float32, count)
		if err := g.Broadcast(ctx, HostSlice(in(count)), HostSlice(bc), n-1); err != nil {
			return nil, err
		}
		bcIn := in(count)
		if err := g.Broadcast(ctx, HostSlice(bcIn), HostSlice(bcIn), 1); err != nil {
			return nil, err
		}
		out = append(out, rs, rsRes, ag, agIn, bc, bcIn)
		if err := g.Barrier(ctx); err != nil {
			return nil, err
		}
	}
	ints := []int64{int64(r*3 - 7), int64(r) << 40}
	if err := g.AllReduce(ctx, HostSlice(ints), HostSlice(ints), Avg); err != nil {
		return nil, err
	}
	out = append(out, []float32{float32(ints[0]), float32(ints[1] >> 20)})
	return out, nil
}

// worldResults runs collectiveResults on every rank of a world and
// returns every rank's results (ref: the one-node reference).
func worldResults(t *testing.T, n int, counts []int, ref bool, opts func(r int) []Option) ([][][]float32, error) {
	t.Helper()
	res := make([][][]float32, n)
	var mu sync.Mutex
	err := world(t, n, opts, func(g *Group) error {
		out, err := collectiveResults(context.Background(), g, counts, ref)
		mu.Lock()
		res[g.Rank()] = out
		mu.Unlock()
		return err
	})
	return res, err
}

// A group across "nodes" (host names of in-process ranks) on the host
// backend, its inter-node stage on the fake NCCL, gives bit for bit what
// the same ranks give on one node, for every collective (sizes up to 1003
// elements here; multinode_norace_test.go adds large ones).
func TestGroupAcrossNodesMatchesOneNode(t *testing.T) {
	testAcrossNodesMatchesOneNode(t, []int{1, 2, 5, 12, 1003}, nil)
}

func testAcrossNodesMatchesOneNode(t *testing.T, counts []int, opts []Option) {
	tests := []struct {
		desc string
		n    int
		host func(r int) string
	}{
		{desc: "2 nodes x 2 ranks", n: 4, host: func(r int) string { return fmt.Sprintf("node%d", r/2) }},
		{desc: "3 nodes x 2 ranks", n: 6, host: func(r int) string { return fmt.Sprintf("node%d", r/2) }},
		{desc: "2 nodes x 3 ranks", n: 6, host: func(r int) string { return fmt.Sprintf("node%d", r/3) }},
		{desc: "2 nodes x 1 rank", n: 2, host: func(r int) string { return fmt.Sprintf("node%d", r) }},
		{desc: "2 nodes, ranks interleaved", n: 4, host: func(r int) string { return fmt.Sprintf("node%d", r%2) }},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			flat, err := worldResults(t, tc.n, counts, true, func(int) []Option { return opts })
			require.NoError(t, err)
			var mu sync.Mutex
			layout := map[int][2]int{}
			nodes, err := worldResults(t, tc.n, counts, false, func(r int) []Option {
				return append([]Option{withHost(tc.host(r)), withFakeNCCL()}, opts...)
			})
			require.NoError(t, err)
			for r := range tc.n {
				require.Equal(t, len(flat[r]), len(nodes[r]), "rank %d", r)
				for k := range flat[r] {
					require.Equal(t, flat[r][k], nodes[r][k], "rank %d, result %d", r, k)
				}
			}
			// The node-local view.
			err = world(t, tc.n, func(r int) []Option { return []Option{withHost(tc.host(r)), withFakeNCCL()} }, func(g *Group) error {
				mu.Lock()
				layout[g.Rank()] = [2]int{g.LocalRank(), g.LocalSize()}
				if g.NumNodes() != tc.n/g.LocalSize() {
					return fmt.Errorf("NumNodes %d, want %d", g.NumNodes(), tc.n/g.LocalSize())
				}
				mu.Unlock()
				return nil
			})
			require.NoError(t, err)
			p, err := planNodes(func() []string {
				h := make([]string, tc.n)
				for r := range h {
					h[r] = tc.host(r)
				}
				return h
			}())
			require.NoError(t, err)
			for r := range tc.n {
				require.Equal(t, [2]int{p.local[r], p.localSize}, layout[r], "rank %d", r)
			}
		})
	}
}

// Without NCCL, a group across hosts fails at Init on every rank, saying
// why and what to do.
func TestGroupAcrossNodesWithoutNCCL(t *testing.T) {
	twoNodes := func(r int) Option { return withHost(fmt.Sprintf("node%d", r/2)) }
	gpu := func() []Option {
		f := cuda.NewFake()
		comm.InstallFakeCUDAKernels(f)
		return []Option{withCUDA(f), WithBackend(BackendGPU)}
	}
	tests := []struct {
		desc string
		opts func(r int) []Option
		want []string
	}{
		{desc: "host backend", opts: func(r int) []Option { return []Option{twoNodes(r)} },
			want: []string{"4 ranks are on 2 hosts", "host backend cannot cross nodes", "MIGCTL_BACKEND=gpu", "NCCL installed"}},
		{desc: "gpu backend, no libnccl", opts: func(r int) []Option {
			return append(gpu(), twoNodes(r), withNCCLOpen(func() (nccl.Interface, error) {
				return nil, fmt.Errorf("%w: loading libnccl.so.2: cannot open shared object file; set LD_LIBRARY_PATH", nccl.ErrLibraryNotFound)
			}))
		}, want: []string{"4 ranks are on 2 hosts", "inter-node stage needs NCCL", "libnccl.so.2 not found", "set LD_LIBRARY_PATH"}},
		{desc: "fake NCCL on the gpu backend", opts: func(r int) []Option { return append(gpu(), twoNodes(r), withFakeNCCL()) },
			want: []string{"fake NCCL) runs on the host backend only"}},
		{desc: "uneven nodes", opts: func(r int) []Option { return []Option{withHost(fmt.Sprintf("node%d", min(r, 1))), withFakeNCCL()} },
			want: []string{"same number of ranks on every node"}},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			start := time.Now()
			err := world(t, 4, tc.opts, func(*Group) error { return errors.New("Init succeeded across hosts") })
			require.ErrorIs(t, err, ErrMultiNode)
			require.NotContains(t, err.Error(), "Init succeeded")
			for _, w := range tc.want {
				require.ErrorContains(t, err, w)
			}
			require.Less(t, time.Since(start), 10*time.Second)
		})
	}
}

// One node without NCCL fails the whole group at Init, the nodes that have
// it too, at once (not at the setup deadline inside ncclCommInitRank).
func TestGroupAcrossNodesOneNodeWithoutNCCL(t *testing.T) {
	start := time.Now()
	err := world(t, 4, func(r int) []Option {
		f := cuda.NewFake()
		comm.InstallFakeCUDAKernels(f)
		return []Option{withCUDA(f), WithBackend(BackendGPU), withHost(fmt.Sprintf("node%d", r/2)),
			withNCCLOpen(func() (nccl.Interface, error) {
				if r >= 2 {
					return nil, fmt.Errorf("%w: stub", nccl.ErrLibraryNotFound)
				}
				return nccl.NewFake(fakeDeviceMemory{f}), nil
			})}
	}, func(*Group) error { return errors.New("Init succeeded") })
	require.ErrorIs(t, err, ErrMultiNode)
	require.NotContains(t, err.Error(), "Init succeeded")
	for r := range 4 {
		require.ErrorContains(t, err, fmt.Sprintf("rank %d", r))
	}
	require.Less(t, time.Since(start), 10*time.Second)
}

// The real NCCL loader on this machine: where libnccl.so.2 is absent (CI),
// Init across hosts on the gpu backend says so.
func TestGroupAcrossNodesRealLoader(t *testing.T) {
	if _, err := nccl.Open(); err == nil {
		t.Skip("NCCL is installed here")
	}
	err := world(t, 2, func(r int) []Option {
		f := cuda.NewFake()
		comm.InstallFakeCUDAKernels(f)
		return []Option{withCUDA(f), WithBackend(BackendGPU), withHost(fmt.Sprintf("node%d", r))}
	}, func(*Group) error { return errors.New("Init succeeded") })
	require.ErrorIs(t, err, ErrMultiNode)
	require.ErrorIs(t, err, nccl.ErrLibraryNotFound)
	require.ErrorContains(t, err, "set LD_LIBRARY_PATH")
}

// A rank that fails releases the ranks of the other node at once: their
// collective fails, it does not wait for the deadline.
func TestGroupAcrossNodesPeerFailure(t *testing.T) {
	start := time.Now()
	err := world(t, 4, func(r int) []Option { return []Option{withHost(fmt.Sprintf("node%d", r/2)), withFakeNCCL()} },
		func(g *Group) error {
			ctx := context.Background()
			buf := []float32{1, 2, 3, 4, 5}
			if err := g.AllReduce(ctx, HostSlice(buf), HostSlice(buf), Sum); err != nil {
				return err
			}
			if g.Rank() == 3 {
				return errors.New("rank 3 gives up")
			}
			return g.AllReduce(ctx, HostSlice(buf), HostSlice(buf), Sum)
		})
	require.ErrorContains(t, err, "rank 3 gives up")
	for _, r := range []int{0, 1, 2} {
		require.ErrorContains(t, err, fmt.Sprintf("on rank %d", r))
	}
	require.Less(t, time.Since(start), 15*time.Second, "ranks waited for the deadline: %v", err)
}

// fakeDeviceMemory lets the fake NCCL reach a fake driver's device memory.
type fakeDeviceMemory struct{ f *cuda.Fake }

func (m fakeDeviceMemory) Bytes(addr uintptr, n int) ([]byte, error) {
	b, err := m.f.Memory(cuda.DevicePtr(addr), uint64(n))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", nccl.ErrInvalidArgument, err)
	}
	return b, nil
}

// The gpu backend's inter-node path (the primary context current on a
// locked thread for NCCL, NCCL's own stream waited for through an event,
// device addresses and views of device buffers) on the fake driver with the
// fake NCCL reaching its device memory: staged host slices and device
// buffers give what a one-node host group gives.
func TestGroupAcrossNodesGPUPathOnFakes(t *testing.T) {
	counts := []int{1, 5, 1003}
	flat, err := worldResults(t, 4, counts, true, func(int) []Option { return nil })
	require.NoError(t, err)
	fakes := make([]*cuda.Fake, 4)
	res := make([][][]float32, 4)
	var mu sync.Mutex
	err = world(t, 4, func(r int) []Option {
		f := cuda.NewFake()
		comm.InstallFakeCUDAKernels(f)
		fakes[r] = f
		return []Option{withCUDA(f), WithBackend(BackendGPU), withHost(fmt.Sprintf("node%d", r/2)),
			withNCCLOpen(func() (nccl.Interface, error) { return nccl.NewFake(fakeDeviceMemory{f}), nil })}
	}, func(g *Group) error {
		ctx := context.Background()
		if g.Backend() != BackendGPU {
			return fmt.Errorf("backend %s, want gpu", g.Backend())
		}
		out, err := collectiveResults(ctx, g, counts, false)
		if err != nil {
			return err
		}
		mu.Lock()
		res[g.Rank()] = out
		mu.Unlock()
		// A device buffer, in place.
		const count = 777
		send := make([]float32, count)
		for i := range send {
			send[i] = input(g.Rank(), i)
		}
		got, err := deviceAllReduce(ctx, g, send, Sum)
		if err != nil {
			return err
		}
		for i := range got {
			want := input(0, i) + input(1, i) + input(2, i) + input(3, i)
			if got[i] != want {
				return fmt.Errorf("device all-reduce element %d = %v, want %v", i, got[i], want)
			}
		}
		return nil
	})
	require.NoError(t, err)
	for r := range 4 {
		require.Equal(t, len(flat[r]), len(res[r]), "rank %d", r)
		for k := range flat[r] {
			require.Equal(t, flat[r][k], res[r][k], "rank %d, result %d", r, k)
		}
	}
	for r, f := range fakes {
		_, _, streams, _ := f.Live()
		require.Zero(t, streams, "rank %d left streams", r)
	}
}

// A node that stalls (alive, not issuing the collective): the other node's
// collective ends at its deadline with ErrTimeout, its NCCL communicator is
// aborted, and its next collective fails at once.
func TestGroupAcrossNodesStalledPeer(t *testing.T) {
	var mu sync.Mutex
	errs := map[int][]error{}
	err := world(t, 2, func(r int) []Option {
		return []Option{withHost(fmt.Sprintf("node%d", r)), withFakeNCCL(), WithTimeout(time.Second)}
	}, func(g *Group) error {
		ctx := context.Background()
		buf := []float32{1, 2, 3}
		if g.Rank() == 1 {
			time.Sleep(3 * time.Second)
			return nil
		}
		start := time.Now()
		first := g.AllReduce(ctx, HostSlice(buf), HostSlice(buf), Sum)
		took := time.Since(start)
		second := g.AllReduce(ctx, HostSlice(buf), HostSlice(buf), Sum)
		mu.Lock()
		errs[g.Rank()] = []error{first, second}
		mu.Unlock()
		if took > 2500*time.Millisecond {
			return fmt.Errorf("the first all-reduce took %v, deadline 1s", took)
		}
		return nil
	})
	require.NoError(t, err)
	require.ErrorIs(t, errs[0][0], ErrTimeout)
	require.ErrorIs(t, errs[0][1], comm.ErrAborted)
	require.ErrorContains(t, errs[0][1], "aborted earlier")
}
