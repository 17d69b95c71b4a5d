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
		all := [][]byte{dst}
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
		return ReduceHost(dst, all, dt, op, 1)
	}
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
