package nccl

import (
	"encoding/binary"
	"math"
	"os"
	"runtime"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/internal/cuda"
)

// The real library's collectives on one GPU, a communicator of one rank
// (what a machine with one GPU can check of the prototypes: every call
// with its arguments in the right places, results in device memory).
// Skips without a GPU or NCCL.
func TestRealLibraryOneRank(t *testing.T) {
	lib, err := Open()
	if err != nil {
		if os.Getenv("MIGCTL_NCCL_REQUIRED") == "1" {
			t.Fatalf("MIGCTL_NCCL_REQUIRED=1 but: %v", err)
		}
		t.Skipf("no NCCL: %v", err)
	}
	api, err := cuda.Open()
	if err != nil {
		t.Skipf("no CUDA driver: %v", err)
	}
	if err := api.Init(0); err != nil {
		t.Skipf("cuInit: %v", err)
	}
	if n, err := api.DeviceGetCount(); err != nil || n == 0 {
		t.Skip("no GPU")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	dev, err := api.DeviceGet(0)
	require.NoError(t, err)
	ctx, err := api.DevicePrimaryCtxRetain(dev)
	require.NoError(t, err)
	defer api.DevicePrimaryCtxRelease(dev)
	require.NoError(t, api.CtxSetCurrent(ctx))
	s, err := api.StreamCreate(1)
	require.NoError(t, err)
	defer api.StreamDestroy(s)

	const n = 1 << 20
	host := make([]byte, 4*n)
	for i := range n {
		binary.LittleEndian.PutUint32(host[4*i:], math.Float32bits(float32(i%1000)))
	}
	a, err := api.MemAlloc(4 * n)
	require.NoError(t, err)
	defer api.MemFree(a)
	b, err := api.MemAlloc(4 * n)
	require.NoError(t, err)
	defer api.MemFree(b)
	require.NoError(t, api.MemcpyHtoD(a, unsafe.Pointer(&host[0]), 4*n))

	id, err := lib.GetUniqueID()
	require.NoError(t, err)
	c, err := lib.CommInitRank(1, id, 0)
	require.NoError(t, err)
	st := Stream(s)
	require.NoError(t, lib.AllReduce(uintptr(a), uintptr(b), n, Float32, Max, Comm(c), st))
	require.NoError(t, lib.Broadcast(uintptr(b), uintptr(b), n, Float32, 0, c, st))
	require.NoError(t, lib.GroupStart())
	require.NoError(t, lib.AllGather(uintptr(b), uintptr(a), n, Float32, c, st))
	require.NoError(t, lib.GroupEnd())
	require.NoError(t, lib.ReduceScatter(uintptr(a), uintptr(b), n, Float32, Sum, c, st))
	require.NoError(t, api.StreamSynchronize(s))
	require.NoError(t, lib.CommGetAsyncError(c))
	got := make([]byte, 4*n)
	require.NoError(t, api.MemcpyDtoH(unsafe.Pointer(&got[0]), b, 4*n))
	require.Equal(t, host, got)
	// An argument NCCL refuses: an error value, with NCCL's last-error text.
	err = lib.Broadcast(uintptr(b), uintptr(b), n, Float32, 5, c, st)
	require.ErrorIs(t, err, ErrInvalidArgument)
	t.Logf("root 5 of 1 rank: %v", err)
	require.NoError(t, lib.CommDestroy(c))
}
