package comm

import (
	"fmt"
	"testing"
)

// BenchmarkReduceHost measures the CPU reduction: go test -bench ReduceHost ./comm
// (bytes/s counts the output; the input read is srcs times that).
func BenchmarkReduceHost(b *testing.B) {
	const n = 32 << 20
	for _, dt := range []DType{Float32, BFloat16, Float16} {
		for _, srcs := range []int{2, 7} {
			for _, workers := range []int{1, 2} {
				b.Run(fmt.Sprintf("dt%d/srcs%d/workers%d", dt, srcs, workers), func(b *testing.B) {
					in := make([][]byte, srcs)
					for i := range in {
						in[i] = make([]byte, n)
					}
					dst := make([]byte, n)
					for _, s := range append(in, dst) {
						for i := range s {
							s[i] = byte(i)
						}
					}
					b.SetBytes(n)
					b.ResetTimer()
					for range b.N {
						if err := ReduceHost(dst, in, dt, Sum, workers); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		}
	}
	for _, stream := range []bool{false, true} {
		// The result stored plainly or past the cache (NonTemporal).
		for _, k := range []int{2, 7} {
			b.Run(fmt.Sprintf("f32/srcs%d/workers2/stream=%v", k, stream), func(b *testing.B) {
				in := make([][]byte, k)
				for i := range in {
					in[i] = make([]byte, n)
				}
				dst := make([]byte, n)
				b.SetBytes(n)
				b.ResetTimer()
				for range b.N {
					if err := ReduceHostWith(dst, in, Float32, Sum, ReduceOptions{Workers: 2, NonTemporal: stream}); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
	b.Run("memcpy", func(b *testing.B) {
		src, dst := make([]byte, n), make([]byte, n)
		copy(dst, src)
		b.SetBytes(n)
		b.ResetTimer()
		for range b.N {
			copy(dst, src)
		}
	})
}
