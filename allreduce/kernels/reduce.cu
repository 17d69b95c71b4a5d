// Reduction kernels of migctl's GPU collectives. Compiled to PTX by
// scripts/gen-ptx.sh (nvcc -ptx) and loaded at run time with
// cuModuleLoadData; no CUDA header is needed (half/bfloat16 conversions are
// PTX instructions or bit operations).
//
// Kernel ABI (comm/cuda_kernels.go launches these; keep the two in step):
//
//   mig_reduce_<op>_<dt>(void *dst, Srcs srcs, int k, unsigned long long n)
//     dst[i] = op(dst[i], srcs.p[0][i], ..., srcs.p[k-1][i]) for i < n
//     (n elements, 1 <= k <= 8). Every pointer is a device address: device
//     memory, or mapped pinned host memory (cuMemHostGetDevicePointer), which
//     the kernel reads directly over PCIe/NVLink-C2C. When dst and every src
//     are 16-byte aligned, the body moves 16-byte vectors; the tail and the
//     unaligned case go element by element. Grid-stride: any grid size works.
//   mig_scale_<dt>(void *dst, unsigned long long n, long long div)
//     dst[i] = dst[i] / div: true division for floating types (rounded once
//     to the element type), truncating division for integers.
//
//   mig_copy(void *dst, const void *src, unsigned long long n)
//     dst[i] = src[i] for n bytes: the small host-to-device copies of
//     comm.H2DKernel, src being mapped host memory. 16-byte vectors when
//     both are 16-byte aligned (the tail by bytes), else bytes.
//
//   op: sum | min | max (avg = sum, then scale by the rank count)
//   dt: f32 | f16 | bf16 | f64 | i32 | i64 | u8
//
// fp16/bf16 accumulate in fp32 across the k sources and round once; integer
// sums wrap around (two's complement), like Go's.

typedef unsigned long long u64;
typedef long long i64;

struct Srcs {
    const void *p[8];
};

__device__ __forceinline__ float h2f(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ unsigned short f2h(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
__device__ __forceinline__ float b2f(unsigned short b) {
    return __uint_as_float(((unsigned)b) << 16);
}
__device__ __forceinline__ unsigned short f2b(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
    return (unsigned short)(u >> 16);
}

// Element traits: storage type S, accumulator type A, conversions, add, div.
struct F32 {
    typedef float S; typedef float A;
    static __device__ __forceinline__ A ld(S v) { return v; }
    static __device__ __forceinline__ S st(A v) { return v; }
    static __device__ __forceinline__ A add(A a, A b) { return a + b; }
    static __device__ __forceinline__ S div(S v, i64 d) { return v / (float)d; }
};
struct F64 {
    typedef double S; typedef double A;
    static __device__ __forceinline__ A ld(S v) { return v; }
    static __device__ __forceinline__ S st(A v) { return v; }
    static __device__ __forceinline__ A add(A a, A b) { return a + b; }
    static __device__ __forceinline__ S div(S v, i64 d) { return v / (double)d; }
};
struct F16 {
    typedef unsigned short S; typedef float A;
    static __device__ __forceinline__ A ld(S v) { return h2f(v); }
    static __device__ __forceinline__ S st(A v) { return f2h(v); }
    static __device__ __forceinline__ A add(A a, A b) { return a + b; }
    static __device__ __forceinline__ S div(S v, i64 d) { return f2h(h2f(v) / (float)d); }
};
struct BF16 {
    typedef unsigned short S; typedef float A;
    static __device__ __forceinline__ A ld(S v) { return b2f(v); }
    static __device__ __forceinline__ S st(A v) { return f2b(v); }
    static __device__ __forceinline__ A add(A a, A b) { return a + b; }
    static __device__ __forceinline__ S div(S v, i64 d) { return f2b(b2f(v) / (float)d); }
};
struct I32 {
    typedef int S; typedef int A;
    static __device__ __forceinline__ A ld(S v) { return v; }
    static __device__ __forceinline__ S st(A v) { return v; }
    static __device__ __forceinline__ A add(A a, A b) { return (int)((unsigned)a + (unsigned)b); }
    static __device__ __forceinline__ S div(S v, i64 d) { return (int)((i64)v / d); }
};
struct I64 {
    typedef i64 S; typedef i64 A;
    static __device__ __forceinline__ A ld(S v) { return v; }
    static __device__ __forceinline__ S st(A v) { return v; }
    static __device__ __forceinline__ A add(A a, A b) { return (i64)((u64)a + (u64)b); }
    static __device__ __forceinline__ S div(S v, i64 d) {
        return d == -1 ? (i64)(0ull - (u64)v) : v / d;  // INT64_MIN / -1 wraps, no trap
    }
};
struct U8 {
    typedef unsigned char S; typedef unsigned A;
    static __device__ __forceinline__ A ld(S v) { return v; }
    static __device__ __forceinline__ S st(A v) { return (unsigned char)v; }
    static __device__ __forceinline__ A add(A a, A b) { return a + b; }
    static __device__ __forceinline__ S div(S v, i64 d) { return (unsigned char)((i64)v / d); }
};

template <class T> struct OpSum {
    static __device__ __forceinline__ typename T::A f(typename T::A a, typename T::A b) { return T::add(a, b); }
};
template <class T> struct OpMin {
    static __device__ __forceinline__ typename T::A f(typename T::A a, typename T::A b) { return b < a ? b : a; }
};
template <class T> struct OpMax {
    static __device__ __forceinline__ typename T::A f(typename T::A a, typename T::A b) { return b > a ? b : a; }
};

template <class T, class Op>
__device__ __forceinline__ void reduce_body(void *dstv, const Srcs &s, int k, u64 n) {
    typedef typename T::S S;
    typedef typename T::A A;
    const int V = 16 / sizeof(S);
    union Vec {
        uint4 v;
        S e[16 / sizeof(S)];
    };

    const void *p[8];
    u64 mis = (u64)dstv;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        p[j] = s.p[j];
        if (j < k) mis |= (u64)p[j];
    }
    S *dst = (S *)dstv;
    const u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    u64 head = 0;

    if ((mis & 15) == 0) {
        const u64 nv = n / V;
        for (u64 i = tid; i < nv; i += stride) {
            // Issue every source load before combining: k loads in flight.
            Vec x[8];
#pragma unroll
            for (int j = 0; j < 8; j++)
                if (j < k) x[j].v = ((const uint4 *)p[j])[i];
            Vec d;
            d.v = ((const uint4 *)dst)[i];
            A acc[16 / sizeof(S)];
#pragma unroll
            for (int e = 0; e < V; e++) acc[e] = T::ld(d.e[e]);
#pragma unroll
            for (int j = 0; j < 8; j++)
                if (j < k) {
#pragma unroll
                    for (int e = 0; e < V; e++) acc[e] = Op::f(acc[e], T::ld(x[j].e[e]));
                }
#pragma unroll
            for (int e = 0; e < V; e++) d.e[e] = T::st(acc[e]);
            ((uint4 *)dst)[i] = d.v;
        }
        head = nv * V;
    }
    for (u64 i = head + tid; i < n; i += stride) {
        A a = T::ld(dst[i]);
#pragma unroll
        for (int j = 0; j < 8; j++)
            if (j < k) a = Op::f(a, T::ld(((const S *)p[j])[i]));
        dst[i] = T::st(a);
    }
}

template <class T>
__device__ __forceinline__ void scale_body(void *dstv, u64 n, i64 div) {
    typename T::S *dst = (typename T::S *)dstv;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) dst[i] = T::div(dst[i], div);
}

#define REDUCE(op, Op, dt, T)                                                                  \
    extern "C" __global__ void mig_reduce_##op##_##dt(void *dst, Srcs srcs, int k, u64 n) { \
        reduce_body<T, Op<T> >(dst, srcs, k, n);                                               \
    }
#define DTYPE(dt, T)                                                                    \
    REDUCE(sum, OpSum, dt, T)                                                           \
    REDUCE(min, OpMin, dt, T)                                                           \
    REDUCE(max, OpMax, dt, T)                                                           \
    extern "C" __global__ void mig_scale_##dt(void *dst, u64 n, i64 div) { scale_body<T>(dst, n, div); }

DTYPE(f32, F32)
DTYPE(f16, F16)
DTYPE(bf16, BF16)
DTYPE(f64, F64)
DTYPE(i32, I32)
DTYPE(i64, I64)
DTYPE(u8, U8)

extern "C" __global__ void mig_copy(void *dstv, const void *srcv, u64 n) {
    unsigned char *dst = (unsigned char *)dstv;
    const unsigned char *src = (const unsigned char *)srcv;
    const u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    u64 head = 0;
    if ((((u64)dst | (u64)src) & 15) == 0) {
        const u64 nv = n / 16;
        for (u64 i = tid; i < nv; i += stride) ((uint4 *)dst)[i] = ((const uint4 *)src)[i];
        head = nv * 16;
    }
    for (u64 i = head + tid; i < n; i += stride) dst[i] = src[i];
}
