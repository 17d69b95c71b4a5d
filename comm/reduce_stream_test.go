package comm

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestStreamStoresSameBytes: with StreamStores the reductions (every dtype
// and op, sizes around the block and line sizes, destinations aligned and
// not, in place, several workers) write exactly the bytes of plain stores,
// and leave the bytes around dst alone.
func TestStreamStoresSameBytes(t *testing.T) {
	defer func(old bool) { StreamStores = old }(StreamStores)
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
							StreamStores = stream
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
							require.NoError(t, ReduceHost(dst, in, dt, op, 1+rng.IntN(3)), name)
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
