package allreduce

import (
	"bytes"
	"encoding/binary"
	"math"
	"slices"

	"github.com/migctl/migctl/comm"
)

// Exactly predictable inputs and results for checking collectives element by
// element (the bench's -c 1 and the tests). Every rank sends something of its
// own at every position (a block delivered to the wrong rank differs), the
// values follow no short period (a block at the wrong offset differs), and
// every partial result is exact in the dtype whatever the order of the
// reduction, so results are compared bit for bit.
//
// Sum and avg: rank r sends c(i) + e_i(r) at position i, where c(i) is a
// pseudo-random 0..C and e_i is a pseudo-random permutation of
// {2k-(world-1) : k < world} (distinct, summing to 0: the sum is world·c(i),
// the average c(i), exact in floating point); integer types use
// {k-(world-1)/2} (averages truncate anyway). C (at most 16) is the largest that keeps every partial
// sum within the integers the dtype holds exactly (bf16 ±256, fp16 ±2048).
// Where no C ≥ 1 fits (bf16 beyond 31 ranks, fp16 beyond 89), e_i pairs
// ranks as +1/−1 instead and ranks are no longer all distinct. uint8 sums
// wrap like the machine's; uint8 averages get an offset that keeps inputs
// non-negative and their sum below 256 (partial sums are bytes): distinct up
// to 22 ranks, then pairs, and from 128 ranks a flat c(i).
//
// Min and max: rank r sends (u_i·r + b_i) mod 256 with u_i odd: distinct for
// up to 256 ranks, exact in every dtype.

// pattern is the check pattern of one dtype, op and world.
type pattern struct {
	op    comm.Op
	world int
	units []int // the units mod world (the multipliers of the permutations)
	pairs bool  // e_i(r) is ±1 by pairs (too many ranks for distinct values)
	flat  bool  // e_i(r) is 0 (uint8 averages of 128+ ranks)
	step  int   // spacing of the distinct e values: 2 for floats (they sum to 0), 1 for integers
	sumE  int   // the sum of e over the ranks (the same at every position)
	c     int   // c(i) is in 0..c
	off   int   // added to every input (uint8 averages)
}

// exactLimit is the largest integer magnitude every partial sum must stay
// within, for dt.
func exactLimit(dt comm.DType, op comm.Op) int {
	switch dt {
	case comm.BFloat16:
		return 256
	case comm.Float16:
		return 2048
	case comm.Uint8:
		if op == comm.Avg {
			// Partial sums are uint8 (the final step divides): the whole
			// sum must not wrap.
			return 255
		}
	}
	return 1 << 24
}

func newPattern(dt comm.DType, op comm.Op, world int) pattern {
	p := pattern{op: op, world: world, step: 2}
	switch dt {
	case comm.Int32, comm.Int64, comm.Uint8:
		p.step = 1 // averages truncate: no need for sums divisible by world
	}
	if op == comm.Min || op == comm.Max {
		return p
	}
	for u := 1; u <= max(world, 1); u++ {
		if gcd(u, world) == 1 {
			p.units = append(p.units, u)
		}
	}
	limit := exactLimit(dt, op)
	unsigned := dt == comm.Uint8 && op == comm.Avg // inputs must stay in 0..255 (they are summed as bytes)
	for _, mode := range []struct{ pairs, flat bool }{{false, false}, {true, false}, {false, true}} {
		p.pairs, p.flat, p.off = mode.pairs, mode.flat, 0
		if unsigned {
			p.off = -slices.Min(p.es())
		}
		for p.c = 16; p.c >= 0; p.c-- {
			if p.c == 0 && !p.flat {
				break // keep results varying while anything else fits
			}
			if p.fits(limit) {
				for _, e := range p.es() {
					p.sumE += e
				}
				return p
			}
		}
	}
	return p // flat and c = 0: every input 0
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// es lists the e values of one position (the same multiset at every one).
func (p pattern) es() []int {
	out := make([]int, p.world)
	for r := range p.world {
		switch {
		case p.flat:
		case !p.pairs:
			out[r] = p.e(r)
		case r == p.world-1 && p.world%2 == 1:
			out[r] = 0
		default:
			out[r] = 1 - 2*(r%2)
		}
	}
	return out
}

// fits reports whether every partial sum of any subset of the ranks'
// inputs stays within ±limit.
func (p pattern) fits(limit int) bool {
	pos, neg := 0, 0
	for _, e := range p.es() {
		pos += max(0, p.c+p.off+e)
		neg += max(0, -(p.off + e))
	}
	return pos <= limit && neg <= limit
}

// e is the k-th distinct e value: spaced by step around 0.
func (p pattern) e(k int) int {
	if p.step == 2 {
		return 2*k - (p.world - 1)
	}
	return k - (p.world-1)/2
}

// below maps the low 32 bits of h to 0..n-1 (a multiply, not a division).
func below(h uint64, n int) int { return int(h & 0xffffffff * uint64(n) >> 32) }

// mix is splitmix64's finaliser: a pseudo-random function of i.
func mix(i uint64) uint64 {
	i += 0x9e3779b97f4a7c15
	i = (i ^ i>>30) * 0xbf58476d1ce4e5b9
	i = (i ^ i>>27) * 0x94d049bb133111eb
	return i ^ i>>31
}

// value is rank r's input element i, as a real number.
func (p pattern) value(r, i int) float64 { return p.valueH(r, mix(uint64(i))) }

// valueH is value with h = mix(i).
func (p pattern) valueH(r int, h uint64) float64 {
	if p.op == comm.Min || p.op == comm.Max {
		u := int(h&0xff) | 1
		return float64((u*r + int(h>>8&0xff)) & 0xff)
	}
	c := below(h, p.c+1)
	var e int
	if p.flat {
		return float64(c + p.off)
	}
	if p.pairs {
		switch {
		case r == p.world-1 && p.world%2 == 1:
		case mix(h^uint64(r/2))&1 == 0:
			e = 1 - 2*(r%2)
		default:
			e = 2*(r%2) - 1
		}
	} else {
		u := p.units[below(h>>16, len(p.units))]
		e = p.e((u*r + below(h>>32, p.world)) % p.world)
	}
	return float64(c + e + p.off)
}

// reduced is element i of the reduction over every rank.
func (p pattern) reduced(i int) float64 {
	switch p.op {
	case comm.Min, comm.Max:
		h := mix(uint64(i))
		acc := p.valueH(0, h)
		for r := 1; r < p.world; r++ {
			if p.op == comm.Min {
				acc = math.Min(acc, p.valueH(r, h))
			} else {
				acc = math.Max(acc, p.valueH(r, h))
			}
		}
		return acc
	}
	sum := float64(p.world*(below(mix(uint64(i)), p.c+1)+p.off) + p.sumE)
	if p.op == comm.Avg {
		return math.Trunc(sum / float64(p.world))
	}
	return sum
}

// InputLen is the number of elements of a rank's send buffer for count.
func InputLen(coll Coll, world, count int) int {
	if coll == ReduceScatter {
		return world * count
	}
	return count
}

// OutputLen is the number of elements of a rank's receive buffer for count.
func OutputLen(coll Coll, world, count int) int {
	if coll == AllGather {
		return world * count
	}
	return count
}

// Input is rank's send buffer for a check of coll with count elements.
func Input(coll Coll, dt comm.DType, op comm.Op, world, rank, count int) []byte {
	n := InputLen(coll, world, count)
	out := make([]byte, n*dt.Size())
	p := newPattern(dt, op, world)
	for i := range n {
		put(out, dt, i, p.value(rank, i))
	}
	return out
}

// Expected is rank's receive buffer after coll over the Inputs of every rank.
func Expected(coll Coll, dt comm.DType, op comm.Op, world, rank, root, count int) []byte {
	n := OutputLen(coll, world, count)
	out := make([]byte, n*dt.Size())
	p := newPattern(dt, op, world)
	for i := range n {
		var v float64
		switch coll {
		case AllGather:
			v = p.value(i/count, i%count)
		case Broadcast:
			v = p.value(root, i)
		default:
			gi := i
			if coll == ReduceScatter {
				gi = rank*count + i
			}
			v = p.reduced(gi)
		}
		put(out, dt, i, v)
	}
	return out
}

// put stores v (an integer-valued real) as element i of type dt; integers
// wrap like machine arithmetic.
func put(b []byte, dt comm.DType, i int, v float64) {
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
		binary.LittleEndian.PutUint32(b[4*i:], uint32(int32(int64(v))))
	case comm.Int64:
		binary.LittleEndian.PutUint64(b[8*i:], uint64(int64(v)))
	case comm.Uint8:
		b[i] = byte(int64(v))
	}
}

// Wrong counts the elements where got and want differ bit for bit (and
// elements missing from got).
func Wrong(got, want []byte, dt comm.DType) int {
	if bytes.Equal(got, want) {
		return 0
	}
	es := dt.Size()
	wrong := 0
	for i := 0; i+es <= len(want); i += es {
		if i+es > len(got) || string(got[i:i+es]) != string(want[i:i+es]) {
			wrong++
		}
	}
	return wrong
}
