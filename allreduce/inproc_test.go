package allreduce

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/comm"
	"github.com/migctl/migctl/comm/shm"
)

// group is world ranks as goroutines of this process over one anonymous
// shared mapping: the real transport and executor, without processes.
type group struct {
	comms []*Communicator
	devs  []comm.Device
	trs   []*comm.ShmTransport
}

func newGroup(t testing.TB, world int, alg Algorithm, opts Options) *group {
	t.Helper()
	return newGroupWith(t, world, alg, opts, nil)
}

// newGroupWith is newGroup with every rank's device passed through wrap
// (nil: as it is).
func newGroupWith(t testing.TB, world int, alg Algorithm, opts Options, wrap func(comm.Device) comm.Device) *group {
	t.Helper()
	opts = opts.withDefaults(world)
	l := shm.Layout{World: world, Flags: world * FlagsPerRank, DataBytes: ArenaBytes(world, opts.Chunk, opts.Slots)}
	// Go memory rather than a mapping: the race detector tracks the
	// atomics on flags only in memory it knows.
	mem := alignedMem(l.Size())
	_, err := shm.Init(mem, l)
	require.NoError(t, err)
	g := &group{}
	for r := range world {
		ctl, err := shm.Attach(mem, l)
		require.NoError(t, err)
		tr, err := comm.NewShmTransport(ctl, r, comm.ShmOptions{})
		require.NoError(t, err)
		var dev comm.Device = comm.NewHostDevice(comm.HostOptions{ReduceWorkers: 1})
		if wrap != nil {
			dev = wrap(dev)
		}
		ex, err := NewExecutor(dev, tr, opts)
		require.NoError(t, err)
		t.Cleanup(func() { _ = ex.Close(); _ = tr.Close(); _ = dev.Close() })
		g.comms = append(g.comms, NewCommunicator(ex, alg))
		g.devs = append(g.devs, dev)
		g.trs = append(g.trs, tr)
	}
	return g
}

// run calls f on every rank concurrently and returns their errors.
func (g *group) run(f func(r int, c *Communicator) error) []error {
	errs := make([]error, len(g.comms))
	var wg sync.WaitGroup
	for r, c := range g.comms {
		wg.Add(1)
		go func() { defer wg.Done(); errs[r] = f(r, c) }()
	}
	wg.Wait()
	return errs
}

func hostBuf(t *testing.T, dev comm.Device, b []byte, n int) *comm.HostBuffer {
	t.Helper()
	buf, err := dev.Alloc(max(n, len(b)))
	require.NoError(t, err)
	hb := buf.(*comm.HostBuffer)
	copy(hb.Bytes(), b)
	return hb
}

// check runs coll on every rank and checks every element.
func (g *group) check(t *testing.T, coll Coll, dt comm.DType, op comm.Op, count int, inPlace bool, root int) {
	t.Helper()
	world := len(g.comms)
	es := dt.Size()
	// buffers are made here, in the test goroutine (hostBuf requires), not
	// in the ranks' goroutines
	type rankBufs struct {
		send, recv *comm.HostBuffer
		base       int
	}
	bufs := make([]rankBufs, world)
	for r := range world {
		in := Input(coll, dt, op, world, r, count)
		outLen := OutputLen(coll, world, count) * es
		b := &bufs[r]
		switch {
		case !inPlace:
			b.send, b.recv = hostBuf(t, g.devs[r], in, 0), hostBuf(t, g.devs[r], nil, outLen)
		case coll == AllGather:
			b.recv = hostBuf(t, g.devs[r], nil, outLen)
			copy(b.recv.Bytes()[r*count*es:], in)
			b.send = b.recv
		case coll == ReduceScatter:
			b.send = hostBuf(t, g.devs[r], in, 0)
			b.recv, b.base = b.send, r*count*es
		default:
			b.send = hostBuf(t, g.devs[r], in, outLen)
			b.recv = b.send
		}
	}
	errs := g.run(func(r int, c *Communicator) error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		send, recv, base := bufs[r].send, bufs[r].recv, bufs[r].base
		var err error
		switch coll {
		case AllReduce:
			err = c.AllReduce(ctx, send, recv, count, dt, op)
		case ReduceScatter:
			err = c.ReduceScatter(ctx, send, recv, count, dt, op)
		case AllGather:
			err = c.AllGather(ctx, send, recv, count, dt)
		case Broadcast:
			err = c.Broadcast(ctx, send, recv, count, dt, root)
		}
		if err != nil {
			return err
		}
		want := Expected(coll, dt, op, world, r, root, count)
		if w := Wrong(recv.Bytes()[base:base+len(want)], want, dt); w != 0 {
			return fmt.Errorf("rank %d: %d of %d elements wrong", r, w, len(want)/es)
		}
		return nil
	})
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
}

var allDTypes = []comm.DType{comm.Float32, comm.Float16, comm.BFloat16, comm.Float64, comm.Int32, comm.Int64, comm.Uint8}
var allOps = []comm.Op{comm.Sum, comm.Avg, comm.Min, comm.Max}

func TestInProcessCollectives(t *testing.T) {
	opts := Options{Chunk: 4 << 10, Slots: 2}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, world := range []int{1, 2, 3, 5} {
		for _, alg := range []Algorithm{HostStaged, Ring} {
			g := newGroup(t, world, alg, opts)
			g.checkAll(t, rng, world, alg)
		}
	}
}

// stagingDevice hands out streams that are comm.StagingReducers and counts
// the reductions queued through ReduceFromHostStaged (done as ReduceFromHost:
// the host device has nothing to stage into).
type stagingDevice struct {
	comm.Device
	staged *atomic.Int64
}

func (d stagingDevice) NewStream() (comm.Stream, error) {
	s, err := d.Device.NewStream()
	if err != nil {
		return nil, err
	}
	return stagingStream{s, d.staged}, nil
}

type stagingStream struct {
	comm.Stream
	staged *atomic.Int64
}

func (s stagingStream) ReduceFromHostStaged(dst comm.Buffer, dstOff int, srcs [][]byte, dt comm.DType, op comm.Op) error {
	s.staged.Add(1)
	return s.ReduceFromHost(dst, dstOff, srcs, dt, op)
}

// The executor queues a step that asks for staging (the ring's reductions)
// through comm.StagingReducer where the stream has it, and no other step.
func TestInProcessStagedReductions(t *testing.T) {
	for _, alg := range []Algorithm{Ring, HostStaged} {
		var staged atomic.Int64
		g := newGroupWith(t, 3, alg, Options{Chunk: 4 << 10, Slots: 2, GPUShare: GPUShareOne},
			func(d comm.Device) comm.Device { return stagingDevice{d, &staged} })
		g.check(t, AllReduce, comm.Float32, comm.Sum, 10007, false, 0)
		if alg == Ring {
			require.Positive(t, staged.Load(), "the ring's device reductions go through ReduceFromHostStaged")
		} else {
			require.Zero(t, staged.Load(), "host-staged (device share) reduces as before")
		}
	}
}

// The shm ring hands small all-reduces to the one-round small path, as the
// other shm algorithms do, and alternates with it (fenced) over mixed sizes,
// every dtype and op, in and out of place.
func TestInProcessRingSmallMessages(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 9))
	for _, world := range []int{2, 3} {
		g := newGroup(t, world, Ring, Options{Chunk: 4 << 10, Slots: 2, SmallBytes: 256})
		for _, dt := range allDTypes {
			for _, op := range allOps {
				for _, count := range []int{1 + rng.IntN(256/dt.Size()), 300 + rng.IntN(6000)} {
					g.check(t, AllReduce, dt, op, count, rng.IntN(2) == 0, 0)
				}
			}
		}
		for _, c := range g.comms {
			algs := map[Algorithm]bool{}
			for p := range c.cache {
				algs[p.Algorithm] = true
			}
			require.Equal(t, map[Algorithm]bool{Ring: true, HostStagedSmall: true}, algs, "world %d", world)
		}
	}
}

// TestInProcessHierarchical runs the hierarchical all-reduce over groupings
// of ranks (contiguous, uneven, round robin, one group, every rank alone)
// in every dtype and op, then a sequence of calls of mixed sizes that skip
// the fence (same grouping), small ones and barriers in between.
func TestInProcessHierarchical(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 7))
	for _, tc := range []struct {
		world  int
		labels []int
	}{
		{2, []int{0, 0}}, {2, []int{0, 1}}, {4, []int{0, 0, 1, 1}}, {5, []int{0, 0, 0, 1, 1}},
		{6, []int{0, 1, 2, 0, 1, 2}}, {3, []int{0, 1, 2}}, {7, []int{0, 0, 0, 0, 0, 0, 0}}, {8, []int{0, 0, 0, 0, 1, 1, 1, 1}},
	} {
		groups, err := NewGrouping(tc.labels)
		require.NoError(t, err)
		g := newGroup(t, tc.world, Hierarchical, Options{Chunk: 4 << 10, Slots: 3, SmallBytes: 256})
		for _, c := range g.comms {
			require.NoError(t, c.SetGroups(groups))
		}
		t.Run(fmt.Sprintf("groups%v", groups.Sizes()), func(t *testing.T) {
			for _, dt := range allDTypes {
				for _, op := range allOps {
					count := 1 + rng.IntN(6000)
					for _, inPlace := range []bool{false, true} {
						g.check(t, AllReduce, dt, op, count, inPlace, 0)
					}
				}
			}
			for range 6 {
				count := []int{1, 37, 5000, 5000, 12345}[rng.IntN(5)]
				g.check(t, AllReduce, comm.Float32, comm.Sum, count, rng.IntN(2) == 0, 0)
				if rng.IntN(3) == 0 {
					g.check(t, Broadcast, comm.Int32, comm.Sum, 999, false, tc.world-1)
				}
			}
		})
	}
}

func (g *group) checkAll(t *testing.T, rng *rand.Rand, world int, alg Algorithm) {
	t.Helper()
	for _, dt := range allDTypes {
		for _, op := range allOps {
			count := 1 + rng.IntN(12000)
			for _, inPlace := range []bool{false, true} {
				name := fmt.Sprintf("n%d/%s/%d/op%d/n%d/inplace=%v", world, alg, dt, op, count, inPlace)
				t.Run(name+"/allreduce", func(t *testing.T) { g.check(t, AllReduce, dt, op, count, inPlace, 0) })
				if alg == HostStaged {
					t.Run(name+"/reducescatter", func(t *testing.T) { g.check(t, ReduceScatter, dt, op, count/world+1, inPlace, 0) })
					t.Run(name+"/allgather", func(t *testing.T) { g.check(t, AllGather, dt, op, count/world+1, inPlace, 0) })
					t.Run(name+"/broadcast", func(t *testing.T) { g.check(t, Broadcast, dt, op, count, inPlace, world-1) })
				}
			}
		}
	}
	errs := g.run(func(r int, c *Communicator) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return c.Barrier(ctx)
	})
	for _, err := range errs {
		require.NoError(t, err)
	}
}

// alignedMem returns n bytes of Go memory aligned to a page.
func alignedMem(n int) []byte {
	raw := make([]uint64, (n+2*4096)/8)
	b := unsafe.Slice((*byte)(unsafe.Pointer(&raw[0])), len(raw)*8)
	off := (4096 - int(uintptr(unsafe.Pointer(&b[0]))%4096)) % 4096
	return b[off : off+n : off+n]
}

// The IPC ring with host buffers standing in for buffers opened through IPC
// (the host stream reduces between buffers like the CUDA one).
func TestInProcessIPCRing(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	for _, world := range []int{1, 2, 3, 4} {
		g := newGroup(t, world, RingIPC, Options{Chunk: 4 << 10, Slots: 2})
		for _, dt := range allDTypes {
			for _, op := range allOps {
				for _, inPlace := range []bool{false, true} {
					count := 1 + rng.IntN(9000)
					t.Run(fmt.Sprintf("n%d/dt%d/op%d/n%d/inplace=%v", world, dt, op, count, inPlace), func(t *testing.T) {
						es := dt.Size()
						sends := make([]*comm.HostBuffer, world)
						recvs := make([]*comm.HostBuffer, world)
						for r := range world {
							sends[r] = hostBuf(t, g.devs[r], Input(AllReduce, dt, op, world, r, count), 0)
							recvs[r] = sends[r]
							if !inPlace {
								recvs[r] = hostBuf(t, g.devs[r], nil, count*es)
							}
						}
						errs := g.run(func(r int, c *Communicator) error {
							ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
							defer cancel()
							prev := (r + world - 1) % world
							if err := c.AllReduceIPC(ctx, sends[r], recvs[r], sends[prev], recvs[prev], count, dt, op); err != nil {
								return err
							}
							want := Expected(AllReduce, dt, op, world, r, 0, count)
							if w := Wrong(recvs[r].Bytes()[:len(want)], want, dt); w != 0 {
								return fmt.Errorf("rank %d: %d of %d wrong", r, w, count)
							}
							return nil
						})
						for r, err := range errs {
							require.NoError(t, err, "rank %d", r)
						}
					})
				}
			}
		}
	}
}

// DDP's two buffer broadcasts per forward pass: with broadcast pairs (the
// default) the root finishes both before a slow rank has entered the
// first, and every rank still receives both; unpaired, the root's second
// waits for every rank to have finished the first.
func TestBroadcastPairsLeaveTheRootFree(t *testing.T) {
	for _, paired := range []bool{true, false} {
		t.Run(fmt.Sprintf("paired=%v", paired), func(t *testing.T) {
			const world, count = 3, 1000
			g := newGroup(t, world, HostStaged, Options{Chunk: 64 << 10, Slots: 4})
			bufs := make([][2]*comm.HostBuffer, world)
			for r := range world {
				g.comms[r].SetBroadcastPairs(paired)
				for i := range 2 {
					b := make([]byte, 4*count)
					if r == 0 {
						for j := range b {
							b[j] = byte(j*7 + i + 1)
						}
					}
					bufs[r][i] = hostBuf(t, g.devs[r], b, 0)
				}
			}
			rootDone := make(chan struct{})
			errs := g.run(func(r int, c *Communicator) error {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				if r == world-1 {
					// The slow rank enters once the root is done with both or,
					// unpaired, once the root has waited 300 ms for it.
					select {
					case <-rootDone:
						if !paired {
							return fmt.Errorf("unpaired: the root finished its second broadcast before rank %d finished the first", r)
						}
					case <-time.After(300 * time.Millisecond):
						if paired {
							return fmt.Errorf("paired: the root did not finish both broadcasts without rank %d", r)
						}
					}
				}
				for i := range 2 {
					if err := c.Broadcast(ctx, bufs[r][i], bufs[r][i], count, comm.Float32, 0); err != nil {
						return err
					}
				}
				if r == 0 {
					close(rootDone)
				}
				return nil
			})
			for r, err := range errs {
				require.NoError(t, err, "rank %d", r)
			}
			for r := 1; r < world; r++ {
				for i := range 2 {
					require.Equal(t, bufs[0][i].Bytes(), bufs[r][i].Bytes(), "rank %d broadcast %d", r, i)
				}
			}
		})
	}
}

// Host-staged all-reduces of one or two chunks move quarter chunks
// (PieceFor), longer ones whole chunks, in any order through one executor:
// every element right, for every op and a few element types, in place and
// not; Options.WholeChunks keeps every call whole.
func TestInProcessPieces(t *testing.T) {
	const world, chunk = 3, 16 << 10
	opts := Options{Chunk: chunk, Slots: 8, SmallBytes: -1}
	g := newGroup(t, world, HostStaged, opts)
	for _, whole := range []bool{false, true} {
		c := newGroup(t, world, HostStaged, Options{Chunk: chunk, Slots: 8, SmallBytes: -1, WholeChunks: whole}).comms[0]
		for _, n := range []int{4, 8 << 10, chunk, 2 * chunk, 2*chunk + 4} {
			s, err := c.schedule(Params{Coll: AllReduce, Algorithm: HostStaged, Bytes: n, ElemSize: 4})
			require.NoError(t, err)
			want := PieceFor(n, world, 4, chunk, 8)
			if whole {
				want = 0
			}
			require.Equal(t, want, s.Params.Piece, "%d bytes, whole chunks %v", n, whole)
			require.Equal(t, !whole && n <= 2*chunk, s.Params.Piece > 0, "%d bytes, whole chunks %v", n, whole)
		}
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for _, dt := range []comm.DType{comm.Float32, comm.Float16, comm.Float64, comm.Int32} {
		es := dt.Size()
		for _, op := range allOps {
			// pieces and whole chunks alternate through the same slots
			for _, bytes := range []int{2 * chunk, 5 * chunk, es, chunk + 64, 3 * chunk, chunk / 2} {
				count := bytes / es
				g.check(t, AllReduce, dt, op, count, rng.IntN(2) == 0, 0)
			}
		}
	}
}
