package trainer

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/comm"
)

func TestPlanNodes(t *testing.T) {
	tests := []struct {
		desc      string
		hosts     []string
		wantNode  []int
		wantLocal []int
		err       string
	}{
		{desc: "launcher layout", hosts: []string{"a", "a", "b", "b"}, wantNode: []int{0, 0, 1, 1}, wantLocal: []int{0, 1, 0, 1}},
		{desc: "one per node", hosts: []string{"x", "y", "z"}, wantNode: []int{0, 1, 2}, wantLocal: []int{0, 0, 0}},
		{desc: "interleaved", hosts: []string{"b", "a", "b", "a"}, wantNode: []int{0, 1, 0, 1}, wantLocal: []int{0, 0, 1, 1}},
		{desc: "uneven", hosts: []string{"a", "a", "b"}, err: "host a has 2 ranks and host b 1"},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			p, err := planNodes(tc.hosts)
			if tc.err != "" {
				require.ErrorIs(t, err, comm.ErrInvalid)
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.wantNode, p.node)
			require.Equal(t, tc.wantLocal, p.local)
			for r := range tc.hosts {
				require.Equal(t, r, p.rankOf(p.node[r], p.local[r]))
				require.Equal(t, r, p.members(p.node[r])[p.local[r]])
				require.Equal(t, r, p.shard(p.local[r])[p.node[r]])
			}
		})
	}
}

// The stages of a 2-node × 2-rank all-reduce, spelled out.
func TestAllReduceStagesTwoByTwo(t *testing.T) {
	p, err := planNodes([]string{"a", "a", "b", "b"})
	require.NoError(t, err)
	require.Equal(t, "work 4; intra-reducescatter work[0] <- send[0] count 4 op 0; "+
		"inter-allreduce work[0] count 4 op 0; intra-allgather recv[0] <- work[0] count 4 op 0; "+
		"intra-allreduce recv[8] <- send[8] count 1 op 0; intra-broadcast recv[8] count 1 root 0; scale recv[0:+9] /4",
		p.allReduce(3, 9, comm.Avg, false).String())
	// Only local rank 0 carries the leftover element across nodes.
	require.Equal(t, []stageKind{stIntraReduceScatter, stInterAllReduce, stIntraAllGather, stIntraAllReduce,
		stInterAllReduce, stIntraBroadcast}, p.allReduce(2, 9, comm.Sum, true).kinds())
	require.Empty(t, p.allReduce(0, 0, comm.Sum, true).Stages)
	require.Equal(t, []stageKind{stInterAllReduce, stIntraBarrier}, p.barrier(1).kinds())
	// Broadcast from rank 3 (node 1): node 1 first shares it, then each
	// shard carries its piece; node 0 gathers the pieces, and local rank 0
	// carries the leftover element.
	require.Equal(t, []stageKind{stIntraBroadcast, stInterBroadcast, stInterBroadcast}, p.broadcast(2, 5, 3, true).kinds())
	require.Equal(t, []stageKind{stInterBroadcast, stIntraAllGather, stInterBroadcast, stIntraBroadcast}, p.broadcast(0, 5, 3, true).kinds())
	require.Equal(t, []stageKind{stInterBroadcast, stIntraAllGather, stIntraBroadcast}, p.broadcast(1, 5, 3, true).kinds())
}

// simulate runs every rank's schedule the way the group runs it (intra
// stages meet the node's ranks, inter stages the shard's, in order) on
// float64 buffers and returns every rank's recv. Parts of a buffer a
// collective leaves undefined become NaN, so a schedule that reads them
// fails the comparison. It fails on a deadlock or on ranks that meet with
// different stages.
func simulate(t *testing.T, p nodePlan, scheds []schedule, send, recv [][]float64, inPlace bool) {
	t.Helper()
	W := len(scheds)
	work := make([][]float64, W)
	buf := func(r int, b bufID) []float64 {
		switch {
		case b == bufWork:
			return work[r]
		case b == bufSend && !inPlace:
			return send[r]
		}
		return recv[r]
	}
	for r := range W {
		work[r] = make([]float64, scheds[r].Work)
		for i := range work[r] {
			work[r][i] = math.NaN()
		}
	}
	pc := make([]int, W)
	for {
		// Local stages run at once.
		for r := range W {
			for pc[r] < len(scheds[r].Stages) {
				st := scheds[r].Stages[pc[r]]
				if st.Kind != stCopy && st.Kind != stScale {
					break
				}
				d := buf(r, st.Dst)
				if st.Kind == stCopy {
					copy(d[st.Off:st.Off+st.Count], buf(r, st.Src)[st.SrcOff:st.SrcOff+st.Count])
				} else {
					for k := st.Off; k < st.Off+st.Count; k++ {
						d[k] /= float64(st.Div)
					}
				}
				pc[r]++
			}
		}
		done, progress := true, false
		for r := range W {
			if pc[r] == len(scheds[r].Stages) {
				continue
			}
			done = false
			st := scheds[r].Stages[pc[r]]
			var group []int
			if st.Kind.intra() {
				group = p.members(p.node[r])
			} else {
				group = p.shard(p.local[r])
			}
			ready := true
			for _, q := range group {
				ready = ready && pc[q] < len(scheds[q].Stages) && scheds[q].Stages[pc[q]].Kind.inter() == st.Kind.inter() &&
					scheds[q].Stages[pc[q]].Kind.intra() == st.Kind.intra()
			}
			if !ready {
				continue
			}
			for _, q := range group {
				o := scheds[q].Stages[pc[q]]
				require.Equal(t, st.Kind, o.Kind, "rank %d meets rank %d's %v with %v", q, r, st, o)
				require.Equal(t, []int{st.Count, st.Root, int(st.Op)}, []int{o.Count, o.Root, int(o.Op)}, "rank %d: %v vs rank %d: %v", r, st, q, o)
			}
			runGroup(st, group, func(q int) []float64 {
				o := scheds[q].Stages[pc[q]]
				if o.Kind.inter() {
					return buf(q, o.Dst)[o.Off:]
				}
				return buf(q, o.Src)[o.SrcOff:]
			}, func(q int) []float64 {
				o := scheds[q].Stages[pc[q]]
				return buf(q, o.Dst)[o.Off:]
			})
			for _, q := range group {
				pc[q]++
			}
			progress = true
			break
		}
		if done {
			return
		}
		require.True(t, progress, "deadlock at %v", pc)
	}
}

// runGroup runs one collective among group: src(q) is where member q's
// input starts, dst(q) where its output goes (the same for inter-node
// stages, which run in place).
func runGroup(st stage, group []int, src, dst func(q int) []float64) {
	n, c := len(group), st.Count
	red := func(a, b float64) float64 {
		switch st.Op {
		case comm.Min:
			return math.Min(a, b)
		case comm.Max:
			return math.Max(a, b)
		}
		return a + b
	}
	span := c
	if st.Kind == stIntraReduceScatter || st.Kind == stInterReduceScatter {
		span = c * n
	}
	// Inputs are read in full before any output is written (in place).
	in := make([][]float64, n)
	for idx, q := range group {
		switch st.Kind {
		case stIntraAllGather:
			in[idx] = append([]float64(nil), src(q)[:c]...)
		case stInterAllGather:
			in[idx] = append([]float64(nil), src(q)[idx*c:(idx+1)*c]...)
		case stIntraBarrier:
		default:
			in[idx] = append([]float64(nil), src(q)[:span]...)
		}
	}
	switch st.Kind {
	case stIntraAllReduce, stInterAllReduce, stIntraReduceScatter, stInterReduceScatter:
		acc := in[0]
		for _, v := range in[1:] {
			for k := range acc {
				acc[k] = red(acc[k], v[k])
			}
		}
		for idx, q := range group {
			switch st.Kind {
			case stIntraReduceScatter:
				copy(dst(q)[:c], acc[idx*c:])
			case stInterReduceScatter:
				reg := dst(q)[:span]
				for k := range reg {
					reg[k] = math.NaN() // only this rank's block is defined
				}
				copy(reg[idx*c:(idx+1)*c], acc[idx*c:])
			default:
				copy(dst(q)[:c], acc)
			}
		}
	case stIntraAllGather, stInterAllGather:
		for _, q := range group {
			for idx := range group {
				copy(dst(q)[idx*c:(idx+1)*c], in[idx])
			}
		}
	case stIntraBroadcast, stInterBroadcast:
		for _, q := range group {
			copy(dst(q)[:c], in[st.Root])
		}
	}
}

// Every collective's schedule, run by the simulator, gives what a flat
// group gives: every layout, size, op, in place or not.
func TestSchedulesMatchFlatGroup(t *testing.T) {
	layouts := [][]string{
		{"a", "b"}, {"a", "a", "b", "b"}, {"a", "a", "a", "b", "b", "b"}, {"a", "a", "b", "b", "c", "c"},
		{"a", "b", "a", "b"}, {"c", "a", "b", "a", "c", "b"}, {"a", "a", "a", "b", "b", "b", "c", "c", "c", "d", "d", "d"},
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, hosts := range layouts {
		p, err := planNodes(hosts)
		require.NoError(t, err)
		W := len(hosts)
		in := func(r, k int) float64 { return float64((r+1)*1000 + (k*7+r)%997) }
		for _, count := range []int{0, 1, 2, 5, 7, 12, 13, 64, 1003} {
			for _, inPlace := range []bool{false, true} {
				name := fmt.Sprintf("%v count %d inplace %v", hosts, count, inPlace)
				for _, op := range []comm.Op{comm.Sum, comm.Avg, comm.Min, comm.Max} {
					t.Run("allreduce "+name+fmt.Sprint(" op ", op), func(t *testing.T) {
						send, recv := make([][]float64, W), make([][]float64, W)
						scheds := make([]schedule, W)
						for r := range W {
							send[r] = make([]float64, count)
							for k := range send[r] {
								send[r][k] = in(r, k)
							}
							recv[r] = make([]float64, count)
							if inPlace {
								copy(recv[r], send[r])
							}
							scheds[r] = p.allReduce(r, count, op, inPlace)
						}
						simulate(t, p, scheds, send, recv, inPlace)
						for k := range count {
							want := in(0, k)
							for r := 1; r < W; r++ {
								switch op {
								case comm.Min:
									want = math.Min(want, in(r, k))
								case comm.Max:
									want = math.Max(want, in(r, k))
								default:
									want += in(r, k)
								}
							}
							if op == comm.Avg {
								want /= float64(W)
							}
							for r := range W {
								require.Equal(t, want, recv[r][k], "rank %d element %d", r, k)
							}
						}
					})
				}
				t.Run("reducescatter "+name, func(t *testing.T) {
					block := count
					send, recv := make([][]float64, W), make([][]float64, W)
					scheds := make([]schedule, W)
					for r := range W {
						send[r] = make([]float64, W*block)
						for k := range send[r] {
							send[r][k] = in(r, k)
						}
						if inPlace {
							recv[r] = append([]float64(nil), send[r]...)
						} else {
							recv[r] = make([]float64, block)
						}
						scheds[r] = p.reduceScatter(r, block, comm.Sum, inPlace)
					}
					simulate(t, p, scheds, send, recv, inPlace)
					for r := range W {
						base := 0
						if inPlace {
							base = r * block
						}
						for k := range block {
							want := 0.0
							for q := range W {
								want += in(q, r*block+k)
							}
							require.Equal(t, want, recv[r][base+k], "rank %d element %d", r, k)
						}
					}
				})
				t.Run("allgather "+name, func(t *testing.T) {
					block := count
					send, recv := make([][]float64, W), make([][]float64, W)
					scheds := make([]schedule, W)
					for r := range W {
						send[r] = make([]float64, block)
						for k := range send[r] {
							send[r][k] = in(r, k)
						}
						recv[r] = make([]float64, W*block)
						if inPlace {
							copy(recv[r][r*block:], send[r])
						}
						scheds[r] = p.allGather(r, block, inPlace)
					}
					simulate(t, p, scheds, send, recv, inPlace)
					for r := range W {
						for q := range W {
							for k := range block {
								require.Equal(t, in(q, k), recv[r][q*block+k], "rank %d, rank %d's element %d", r, q, k)
							}
						}
					}
				})
				t.Run("broadcast "+name, func(t *testing.T) {
					root := rng.IntN(W)
					send, recv := make([][]float64, W), make([][]float64, W)
					scheds := make([]schedule, W)
					for r := range W {
						send[r] = make([]float64, count)
						for k := range send[r] {
							send[r][k] = in(r, k)
						}
						recv[r] = make([]float64, count)
						if inPlace {
							copy(recv[r], send[r])
						}
						scheds[r] = p.broadcast(r, count, root, inPlace)
					}
					simulate(t, p, scheds, send, recv, inPlace)
					for r := range W {
						for k := range count {
							require.Equal(t, in(root, k), recv[r][k], "rank %d element %d (root %d)", r, k, root)
						}
					}
				})
			}
		}
		t.Run(fmt.Sprintf("barrier %v", hosts), func(t *testing.T) {
			scheds := make([]schedule, W)
			empty := make([][]float64, W)
			for r := range W {
				scheds[r] = p.barrier(r)
				empty[r] = []float64{}
			}
			simulate(t, p, scheds, empty, empty, true)
		})
	}
}
