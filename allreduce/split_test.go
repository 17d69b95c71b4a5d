package allreduce

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/comm"
	"github.com/migctl/migctl/comm/shm"
	"github.com/migctl/migctl/internal/cuda"
)

func TestParseReduceOn(t *testing.T) {
	tests := []struct {
		in    string
		mode  ReduceOn
		share int
		bad   bool
	}{
		{"", ReduceOnAuto, -1, false},
		{"auto", ReduceOnAuto, -1, false},
		{"cpu", ReduceOnCPU, 0, false},
		{"gpu", ReduceOnGPU, GPUShareOne, false},
		{"split", ReduceOnSplit, -1, false},
		{"split:0.25", ReduceOnSplit, 250, false},
		{" split:0.125 ", ReduceOnSplit, 125, false},
		{"split:0", "", 0, true},
		{"split:1", "", 0, true},
		{"split:x", "", 0, true},
		{"gpu:0.5", "", 0, true},
		{"host", "", 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			mode, share, err := ParseReduceOn(tc.in)
			if tc.bad {
				require.ErrorIs(t, err, ErrUnsupported)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.mode, mode)
			require.Equal(t, tc.share, share)
		})
	}
}

// splitShares are the shares the simulations cover.
func splitShares(rng *rand.Rand) []int {
	return []int{1, 969, GPUShareOne, 1 + rng.IntN(GPUShareOne)}
}

// TestSplitAsData simulates the split schedule over worlds, shares, element
// sizes, slot counts and sizes (empty, a few elements, odd, several
// chunks), in place or not, in random interleavings: every byte of every
// result holds every rank's contribution once, and an average divides every
// byte once.
func TestSplitAsData(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	cases := 0
	for _, world := range []int{2, 3, 4, 5, 7, 9} {
		for _, share := range splitShares(rng) {
			for _, es := range []int{1, 2, 8} {
				slots := 1 + rng.IntN(3)
				chunk := (64*world*es*(1+rng.IntN(3)) + 63) &^ 63
				for _, elems := range []int{0, 1, world - 1, world + 1, 3*chunk/es + 7, rng.IntN(5 * chunk / es)} {
					p := Params{Coll: AllReduce, Algorithm: HostStaged, World: world, Bytes: elems * es, ElemSize: es,
						InPlace: rng.IntN(2) == 0, Chunk: chunk, Slots: slots, GPUShare: share, Avg: rng.IntN(2) == 0}
					name := fmt.Sprintf("n%d/share%d/es%d/k%d/c%d/b%d/inplace=%v", world, share, es, slots, chunk, p.Bytes, p.InPlace)
					s, err := Build(p)
					require.NoError(t, err, name)
					require.LessOrEqual(t, s.HostBytes, ArenaBytes(world, chunk, slots), name)
					for trial := range 2 {
						got, err := simulate(s, rand.New(rand.NewPCG(uint64(trial), uint64(elems+world+share))))
						require.NoError(t, err, name)
						for r := range world {
							for i, m := range got[r] {
								if want, _ := wantTag(p, 0, r, i); m != want {
									require.Failf(t, "wrong result", "%s trial %d: rank %d byte %d holds %#x, want %#x", name, trial, r, i, m, want)
								}
							}
						}
					}
					if p.Avg {
						finals := 0
						for r := range world {
							for _, st := range s.Steps[r] {
								switch {
								case st.Final && st.Kind == ReduceIn:
									finals += st.Len
								case st.Final && st.Kind == HostReduce:
									require.Zero(t, st.Div, name) // divides by its n inputs
									require.Len(t, st.Hosts, world, name)
									finals += st.Host.Len
								}
							}
						}
						require.Equal(t, p.Bytes, finals, "%s: bytes divided", name)
					}
					cases++
				}
			}
		}
	}
	t.Logf("%d split schedules simulated", cases)
}

// TestSplitSequences runs random sequences of split all-reduces (shares
// and sizes changing from call to call) among the other collectives on
// one arena, with the executor's fence rule: host-staged calls of any
// share need no fence between them.
func TestSplitSequences(t *testing.T) {
	rng := rand.New(rand.NewPCG(23, 24))
	for trial := range 150 {
		world := 2 + rng.IntN(6)
		es := []int{1, 2, 4}[rng.IntN(3)]
		chunk := 64 * world * es * (1 + rng.IntN(2))
		slots := 1 + rng.IntN(3)
		var calls []Schedule
		small := 0
		for range 2 + rng.IntN(6) {
			p := Params{Coll: AllReduce, Algorithm: HostStaged, World: world, Bytes: es * rng.IntN(4*chunk/es), ElemSize: es,
				InPlace: rng.IntN(2) == 0, Root: rng.IntN(world), Chunk: chunk, Slots: slots, Avg: rng.IntN(2) == 0}
			switch k := rng.IntN(10); {
			case k < 5:
				p.GPUShare = []int{0, 1, 300, 500, GPUShareOne}[rng.IntN(5)]
			case k == 5:
				p.Algorithm = HostStagedSmall
				p.Bytes = es * rng.IntN(SmallCapacity(world, chunk, slots)/es+1)
				p.Parity = small & 1
				small++
			case k == 6:
				p.Algorithm, p.Groups = Hierarchical, randomGrouping(rng, world)
			case k == 7:
				p.Coll = Barrier
			case k == 8:
				p.Coll = Broadcast
			default:
				p.Coll = ReduceScatter
			}
			s, err := Build(p)
			require.NoError(t, err)
			calls = append(calls, s)
		}
		got, err := simulateSeq(calls, rand.New(rand.NewPCG(uint64(trial), 2)))
		if err != nil {
			for ci, s := range calls {
				t.Logf("call %d: %+v", ci, s.Params)
			}
		}
		require.NoError(t, err, "trial %d", trial)
		for ci, s := range calls {
			for r := range world {
				for i, m := range got[ci][r] {
					if want, ok := wantTag(s.Params, ci, r, i); ok && m != want {
						require.Failf(t, "wrong result", "trial %d call %d (%+v): rank %d byte %d holds %#x, want %#x",
							trial, ci, s.Params, r, i, m, want)
					}
				}
			}
		}
	}
}

// TestSplitDropsDependency: dropping any of the split schedule's kinds of
// waits (a device reduction on a peer's staged input, a fetch on a CPU
// piece or a device part, a restage on the slot's previous fetches) is
// caught by the simulator in some interleaving.
func TestSplitDropsDependency(t *testing.T) {
	for _, share := range []int{500, GPUShareOne} {
		p := Params{Coll: AllReduce, Algorithm: HostStaged, World: 4, Bytes: 4 * 4096, ElemSize: 4, Chunk: 1024, Slots: 2,
			GPUShare: share}
		drops := []struct {
			kind Kind
			role int
		}{{ReduceIn, roleA}, {CopyIn, roleD}, {CopyOut, roleC}}
		if share < GPUShareOne {
			drops = append(drops, struct {
				kind Kind
				role int
			}{CopyIn, roleB})
		}
		for _, drop := range drops {
			t.Run(fmt.Sprintf("share%d/%s waits on role %d", share, drop.kind, drop.role), func(t *testing.T) {
				s, err := Build(p)
				require.NoError(t, err)
				dropped := false
				for i, st := range s.Steps[1] {
					if st.Kind != drop.kind {
						continue
					}
					kept := slices.DeleteFunc(slices.Clone(st.Wait), func(c Cond) bool { return c.Flag%FlagsPerRank == drop.role })
					if len(kept) < len(st.Wait) {
						s.Steps[1][i].Wait = kept
						dropped = true
					}
				}
				require.True(t, dropped)
				fails := 0
				for trial := 0; trial < 400 && fails == 0; trial++ {
					got, err := simulate(s, rand.New(rand.NewPCG(uint64(trial), 19)))
					if err != nil {
						fails++
						continue
					}
					for r := range 4 {
						for i, m := range got[r] {
							if want, _ := wantTag(p, 0, r, i); m != want {
								fails++
							}
						}
					}
				}
				require.Positive(t, fails)
			})
		}
	}
}

// TestSplitTraffic counts, from the schedules, every rank's bytes over
// the link each way and the bytes the CPU threads read, and compares them
// with the cost model's Estimate for the same share: S out; S + f·S·(n−2)/n
// in; n·(1−f)·S read by the CPU.
func TestSplitTraffic(t *testing.T) {
	const S = 4 * 7 * 5 * 64 * 1024
	for _, n := range []int{2, 3, 7} {
		for _, share := range []int{0, 125, 500, GPUShareOne} {
			p := Params{Coll: AllReduce, Algorithm: HostStaged, World: n, Bytes: S, ElemSize: 4, Chunk: 64 << 10, Slots: 4,
				GPUShare: share}
			s, err := Build(p)
			require.NoError(t, err)
			e, err := H200().Estimate(Workload{Coll: AllReduce, Algorithm: HostStaged, Groups: ContiguousGroups(n, n),
				Bytes: S, ReduceThreads: n, GPUShare: share})
			require.NoError(t, err)
			cpu, linkOut, linkIn := 0, 0, 0
			for r := range n {
				out, in := 0, 0
				for _, st := range s.Steps[r] {
					switch st.Kind {
					case CopyOut:
						out += st.Len
					case CopyIn:
						in += st.Len
					case ReduceIn:
						in += st.Len * len(st.Hosts) // the peers' copies; its own input is on the device
					case HostReduce:
						cpu += st.Host.Len * len(st.Hosts)
					}
				}
				f := float64(share) / GPUShareOne
				// Parts are cut on 64-byte boundaries: up to 64 bytes per
				// cut of each chunk, read by n−1 peers.
				slack := float64(S / p.Chunk * 64 * n)
				require.InDelta(t, float64(S), float64(out), slack, "out, n=%d share=%d rank %d", n, share, r)
				require.InDelta(t, S+f*S*float64(n-2)/float64(n), float64(in), slack, "in, n=%d share=%d rank %d", n, share, r)
				linkOut += out
				linkIn += in
			}
			require.InDelta(t, e.LinkOut, float64(linkOut), S/100, "estimate out, n=%d share=%d", n, share)
			require.InDelta(t, e.LinkIn, float64(linkIn), S/100, "estimate in, n=%d share=%d", n, share)
			require.InDelta(t, e.HostRead, float64(cpu), S/100, "estimate cpu, n=%d share=%d", n, share)
		}
	}
}

func TestSplitBuildRejects(t *testing.T) {
	ok := Params{Coll: AllReduce, Algorithm: HostStaged, World: 3, Bytes: 640, ElemSize: 4, Chunk: 4096, Slots: 2, GPUShare: 500}
	_, err := Build(ok)
	require.NoError(t, err)
	for _, edit := range []func(*Params){
		func(p *Params) { p.GPUShare = -1 },
		func(p *Params) { p.GPUShare = GPUShareOne + 1 },
		func(p *Params) { p.Algorithm = Ring },
		func(p *Params) { p.Coll = ReduceScatter },
		func(p *Params) { p.Algorithm, p.Groups = Hierarchical, ContiguousGroups(3, 3) },
	} {
		p := ok
		edit(&p)
		_, err := Build(p)
		require.ErrorIs(t, err, ErrUnsupported, "%+v", p)
	}
	// One rank: the plain schedule, whatever the share.
	one, err := Build(Params{Coll: AllReduce, Algorithm: HostStaged, World: 1, Bytes: 640, ElemSize: 4, Chunk: 4096, Slots: 2, GPUShare: 700})
	require.NoError(t, err)
	for _, st := range one.Steps[0] {
		require.NotEqual(t, ReduceIn, st.Kind)
	}
}

// TestInProcessSplit runs split all-reduces between goroutines over the real
// transport and executor on the host backend (where the "device" reduction
// runs on the host stream): every dtype and op, odd sizes, in place or
// not, then mixed sequences with plain host-staged, small and barrier
// calls between them.
func TestInProcessSplit(t *testing.T) {
	rng := rand.New(rand.NewPCG(25, 26))
	for _, tc := range []struct{ world, share int }{{2, GPUShareOne}, {3, 500}, {7, 125}, {7, GPUShareOne}} {
		g := newGroup(t, tc.world, HostStaged, Options{Chunk: 4 << 10, Slots: 3, SmallBytes: 256, GPUShare: tc.share})
		t.Run(fmt.Sprintf("n%d/share%d", tc.world, tc.share), func(t *testing.T) {
			for _, dt := range allDTypes {
				for _, op := range allOps {
					count := 1 + rng.IntN(6000)
					for _, inPlace := range []bool{false, true} {
						g.check(t, AllReduce, dt, op, count, inPlace, 0)
					}
				}
			}
			for range 6 {
				g.check(t, AllReduce, comm.Float32, comm.Sum, []int{1, 37, 65539, 5000, 12345}[rng.IntN(5)], rng.IntN(2) == 0, 0)
				if rng.IntN(3) == 0 {
					g.check(t, ReduceScatter, comm.Int32, comm.Max, 999, false, 0)
				}
			}
		})
	}
}

// cudaGroup is world ranks as goroutines, each with its own CUDADevice on
// its own cuda.Fake, over one shared arena: the reduction kernels' ABI and
// the mapped-host-memory path of the split schedule, end to end.
type cudaGroup struct {
	comms []*Communicator
	fakes []*cuda.Fake
	devs  []*comm.CUDADevice
}

func newCUDAGroup(t *testing.T, world int, opts Options) *cudaGroup {
	t.Helper()
	opts = opts.withDefaults(world)
	l := shm.Layout{World: world, Flags: world * FlagsPerRank, DataBytes: ArenaBytes(world, opts.Chunk, opts.Slots)}
	mem := alignedMem(l.Size())
	_, err := shm.Init(mem, l)
	require.NoError(t, err)
	g := &cudaGroup{}
	for r := range world {
		f := cuda.NewFake()
		comm.InstallFakeCUDAKernels(f)
		dev, err := comm.NewCUDADevice(f, comm.CUDAConfig{PTX: []byte("// fake module")})
		require.NoError(t, err)
		ctl, err := shm.Attach(mem, l)
		require.NoError(t, err)
		tr, err := comm.NewShmTransport(ctl, r, comm.ShmOptions{})
		require.NoError(t, err)
		ex, err := NewExecutor(dev, tr, opts)
		require.NoError(t, err)
		t.Cleanup(func() { _ = ex.Close(); _ = tr.Close(); _ = dev.Close() })
		g.comms = append(g.comms, NewCommunicator(ex, HostStaged))
		g.fakes = append(g.fakes, f)
		g.devs = append(g.devs, dev)
	}
	return g
}

// allReduce runs one all-reduce of count elements on device buffers and
// returns every rank's result.
func (g *cudaGroup) allReduce(t *testing.T, dt comm.DType, op comm.Op, count int, inPlace bool) [][]byte {
	t.Helper()
	world, n := len(g.comms), count*dt.Size()
	sends, recvs := make([]comm.Buffer, world), make([]comm.Buffer, world)
	for r := range world {
		var err error
		sends[r], err = g.devs[r].Alloc(max(n, 1))
		require.NoError(t, err)
		mem, err := g.fakes[r].Memory(sends[r].(*comm.CUDABuffer).Ptr(), uint64(n))
		require.NoError(t, err)
		copy(mem, Input(AllReduce, dt, op, world, r, count))
		recvs[r] = sends[r]
		if !inPlace {
			recvs[r], err = g.devs[r].Alloc(max(n, 1))
			require.NoError(t, err)
		}
	}
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r, c := range g.comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			errs[r] = c.AllReduce(ctx, sends[r], recvs[r], count, dt, op)
		}()
	}
	wg.Wait()
	out := make([][]byte, world)
	for r := range world {
		require.NoError(t, errs[r], "rank %d", r)
		mem, err := g.fakes[r].Memory(recvs[r].(*comm.CUDABuffer).Ptr(), uint64(n))
		require.NoError(t, err)
		out[r] = slices.Clone(mem)
		require.NoError(t, g.devs[r].Free(sends[r]))
		if !inPlace {
			require.NoError(t, g.devs[r].Free(recvs[r]))
		}
	}
	return out
}

// TestSplitOnFakeCUDA runs the all-reduce on CUDA devices (each rank its
// own fake driver, kernels reading the shared arena through its mapped
// device address) with the reduction on the CPU, on the devices and split,
// and requires every rank's result to equal, byte for byte, both the
// expected values and the CPU path's result: every dtype and op, odd sizes
// (65539 elements: a last chunk cut off mid-part), in place or not.
func TestSplitOnFakeCUDA(t *testing.T) {
	rng := rand.New(rand.NewPCG(27, 28))
	for _, world := range []int{2, 3, 7} {
		shares := []int{0, 250, GPUShareOne}
		groups := make([]*cudaGroup, len(shares))
		for i, share := range shares {
			groups[i] = newCUDAGroup(t, world, Options{Chunk: 16 << 10, Slots: 3, SmallBytes: 512, GPUShare: share})
		}
		for _, dt := range allDTypes {
			for _, op := range allOps {
				count := []int{1 + rng.IntN(9000), 129}[rng.IntN(2)]
				if dt == comm.Float32 && op == comm.Sum || dt == comm.BFloat16 && op == comm.Avg {
					count = 65539
				}
				inPlace := rng.IntN(2) == 0
				name := fmt.Sprintf("n%d/dt%d/op%d/count%d/inplace=%v", world, dt, op, count, inPlace)
				want := Expected(AllReduce, dt, op, world, 0, 0, count)
				var cpu [][]byte
				for i, g := range groups {
					got := g.allReduce(t, dt, op, count, inPlace)
					for r := range world {
						require.Zero(t, Wrong(got[r], want, dt), "%s share %d rank %d", name, shares[i], r)
						if i == 0 {
							continue
						}
						require.Equal(t, cpu[r], got[r], "%s share %d rank %d: differs from the CPU path", name, shares[i], r)
					}
					if i == 0 {
						cpu = got
					}
				}
			}
		}
	}
}

// TestGPUShareOnH200: the cost model's share on the H200 figures, and where
// the CPU binds (a host that reduces slower), a split that balances the
// CPU against the link and beats both ends.
func TestGPUShareOnH200(t *testing.T) {
	w := func(n, threads int) Workload {
		return Workload{Coll: AllReduce, Groups: ContiguousGroups(n, n), Bytes: 256 << 20, ReduceThreads: threads}
	}
	m := H200()
	slow := m
	slow.ReduceHostGiBs = 15
	tests := []struct {
		desc      string
		m         Machine
		w         Workload
		lo, hi    int
		want      int
		wantAbove int // want is ignored when wantAbove > 0: share must lie in (wantAbove, hi)
	}{
		// 2 ranks: the CPU does not bind: the measured schedule stays.
		{"2 on 1 GPU", m, w(2, 2*6), 0, GPUShareOne, 0, 0},
		// A host that reduces 15 GiB/s in all: the CPU binds 2 ranks far
		// enough for a split to pay (the kernels' reads of host memory cost
		// the link, so not all of it).
		{"2 on 1 GPU, slow host", slow, w(2, 2*6), 0, GPUShareOne, 0, 1},
		// 7 ranks on the H200 figures: both ways of the link bind already.
		{"7 on 1 GPU", m, w(7, 7*2), 0, GPUShareOne, 0, 0},
		// "split" on 7 ranks: the smallest share that splits.
		{"7 on 1 GPU, split", m, w(7, 7*2), shareStep, GPUShareOne - shareStep, shareStep, 0},
		// A host that reduces 15 GiB/s in all: a split.
		{"7 on 1 GPU, slow host", slow, w(7, 7*2), 0, GPUShareOne, 0, 1},
		{"host backend", m, Workload{Coll: AllReduce, Groups: ContiguousGroups(7, 7), Bytes: 1 << 20, ReduceThreads: 7,
			HostBackend: true}, 0, GPUShareOne, 0, 0},
		{"one rank", m, w(1, 6), 0, GPUShareOne, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			got, err := tc.m.GPUShare(tc.w, tc.lo, tc.hi)
			require.NoError(t, err)
			if tc.wantAbove == 0 {
				require.Equal(t, tc.want, got)
				return
			}
			require.Greater(t, got, tc.wantAbove)
			require.Less(t, got, tc.hi)
			at := func(share int) time.Duration {
				x := tc.w
				x.Algorithm, x.GPUShare = HostStaged, share
				e, err := tc.m.Estimate(x)
				require.NoError(t, err)
				return e.Limit
			}
			require.Less(t, at(got), at(0))
			require.Less(t, at(got), at(GPUShareOne))
			// At the balance: no neighbouring share has a lower floor.
			require.LessOrEqual(t, at(got), at(got-shareStep))
			require.LessOrEqual(t, at(got), at(min(got+shareStep, tc.hi)))
		})
	}
	_, err := m.GPUShare(w(2, 2), 600, 500)
	require.ErrorIs(t, err, ErrUnsupported)
}

func TestResolveGPUShare(t *testing.T) {
	m := H200()
	w := func(n int) Workload {
		return Workload{Coll: AllReduce, Groups: ContiguousGroups(n, n), Bytes: 256 << 20, ReduceThreads: n * workers(n)}
	}
	for _, tc := range []struct {
		s     string
		n     int
		want  int
		fails bool
	}{
		{"cpu", 2, 0, false}, {"gpu", 7, GPUShareOne, false}, {"split:0.3", 7, 300, false},
		{"auto", 2, 0, false}, {"", 7, 0, false}, {"split", 7, shareStep, false},
		{"split", 2, shareStep, false}, {"nope", 2, 0, true},
	} {
		got, err := m.ResolveGPUShare(tc.s, w(tc.n))
		if tc.fails {
			require.ErrorIs(t, err, ErrUnsupported, tc.s)
			continue
		}
		require.NoError(t, err, tc.s)
		require.Equal(t, tc.want, got, "%s on %d ranks", tc.s, tc.n)
	}
}
