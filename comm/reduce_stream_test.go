package comm

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestStreamStoresSameBytes: with non-temporal stores the reductions (every dtype
// and op, sizes around the block and line sizes, destinations aligned and
// not, in place, several workers) write exactly the bytes of plain stores,
// and leave the bytes around dst alone.
func TestStreamStoresSameBytes(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, dt := range []DType{Float32, Float16, BFloat16, Float64, Int32, Int64, Uint8} {
		for _, op := range []Op{Sum, Avg, Min, Max} {
			for _, n := range []int{blockBytes, blockBytes + 64, 3*blockBytes + 40, 200 << 10} {
				n -= n % dt.Size()
				for _, off := range []int{0, 8, 24} {
					for _, inPlace := range []bool{false, true} {
						name := fmt.Sprintf("dt%d/op%d/n%d/off%d/inplace=%v", dt, op, n, off, inPlace)
						srcs := make([][]byte, 1+rng.IntN(7))
						for i := range srcs {
							srcs[i] = make([]byte, n)
							for j := range srcs[i] {
								srcs[i][j] = byte(rng.IntN(256))
							}
						}
						run := func(stream bool) []byte {
							mem := make([]byte, n+off+64)
							for i := range mem {
								mem[i] = 0xee
							}
							dst := mem[off : off+n]
							in := append([][]byte(nil), srcs...)
							if inPlace {
								copy(dst, srcs[0])
								in[0] = dst
							}
							require.NoError(t, ReduceHostWith(dst, in, dt, op, ReduceOptions{Workers: 1 + rng.IntN(3), NonTemporal: stream}), name)
							return mem
						}
						plain, stream := run(false), run(true)
						require.Equal(t, plain, stream, name)
					}
				}
			}
		}
	}
}

// TestNonTemporalFor: results that copy engines read next are stored
// non-temporally, those the CPU reads next plainly, unless
// MIGCTL_STREAM_STORES (read at start: here its two variables) says
// otherwise; ReduceHost follows only the "1".
func TestNonTemporalFor(t *testing.T) {
	defer func(on, off bool) { StreamStores, streamStoresOff = on, off }(StreamStores, streamStoresOff)
	for _, tc := range []struct {
		name     string
		on, off  bool
		dma, cpu bool // NonTemporalFor(true), NonTemporalFor(false)
	}{
		{"unset", false, false, true, false},
		{"1", true, false, true, true},
		{"0", false, true, false, false},
	} {
		StreamStores, streamStoresOff = tc.on, tc.off
		require.Equal(t, tc.dma, NonTemporalFor(true), tc.name)
		require.Equal(t, tc.cpu, NonTemporalFor(false), tc.name)
	}
}

// TestReadsByDMA: the host device's copies are the CPU's; a CUDA device's
// (the fake driver's here) are copy engines'.
func TestReadsByDMA(t *testing.T) {
	require.False(t, ReadsByDMA(NewHostDevice(HostOptions{})))
	require.True(t, ReadsByDMA(&CUDADevice{}))
}
