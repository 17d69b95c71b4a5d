//go:build !amd64

package comm

// simdF32 is false where there is no assembly: the Go loops do everything.
var simdF32 = false

func fsum2(d, a, b []float32) int    { return 0 }
func fsum3(d, a, b, c []float32) int { return 0 }
func fsum4(d, a, b, c, e []float32) int {
	return 0
}

// streamCopy has no non-temporal stores here: the caller copies.
func streamCopy(dst, src []byte) int { return 0 }
