package allreduce

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/comm"
)

func TestCrossWaits(t *testing.T) {
	p := func(bytes int) Params {
		return Params{Coll: AllReduce, Algorithm: HostStaged, World: 2, Bytes: bytes, ElemSize: 4, Chunk: 1024, Slots: 2}
	}
	conds := func(role int, v uint64) []Cond { return allRanks(2, role, v) }
	tests := []struct {
		name     string
		prev     Params
		next     Params
		out, red [][]Cond
	}{
		{"prev 3 chunks, next 3: slot 0 last held chunk 2, slot 1 chunk 1", p(3 * 1024), p(3 * 1024),
			[][]Cond{conds(roleB, 3), conds(roleB, 2)}, [][]Cond{conds(roleC, 3), conds(roleC, 2)}},
		{"prev 1 chunk: only slot 0 was used", p(100), p(5 * 1024),
			[][]Cond{conds(roleB, 1)}, [][]Cond{conds(roleC, 1)}},
		{"next 1 chunk: only its chunk 0 waits", p(4 * 1024), p(1024),
			[][]Cond{conds(roleB, 3)}, [][]Cond{conds(roleC, 3)}},
		{"prev empty", p(0), p(4096), nil, nil},
		{"next not host-staged", p(4096), func() Params { q := p(4096); q.Algorithm = Ring; return q }(), nil, nil},
		{"prev a broadcast", func() Params { q := p(4096); q.Coll = Broadcast; return q }(), p(4096), nil, nil},
		{"next reduces on the devices in part", p(4096), func() Params { q := p(4096); q.GPUShare = 500; return q }(), nil, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := crossWaits(tc.prev, tc.next)
			require.Equal(t, tc.out, w[LaneOut])
			require.Equal(t, tc.red, w[LaneReduce])
			require.Nil(t, w[LaneIn])
		})
	}
}

// jitterDevice delays every copy its streams queue by up to limit, so that
// the lanes and ranks of chained calls interleave in many orders.
type jitterDevice struct {
	comm.Device
	limit time.Duration
	rng   *lockedRand
}

type lockedRand struct {
	mu sync.Mutex
	r  *rand.Rand
}

func (l *lockedRand) dur(limit time.Duration) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return time.Duration(l.r.Int64N(int64(limit) + 1))
}

func (d jitterDevice) NewStream() (comm.Stream, error) {
	s, err := d.Device.NewStream()
	if err != nil {
		return nil, err
	}
	return jitterStream{s, d}, nil
}

type jitterStream struct {
	comm.Stream
	d jitterDevice
}

func (s jitterStream) CopyToHost(dst []byte, src comm.Buffer, off int) error {
	time.Sleep(s.d.rng.dur(s.d.limit))
	return s.Stream.CopyToHost(dst, src, off)
}

func (s jitterStream) CopyFromHost(dst comm.Buffer, off int, src []byte) error {
	time.Sleep(s.d.rng.dur(4 * s.d.limit)) // copies back lag the most: the next call's copies out may pass them
	return s.Stream.CopyFromHost(dst, off, src)
}

// chainInput is rank r's input of call i: int32 values that differ from
// call to call, so that a stale slot shows.
func chainInput(i, r, count int) []byte {
	b := make([]byte, 4*count)
	for j := range count {
		binary.LittleEndian.PutUint32(b[4*j:], uint32((i*1000003+r*7919+j*31)%100003))
	}
	return b
}

func chainWant(i, world, count int) []byte {
	want := make([]byte, 4*count)
	for j := range count {
		var s uint32
		for r := range world {
			s += uint32((i*1000003 + r*7919 + j*31) % 100003)
		}
		binary.LittleEndian.PutUint32(want[4*j:], s)
	}
	return want
}

// runChained runs calls on c as the trainer's worker does: each on a
// goroutine of its own, the next one started once the running one admits it
// (or has returned). It returns each call's error.
func runChained(c *Communicator, timeout time.Duration, calls []func(ctx context.Context) error) []error {
	errs := make([]error, len(calls))
	var wg sync.WaitGroup
	for i, call := range calls {
		admitted := make(chan struct{})
		var once sync.Once
		admit := func() { once.Do(func() { close(admitted) }) }
		ctx, cancel := context.WithTimeout(WithAdmit(context.Background(), admit), timeout)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer cancel()
			errs[i] = call(ctx)
			admit()
		}()
		<-admitted
	}
	wg.Wait()
	return errs
}

// Back-to-back host-staged all-reduces of every chunk count around the slot
// count, started as soon as the one before admits the next, with the copies
// delayed at random: every result is right, and calls did overlap. A call
// whose input is the previous call's output (in place) waits for it.
func TestChainedAllReduces(t *testing.T) {
	const chunk, slots = 4 << 10, 2
	for _, world := range []int{2, 3, 5} {
		t.Run(fmt.Sprintf("world=%d", world), func(t *testing.T) {
			rng := &lockedRand{r: rand.New(rand.NewPCG(uint64(world), 9))}
			g := newGroupWith(t, world, HostStaged, Options{Chunk: chunk, Slots: slots, SmallBytes: -1},
				func(d comm.Device) comm.Device { return jitterDevice{d, 150 * time.Microsecond, rng} })
			elems := chunk / 4
			// chunk counts: < K, = K, > K, several K, a partial last chunk
			counts := []int{elems / 3, elems, 2 * elems, 3*elems + 5, elems + 1, 7 * elems, 1, 2*elems - 1, 5 * elems}
			const rounds = 3
			type rankBufs struct{ send, recv []*comm.HostBuffer }
			bufs := make([]rankBufs, world)
			var calls []int // index into counts per call
			for range rounds {
				for k := range counts {
					calls = append(calls, k)
				}
			}
			for r := range world {
				for i, k := range calls {
					bufs[r].send = append(bufs[r].send, hostBuf(t, g.devs[r], chainInput(i, r, counts[k]), 0))
					bufs[r].recv = append(bufs[r].recv, hostBuf(t, g.devs[r], nil, 4*counts[k]))
				}
			}
			// Then an in-place chain on one buffer: each call reads what the
			// one before wrote (a sum: an early read would sum stale values).
			inplace := make([]*comm.HostBuffer, world)
			for r := range world {
				inplace[r] = hostBuf(t, g.devs[r], chainInput(99, r, elems/2), 0)
			}
			errs := g.run(func(r int, c *Communicator) error {
				var fs []func(ctx context.Context) error
				for i, k := range calls {
					fs = append(fs, func(ctx context.Context) error {
						return c.AllReduce(ctx, bufs[r].send[i], bufs[r].recv[i], counts[k], comm.Int32, comm.Sum)
					})
				}
				for range 6 {
					fs = append(fs, func(ctx context.Context) error {
						return c.AllReduce(ctx, inplace[r], inplace[r], elems/2, comm.Int32, comm.Sum)
					})
				}
				for i, err := range runChained(c, 20*time.Second, fs) {
					if err != nil {
						return fmt.Errorf("call %d: %w", i, err)
					}
				}
				for i, k := range calls {
					if w := Wrong(bufs[r].recv[i].Bytes(), chainWant(i, world, counts[k]), comm.Int32); w != 0 {
						return fmt.Errorf("rank %d call %d (%d elements): %d wrong", r, i, counts[k], w)
					}
				}
				return nil
			})
			for r, err := range errs {
				require.NoError(t, err, "rank %d", r)
			}
			// the in-place chain of 6 sums: world⁵ times the first one's
			want := chainWant(99, world, elems/2)
			for j := range elems / 2 {
				v := binary.LittleEndian.Uint32(want[4*j:])
				binary.LittleEndian.PutUint32(want[4*j:], v*uint32(world*world*world*world*world))
			}
			for r := range world {
				require.Zero(t, Wrong(inplace[r].Bytes(), want, comm.Int32), "rank %d in-place chain", r)
				require.Positive(t, g.comms[r].exec.overlaps.Load(), "rank %d: no call overlapped the one before", r)
			}
		})
	}
}

// A rank that stops calling while its peers have chained calls in flight:
// every call of theirs ends with an error by its deadline (none hangs), and
// the communicator is unusable afterwards.
func TestChainedAllReduceFailure(t *testing.T) {
	const chunk, slots, world = 4 << 10, 2, 3
	g := newGroup(t, world, HostStaged, Options{Chunk: chunk, Slots: slots, SmallBytes: -1})
	count := 5 * chunk / 4
	var bufs [world][]*comm.HostBuffer
	for r := range world {
		for i := range 6 {
			bufs[r] = append(bufs[r], hostBuf(t, g.devs[r], chainInput(i, r, count), 0))
		}
	}
	var failed atomic.Int64
	start := time.Now()
	errs := g.run(func(r int, c *Communicator) error {
		n := 6
		if r == 1 {
			n = 2 // rank 1 makes two calls only
		}
		var fs []func(ctx context.Context) error
		for i := range n {
			fs = append(fs, func(ctx context.Context) error {
				return c.AllReduce(ctx, bufs[r][i], bufs[r][i], count, comm.Int32, comm.Sum)
			})
		}
		res := runChained(c, 2*time.Second, fs)
		for i, err := range res {
			if i < 2 && err != nil {
				return fmt.Errorf("call %d failed: %w", i, err)
			}
			if i >= 2 && err == nil {
				return fmt.Errorf("call %d succeeded without rank 1", i)
			}
			if err != nil {
				failed.Add(1)
			}
		}
		if r != 1 {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			if err := c.AllReduce(ctx, bufs[r][0], bufs[r][0], count, comm.Int32, comm.Sum); err == nil {
				return fmt.Errorf("a call after the failure succeeded")
			}
		}
		return nil
	})
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
	require.Equal(t, int64(2*4), failed.Load())
	require.Less(t, time.Since(start), 15*time.Second)
}

// Chains says what Run does: a host-staged all-reduce above the small size
// with the CPU reduction chains; a small one, one reduced on the devices in
// part, or another algorithm's does not.
func TestCommunicatorChains(t *testing.T) {
	opts := Options{Chunk: 4 << 10, Slots: 2, SmallBytes: 1 << 10}
	hs := newGroup(t, 2, HostStaged, opts).comms[0]
	require.True(t, hs.Chains(4096))
	require.False(t, hs.Chains(1<<10), "the small-message path")
	require.False(t, hs.Chains(0))
	require.NoError(t, hs.SetGPUShare(500))
	require.False(t, hs.Chains(4096), "a device share")
	require.False(t, newGroup(t, 2, Ring, opts).comms[0].Chains(4096))
	require.False(t, newGroup(t, 1, HostStaged, opts).comms[0].Chains(4096), "one rank")
}
