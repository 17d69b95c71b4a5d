package comm

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestHalfConversionsRoundTrip(t *testing.T) {
	for h := range 1 << 16 {
		f := f16to32(uint16(h))
		if f != f { // NaN: stays a NaN
			require.True(t, f16to32(f32to16(f)) != f16to32(f32to16(f)))
			continue
		}
		require.Equal(t, uint16(h), f32to16(f), "float16 %#04x", h)
		b := BFloat16FromBits(uint16(h))
		if b == b {
			require.Equal(t, uint16(h), BFloat16Bits(b), "bfloat16 %#04x", h)
		}
	}
	tests := []struct {
		desc string
		in   float32
		f16  uint16
		bf16 uint16
	}{
		{"one", 1, 0x3c00, 0x3f80},
		{"ties to even down", 1 + 1.0/2048, 0x3c00, 0x3f80},
		{"ties to even up", 1 + 3.0/2048, 0x3c02, 0x3f80},
		{"overflow to inf", 70000, 0x7c00, 0x4789},
		{"smallest subnormal", float32(math.Ldexp(1, -24)), 0x0001, 0x3380},
		{"underflow to zero", float32(math.Ldexp(1, -26)), 0x0000, 0x3280},
		{"negative", -2.5, 0xc100, 0xc020},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			require.Equal(t, tc.f16, f32to16(tc.in))
			require.Equal(t, tc.bf16, f32toBF16(tc.in))
		})
	}
}

// reference reduces element by element in the most obvious way: float64 for
// wide types, a float32 accumulator for the 16-bit floats, wrapping integers.
func reference(dt DType, op Op, srcs [][]byte) []byte {
	es := dt.Size()
	n := len(srcs[0]) / es
	out := make([]byte, len(srcs[0]))
	for i := range n {
		get := func(s []byte) float64 {
			b := s[i*es:]
			switch dt {
			case Float32:
				return float64(math.Float32frombits(binary.LittleEndian.Uint32(b)))
			case Float64:
				return math.Float64frombits(binary.LittleEndian.Uint64(b))
			case Float16:
				return float64(f16to32(binary.LittleEndian.Uint16(b)))
			case BFloat16:
				return float64(BFloat16FromBits(binary.LittleEndian.Uint16(b)))
			case Int32:
				return float64(int32(binary.LittleEndian.Uint32(b)))
			case Int64:
				return float64(int64(binary.LittleEndian.Uint64(b)))
			default:
				return float64(b[0])
			}
		}
		acc := get(srcs[0])
		for _, s := range srcs[1:] {
			x := get(s)
			switch op {
			case Min:
				acc = math.Min(acc, x)
			case Max:
				acc = math.Max(acc, x)
			default:
				if dt == Float32 || dt == Float16 || dt == BFloat16 {
					acc = float64(float32(acc) + float32(x))
				} else {
					acc += x
				}
			}
		}
		if op == Avg {
			switch dt {
			case Int32, Int64, Uint8:
				acc = math.Trunc(acc / float64(len(srcs)))
			case Float64:
				acc /= float64(len(srcs))
			default:
				acc = float64(float32(acc) / float32(len(srcs)))
			}
		}
		b := out[i*es:]
		switch dt {
		case Float32:
			binary.LittleEndian.PutUint32(b, math.Float32bits(float32(acc)))
		case Float64:
			binary.LittleEndian.PutUint64(b, math.Float64bits(acc))
		case Float16:
			binary.LittleEndian.PutUint16(b, f32to16(float32(acc)))
		case BFloat16:
			binary.LittleEndian.PutUint16(b, f32toBF16(float32(acc)))
		case Int32:
			binary.LittleEndian.PutUint32(b, uint32(int32(int64(acc))))
		case Int64:
			binary.LittleEndian.PutUint64(b, uint64(int64(acc)))
		default:
			b[0] = byte(int64(acc))
		}
	}
	return out
}

// randomInputs makes n elements per source: small integers for the integer
// types (so float64 references are exact), values of mixed sign and
// magnitude for the floats, exactly summable within float32 for ordering.
func randomInputs(rng *rand.Rand, dt DType, k, n int) [][]byte {
	srcs := make([][]byte, k)
	for j := range srcs {
		s := make([]byte, n*dt.Size())
		for i := range n {
			v := float64(rng.IntN(2001)-1000) / 8
			b := s[i*dt.Size():]
			switch dt {
			case Float32:
				binary.LittleEndian.PutUint32(b, math.Float32bits(float32(v)))
			case Float64:
				binary.LittleEndian.PutUint64(b, math.Float64bits(v*1024))
			case Float16:
				binary.LittleEndian.PutUint16(b, f32to16(float32(v)))
			case BFloat16:
				binary.LittleEndian.PutUint16(b, f32toBF16(float32(v)))
			case Int32:
				binary.LittleEndian.PutUint32(b, uint32(int32(rng.IntN(1<<20)-1<<19)))
			case Int64:
				binary.LittleEndian.PutUint64(b, uint64(int64(rng.IntN(1<<40)-1<<39)))
			default:
				b[0] = byte(rng.IntN(256))
			}
		}
		srcs[j] = s
	}
	return srcs
}

func TestReduceHostMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, dt := range []DType{Float32, Float16, BFloat16, Float64, Int32, Int64, Uint8} {
		for _, op := range []Op{Sum, Avg, Min, Max} {
			for _, k := range []int{1, 2, 4, 5, 7} {
				n := 1 + rng.IntN(80000)
				t.Run(fmt.Sprintf("dt%d/op%d/srcs%d/n%d", dt, op, k, n), func(t *testing.T) {
					srcs := randomInputs(rng, dt, k, n)
					want := reference(dt, op, srcs)
					for _, workers := range []int{1, 3} {
						dst := make([]byte, len(want))
						require.NoError(t, ReduceHost(dst, srcs, dt, op, workers))
						require.Equal(t, want, dst, "workers %d", workers)
					}
					// In place: the destination is the first source.
					first := append([]byte(nil), srcs[0]...)
					in := append([][]byte{first}, srcs[1:]...)
					require.NoError(t, ReduceHost(first, in, dt, op, 2))
					require.Equal(t, want, first, "in place")
				})
			}
		}
	}
}

func TestFastFloat16MatchesSlow(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	for range 2000000 {
		f := math.Float32frombits(rng.Uint32())
		if f != f {
			continue
		}
		require.Equal(t, f32to16(f), f32to16Fast(f), "%g (%#08x)", f, math.Float32bits(f))
	}
	for _, f := range []float32{65504, 65519.99, 65520, float32(math.Ldexp(1, -14)), float32(math.Ldexp(1, -15)), 0, -0} {
		require.Equal(t, f32to16(f), f32to16Fast(f), "%g", f)
	}
}

func TestReduceHostRejects(t *testing.T) {
	b := make([]byte, 8)
	require.ErrorIs(t, ReduceHost(b, nil, Float32, Sum, 1), ErrInvalid)
	require.ErrorIs(t, ReduceHost(b[:6], [][]byte{b}, Float32, Sum, 1), ErrInvalid)
	require.ErrorIs(t, ReduceHost(b, [][]byte{b[:4]}, Float32, Sum, 1), ErrInvalid)
	require.ErrorIs(t, ReduceHost(b, [][]byte{b}, Float32, Op(9), 1), ErrInvalid)
	require.ErrorIs(t, ScaleHost(b, Float32, 0), ErrInvalid)
}
