package allreduce

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/comm"
)

// callSpec is one rank's collective call in a mismatch test.
type callSpec struct {
	coll  Coll
	count int
	dt    comm.DType
	op    comm.Op
	root  int
}

func (s callSpec) run(ctx context.Context, t *testing.T, c *Communicator, dev comm.Device, world int) error {
	n := s.count * s.dt.Size()
	if s.coll == AllGather {
		n *= world
	}
	if s.coll == ReduceScatter {
		n *= world
	}
	send := hostBuf(t, dev, nil, max(n, 1))
	recv := hostBuf(t, dev, nil, max(n, 1))
	switch s.coll {
	case AllReduce:
		return c.AllReduce(ctx, send, recv, s.count, s.dt, s.op)
	case ReduceScatter:
		return c.ReduceScatter(ctx, send, recv, s.count, s.dt, s.op)
	case AllGather:
		return c.AllGather(ctx, send, recv, s.count, s.dt)
	case Broadcast:
		return c.Broadcast(ctx, send, recv, s.count, s.dt, s.root)
	}
	return c.Barrier(ctx)
}

// Ranks whose calls differ fail at once (well before the deadline) with
// errors that match comm.ErrMismatch and comm.ErrInvalid and say what each
// side called, instead of returning a wrong result or waiting for the
// deadline, and every rank's next call fails with the cause.
func TestMismatchedCallsFail(t *testing.T) {
	f32, sum := comm.Float32, comm.Sum
	tests := []struct {
		name   string
		alg    Algorithm
		calls  [2]callSpec
		reason string // in the error of a rank that compared
	}{
		{"small all-reduce, counts", HostStaged, [2]callSpec{{AllReduce, 100, f32, sum, 0}, {AllReduce, 200, f32, sum, 0}},
			"allreduce of 400 bytes of float32 (sum)"},
		{"chunked all-reduce, counts", HostStaged,
			[2]callSpec{{AllReduce, 300 << 10, f32, sum, 0}, {AllReduce, 200 << 10, f32, sum, 0}}, "819200 bytes"},
		{"ring, counts", Ring, [2]callSpec{{AllReduce, 300 << 10, f32, sum, 0}, {AllReduce, 200 << 10, f32, sum, 0}},
			"1228800 bytes"},
		{"element type", HostStaged, [2]callSpec{{AllReduce, 1000, f32, sum, 0}, {AllReduce, 1000, comm.Int32, sum, 0}},
			"of int32 (sum)"},
		{"operator", HostStaged, [2]callSpec{{AllReduce, 1000, f32, sum, 0}, {AllReduce, 1000, f32, comm.Max, 0}},
			"(max)"},
		{"collective", HostStaged, [2]callSpec{{AllReduce, 1000, f32, sum, 0}, {AllGather, 1000, f32, sum, 0}},
			"allgather of 4000 bytes of float32"},
		{"all-reduce and barrier", HostStaged, [2]callSpec{{AllReduce, 1000, f32, sum, 0}, {Barrier, 0, f32, sum, 0}},
			"barrier"},
		{"broadcast root", HostStaged, [2]callSpec{{Broadcast, 1000, f32, sum, 0}, {Broadcast, 1000, f32, sum, 1}},
			"from rank 1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := newGroup(t, 2, tc.alg, Options{Chunk: 256 << 10, Slots: 2})
			start := time.Now()
			errs := g.run(func(r int, c *Communicator) error {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				return tc.calls[r].run(ctx, t, c, g.devs[r], 2)
			})
			require.Less(t, time.Since(start), 10*time.Second, "a mismatch is found at the first wait, not at the deadline")
			compared := 0
			for r, err := range errs {
				if err == nil {
					// A rank that waited for nothing of its peer (a
					// broadcast's root) may finish its call before the
					// peer compares; its next call fails (below).
					continue
				}
				require.ErrorIs(t, err, comm.ErrMismatch, "rank %d", r)
				require.ErrorIs(t, err, comm.ErrInvalid, "rank %d", r)
				var me *MismatchError
				if errors.As(err, &me) {
					compared++
					require.Equal(t, r, me.Rank)
					require.Equal(t, 1-r, me.Peer)
					require.Contains(t, err.Error(), tc.reason)
				} else {
					require.Contains(t, err.Error(), "differs from its own")
				}
			}
			require.Positive(t, compared, "at least one rank compared the calls and says how they differ")
			// The group is unusable afterwards, on every rank, with the cause.
			errs = g.run(func(r int, c *Communicator) error {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				return c.Barrier(ctx)
			})
			for r, err := range errs {
				require.ErrorIs(t, err, comm.ErrMismatch, "rank %d, the next call", r)
			}
		})
	}
}

// Matching calls publish and compare signatures without a false alarm:
// many calls in a row of every collective, sizes across the small-message
// bound and the chunk size, each checked element by element.
func TestMatchingCallsPassSignatureCheck(t *testing.T) {
	for _, alg := range []Algorithm{HostStaged, Ring} {
		g := newGroup(t, 3, alg, Options{Chunk: 4 << 10, Slots: 2})
		for _, count := range []int{1, 7, 1000, 5000, 1 << 14} {
			g.check(t, AllReduce, comm.Float32, comm.Sum, count, false, 0)
			g.check(t, AllReduce, comm.Int64, comm.Max, count, true, 0)
			g.check(t, ReduceScatter, comm.Float32, comm.Avg, count, false, 0)
			g.check(t, AllGather, comm.BFloat16, comm.Sum, count, false, 0)
			g.check(t, Broadcast, comm.Uint8, comm.Sum, count, false, 2)
		}
		for r, tr := range g.trs {
			require.NoError(t, tr.Aborted(), "rank %d", r)
		}
	}
}

// The signature words round-trip every field a user sets.
func TestSignatureFields(t *testing.T) {
	p := Params{Coll: Broadcast, Algorithm: Ring, Bytes: 5<<30 + 12345, Root: 300}
	s := signatureOf(p, Call{DType: comm.BFloat16, Op: comm.Max})
	require.Equal(t, Broadcast, s.coll())
	require.Equal(t, Ring, s.algorithm())
	require.Equal(t, comm.BFloat16, s.dtype())
	require.Equal(t, comm.Sum, s.op(), "a broadcast has no operator")
	require.Equal(t, 300, s.root())
	require.Equal(t, uint64(5<<30+12345), s.bytes())
	require.Less(t, s.kind, uint64(1)<<sigBits)
	require.Less(t, s.lo, uint64(1)<<sigBits)
	require.Less(t, s.hi, uint64(1)<<sigBits)
	r := signatureOf(Params{Coll: AllReduce, Bytes: 8}, Call{DType: comm.Float64, Op: comm.Min})
	require.Equal(t, "allreduce of 8 bytes of float64 (min)", r.String())
	require.Equal(t, comm.Min, r.op())
	require.Equal(t, 0, r.root(), "an all-reduce has no root")
}

// A broadcast's root waits for nobody, so it can finish a mismatched
// broadcast and publish its next call (a barrier: no fence) before the
// other rank makes its own broadcast: that rank must still find the
// root's signature of the broadcast (two generations are kept) rather
// than read a staged area of another size, or finish without a word.
func TestMismatchAfterTheRootMovedOn(t *testing.T) {
	for _, tc := range []struct {
		name  string
		other callSpec // rank 1's broadcast; rank 0's: 100 float32 from rank 0
	}{
		{"size", callSpec{Broadcast, 200, comm.Float32, comm.Sum, 0}},
		{"root", callSpec{Broadcast, 100, comm.Float32, comm.Sum, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newGroup(t, 2, HostStaged, Options{Chunk: 256 << 10, Slots: 2})
			mine := [2]callSpec{{Broadcast, 100, comm.Float32, comm.Sum, 0}, tc.other}
			rootDone := make(chan struct{})
			errs := g.run(func(r int, c *Communicator) error {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				if r == 1 {
					<-rootDone // rank 0 has finished its broadcast
					time.Sleep(50 * time.Millisecond)
				}
				err := mine[r].run(ctx, t, c, g.devs[r], 2)
				if r == 0 {
					close(rootDone)
				}
				if err != nil {
					return err
				}
				return c.Barrier(ctx)
			})
			var me *MismatchError
			require.ErrorAs(t, errs[1], &me, "the late rank compares with the root's broadcast")
			require.ErrorIs(t, errs[0], comm.ErrMismatch, "the root fails at its barrier")
		})
	}
}
