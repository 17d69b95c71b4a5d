package comm

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// AVX2 float32 sums (reduce_amd64.s); the Go loops do the rest and every
// other type and op.

//go:noescape
func sum2F32(d, a, b *float32, n int)

//go:noescape
func sum3F32(d, a, b, c *float32, n int)

//go:noescape
func sum4F32(d, a, b, c, e *float32, n int)

// simdF32 turns the assembly on (tests turn it off to compare).
var simdF32 = cpu.X86.HasAVX2

//go:noescape
func ntCopy(d, s *byte, n int)

// streamCopy copies src into dst with non-temporal stores where it can (a
// 16-byte aligned dst, whole 64-byte lines) and returns how many leading
// bytes it did; the caller copies the rest.
func streamCopy(dst, src []byte) int {
	n := min(len(dst), len(src)) &^ 63
	if n == 0 || uintptr(unsafe.Pointer(&dst[0]))%16 != 0 {
		return 0
	}
	ntCopy(&dst[0], &src[0], n)
	return n
}

// fsum2, fsum3 and fsum4 sum equally long sources into d (which may be
// one of them) with AVX2 and return how many leading elements they did (a
// multiple of 8; 0 without AVX2).
func fsum2(d, a, b []float32) int {
	n := len(d) &^ 7
	if !simdF32 || n == 0 {
		return 0
	}
	sum2F32(&d[0], &a[0], &b[0], n)
	return n
}

func fsum3(d, a, b, c []float32) int {
	n := len(d) &^ 7
	if !simdF32 || n == 0 {
		return 0
	}
	sum3F32(&d[0], &a[0], &b[0], &c[0], n)
	return n
}

func fsum4(d, a, b, c, e []float32) int {
	n := len(d) &^ 7
	if !simdF32 || n == 0 {
		return 0
	}
	sum4F32(&d[0], &a[0], &b[0], &c[0], &e[0], n)
	return n
}
