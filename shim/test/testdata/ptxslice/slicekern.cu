// Test kernels for PTX slicing and the preemption-delay probes (ptxslicetest gpu-run / gpu-delay);
// compiled with nvcc -ptx -arch=compute_90 by scripts/h200-session.d/{ptx-slice,prio-xctx,prio-mps}.sh.
// slicekern.ptx beside it is a hand-written PTX of the same kernels, used where nvcc is missing.
extern "C" __global__ void grid_probe(unsigned *count, unsigned *val, unsigned seed) {
    if (threadIdx.x != 0) return;
    unsigned x = blockIdx.x, y = blockIdx.y, z = blockIdx.z, nx = gridDim.x, ny = gridDim.y, nz = gridDim.z;
    unsigned long long i = x + (unsigned long long)nx * (y + (unsigned long long)ny * z);
    atomicAdd(&count[i], 1u);
    val[i] = seed ^ (x * 0x9E3779B1u) ^ (y * 0x85EBCA77u) ^ (z * 0xC2B2AE3Du) ^ (nx * 0x27D4EB2Fu) ^
             (ny * 0x165667B1u) ^ (nz * 0x61C88647u);
}
__device__ __forceinline__ unsigned long long gtimer() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
extern "C" __global__ void spin(unsigned *out, unsigned long long ns) {
    unsigned long long t0 = gtimer();
    while (gtimer() - t0 < ns) {
    }
    if (threadIdx.x == 0) out[blockIdx.x] = blockIdx.x ^ gridDim.x;
}
extern "C" __global__ void tiny(unsigned long long *t) {
    if (threadIdx.x == 0) *t = gtimer();
}
