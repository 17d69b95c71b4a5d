package nccl

import (
	"encoding/binary"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// ranks runs body on n ranks of one communicator of the fake, each with its
// own Fake and HostMemory (as separate processes would have), and returns
// their errors.
func ranks(t *testing.T, n int, body func(f *Fake, mem *HostMemory, c Comm, rank int) error) []error {
	t.Helper()
	root := NewFake(NewHostMemory())
	id, err := root.GetUniqueID()
	require.NoError(t, err)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mem := NewHostMemory()
			f := NewFake(mem)
			c, err := f.CommInitRank(n, id, r)
			if err != nil {
				errs[r] = err
				return
			}
			errs[r] = body(f, mem, c, r)
			if err := f.CommDestroy(c); err != nil && errs[r] == nil {
				errs[r] = err
			}
		}()
	}
	wg.Wait()
	return errs
}

func f32(b []byte) []float32 {
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

func f32bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

func TestFakeCollectives(t *testing.T) {
	const n, count = 3, 5
	in := func(r, i int) float32 { return float32((r+1)*100 + i) }
	tests := []struct {
		desc    string
		inPlace bool
		run     func(f *Fake, mem *HostMemory, c Comm, r int) ([]float32, error)
		want    func(r int) []float32
	}{
		{desc: "all-reduce sum", run: func(f *Fake, mem *HostMemory, c Comm, r int) ([]float32, error) {
			s, rv := vec(r, count, in), make([]byte, 4*count)
			err := f.AllReduce(mem.Register(s), mem.Register(rv), count, Float32, Sum, c, 0)
			return f32(rv), err
		}, want: func(int) []float32 { return fill(count, func(i int) float32 { return in(0, i) + in(1, i) + in(2, i) }) }},
		{desc: "all-reduce avg in place", run: func(f *Fake, mem *HostMemory, c Comm, r int) ([]float32, error) {
			s := vec(r, count, in)
			p := mem.Register(s)
			err := f.AllReduce(p, p, count, Float32, Avg, c, 0)
			return f32(s), err
		}, want: func(int) []float32 {
			return fill(count, func(i int) float32 { return (in(0, i) + in(1, i) + in(2, i)) / 3 })
		}},
		{desc: "all-reduce max", run: func(f *Fake, mem *HostMemory, c Comm, r int) ([]float32, error) {
			s, rv := vec(r, count, in), make([]byte, 4*count)
			err := f.AllReduce(mem.Register(s), mem.Register(rv), count, Float32, Max, c, 0)
			return f32(rv), err
		}, want: func(int) []float32 { return fill(count, func(i int) float32 { return in(2, i) }) }},
		{desc: "all-gather in place", run: func(f *Fake, mem *HostMemory, c Comm, r int) ([]float32, error) {
			all := make([]byte, 4*count*n)
			copy(all[4*count*r:], vec(r, count, in))
			p := mem.Register(all)
			err := f.AllGather(p+uintptr(4*count*r), p, count, Float32, c, 0)
			return f32(all), err
		}, want: func(int) []float32 {
			return fill(count*n, func(i int) float32 { return in(i/count, i%count) })
		}},
		{desc: "reduce-scatter", run: func(f *Fake, mem *HostMemory, c Comm, r int) ([]float32, error) {
			s, rv := vec(r, count*n, in), make([]byte, 4*count)
			err := f.ReduceScatter(mem.Register(s), mem.Register(rv), count, Float32, Sum, c, 0)
			return f32(rv), err
		}, want: func(r int) []float32 {
			return fill(count, func(i int) float32 { return in(0, r*count+i) + in(1, r*count+i) + in(2, r*count+i) })
		}},
		{desc: "broadcast from rank 1", run: func(f *Fake, mem *HostMemory, c Comm, r int) ([]float32, error) {
			s := vec(r, count, in)
			p := mem.Register(s)
			err := f.Broadcast(p, p, count, Float32, 1, c, 0)
			return f32(s), err
		}, want: func(int) []float32 { return fill(count, func(i int) float32 { return in(1, i) }) }},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			got := make([][]float32, n)
			errs := ranks(t, n, func(f *Fake, mem *HostMemory, c Comm, r int) error {
				var err error
				got[r], err = tc.run(f, mem, c, r)
				return err
			})
			for r := range n {
				require.NoError(t, errs[r], "rank %d", r)
				require.Equal(t, tc.want(r), got[r], "rank %d", r)
			}
		})
	}
}

func vec(r, count int, in func(r, i int) float32) []byte {
	return f32bytes(fill(count, func(i int) float32 { return in(r, i) }))
}

func fill(n int, f func(i int) float32) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = f(i)
	}
	return v
}

func TestFakeDataTypes(t *testing.T) {
	tests := []struct {
		dt   DataType
		put  func(b []byte, v float64)
		get  func(b []byte) float64
		a, b float64 // the two ranks' values
	}{
		{Int8, func(b []byte, v float64) { b[0] = byte(int8(v)) }, func(b []byte) float64 { return float64(int8(b[0])) }, -3, 7},
		{Uint8, func(b []byte, v float64) { b[0] = byte(v) }, func(b []byte) float64 { return float64(b[0]) }, 3, 7},
		{Int32, func(b []byte, v float64) { binary.LittleEndian.PutUint32(b, uint32(int32(v))) },
			func(b []byte) float64 { return float64(int32(binary.LittleEndian.Uint32(b))) }, -100000, 7},
		{Int64, func(b []byte, v float64) { binary.LittleEndian.PutUint64(b, uint64(int64(v))) },
			func(b []byte) float64 { return float64(int64(binary.LittleEndian.Uint64(b))) }, -1 << 40, 9},
		{Float64, func(b []byte, v float64) { binary.LittleEndian.PutUint64(b, math.Float64bits(v)) },
			func(b []byte) float64 { return math.Float64frombits(binary.LittleEndian.Uint64(b)) }, 1.5, -0.25},
		{Float16, func(b []byte, v float64) { binary.LittleEndian.PutUint16(b, toHalf(float32(v), Float16)) },
			func(b []byte) float64 { return float64(half(binary.LittleEndian.Uint16(b), Float16)) }, 1.5, 2.25},
		{BFloat16, func(b []byte, v float64) { binary.LittleEndian.PutUint16(b, toHalf(float32(v), BFloat16)) },
			func(b []byte) float64 { return float64(half(binary.LittleEndian.Uint16(b), BFloat16)) }, -3, 0.5},
	}
	for _, tc := range tests {
		for _, op := range []RedOp{Sum, Prod, Min, Max} {
			t.Run(fmt.Sprintf("%v %v", tc.dt, op), func(t *testing.T) {
				got := make([]float64, 2)
				errs := ranks(t, 2, func(f *Fake, mem *HostMemory, c Comm, r int) error {
					b := make([]byte, tc.dt.Size())
					tc.put(b, []float64{tc.a, tc.b}[r])
					p := mem.Register(b)
					err := f.AllReduce(p, p, 1, tc.dt, op, c, 0)
					got[r] = tc.get(b)
					return err
				})
				want := map[RedOp]float64{Sum: tc.a + tc.b, Prod: tc.a * tc.b, Min: min(tc.a, tc.b), Max: max(tc.a, tc.b)}[op]
				for r := range 2 {
					require.NoError(t, errs[r])
					require.Equal(t, want, got[r], "rank %d", r)
				}
			})
		}
	}
}

func TestHalfConversions(t *testing.T) {
	for _, v := range []float32{0, 1, -2, 0.5, 65504, 6.103515625e-05, 5.960464477539063e-08, 1000.5} {
		require.Equal(t, v, half(toHalf(v, Float16), Float16), "%v", v)
	}
	require.Equal(t, uint16(0x7c00), toHalf(1e6, Float16))
	require.Equal(t, float32(3), half(toHalf(3, BFloat16), BFloat16))
}

func TestFakeMismatchedCollectivesFailEveryRank(t *testing.T) {
	errs := ranks(t, 2, func(f *Fake, mem *HostMemory, c Comm, r int) error {
		b := make([]byte, 16)
		p := mem.Register(b)
		return f.AllReduce(p, p, 2+r, Float32, Sum, c, 0) // counts 2 and 3
	})
	for r := range 2 {
		require.ErrorIs(t, errs[r], ErrInvalidUsage)
		require.ErrorContains(t, errs[r], "rank 1 issued ncclAllReduce(count 3")
	}
}

func TestFakeAbortFailsThePeers(t *testing.T) {
	errs := ranks(t, 3, func(f *Fake, mem *HostMemory, c Comm, r int) error {
		if r == 2 {
			if err := f.CommAbort(c); err != nil {
				return err
			}
			_, err := f.comm(c)
			require.ErrorIs(t, err, ErrInvalidArgument) // gone
			return nil
		}
		b := make([]byte, 8)
		p := mem.Register(b)
		err := f.AllReduce(p, p, 2, Float32, Sum, c, 0)
		require.ErrorIs(t, f.CommGetAsyncError(c), ErrRemote)
		require.Contains(t, f.GetLastError(c), "rank 2 left")
		return err
	})
	require.ErrorIs(t, errs[0], ErrRemote)
	require.ErrorIs(t, errs[1], ErrRemote)
	require.ErrorIs(t, errs[2], ErrInvalidArgument) // its CommDestroy after abort: no such comm
}

func TestFakeInitErrors(t *testing.T) {
	f := NewFake(NewHostMemory())
	f.SetInitTimeout(300 * time.Millisecond)
	_, err := f.CommInitRank(2, UniqueID{}, 0)
	require.ErrorIs(t, err, ErrInvalidArgument)
	_, err = f.CommInitRank(2, UniqueID{}, 2)
	require.ErrorIs(t, err, ErrInvalidArgument)

	id, err := f.GetUniqueID()
	require.NoError(t, err)
	start := time.Now()
	_, err = f.CommInitRank(2, id, 0) // rank 1 never comes
	require.Error(t, err)
	require.ErrorContains(t, err, "only 1 of 2 ranks joined")
	require.Less(t, time.Since(start), 5*time.Second)
}

func TestFakeUnregisteredBuffer(t *testing.T) {
	errs := ranks(t, 1, func(f *Fake, mem *HostMemory, c Comm, r int) error {
		return f.AllReduce(0x1234, 0x1234, 1, Float32, Sum, c, 0)
	})
	require.ErrorIs(t, errs[0], ErrInvalidArgument)
	require.ErrorContains(t, errs[0], "not in registered memory")
}

func TestResults(t *testing.T) {
	require.Equal(t, "nccl: remote process exited or there was a network error (ncclRemoteError)", ErrRemote.Error())
	require.Equal(t, "ncclResult(42)", Result(42).Name())
	require.NoError(t, resultError(0))
	err := detailed("ncclAllReduce", resultError(2), "socket closed")
	require.ErrorIs(t, err, ErrSystem)
	require.Equal(t, "ncclAllReduce: nccl: unhandled system error (ncclSystemError): socket closed", err.Error())
	a, b, c := Version(22105)
	require.Equal(t, []int{2, 21, 5}, []int{a, b, c})
	require.Equal(t, "2.8.4", VersionString(2804))
}
