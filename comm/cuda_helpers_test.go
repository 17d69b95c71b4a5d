package comm_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/comm"
)

var allDTypes = []comm.DType{comm.Float32, comm.Float16, comm.BFloat16, comm.Float64, comm.Int32, comm.Int64, comm.Uint8}

var dtypeNames = map[comm.DType]string{
	comm.Float32: "f32", comm.Float16: "f16", comm.BFloat16: "bf16", comm.Float64: "f64",
	comm.Int32: "i32", comm.Int64: "i64", comm.Uint8: "u8",
}

var opNames = map[comm.Op]string{comm.Sum: "sum", comm.Avg: "avg", comm.Min: "min", comm.Max: "max"}

// mmapArena returns n bytes of anonymous mapped memory (page aligned, not Go
// heap: what a shared-memory segment looks like), unmapped at cleanup.
func mmapArena(t testing.TB, n int) []byte {
	t.Helper()
	b, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	require.NoError(t, err)
	t.Cleanup(func() { _ = syscall.Munmap(b) })
	return b
}

func isFloat(dt comm.DType) bool {
	return dt == comm.Float32 || dt == comm.Float16 || dt == comm.BFloat16 || dt == comm.Float64
}

// value j at index i: small integers, exactly representable in every type.
func value(dt comm.DType, j, i int) int64 {
	v := int64((i*7+j*13+3)%61) - 30
	if dt == comm.Uint8 {
		v += 30
	}
	return v
}

// put stores integer value v (or float f for floating types) at element i.
func put(dt comm.DType, b []byte, i int, v float64) {
	switch dt {
	case comm.Float32:
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(v)))
	case comm.Float64:
		binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(v))
	case comm.Float16:
		binary.LittleEndian.PutUint16(b[2*i:], comm.Float16Bits(float32(v)))
	case comm.BFloat16:
		binary.LittleEndian.PutUint16(b[2*i:], comm.BFloat16Bits(float32(v)))
	case comm.Int32:
		binary.LittleEndian.PutUint32(b[4*i:], uint32(int64(v)))
	case comm.Int64:
		binary.LittleEndian.PutUint64(b[8*i:], uint64(int64(v)))
	case comm.Uint8:
		b[i] = byte(int64(v))
	}
}

// putInt stores an integer with wrap-around (two's complement) semantics.
func putInt(dt comm.DType, b []byte, i int, v int64) {
	switch dt {
	case comm.Int32:
		binary.LittleEndian.PutUint32(b[4*i:], uint32(v))
	case comm.Int64:
		binary.LittleEndian.PutUint64(b[8*i:], uint64(v))
	case comm.Uint8:
		b[i] = byte(v)
	default:
		put(dt, b, i, float64(v))
	}
}

func get(dt comm.DType, b []byte, i int) float64 {
	switch dt {
	case comm.Float32:
		return float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])))
	case comm.Float64:
		return math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
	case comm.Float16:
		return float64(comm.Float16FromBits(binary.LittleEndian.Uint16(b[2*i:])))
	case comm.BFloat16:
		return float64(comm.BFloat16FromBits(binary.LittleEndian.Uint16(b[2*i:])))
	case comm.Int32:
		return float64(int32(binary.LittleEndian.Uint32(b[4*i:])))
	case comm.Int64:
		return float64(int64(binary.LittleEndian.Uint64(b[8*i:])))
	case comm.Uint8:
		return float64(b[i])
	}
	panic("dtype")
}

func getInt(dt comm.DType, b []byte, i int) int64 {
	switch dt {
	case comm.Int32:
		return int64(int32(binary.LittleEndian.Uint32(b[4*i:])))
	case comm.Int64:
		return int64(binary.LittleEndian.Uint64(b[8*i:]))
	case comm.Uint8:
		return int64(b[i])
	}
	return int64(get(dt, b, i))
}

// expect is the reference result of dst = op(init, srcs...) (then /(k+1) for
// Avg), written independently of the kernels: exact integer arithmetic for
// the small inputs, one rounding to the element type at the end.
func expect(dt comm.DType, op comm.Op, init []byte, srcs [][]byte) []byte {
	es := dt.Size()
	n := len(init) / es
	out := make([]byte, len(init))
	for i := 0; i < n; i++ {
		acc := getInt(dt, init, i)
		for _, s := range srcs {
			v := getInt(dt, s, i)
			switch op {
			case comm.Sum, comm.Avg:
				acc += v
			case comm.Min:
				acc = min(acc, v)
			case comm.Max:
				acc = max(acc, v)
			}
		}
		if op == comm.Avg {
			// The sum is stored in the element type first (wrapping integers,
			// rounding floats), then divided: truncating for integers, one
			// rounding for floats.
			div := int64(len(srcs) + 1)
			var tmp [8]byte
			putInt(dt, tmp[:], 0, acc)
			switch {
			case dt == comm.Float64:
				put(dt, out, i, get(dt, tmp[:], 0)/float64(div))
			case isFloat(dt):
				put(dt, out, i, float64(float32(get(dt, tmp[:], 0))/float32(div)))
			default:
				putInt(dt, out, i, getInt(dt, tmp[:], 0)/div)
			}
			continue
		}
		putInt(dt, out, i, acc)
	}
	return out
}

// countWrong compares element by element and describes the first mismatch.
func countWrong(dt comm.DType, got, want []byte) (int, string) {
	es := dt.Size()
	wrong, first := 0, ""
	for i := 0; i < len(want)/es; i++ {
		if string(got[i*es:(i+1)*es]) != string(want[i*es:(i+1)*es]) {
			if wrong == 0 {
				first = fmt.Sprintf("element %d: got %v want %v", i, get(dt, got, i), get(dt, want, i))
			}
			wrong++
		}
	}
	return wrong, first
}

// reduceCase is one ReduceFromHost (+ Scale for Avg) check.
type reduceCase struct {
	dt      comm.DType
	op      comm.Op
	k       int  // sources
	n       int  // elements
	shifted bool // dst and sources one element off 16-byte alignment
}

func (c reduceCase) String() string {
	al := "aligned"
	if c.shifted {
		al = "shifted"
	}
	return fmt.Sprintf("%s/%s/k=%d/n=%d/%s", dtypeNames[c.dt], opNames[c.op], c.k, c.n, al)
}

// runReduceCases runs every case on dev with sources carved from one
// registered arena and checks every element against expect.
func runReduceCases(t *testing.T, dev comm.Device, cases []reduceCase, timeout time.Duration) {
	t.Helper()
	runReduceCasesVia(t, dev, cases, timeout, false)
}

// runReduceCasesVia is runReduceCases through ReduceFromHostStaged when
// staged (the device's streams must be comm.StagingReducers).
func runReduceCasesVia(t *testing.T, dev comm.Device, cases []reduceCase, timeout time.Duration, staged bool) {
	t.Helper()
	maxBytes := 0
	for _, c := range cases {
		maxBytes = max(maxBytes, (c.n+1)*c.dt.Size())
	}
	slot := (maxBytes + 4095) &^ 4095
	const slots = 14 // up to 12 sources, init, out
	arena := mmapArena(t, slots*slot)
	require.NoError(t, dev.Register(arena))
	t.Cleanup(func() { require.NoError(t, dev.Unregister(arena)) })
	dst, err := dev.Alloc(maxBytes + 64)
	require.NoError(t, err)
	st, err := dev.NewStream()
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, st.Close()) })

	for _, c := range cases {
		t.Run(c.String(), func(t *testing.T) {
			es := c.dt.Size()
			shift := 0
			if c.shifted {
				shift = es
			}
			nb := c.n * es
			region := func(s int) []byte { return arena[s*slot+shift : s*slot+shift+nb] }
			srcs := make([][]byte, c.k)
			for j := range srcs {
				srcs[j] = region(j)
				for i := 0; i < c.n; i++ {
					putInt(c.dt, srcs[j], i, value(c.dt, j+1, i))
				}
			}
			init, out := region(12), region(13)
			for i := 0; i < c.n; i++ {
				putInt(c.dt, init, i, value(c.dt, 0, i))
			}
			clear(out)
			dstOff := shift // 0 or one element: misaligned like the sources
			require.NoError(t, st.CopyFromHost(dst, dstOff, init))
			reduce := st.ReduceFromHost
			if staged {
				sr, ok := st.(comm.StagingReducer)
				require.True(t, ok, "%T is no comm.StagingReducer", st)
				reduce = sr.ReduceFromHostStaged
			}
			require.NoError(t, reduce(dst, dstOff, srcs, c.dt, c.op))
			if c.op == comm.Avg {
				require.NoError(t, st.Scale(dst, dstOff, nb, c.dt, c.k+1))
			}
			require.NoError(t, st.CopyToHost(out, dst, dstOff))
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			require.NoError(t, st.Synchronize(ctx))
			wrong, first := countWrong(c.dt, out, expect(c.dt, c.op, init, srcs))
			require.Zerof(t, wrong, "%d of %d elements wrong; first: %s", wrong, c.n, first)
		})
	}
}

// reduceMatrix is every dtype × op × source count, at the given sizes.
func reduceMatrix(ns []int, ks []int) []reduceCase {
	var cases []reduceCase
	for _, dt := range allDTypes {
		for _, op := range []comm.Op{comm.Sum, comm.Avg, comm.Min, comm.Max} {
			for _, k := range ks {
				for _, n := range ns {
					for _, shifted := range []bool{false, true} {
						cases = append(cases, reduceCase{dt: dt, op: op, k: k, n: n, shifted: shifted})
					}
				}
			}
		}
	}
	return cases
}
