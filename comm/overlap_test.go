package comm

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/internal/cuda"
)

// otherBuffer is a Buffer of a device this package does not know.
type otherBuffer struct{ n int }

func (b otherBuffer) Len() int { return b.n }

func TestMayOverlap(t *testing.T) {
	mem := make([]byte, 4096)
	host := func(lo, hi int) Buffer { return WrapHostBytes(mem[lo:hi]) }
	dev := func(ptr, n int) Buffer { return &CUDABuffer{ptr: cuda.DevicePtr(ptr), n: n} }
	var nilHost *HostBuffer
	tests := []struct {
		name string
		a, b Buffer
		want bool
	}{
		{"the same host memory", host(0, 100), host(0, 100), true},
		{"host ranges that share bytes", host(0, 100), host(99, 200), true},
		{"adjacent host ranges", host(0, 100), host(100, 200), false},
		{"one inside the other", host(0, 4096), host(1000, 1001), true},
		{"device ranges apart", dev(1<<20, 4096), dev(1<<20+4096, 4096), false},
		{"device ranges that share bytes", dev(1<<20, 4096), dev(1<<20+4095, 10), true},
		{"the same device buffer", dev(1<<20, 4096), dev(1<<20, 4096), true},
		{"an empty buffer", dev(1<<20, 0), dev(1<<20, 4096), false},
		{"host and device memory", host(0, 100), dev(1<<20, 4096), false},
		{"nil", nil, host(0, 100), false},
		{"a typed nil", nilHost, host(0, 100), false},
		{"a buffer of another device: assume the worst", otherBuffer{100}, host(0, 100), true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, MayOverlap(tc.a, tc.b))
			require.Equal(t, tc.want, MayOverlap(tc.b, tc.a), "symmetric")
		})
	}
}
