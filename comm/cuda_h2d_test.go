package comm_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/comm"
	"github.com/migctl/migctl/internal/cuda"
)

// Every small host-to-device copy mode lands exactly the bytes asked for, at
// the offset asked for, from registered and from unregistered memory, and
// the default (2D rows) never issues a one-row 2D copy or a 1D copy above a
// byte: the driver's slow path for small copies.
func TestCUDADeviceFakeSmallH2DModes(t *testing.T) {
	sizes := []int{1, 2, 3, 7, 8, 63, 64, 65, 100, 127, 128, 129, 191, 4099, 8192, 8200, comm.SmallH2DBytes - 1, comm.SmallH2DBytes, 40000}
	for _, mode := range []comm.H2DMode{"", comm.H2D2DRows, comm.H2DPlain, comm.H2D2D, comm.H2DFromMapped, comm.H2DPadded, comm.H2DKernel} {
		for _, registered := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/registered=%v", mode, registered), func(t *testing.T) {
				f := cuda.NewFake()
				comm.InstallFakeCUDAKernels(f)
				d, err := comm.NewCUDADevice(f, comm.CUDAConfig{PTX: []byte("// fake module"), SmallH2D: mode})
				require.NoError(t, err)
				t.Cleanup(func() { _ = d.Close() })
				checkSmallH2D(t, d, registered, sizes)
				if mode == comm.H2DKernel {
					// The registered sources below SmallH2DBytes go by
					// the copy kernel; the rest (and the poison, Go
					// memory) by the copy engines.
					want := 0
					for _, n := range sizes {
						if registered && n < comm.SmallH2DBytes {
							want++
						}
					}
					require.Equal(t, want, f.Calls("LaunchKernel"))
				}
				if mode == "" || mode == comm.H2D2DRows {
					// 1D copies only for SmallH2DBytes and more, and for
					// a single byte (alone, or left over after 64-byte rows).
					oneD := func(l int) int {
						if l >= comm.SmallH2DBytes || l == 1 || (l >= 128 && l%64 == 1) {
							return 1
						}
						return 0
					}
					want := 0
					for _, n := range sizes {
						want += oneD(n) + oneD(n+10)
					}
					require.Equal(t, want, f.Calls("MemcpyHtoDAsync"))
					require.Positive(t, f.Calls("Memcpy2DHtoDAsync"))
				}
			})
		}
	}
}

// checkSmallH2D copies each size from (registered or Go) host memory to an
// odd device offset between poisoned bytes and requires exactly the bytes
// asked for to land.
func checkSmallH2D(t *testing.T, d comm.Device, registered bool, sizes []int) {
	t.Helper()
	arena := mmapArena(t, 1<<17)
	if registered {
		require.NoError(t, d.Register(arena))
	} else {
		arena = make([]byte, 1<<17)
	}
	dst, err := d.Alloc(1 << 17)
	require.NoError(t, err)
	st, err := d.NewStream()
	require.NoError(t, err)
	back := make([]byte, 1<<17)
	for _, n := range sizes {
		const off = 5 // an odd destination offset
		src := arena[3 : 3+n]
		for i := range src {
			src[i] = byte(i*31 + n)
		}
		// Poison the destination, then copy and read back.
		poison := make([]byte, n+2*off)
		for i := range poison {
			poison[i] = 0xA5
		}
		require.NoError(t, st.CopyFromHost(dst, 0, poison))
		require.NoError(t, st.CopyFromHost(dst, off, src))
		require.NoError(t, st.CopyToHost(back[:n+2*off], dst, 0))
		require.NoError(t, st.Synchronize(syncCtx(t)))
		require.Equal(t, src, back[off:off+n], "%d bytes", n)
		require.Equal(t, poison[:off], back[:off], "%d bytes: bytes before the copy", n)
		require.Equal(t, poison[:off], back[n+off:n+2*off], "%d bytes: bytes after the copy", n)
	}
}

// On the GPU, the copy kernel lands the bytes like the copy engines.
func TestCUDADeviceGPUSmallH2DKernel(t *testing.T) {
	d := gpuDeviceWith(t, comm.CUDAConfig{SmallH2D: comm.H2DKernel})
	for _, registered := range []bool{true, false} {
		checkSmallH2D(t, d, registered, []int{1, 3, 8, 63, 64, 65, 100, 4099, 8192, 8200, comm.SmallH2DBytes - 1, 40000})
	}
}

func TestParseH2DMode(t *testing.T) {
	m, err := comm.ParseH2DMode("")
	require.NoError(t, err)
	require.Equal(t, comm.H2D2DRows, m)
	m, err = comm.ParseH2DMode("pad")
	require.NoError(t, err)
	require.Equal(t, comm.H2DPadded, m)
	m, err = comm.ParseH2DMode("kernel")
	require.NoError(t, err)
	require.Equal(t, comm.H2DKernel, m)
	_, err = comm.ParseH2DMode("fast")
	require.ErrorIs(t, err, comm.ErrInvalid)
}
