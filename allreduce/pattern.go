package allreduce

import (
	"bytes"
	"encoding/binary"
	"math"

	"github.com/migctl/migctl/comm"
)

// Exactly predictable inputs and results for checking collectives element by
// element (the bench's -c 1 and the tests). Values are small integers, so
// every partial sum is exact in every type (bf16 up to 64 ranks) and the
// result does not depend on the order of the reduction.

// value is rank r's input element i for op, as a real number.
func value(op comm.Op, world, r, i int) float64 {
	switch op {
	case comm.Avg:
		// a(i) + (2r - (world-1)): the offsets cancel, the average is a(i).
		return float64(i%2+world) + float64(2*r-(world-1))
	case comm.Min, comm.Max:
		return float64((i*7 + r*3) % 13)
	default:
		return float64((i+r)%4 + 1)
	}
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
	for i := range n {
		put(out, dt, i, value(op, world, rank, i))
	}
	return out
}

// Expected is rank's receive buffer after coll over the Inputs of every rank.
func Expected(coll Coll, dt comm.DType, op comm.Op, world, rank, root, count int) []byte {
	n := OutputLen(coll, world, count)
	out := make([]byte, n*dt.Size())
	for i := range n {
		var v float64
		switch coll {
		case AllGather:
			v = value(op, world, i/count, i%count)
		case Broadcast:
			v = value(op, world, root, i)
		default:
			gi := i
			if coll == ReduceScatter {
				gi = rank*count + i
			}
			v = reduceValues(op, world, gi)
		}
		put(out, dt, i, v)
	}
	return out
}

func reduceValues(op comm.Op, world, i int) float64 {
	acc := value(op, world, 0, i)
	for r := 1; r < world; r++ {
		x := value(op, world, r, i)
		switch op {
		case comm.Min:
			acc = math.Min(acc, x)
		case comm.Max:
			acc = math.Max(acc, x)
		default:
			acc += x
		}
	}
	if op == comm.Avg {
		acc = math.Trunc(acc / float64(world))
	}
	return acc
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
