package comm

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/migctl/migctl/internal/cuda"
)

// InstallFakeCUDAKernels registers on f CPU versions of every kernel of
// allreduce/kernels/reduce.cu, with the same names and parameters, so that a
// CUDADevice runs end to end on a cuda.Fake (the PTX given to it can then be
// any non-empty bytes). Like the GPU, the fake kernels fail with
// CUDA_ERROR_MISALIGNED_ADDRESS on pointers not aligned to the element size
// and with CUDA_ERROR_ILLEGAL_ADDRESS outside known memory; the error sticks.
func InstallFakeCUDAKernels(f *cuda.Fake) {
	for dt := DType(0); dt < numDTypes; dt++ {
		for op := 0; op < numReduceOps; op++ {
			f.AddKernel(reduceKernel(dt, op), fakeReduce(dt, []Op{Sum, Min, Max}[op]))
		}
		f.AddKernel(scaleKernel(dt), fakeScale(dt))
	}
	f.AddKernel(copyKernel, fakeCopy)
}

// fakeCopy is mig_copy: n bytes from src to dst.
func fakeCopy(mem cuda.FakeMemory, _, _ cuda.Dim3, a *cuda.Args) error {
	if a.Len() != 3 {
		return fmt.Errorf("%d parameters, want 3: %w", a.Len(), cuda.ErrInvalidValue)
	}
	n := binary.LittleEndian.Uint64(a.Param(2))
	dst, err := mem.Memory(cuda.DevicePtr(binary.LittleEndian.Uint64(a.Param(0))), n)
	if err != nil {
		return err
	}
	src, err := mem.Memory(cuda.DevicePtr(binary.LittleEndian.Uint64(a.Param(1))), n)
	if err != nil {
		return err
	}
	copy(dst, src)
	return nil
}

const errMisaligned = cuda.Result(716)

func fakeReduce(dt DType, op Op) cuda.FakeKernel {
	return func(mem cuda.FakeMemory, _, _ cuda.Dim3, a *cuda.Args) error {
		if a.Len() != 4 {
			return fmt.Errorf("%d parameters, want 4: %w", a.Len(), cuda.ErrInvalidValue)
		}
		es := uint64(dt.Size())
		dstPtr := binary.LittleEndian.Uint64(a.Param(0))
		srcs := a.Param(1)
		k := int(int32(binary.LittleEndian.Uint32(a.Param(2))))
		n := binary.LittleEndian.Uint64(a.Param(3)) * es
		if k < 1 || k > maxKernelSrcs || len(srcs) != 8*maxKernelSrcs {
			return fmt.Errorf("k=%d: %w", k, cuda.ErrInvalidValue)
		}
		if dstPtr%es != 0 {
			return errMisaligned
		}
		dst, err := mem.Memory(cuda.DevicePtr(dstPtr), n)
		if err != nil {
			return err
		}
		var all [][]byte
		for j := 0; j < k; j++ {
			p := binary.LittleEndian.Uint64(srcs[8*j:])
			if p%es != 0 {
				return errMisaligned
			}
			b, err := mem.Memory(cuda.DevicePtr(p), n)
			if err != nil {
				return err
			}
			all = append(all, b)
		}
		foldSeq(dst, all, dt, op)
		return nil
	}
}

// foldSeq is mig_reduce_<op>_<dt>'s arithmetic: per element, dst then each
// source in turn, acc = op(acc, src) (not the CPU's pairs), half precision
// accumulated in fp32 and rounded once, integers wrapping.
func foldSeq(dst []byte, srcs [][]byte, dt DType, op Op) {
	le := binary.LittleEndian
	es := dt.Size()
	f := func(a, b float64) float64 {
		switch op {
		case Min:
			if b < a {
				return b
			}
			return a
		case Max:
			if b > a {
				return b
			}
			return a
		}
		return a + b
	}
	for i := 0; i < len(dst)/es; i++ {
		at := es * i
		switch dt {
		case Float32:
			acc := math.Float32frombits(le.Uint32(dst[at:]))
			for _, s := range srcs {
				acc = float32(f(float64(acc), float64(math.Float32frombits(le.Uint32(s[at:])))))
			}
			le.PutUint32(dst[at:], math.Float32bits(acc))
		case Float64:
			acc := math.Float64frombits(le.Uint64(dst[at:]))
			for _, s := range srcs {
				acc = f(acc, math.Float64frombits(le.Uint64(s[at:])))
			}
			le.PutUint64(dst[at:], math.Float64bits(acc))
		case Float16, BFloat16:
			from, to := Float16FromBits, Float16Bits
			if dt == BFloat16 {
				from, to = BFloat16FromBits, BFloat16Bits
			}
			acc := from(le.Uint16(dst[at:]))
			for _, s := range srcs {
				acc = float32(f(float64(acc), float64(from(le.Uint16(s[at:])))))
			}
			le.PutUint16(dst[at:], to(acc))
		case Int32:
			acc := int32(le.Uint32(dst[at:]))
			for _, s := range srcs {
				acc = foldInt(acc, int32(le.Uint32(s[at:])), op)
			}
			le.PutUint32(dst[at:], uint32(acc))
		case Int64:
			acc := int64(le.Uint64(dst[at:]))
			for _, s := range srcs {
				acc = foldInt(acc, int64(le.Uint64(s[at:])), op)
			}
			le.PutUint64(dst[at:], uint64(acc))
		case Uint8:
			acc := dst[at]
			for _, s := range srcs {
				acc = foldInt(acc, s[at], op)
			}
			dst[at] = acc
		}
	}
}

func foldInt[T int32 | int64 | uint8](a, b T, op Op) T {
	switch op {
	case Min:
		return min(a, b)
	case Max:
		return max(a, b)
	}
	return a + b // wraps, as on the GPU
}

func fakeScale(dt DType) cuda.FakeKernel {
	return func(mem cuda.FakeMemory, _, _ cuda.Dim3, a *cuda.Args) error {
		if a.Len() != 3 {
			return fmt.Errorf("%d parameters, want 3: %w", a.Len(), cuda.ErrInvalidValue)
		}
		es := uint64(dt.Size())
		dstPtr := binary.LittleEndian.Uint64(a.Param(0))
		n := binary.LittleEndian.Uint64(a.Param(1)) * es
		div := int64(binary.LittleEndian.Uint64(a.Param(2)))
		if dstPtr%es != 0 {
			return errMisaligned
		}
		dst, err := mem.Memory(cuda.DevicePtr(dstPtr), n)
		if err != nil {
			return err
		}
		if div <= 0 {
			return cuda.ErrInvalidValue
		}
		scaleBytes(dst, dt, div)
		return nil
	}
}

// scaleBytes divides every element like mig_scale_<dt>: floats with one
// rounding (fp16/bf16 through fp32), integers truncating.
func scaleBytes(b []byte, dt DType, div int64) {
	le := binary.LittleEndian
	for i := 0; i < len(b)/dt.Size(); i++ {
		switch dt {
		case Float32:
			le.PutUint32(b[4*i:], math.Float32bits(math.Float32frombits(le.Uint32(b[4*i:]))/float32(div)))
		case Float64:
			le.PutUint64(b[8*i:], math.Float64bits(math.Float64frombits(le.Uint64(b[8*i:]))/float64(div)))
		case Float16:
			le.PutUint16(b[2*i:], Float16Bits(Float16FromBits(le.Uint16(b[2*i:]))/float32(div)))
		case BFloat16:
			le.PutUint16(b[2*i:], BFloat16Bits(BFloat16FromBits(le.Uint16(b[2*i:]))/float32(div)))
		case Int32:
			le.PutUint32(b[4*i:], uint32(int32(int64(int32(le.Uint32(b[4*i:])))/div)))
		case Int64:
			v := int64(le.Uint64(b[8*i:]))
			if div != -1 {
				v /= div
			}
			le.PutUint64(b[8*i:], uint64(v))
		case Uint8:
			b[i] = byte(int64(b[i]) / div)
		}
	}
}
