package cuda

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestResultError(t *testing.T) {
	tests := []struct {
		name string
		code int
		want error
		text string
	}{
		{"success is no error", 0, nil, ""},
		{"not ready", 600, ErrNotReady, "cuda: CUDA_ERROR_NOT_READY (600): device not ready"},
		{"invalid value", 1, ErrInvalidValue, "cuda: CUDA_ERROR_INVALID_VALUE (1): invalid argument"},
		{"already registered", 712, ErrHostMemoryAlreadyRegistered, "cuda: CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED (712): part or all of the requested memory range is already mapped"},
		{"missing entry point", -1, ErrFunctionMissing, "cuda: MIGCTL_CUDA_FUNCTION_MISSING (-1): libcuda does not export a driver function migctl needs"},
		{"capturing stream", 900, ErrStreamCaptureUnsupported, "cuda: CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (900): operation not permitted when stream is capturing"},
		{"unknown code", 4242, Result(4242), "cuda: unrecognised CUresult 4242"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := resultError(tc.code)
			if tc.want == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tc.want)
			require.EqualError(t, err, tc.text)
			wrapped := fmt.Errorf("allocating: %w", err)
			require.ErrorIs(t, wrapped, tc.want)
			var r Result
			require.True(t, errors.As(wrapped, &r))
			require.Equal(t, tc.code, int(r))
		})
	}
	require.NotErrorIs(t, resultError(600), ErrInvalidValue)
	require.Equal(t, "CUDA_ERROR_ILLEGAL_ADDRESS", ErrIllegalAddress.Name())
	require.Equal(t, "CUDA_ERROR_4242", Result(4242).Name())
}

func TestResultErrorDoesNotAllocate(t *testing.T) {
	allocs := testing.AllocsPerRun(100, func() { _ = resultError(600) })
	require.Zero(t, allocs)
}

func TestUUIDString(t *testing.T) {
	u := UUID{0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0xfe, 0xdc, 0xba, 0x98, 0x76, 0x54, 0x32, 0x10}
	require.Equal(t, "GPU-01234567-89ab-cdef-fedc-ba9876543210", u.String("GPU"))
	require.Equal(t, "MIG-01234567-89ab-cdef-fedc-ba9876543210", u.String("MIG"))
}

func TestArgsLayout(t *testing.T) {
	var a Args
	srcs := make([]byte, 64)
	srcs[0] = 0xaa
	a.Ptr(0x1122334455667788).Bytes(srcs, 8).Int32(-3).Uint64(99)
	require.Equal(t, 4, a.Len())
	require.False(t, a.Overflow())
	// The layout nvcc gives (void*, struct{void*[8]}, int, unsigned long long):
	// offsets 0, 8, 72, 80.
	require.Equal(t, []byte{0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11}, a.Param(0))
	require.Equal(t, srcs, a.Param(1))
	require.Equal(t, uint16(72), a.off[2])
	require.Equal(t, []byte{0xfd, 0xff, 0xff, 0xff}, a.Param(2))
	require.Equal(t, uint16(80), a.off[3])
	require.Equal(t, 8, len(a.Param(3)))

	a.Reset()
	require.Zero(t, a.Len())
	a.Uint32(1).Float64(2.5).Float32(1)
	require.Equal(t, uint16(8), a.off[1], "a double is 8-aligned after a 4-byte parameter")
	require.Equal(t, uint16(16), a.off[2])

	a.Reset()
	for i := 0; i < MaxArgs; i++ {
		a.Uint32(uint32(i))
	}
	require.False(t, a.Overflow())
	a.Uint32(1)
	require.True(t, a.Overflow())
	a.Reset()
	a.Bytes(make([]byte, MaxArgBytes+1), 8)
	require.True(t, a.Overflow())
}

// IsStreamCapture: the capture results (900-908), wrapped or not, and no other.
func TestIsStreamCapture(t *testing.T) {
	for code := 899; code <= 909; code++ {
		want := code >= 900 && code <= 908
		require.Equal(t, want, IsStreamCapture(fmt.Errorf("x: %w", resultError(code))), "code %d", code)
	}
	require.False(t, IsStreamCapture(nil))
	require.False(t, IsStreamCapture(errors.New("cuda: 900")))
}
