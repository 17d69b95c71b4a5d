package comm

import "fmt"

// The kernel ABI of allreduce/kernels/reduce.cu.
const (
	numDTypes     = DType(Uint8) + 1
	numReduceOps  = 3 // sum, min, max (avg reduces as sum)
	maxKernelSrcs = 8 // sources per reduce launch (struct Srcs)
	kernelThreads = 256
)

var (
	dtypeKernelNames = [numDTypes]string{Float32: "f32", Float16: "f16", BFloat16: "bf16", Float64: "f64", Int32: "i32", Int64: "i64", Uint8: "u8"}
	opKernelNames    = [numReduceOps]string{"sum", "min", "max"}
)

// reduceOp maps an Op to its kernel: Avg runs the sum kernel.
func reduceOp(op Op) int {
	switch op {
	case Min:
		return 1
	case Max:
		return 2
	}
	return 0
}

func reduceKernel(dt DType, op int) string {
	return fmt.Sprintf("mig_reduce_%s_%s", opKernelNames[op], dtypeKernelNames[dt])
}

func scaleKernel(dt DType) string { return "mig_scale_" + dtypeKernelNames[dt] }

// copyKernel copies bytes: mig_copy(void *dst, const void *src, u64 n).
const copyKernel = "mig_copy"

// grid is the block count for units of work (one per thread), capped: the
// kernels are grid-stride loops.
func (d *CUDADevice) grid(units uint64) uint32 {
	g := (units + kernelThreads - 1) / kernelThreads
	return uint32(max(min(g, uint64(d.maxBlocks)), 1))
}
