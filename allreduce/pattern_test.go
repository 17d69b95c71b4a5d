package allreduce

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/comm"
)

// TestPatternExactInAnyOrder reduces the ranks' inputs pairwise with the
// host kernels, in shuffled orders and as a tree, in the dtype's own
// arithmetic, and requires Expected bit for bit: every partial sum of the
// pattern is exact, for every dtype and op up to the largest world bench
// allows.
func TestPatternExactInAnyOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const count = 257
	for _, world := range []int{1, 2, 3, 7, 8, 16, 17, 33, 64, 100, 256} {
		for _, dt := range allDTypes {
			for _, op := range allOps {
				in := make([][]byte, world)
				for r := range world {
					in[r] = Input(AllReduce, dt, op, world, r, count)
				}
				want := Expected(AllReduce, dt, op, world, 0, 0, count)
				fold := op
				if op == comm.Avg {
					fold = comm.Sum
				}
				finish := func(acc []byte) []byte {
					if op == comm.Avg {
						require.NoError(t, comm.ScaleHost(acc, dt, world))
					}
					return acc
				}
				for trial := range 3 {
					order := rng.Perm(world)
					acc := bytes.Clone(in[order[0]])
					for _, r := range order[1:] {
						require.NoError(t, comm.ReduceHost(acc, [][]byte{acc, in[r]}, dt, fold, 1))
					}
					require.Zero(t, Wrong(finish(acc), want, dt), "n%d dtype %d op %d: order %d %v", world, dt, op, trial, order)
				}
				level := make([][]byte, world)
				for r := range world {
					level[r] = bytes.Clone(in[r])
				}
				for len(level) > 1 {
					var next [][]byte
					for k := 0; k < len(level); k += 2 {
						if k+1 < len(level) {
							require.NoError(t, comm.ReduceHost(level[k], [][]byte{level[k], level[k+1]}, dt, fold, 1))
						}
						next = append(next, level[k])
					}
					level = next
				}
				require.Zero(t, Wrong(finish(level[0]), want, dt), "n%d dtype %d op %d: tree order", world, dt, op)
			}
		}
	}
}

// element returns element i of b as bytes.
func element(b []byte, dt comm.DType, i int) string {
	es := dt.Size()
	return string(b[i*es : (i+1)*es])
}

// TestPatternDistinct: at every position every rank sends something of its
// own, and no rank's block repeats under a shift, so a block delivered to the
// wrong rank or at the wrong offset differs.
func TestPatternDistinct(t *testing.T) {
	const count = 64
	for _, world := range []int{2, 4, 5, 7, 8, 9, 16} {
		for _, dt := range allDTypes {
			for _, op := range allOps {
				name := fmt.Sprintf("n%d dtype %d op %d", world, dt, op)
				in := make([][]byte, world)
				for r := range world {
					in[r] = Input(AllReduce, dt, op, world, r, count)
				}
				for i := range count {
					seen := map[string]int{}
					for r := range world {
						e := element(in[r], dt, i)
						q, dup := seen[e]
						require.False(t, dup, "%s: ranks %d and %d send the same element %d", name, q, r, i)
						seen[e] = r
					}
				}
				es := dt.Size()
				for r := range world {
					for s := 1; s < count/2; s++ {
						require.NotEqual(t, in[r][:count/2*es], in[r][s*es:(s+count/2)*es], "%s: rank %d's block repeats after %d elements", name, r, s)
					}
				}
			}
		}
	}
}

// TestSwappedBlocksCaught: with 7 and 8 ranks, an all-gather with two ranks'
// blocks exchanged, a broadcast from another root and a reduce-scatter block
// delivered to the wrong rank all count wrong elements.
func TestSwappedBlocksCaught(t *testing.T) {
	const count = 16
	for _, world := range []int{7, 8} {
		for _, dt := range allDTypes {
			for _, op := range allOps {
				name := fmt.Sprintf("n%d dtype %d op %d", world, dt, op)
				bs := count * dt.Size()
				want := Expected(AllGather, dt, op, world, 0, 0, count)
				for a := range world {
					for b := a + 1; b < world; b++ {
						got := bytes.Clone(want)
						copy(got[a*bs:], want[b*bs:(b+1)*bs])
						copy(got[b*bs:], want[a*bs:(a+1)*bs])
						require.Positive(t, Wrong(got, want, dt), "%s: all-gather with blocks %d and %d swapped", name, a, b)
						require.Positive(t, Wrong(Expected(Broadcast, dt, op, world, 0, b, count), Expected(Broadcast, dt, op, world, 0, a, count), dt),
							"%s: broadcast from root %d instead of %d", name, b, a)
						if op == comm.Sum || op == comm.Avg || world <= 8 {
							require.Positive(t, Wrong(Expected(ReduceScatter, dt, op, world, b, 0, count), Expected(ReduceScatter, dt, op, world, a, 0, count), dt),
								"%s: reduce-scatter gave rank %d rank %d's block", name, a, b)
						}
					}
				}
			}
		}
	}
}

// TestCollectivesSevenPlusRanks runs every collective over 7 and 9 ranks
// (more than the old pattern's period of 4) with the real executor.
func TestCollectivesSevenPlusRanks(t *testing.T) {
	opts := Options{Chunk: 8 << 10, Slots: 2} // at least 64·world·elemsize
	for _, world := range []int{7, 9} {
		for _, alg := range []Algorithm{HostStaged, Ring} {
			g := newGroup(t, world, alg, opts)
			for _, dt := range allDTypes {
				for _, op := range allOps {
					count := 1000 + world
					name := fmt.Sprintf("n%d/%s/%d/op%d", world, alg, dt, op)
					t.Run(name+"/allreduce", func(t *testing.T) { g.check(t, AllReduce, dt, op, count, false, 0) })
					if alg == HostStaged {
						t.Run(name+"/reducescatter", func(t *testing.T) { g.check(t, ReduceScatter, dt, op, count/world+1, false, 0) })
						t.Run(name+"/allgather", func(t *testing.T) { g.check(t, AllGather, dt, op, count/world+1, true, 0) })
						t.Run(name+"/broadcast", func(t *testing.T) { g.check(t, Broadcast, dt, op, count, false, world-2) })
					}
				}
			}
		}
	}
}
