package cuda_test

// GPU tests of the dlopen binding: they skip where libcuda.so.1 cannot be
// loaded or no device is visible, and run on the H200 (bin/cuda.test).
// MIGCTL_PTX=path overrides the embedded kernel PTX.

import (
	"bytes"
	"encoding/binary"
	"math"
	"os"
	"regexp"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/allreduce/kernels"
	"github.com/migctl/migctl/internal/cuda"
)

// openGPU returns the driver with device 0's primary context current on the
// test's (locked) OS thread, or skips.
func openGPU(t *testing.T) (cuda.Interface, cuda.Device) {
	t.Helper()
	api, err := cuda.Open()
	if err != nil {
		t.Skipf("no CUDA driver: %v", err)
	}
	if err := api.Init(0); err != nil {
		t.Skipf("CUDA driver does not initialise: %v", err)
	}
	n, err := api.DeviceGetCount()
	if err != nil || n == 0 {
		t.Skipf("no CUDA device (count %d, %v)", n, err)
	}
	runtime.LockOSThread()
	t.Cleanup(runtime.UnlockOSThread)
	dev, err := api.DeviceGet(0)
	require.NoError(t, err)
	ctx, err := api.DevicePrimaryCtxRetain(dev)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, api.DevicePrimaryCtxRelease(dev)) })
	require.NoError(t, api.CtxSetCurrent(ctx))
	cur, err := api.CtxGetCurrent()
	require.NoError(t, err)
	require.Equal(t, ctx, cur)
	return api, dev
}

func hostArena(t *testing.T, n int) []byte {
	b, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	require.NoError(t, err)
	t.Cleanup(func() { _ = syscall.Munmap(b) })
	return b
}

func ptx(t *testing.T) []byte {
	if p := os.Getenv("MIGCTL_PTX"); p != "" {
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		return b
	}
	return kernels.PTX // generated and committed; kernels' tests check its entries
}

func TestGPUDeviceInfo(t *testing.T) {
	api, dev := openGPU(t)
	v, err := api.DriverGetVersion()
	require.NoError(t, err)
	require.GreaterOrEqual(t, v, 11040, "cuDeviceGetUuid_v2 and cuIpcOpenMemHandle_v2 need CUDA 11.4+")
	name, err := api.DeviceGetName(dev)
	require.NoError(t, err)
	require.NotEmpty(t, name)
	u2, err := api.DeviceGetUUID(dev)
	require.NoError(t, err)
	require.NotEqual(t, cuda.UUID{}, u2)
	u1, err := api.DeviceGetUUIDv1(dev)
	require.NoError(t, err)
	bus, err := api.DeviceGetPCIBusID(dev)
	require.NoError(t, err)
	require.Regexp(t, regexp.MustCompile(`^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$`), bus)
	sms, err := api.DeviceGetAttribute(cuda.AttrMultiprocessorCount, dev)
	require.NoError(t, err)
	require.Positive(t, sms)
	major, err := api.DeviceGetAttribute(cuda.AttrComputeCapabilityMajor, dev)
	require.NoError(t, err)
	uva, err := api.DeviceGetAttribute(cuda.AttrUnifiedAddressing, dev)
	require.NoError(t, err)
	total, err := api.DeviceTotalMem(dev)
	require.NoError(t, err)
	free, total2, err := api.MemGetInfo()
	require.NoError(t, err)
	require.Equal(t, total, total2)
	require.LessOrEqual(t, free, total)
	_, err = api.DeviceGetAttribute(cuda.DeviceAttribute(100000), dev)
	require.ErrorIs(t, err, cuda.ErrInvalidValue)
	t.Logf("driver %d, %q, uuid(v2) %s uuid(v1) %s, bus %s, %d SMs, cc %d.x, UVA %d, %d MiB (%d MiB free)",
		v, name, u2.String("GPU"), u1.String("GPU"), bus, sms, major, uva, total>>20, free>>20)
}

func TestGPUMemoryCopiesAndEvents(t *testing.T) {
	api, _ := openGPU(t)
	const n = 64 << 20
	p, err := api.MemAlloc(n)
	require.NoError(t, err)
	defer func() { require.NoError(t, api.MemFree(p)) }()
	require.NoError(t, api.MemsetD8(p, 0x5a, n))
	host := hostArena(t, 2*n)
	in, out := host[:n], host[n:]
	require.NoError(t, api.MemcpyDtoH(unsafe.Pointer(&out[0]), p, n))
	require.Equal(t, byte(0x5a), out[0])
	require.Equal(t, byte(0x5a), out[n-1])

	hp := unsafe.Pointer(&host[0])
	require.NoError(t, api.MemHostRegister(hp, 2*n, cuda.HostRegisterPortable|cuda.HostRegisterDeviceMap))
	defer func() { require.NoError(t, api.MemHostUnregister(hp)) }()
	require.ErrorIs(t, api.MemHostRegister(unsafe.Pointer(&host[4096]), 4096, cuda.HostRegisterPortable), cuda.ErrHostMemoryAlreadyRegistered)
	other := hostArena(t, 4096)
	require.ErrorIs(t, api.MemHostUnregister(unsafe.Pointer(&other[0])), cuda.ErrHostMemoryNotRegistered)
	dp, err := api.MemHostGetDevicePointer(hp, 0)
	require.NoError(t, err)
	require.NotZero(t, dp)
	t.Logf("registered host %p maps to device %#x", hp, uint64(dp))

	for i := 0; i < n; i += 8 {
		binary.LittleEndian.PutUint64(in[i:], uint64(i)*0x9e3779b97f4a7c15)
	}
	s1, err := api.StreamCreate(cuda.StreamNonBlocking)
	require.NoError(t, err)
	s2, err := api.StreamCreate(cuda.StreamNonBlocking)
	require.NoError(t, err)
	ev, err := api.EventCreate(cuda.EventDisableTiming)
	require.NoError(t, err)
	start := time.Now()
	require.NoError(t, api.MemcpyHtoDAsync(p, unsafe.Pointer(&in[0]), n, s1))
	require.NoError(t, api.EventRecord(ev, s1))
	require.NoError(t, api.StreamWaitEvent(s2, ev, 0))
	require.NoError(t, api.MemcpyDtoHAsync(unsafe.Pointer(&out[0]), p, n, s2))
	err = api.StreamQuery(s2)
	require.True(t, err == nil || err == cuda.ErrNotReady, "%v", err)
	require.NoError(t, api.StreamSynchronize(s2))
	elapsed := time.Since(start)
	require.NoError(t, api.EventQuery(ev))
	require.NoError(t, api.EventSynchronize(ev))
	require.True(t, bytes.Equal(in, out), "round trip through the device differs")
	t.Logf("64 MiB H2D then D2H (ordered by an event across streams): %v, %.1f GB/s each way", elapsed, 2*n/elapsed.Seconds()/1e9)

	require.NoError(t, api.MemsetD8Async(p, 1, 16, s1))
	require.NoError(t, api.MemcpyDtoDAsync(p+16, p, 16, s1))
	require.NoError(t, api.StreamSynchronize(s1))
	require.NoError(t, api.MemcpyDtoH(unsafe.Pointer(&out[0]), p+16, 16))
	require.Equal(t, bytes.Repeat([]byte{1}, 16), out[:16])
	require.NoError(t, api.CtxSynchronize())

	require.NoError(t, api.EventDestroy(ev))
	require.NoError(t, api.StreamDestroy(s1))
	require.NoError(t, api.StreamDestroy(s2))
	err = api.MemFree(cuda.DevicePtr(0x10))
	require.Error(t, err)
	var r cuda.Result
	require.ErrorAs(t, err, &r)
	t.Logf("freeing a bogus pointer: %v", err)
}

func TestGPUIPCHandles(t *testing.T) {
	api, dev := openGPU(t)
	p, err := api.MemAlloc(1 << 20)
	require.NoError(t, err)
	defer func() { require.NoError(t, api.MemFree(p)) }()
	h, err := api.IPCGetMemHandle(p)
	require.NoError(t, err)
	require.NotEqual(t, cuda.IPCMemHandle{}, h)
	_, err = api.IPCOpenMemHandle(h, cuda.IPCMemLazyEnablePeerAccess)
	require.Error(t, err, "a process cannot open its own IPC handle")
	t.Logf("opening our own IPC handle: %v", err)
	ev, err := api.EventCreate(cuda.EventInterprocess | cuda.EventDisableTiming)
	require.NoError(t, err)
	eh, err := api.IPCGetEventHandle(ev)
	require.NoError(t, err)
	require.NotEqual(t, cuda.IPCEventHandle{}, eh)
	require.NoError(t, api.EventDestroy(ev))
	ok, err := api.DeviceCanAccessPeer(dev, dev)
	t.Logf("can access peer (self): %v %v", ok, err)
}

func TestGPUKernelLaunch(t *testing.T) {
	api, _ := openGPU(t)
	m, err := api.ModuleLoadData(ptx(t))
	require.NoError(t, err)
	defer func() { require.NoError(t, api.ModuleUnload(m)) }()
	_, err = api.ModuleGetFunction(m, "no_such_kernel")
	require.ErrorIs(t, err, cuda.ErrNotFound)
	sum, err := api.ModuleGetFunction(m, "mig_reduce_sum_f32")
	require.NoError(t, err)
	scale, err := api.ModuleGetFunction(m, "mig_scale_f32")
	require.NoError(t, err)

	const n = 1<<20 + 5 // odd: exercises the scalar tail
	const nb = 4 * n
	slot := (nb + 4095) &^ 4095
	host := hostArena(t, 4*slot)
	hp := unsafe.Pointer(&host[0])
	require.NoError(t, api.MemHostRegister(hp, uint64(len(host)), cuda.HostRegisterPortable|cuda.HostRegisterDeviceMap))
	defer func() { require.NoError(t, api.MemHostUnregister(hp)) }()
	base, err := api.MemHostGetDevicePointer(hp, 0)
	require.NoError(t, err)
	var srcs [64]byte
	for j := 0; j < 3; j++ {
		for i := 0; i < n; i++ {
			binary.LittleEndian.PutUint32(host[j*slot+4*i:], math.Float32bits(float32(j+1)))
		}
		binary.LittleEndian.PutUint64(srcs[8*j:], uint64(base)+uint64(j*slot))
	}
	dst, err := api.MemAlloc(nb)
	require.NoError(t, err)
	defer func() { require.NoError(t, api.MemFree(dst)) }()
	out := host[3*slot : 3*slot+nb]
	for i := 0; i < n; i++ {
		binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(1))
	}
	require.NoError(t, api.MemcpyHtoD(dst, unsafe.Pointer(&out[0]), nb))
	s, err := api.StreamCreate(cuda.StreamNonBlocking)
	require.NoError(t, err)
	defer func() { require.NoError(t, api.StreamDestroy(s)) }()

	var args cuda.Args
	args.Ptr(dst).Bytes(srcs[:], 8).Int32(3).Uint64(n)
	grid, block := cuda.Dim3{X: 1056, Y: 1, Z: 1}, cuda.Dim3{X: 256, Y: 1, Z: 1}
	require.NoError(t, api.LaunchKernel(sum, grid, block, 0, s, &args))
	args.Reset()
	args.Ptr(dst).Uint64(n).Int64(7)
	require.NoError(t, api.LaunchKernel(scale, grid, block, 0, s, &args))
	require.NoError(t, api.StreamSynchronize(s))
	require.NoError(t, api.MemcpyDtoH(unsafe.Pointer(&out[0]), dst, nb))
	wrong := 0
	for i := 0; i < n; i++ {
		if math.Float32frombits(binary.LittleEndian.Uint32(out[4*i:])) != 1 { // (1+1+2+3)/7
			wrong++
		}
	}
	require.Zero(t, wrong, "elements wrong")

	var bad cuda.Args
	bad.Ptr(dst)
	for i := 0; i < cuda.MaxArgs; i++ {
		bad.Uint32(0)
	}
	require.ErrorIs(t, api.LaunchKernel(sum, grid, block, 0, s, &bad), cuda.ErrInvalidValue)
	args.Reset()
	args.Ptr(dst).Uint64(n).Int64(7)
	require.ErrorIs(t, api.LaunchKernel(scale, grid, cuda.Dim3{X: 4096, Y: 1, Z: 1}, 0, s, &args), cuda.ErrInvalidValue,
		"more than 1024 threads per block")
}

// TestDriverStreamMemOps: on the GPU, a stream waits for a word of mapped
// host memory that the CPU writes, and another stream's write lands in host
// memory after the copy queued before it.
func TestDriverStreamMemOps(t *testing.T) {
	api, _ := openGPU(t)
	host := hostArena(t, 4096)
	hp := unsafe.Pointer(&host[0])
	require.NoError(t, api.MemHostRegister(hp, 4096, cuda.HostRegisterPortable|cuda.HostRegisterDeviceMap))
	defer func() { require.NoError(t, api.MemHostUnregister(hp)) }()
	base, err := api.MemHostGetDevicePointer(hp, 0)
	require.NoError(t, err)
	flag := (*uint64)(hp)
	p, err := api.MemAlloc(64)
	require.NoError(t, err)
	defer func() { require.NoError(t, api.MemFree(p)) }()
	require.NoError(t, api.MemsetD8(p, 0x11, 64))
	s, err := api.StreamCreate(cuda.StreamNonBlocking)
	require.NoError(t, err)
	defer func() { require.NoError(t, api.StreamDestroy(s)) }()

	// Wait for flag >= 3, then copy 64 bytes to host[64:], then write 7 to word 1.
	require.NoError(t, api.StreamWaitValue64(s, base, 3, cuda.StreamWaitValueGEQ))
	require.NoError(t, api.MemcpyDtoHAsync(unsafe.Pointer(&host[64]), p, 64, s))
	require.NoError(t, api.StreamWriteValue64(s, base+8, 7, cuda.StreamWriteValueDefault))
	time.Sleep(20 * time.Millisecond)
	require.ErrorIs(t, api.StreamQuery(s), cuda.ErrNotReady, "the stream waits for the flag")
	require.Zero(t, host[64])
	atomicStore(flag, 2)
	time.Sleep(5 * time.Millisecond)
	require.ErrorIs(t, api.StreamQuery(s), cuda.ErrNotReady, "2 < 3")
	start := time.Now()
	atomicStore(flag, 3)
	require.NoError(t, api.StreamSynchronize(s))
	t.Logf("released %v after the CPU's store", time.Since(start))
	require.Equal(t, byte(0x11), host[64])
	require.Equal(t, byte(0x11), host[127])
	require.Equal(t, uint64(7), binary.LittleEndian.Uint64(host[8:]))
}

func atomicStore(p *uint64, v uint64) { (*atomic.Uint64)(unsafe.Pointer(p)).Store(v) }
