package comm

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"strings"
	"sync"
	"unsafe"
)

// ReduceHost computes dst = op(srcs[0], srcs[1], ...) elementwise on host
// memory, with Avg dividing the sum by len(srcs) (integers truncate toward
// zero). dst may alias srcs[0] exactly (accumulate in place) but must not
// partially overlap any src. Every src must be at least len(dst) bytes long
// and len(dst) a multiple of dt.Size(). Work above a few hundred KiB is split
// over up to workers goroutines (workers <= 0 means GOMAXPROCS). ReduceHost
// blocks until done and is safe for concurrent use on disjoint memory.
func ReduceHost(dst []byte, srcs [][]byte, dt DType, op Op, workers int) error {
	return reduceHost(dst, srcs, dt, op, avgDiv(op, len(srcs)), ReduceOptions{Workers: workers, NonTemporal: StreamStores})
}

// ReduceOptions tune one host reduction.
type ReduceOptions struct {
	// Workers bounds the goroutines (<= 0: GOMAXPROCS).
	Workers int
	// NonTemporal stores the results of outputs of a block or more with
	// non-temporal stores (see NonTemporalFor). Same bits either way.
	NonTemporal bool
}

// ReduceHostWith is ReduceHost with every option explicit.
func ReduceHostWith(dst []byte, srcs [][]byte, dt DType, op Op, o ReduceOptions) error {
	return reduceHost(dst, srcs, dt, op, avgDiv(op, len(srcs)), o)
}

// ScaleHost divides every element of dst by div (integers truncate).
func ScaleHost(dst []byte, dt DType, div int) error {
	if div <= 0 {
		return fmt.Errorf("scaling by %d: %w", div, ErrInvalid)
	}
	return reduceHost(dst, [][]byte{dst}, dt, Sum, div, ReduceOptions{Workers: 1})
}

func avgDiv(op Op, n int) int {
	if op == Avg {
		return n
	}
	return 1
}

// minParallelBytes is the output size below which a reduction runs on the
// calling goroutine: below it, waking goroutines costs more than it saves.
const minParallelBytes = 64 << 10

// blockBytes is the output block reduced source by source while it stays in
// L1/L2: one pass over memory whatever the number of sources.
const blockBytes = 16 << 10

func reduceHost(dst []byte, srcs [][]byte, dt DType, op Op, div int, o ReduceOptions) error {
	if len(srcs) == 0 {
		return fmt.Errorf("reducing into %d bytes with no sources: %w", len(dst), ErrInvalid)
	}
	es := dt.Size()
	if len(dst)%es != 0 {
		return fmt.Errorf("reducing %d bytes of %d-byte elements: %w", len(dst), es, ErrInvalid)
	}
	for i, s := range srcs {
		if len(s) < len(dst) {
			return fmt.Errorf("source %d has %d bytes, want %d: %w", i, len(s), len(dst), ErrInvalid)
		}
	}
	if op < Sum || op > Max {
		return fmt.Errorf("op %d: %w", int(op), ErrInvalid)
	}
	workers := o.Workers
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	n := len(dst)
	if w := n / minParallelBytes; w < workers {
		workers = max(w, 1)
	}
	if workers == 1 {
		reduceRange(dst, srcs, 0, n, dt, op, div, o.NonTemporal)
		return nil
	}
	// Split on 64-byte boundaries so workers never share a cache line.
	per := (n/workers + 63) &^ 63
	var wg sync.WaitGroup
	for lo := 0; lo < n; lo += per {
		hi := min(lo+per, n)
		wg.Add(1)
		go func() {
			defer wg.Done()
			reduceRange(dst, srcs, lo, hi, dt, op, div, o.NonTemporal)
		}()
	}
	wg.Wait()
	return nil
}

// reduceRange reduces bytes [lo, hi) block by block. With nt, each block
// is reduced into a cache-resident scratch block and stored to dst with
// non-temporal stores (same arithmetic, same bits).
func reduceRange(dst []byte, srcs [][]byte, lo, hi int, dt DType, op Op, div int, nt bool) {
	if nt && hi-lo >= blockBytes {
		scratch := scratchPool.Get().(*[blockBytes]byte)
		defer scratchPool.Put(scratch)
		for b := lo; b < hi; b += blockBytes {
			e := min(b+blockBytes, hi)
			s := scratch[:e-b]
			reduceBlock(s, srcs, b, dt, op, div)
			if k := streamCopy(dst[b:e], s); k < len(s) {
				copy(dst[b+k:e], s[k:])
			}
		}
		return
	}
	for b := lo; b < hi; b += blockBytes {
		e := min(b+blockBytes, hi)
		reduceBlock(dst[b:e], srcs, b, dt, op, div)
	}
}

// NonTemporal stores write a result line without reading it from memory
// first (no read-for-ownership): one pass over host memory less per
// reduction, at the cost of the result not being in the cache afterwards.
// That pays where host memory binds and the next reader of the result is
// not the CPU but a copy engine (the gpu backend's copies in), and costs
// where the CPU binds and reads the result next (the host backend).
// Measured:
//   - one H200 host, 256 MiB fp32 all-reduce, host-staged, -c 1, two
//     interleaved pairs in one call (scripts/h200-session.d/small-on-device.sh,
//     2026-12-01): 2 ranks 13.41/13.22 -> 12.81/12.32 ms, 7 ranks
//     44.65/46.47 -> 43.80/43.81 ms (2-7% faster, every pair);
//   - the 2-core dev VM, 32 MiB float32, 2 workers (BenchmarkReduceHost
//     .../stream=): 2 sources 22-25 -> 16 GB/s, 7 sources 7.1-8.6 ->
//     6.0-6.6 GB/s (slower: the CPU binds there).

// StreamStores is MIGCTL_STREAM_STORES: "1" (or true, on) turns
// non-temporal result stores on for every reduction, "0" (false, off) off;
// unset or anything else, NonTemporalFor decides per caller and ReduceHost
// stores plainly. Set before any reduction runs.
var StreamStores = envSwitch("MIGCTL_STREAM_STORES", "1", "true", "on")

var streamStoresOff = envSwitch("MIGCTL_STREAM_STORES", "0", "false", "off")

// envSwitch is whether the environment variable name holds one of values
// (case aside).
func envSwitch(name string, values ...string) bool {
	v := os.Getenv(name)
	for _, w := range values {
		if strings.EqualFold(v, w) {
			return true
		}
	}
	return false
}

// NonTemporalFor is whether reductions whose results copy engines read
// next (dmaReads) should store them non-temporally: yes, unless
// MIGCTL_STREAM_STORES says otherwise.
func NonTemporalFor(dmaReads bool) bool {
	switch {
	case StreamStores:
		return true
	case streamStoresOff:
		return false
	}
	return dmaReads
}

var scratchPool = sync.Pool{New: func() any { return new([blockBytes]byte) }}

func reduceBlock(dst []byte, srcs [][]byte, off int, dt DType, op Op, div int) {
	n := len(dst)
	src := func(i int) []byte { return srcs[i][off : off+n] }
	switch dt {
	case Float32:
		foldDivide[float32](dst, srcs, off, n, op, div)
	case Float64:
		foldDivide[float64](dst, srcs, off, n, op, div)
	case Int32:
		foldDivide[int32](dst, srcs, off, n, op, div)
	case Int64:
		foldDivide[int64](dst, srcs, off, n, op, div)
	case Uint8:
		if op == Avg || div > 1 {
			// Accumulate wide so that avg is exact (a sum wraps mod 256).
			reduceWide(dst, srcs, off, op, div, func(b []byte, i int) float32 { return float32(b[i]) },
				func(b []byte, i int, v float32) { b[i] = byte(uint32(int64(v))) }, 1)
			return
		}
		foldNative(dst, src(0), srcs, off, op)
	case Float16:
		reduceHalf(dst, srcs, off, op, div, false)
	case BFloat16:
		reduceHalf(dst, srcs, off, op, div, true)
	}
}

// foldDivide reduces the block into dst as T and, for div > 1, divides
// every element by div (the last step of an average).
func foldDivide[T ~float32 | ~float64 | ~int32 | ~int64](dst []byte, srcs [][]byte, off, n int, op Op, div int) {
	d := asSlice[T](dst)
	foldNative(d, asSlice[T](srcs[0][off:off+n]), srcs, off, op)
	if div > 1 {
		v := T(div)
		for i := range d {
			d[i] /= v
		}
	}
}

type native interface {
	~float32 | ~float64 | ~int32 | ~int64 | ~uint8
}

// foldNative writes op(first, srcs[1:]...) into d, folding up to four
// sources per pass over the block: fewer loads and stores of d.
func foldNative[T native](d, first []T, srcs [][]byte, off int, op Op) {
	n := len(d)
	es := int(unsafe.Sizeof(d[0]))
	rest := srcs[1:]
	s := func(i int) []T { return asSlice[T](rest[i][off : off+n*es]) }
	switch len(rest) {
	case 0:
		if &d[0] != &first[0] {
			copy(d, first)
		}
		return
	case 1:
		op2(d, first, s(0), op)
		return
	case 2:
		op3(d, first, s(0), s(1), op)
		return
	}
	op4(d, first, s(0), s(1), s(2), op)
	i := 3
	for ; i+2 < len(rest); i += 3 {
		op4(d, d, s(i), s(i+1), s(i+2), op)
	}
	switch len(rest) - i {
	case 2:
		op3(d, d, s(i), s(i+1), op)
	case 1:
		op2(d, d, s(i), op)
	}
}

func op4[T native](d, a, b, c, e []T, op Op) {
	a, b, c, e = a[:len(d)], b[:len(d)], c[:len(d)], e[:len(d)]
	switch op {
	case Sum, Avg:
		i := 0
		if f, ok := any(d).([]float32); ok {
			i = fsum4(f, any(a).([]float32), any(b).([]float32), any(c).([]float32), any(e).([]float32))
		}
		for ; i < len(d); i++ {
			d[i] = (a[i] + b[i]) + (c[i] + e[i])
		}
	case Min:
		for i := range d {
			d[i] = min(a[i], b[i], c[i], e[i])
		}
	case Max:
		for i := range d {
			d[i] = max(a[i], b[i], c[i], e[i])
		}
	}
}

func op2[T native](d, a, b []T, op Op) {
	a, b = a[:len(d)], b[:len(d)]
	switch op {
	case Sum, Avg:
		i := 0
		if f, ok := any(d).([]float32); ok {
			i = fsum2(f, any(a).([]float32), any(b).([]float32))
		}
		for ; i < len(d); i++ {
			d[i] = a[i] + b[i]
		}
	case Min:
		for i := range d {
			d[i] = min(a[i], b[i])
		}
	case Max:
		for i := range d {
			d[i] = max(a[i], b[i])
		}
	}
}

func op3[T native](d, a, b, c []T, op Op) {
	a, b, c = a[:len(d)], b[:len(d)], c[:len(d)]
	switch op {
	case Sum, Avg:
		i := 0
		if f, ok := any(d).([]float32); ok {
			i = fsum3(f, any(a).([]float32), any(b).([]float32), any(c).([]float32))
		}
		for ; i < len(d); i++ {
			d[i] = a[i] + b[i] + c[i]
		}
	case Min:
		for i := range d {
			d[i] = min(a[i], b[i], c[i])
		}
	case Max:
		for i := range d {
			d[i] = max(a[i], b[i], c[i])
		}
	}
}

var f16Table = sync.OnceValue(func() *[1 << 16]float32 {
	var t [1 << 16]float32
	for i := range t {
		t[i] = f16to32(uint16(i))
	}
	return &t
})

// reduceHalf reduces float16 or bfloat16 through a float32 accumulator
// block: one rounding at the end, like the GPU kernels.
func reduceHalf(dst []byte, srcs [][]byte, off int, op Op, div int, bf bool) {
	var accBuf [blockBytes / 2]float32
	n := len(dst) / 2
	acc := accBuf[:n]
	var tab *[1 << 16]float32
	if !bf {
		tab = f16Table()
	}
	// Sums fold two sources per pass: half the loads and stores of acc.
	k0 := 1
	if op == Sum || op == Avg {
		first := asSlice[uint16](srcs[0][off : off+len(dst)])[:n]
		if bf {
			for i := range acc {
				acc[i] = math.Float32frombits(uint32(first[i]) << 16)
			}
		} else {
			for i := range acc {
				acc[i] = tab[first[i]]
			}
		}
		for ; k0+1 < len(srcs); k0 += 2 {
			a := asSlice[uint16](srcs[k0][off : off+len(dst)])[:n]
			b := asSlice[uint16](srcs[k0+1][off : off+len(dst)])[:n]
			if bf {
				for i := range acc {
					acc[i] += math.Float32frombits(uint32(a[i])<<16) + math.Float32frombits(uint32(b[i])<<16)
				}
			} else {
				for i := range acc {
					acc[i] += tab[a[i]] + tab[b[i]]
				}
			}
		}
	} else {
		k0 = 0
	}
	for k := k0; k < len(srcs); k++ {
		h := asSlice[uint16](srcs[k][off : off+len(dst)])[:n]
		switch {
		case k == 0 && bf:
			for i := range acc {
				acc[i] = math.Float32frombits(uint32(h[i]) << 16)
			}
		case k == 0:
			for i := range acc {
				acc[i] = tab[h[i]]
			}
		case bf && (op == Sum || op == Avg):
			for i := range acc {
				acc[i] += math.Float32frombits(uint32(h[i]) << 16)
			}
		case op == Sum || op == Avg:
			for i := range acc {
				acc[i] += tab[h[i]]
			}
		case bf && op == Min:
			for i := range acc {
				acc[i] = min(acc[i], math.Float32frombits(uint32(h[i])<<16))
			}
		case op == Min:
			for i := range acc {
				acc[i] = min(acc[i], tab[h[i]])
			}
		case bf:
			for i := range acc {
				acc[i] = max(acc[i], math.Float32frombits(uint32(h[i])<<16))
			}
		default:
			for i := range acc {
				acc[i] = max(acc[i], tab[h[i]])
			}
		}
	}
	if div > 1 {
		fd := float32(div)
		for i := range acc {
			acc[i] /= fd
		}
	}
	d := asSlice[uint16](dst)[:n]
	if bf {
		for i := range acc {
			d[i] = f32toBF16(acc[i])
		}
	} else {
		for i := range acc {
			d[i] = f32to16Fast(acc[i])
		}
	}
}

// reduceWide reduces narrow types through a float32 accumulator block: one
// rounding at the end, like the GPU kernels.
func reduceWide(dst []byte, srcs [][]byte, off int, op Op, div int,
	load func([]byte, int) float32, store func([]byte, int, float32), es int) {
	var accBuf [blockBytes]float32
	n := len(dst) / es
	acc := accBuf[:n]
	first := srcs[0][off : off+len(dst)]
	for i := range acc {
		acc[i] = load(first, i)
	}
	for _, s := range srcs[1:] {
		s = s[off : off+len(dst)]
		switch op {
		case Sum, Avg:
			for i := range acc {
				acc[i] += load(s, i)
			}
		case Min:
			for i := range acc {
				acc[i] = min(acc[i], load(s, i))
			}
		case Max:
			for i := range acc {
				acc[i] = max(acc[i], load(s, i))
			}
		}
	}
	if div > 1 {
		fd := float32(div)
		if es == 1 {
			for i := range acc {
				acc[i] = float32(int64(acc[i]) / int64(div))
			}
		} else {
			for i := range acc {
				acc[i] /= fd
			}
		}
	}
	for i := range acc {
		store(dst, i, acc[i])
	}
}

// asSlice views b as a slice of T. b must be aligned for T (mmap'd and
// Go-allocated buffers are; offsets used here are multiples of the size).
func asSlice[T any](b []byte) []T {
	var z T
	sz := int(unsafe.Sizeof(z))
	if len(b) < sz {
		return nil
	}
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/sz)
}

// f16to32 converts IEEE half precision bits to float32.
func f16to32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	man := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f: // inf/nan
		return math.Float32frombits(sign | 0xff<<23 | man<<13)
	case exp == 0:
		if man == 0 {
			return math.Float32frombits(sign)
		}
		// subnormal: value = man * 2^-24
		f := float32(man) * (1.0 / (1 << 24))
		if sign != 0 {
			f = -f
		}
		return f
	}
	return math.Float32frombits(sign | (exp+112)<<23 | man<<13)
}

// f32to16 converts float32 to IEEE half precision, rounding to nearest even.
func f32to16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23) & 0xff
	man := b & 0x7fffff
	if exp == 0xff {
		if man != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e <= 0 {
		if e < -10 {
			return sign
		}
		man |= 0x800000
		shift := uint32(14 - e)
		h := man >> shift
		rem := man & (1<<shift - 1)
		half := uint32(1) << (shift - 1)
		if rem > half || (rem == half && h&1 == 1) {
			h++
		}
		return sign | uint16(h)
	}
	h := uint32(e)<<10 | man>>13
	rem := man & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && h&1 == 1) {
		h++ // may carry into the exponent, which is right (up to inf)
	}
	return sign | uint16(h)
}

// f32to16Fast is f32to16 with an inlinable fast path for results in the
// normal float16 range.
func f32to16Fast(f float32) uint16 {
	b := math.Float32bits(f)
	abs := b & 0x7fffffff
	if abs >= 0x38800000 && abs < 0x477ff000 {
		r := abs + 0xfff + (abs>>13)&1 // round to nearest even
		return uint16(b>>16)&0x8000 | uint16((r-0x38000000)>>13)
	}
	return f32to16(f)
}

// f32toBF16 converts float32 to bfloat16, rounding to nearest even.
func f32toBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// Float16Bits and friends convert between float32 and the 16-bit formats
// the way the reductions do; tests and the bench use them to build inputs.
func Float16Bits(f float32) uint16 { return f32to16(f) }

// Float16FromBits converts IEEE half precision bits to float32.
func Float16FromBits(h uint16) float32 { return f16to32(h) }

// BFloat16Bits converts float32 to bfloat16 bits (round to nearest even).
func BFloat16Bits(f float32) uint16 { return f32toBF16(f) }

// BFloat16FromBits converts bfloat16 bits to float32.
func BFloat16FromBits(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

func asBytes[T any](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(s[0])))
}
