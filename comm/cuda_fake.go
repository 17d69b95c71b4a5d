package comm

import (
	"encoding/binary"
	"fmt"

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
		return ScaleHost(dst, dt, int(div))
	}
}
