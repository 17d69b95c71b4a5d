package comm

import (
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// The AVX2 float32 sums give bit for bit what the Go loops give (same
// association), for 2..9 sources, lengths that are and are not multiples
// of 8, offsets into the sources, in place, and with infinities and NaNs.
func TestReduceHostSIMDMatchesGo(t *testing.T) {
	if !simdF32 {
		t.Skip("no AVX2 here: the Go loops are the only path")
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, tc := range []struct{ srcs, elems, off int }{
		{2, 8, 0}, {2, 7, 0}, {3, 1001, 4}, {4, 4096, 0}, {5, 4099, 12}, {7, 2048, 0}, {7, 65537, 4}, {9, 333, 8},
	} {
		mk := func() []byte {
			b := make([]byte, tc.off+4*tc.elems)
			f := unsafe.Slice((*float32)(unsafe.Pointer(&b[tc.off])), tc.elems)
			for i := range f {
				f[i] = float32(rng.NormFloat64() * math.Pow(10, float64(rng.IntN(12)-6)))
			}
			return b
		}
		srcs := make([][]byte, tc.srcs)
		for i := range srcs {
			srcs[i] = mk()
		}
		f0 := unsafe.Slice((*float32)(unsafe.Pointer(&srcs[0][tc.off])), tc.elems)
		f0[0], f0[tc.elems-1] = float32(math.Inf(1)), float32(math.NaN())
		for _, op := range []Op{Sum, Avg} {
			run := func(simd bool) []byte {
				simdF32 = simd
				defer func() { simdF32 = true }()
				dst := make([]byte, 4*tc.elems)
				in := make([][]byte, len(srcs))
				for i, s := range srcs {
					in[i] = s[tc.off:]
				}
				require.NoError(t, ReduceHost(dst, in, Float32, op, 1))
				return dst
			}
			want, got := run(false), run(true)
			wf := unsafe.Slice((*float32)(unsafe.Pointer(&want[0])), tc.elems)
			gf := unsafe.Slice((*float32)(unsafe.Pointer(&got[0])), tc.elems)
			for i := range wf {
				if math.IsNaN(float64(wf[i])) {
					require.True(t, math.IsNaN(float64(gf[i])), "%+v op %d element %d", tc, op, i)
					continue
				}
				require.Equal(t, math.Float32bits(wf[i]), math.Float32bits(gf[i]), "%+v op %d element %d", tc, op, i)
			}
		}
		// in place: the destination is the first source
		in := make([][]byte, len(srcs))
		ref := make([][]byte, len(srcs))
		for i, s := range srcs {
			in[i] = append([]byte(nil), s[tc.off:]...)
			ref[i] = s[tc.off:]
		}
		simdF32 = false
		want := make([]byte, 4*tc.elems)
		require.NoError(t, ReduceHost(want, ref, Float32, Sum, 1))
		simdF32 = true
		require.NoError(t, ReduceHost(in[0], in, Float32, Sum, 1))
		for i := 0; i < len(want); i += 4 {
			if i == len(want)-4 {
				continue // the NaN
			}
			require.Equal(t, want[i:i+4], in[0][i:i+4], "%+v in place, byte %d", tc, i)
		}
	}
}
