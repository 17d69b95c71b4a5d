package cuda_test

import (
	"encoding/binary"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/internal/cuda"
)

// onThread locks the test goroutine to its OS thread and makes the fake's
// first device's primary context current there.
func onThread(t *testing.T, f *cuda.Fake) cuda.Context {
	t.Helper()
	runtime.LockOSThread()
	t.Cleanup(runtime.UnlockOSThread)
	require.NoError(t, f.Init(0))
	c, err := f.DevicePrimaryCtxRetain(0)
	require.NoError(t, err)
	require.NoError(t, f.CtxSetCurrent(c))
	return c
}

func TestFakeNeedsInitAndContext(t *testing.T) {
	f := cuda.NewFake()
	_, err := f.DeviceGetCount()
	require.ErrorIs(t, err, cuda.ErrNotInitialized)
	require.ErrorIs(t, f.Init(1), cuda.ErrInvalidValue)
	require.NoError(t, f.Init(0))
	n, err := f.DeviceGetCount()
	require.NoError(t, err)
	require.Equal(t, 1, n)
	_, err = f.DeviceGet(1)
	require.ErrorIs(t, err, cuda.ErrInvalidDevice)

	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	_, err = f.MemAlloc(16)
	require.ErrorIs(t, err, cuda.ErrInvalidContext, "no context current on this thread")
	c, err := f.DevicePrimaryCtxRetain(0)
	require.NoError(t, err)
	require.NoError(t, f.CtxSetCurrent(c))
	require.Equal(t, c, f.Current())
	p, err := f.MemAlloc(16)
	require.NoError(t, err)

	// Another OS thread does not have the context.
	done := make(chan error)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		done <- f.MemFree(p)
	}()
	require.ErrorIs(t, <-done, cuda.ErrInvalidContext)
	require.NoError(t, f.MemFree(p))
	require.ErrorIs(t, f.MemFree(p), cuda.ErrInvalidValue, "double free")
	require.NoError(t, f.DevicePrimaryCtxRelease(0))
	_, err = f.MemAlloc(16)
	require.ErrorIs(t, err, cuda.ErrInvalidContext, "released context")
}

func TestFakeMemoryAndCopies(t *testing.T) {
	f := cuda.NewFake()
	onThread(t, f)
	p, err := f.MemAlloc(1024)
	require.NoError(t, err)
	require.GreaterOrEqual(t, uint64(p), uint64(0x8000_0000_0000), "device addresses never collide with host ones")
	require.NoError(t, f.MemsetD8(p, 7, 1024))
	out := make([]byte, 1024)
	require.NoError(t, f.MemcpyDtoH(unsafe.Pointer(&out[0]), p, 1024))
	for i := range out {
		require.Equal(t, byte(7), out[i])
	}
	in := make([]byte, 100)
	for i := range in {
		in[i] = byte(i)
	}
	require.NoError(t, f.MemcpyHtoD(p+10, unsafe.Pointer(&in[0]), 100))
	b, err := f.Memory(p+10, 100)
	require.NoError(t, err)
	require.Equal(t, in, b)
	_, err = f.Memory(p+1000, 100)
	require.ErrorIs(t, err, cuda.ErrIllegalAddress)

	// Registered, mapped host memory has a device address the kernels can use.
	host := make([]byte, 4096)
	hp := unsafe.Pointer(&host[0])
	_, err = f.MemHostGetDevicePointer(hp, 0)
	require.ErrorIs(t, err, cuda.ErrInvalidValue, "not registered yet")
	require.NoError(t, f.MemHostRegister(hp, 4096, cuda.HostRegisterPortable|cuda.HostRegisterDeviceMap))
	require.ErrorIs(t, f.MemHostRegister(unsafe.Pointer(&host[100]), 10, 0), cuda.ErrHostMemoryAlreadyRegistered)
	dp, err := f.MemHostGetDevicePointer(unsafe.Pointer(&host[8]), 0)
	require.NoError(t, err)
	host[8] = 42
	hb, err := f.Memory(dp, 1)
	require.NoError(t, err)
	require.Equal(t, byte(42), hb[0])
	require.NoError(t, f.MemHostUnregister(hp))
	require.ErrorIs(t, f.MemHostUnregister(hp), cuda.ErrHostMemoryNotRegistered)
	_, err = f.Memory(dp, 1)
	require.ErrorIs(t, err, cuda.ErrIllegalAddress)
}

func TestFakeStreamsEventsAndKernels(t *testing.T) {
	f := cuda.NewFake()
	onThread(t, f)
	// A kernel adding 1 to n bytes at p (parameters: void*, unsigned long long).
	f.AddKernel("inc", func(mem cuda.FakeMemory, _, _ cuda.Dim3, a *cuda.Args) error {
		b, err := mem.Memory(cuda.DevicePtr(binary.LittleEndian.Uint64(a.Param(0))), binary.LittleEndian.Uint64(a.Param(1)))
		if err != nil {
			return err
		}
		for i := range b {
			b[i]++
		}
		return nil
	})
	m, err := f.ModuleLoadData([]byte("ptx"))
	require.NoError(t, err)
	_, err = f.ModuleGetFunction(m, "nope")
	require.ErrorIs(t, err, cuda.ErrNotFound)
	inc, err := f.ModuleGetFunction(m, "inc")
	require.NoError(t, err)

	s1, err := f.StreamCreate(cuda.StreamNonBlocking)
	require.NoError(t, err)
	s2, err := f.StreamCreate(cuda.StreamNonBlocking)
	require.NoError(t, err)
	ev, err := f.EventCreate(cuda.EventDisableTiming)
	require.NoError(t, err)
	require.NoError(t, f.EventQuery(ev), "a never-recorded event is complete")
	p, err := f.MemAlloc(64)
	require.NoError(t, err)
	host := make([]byte, 64)

	f.Hold()
	var args cuda.Args
	args.Ptr(p).Uint64(64)
	require.NoError(t, f.MemsetD8Async(p, 1, 64, s1))
	require.NoError(t, f.LaunchKernel(inc, cuda.Dim3{X: 1, Y: 1, Z: 1}, cuda.Dim3{X: 64, Y: 1, Z: 1}, 0, s1, &args))
	args.Reset() // the launch copied the parameters
	require.NoError(t, f.EventRecord(ev, s1))
	require.NoError(t, f.StreamWaitEvent(s2, ev, 0))
	require.NoError(t, f.MemcpyDtoHAsync(unsafe.Pointer(&host[0]), p, 64, s2))
	require.ErrorIs(t, f.EventQuery(ev), cuda.ErrNotReady)
	require.ErrorIs(t, f.StreamQuery(s2), cuda.ErrNotReady)
	time.Sleep(5 * time.Millisecond)
	require.Equal(t, byte(0), host[0], "held: nothing ran")
	f.Release()
	require.NoError(t, f.StreamSynchronize(s2))
	require.NoError(t, f.EventSynchronize(ev))
	for i := range host {
		require.Equal(t, byte(2), host[i], "s2 copied after s1's memset and kernel")
	}
	require.Equal(t, 1, f.Calls("LaunchKernel"))

	var bad cuda.Args
	bad.Ptr(p).Uint64(64)
	require.ErrorIs(t, f.LaunchKernel(inc, cuda.Dim3{X: 1, Y: 1, Z: 1}, cuda.Dim3{X: 2048, Y: 1, Z: 1}, 0, s1, &bad), cuda.ErrInvalidValue)
	// An out-of-bounds kernel fails asynchronously and the error sticks.
	bad.Reset()
	bad.Ptr(p).Uint64(65)
	require.NoError(t, f.LaunchKernel(inc, cuda.Dim3{X: 1, Y: 1, Z: 1}, cuda.Dim3{X: 1, Y: 1, Z: 1}, 0, s1, &bad))
	require.ErrorIs(t, f.StreamSynchronize(s1), cuda.ErrIllegalAddress)
	require.ErrorIs(t, f.EventRecord(ev, s2), cuda.ErrIllegalAddress)

	require.NoError(t, f.StreamDestroy(s1))
	require.ErrorIs(t, f.StreamQuery(s1), cuda.ErrInvalidHandle)
	require.NoError(t, f.EventDestroy(ev))
	require.NoError(t, f.ModuleUnload(m))
}

func TestFakeIPCBetweenTwoProcesses(t *testing.T) {
	a, b := cuda.NewFake(), cuda.NewFake()
	onThread(t, a)
	cb, err := func() (cuda.Context, error) {
		require.NoError(t, b.Init(0))
		return b.DevicePrimaryCtxRetain(0)
	}()
	require.NoError(t, err)
	require.NoError(t, b.CtxSetCurrent(cb)) // same locked thread, b's table

	p, err := a.MemAlloc(32)
	require.NoError(t, err)
	src := []byte("thirty-two bytes of device data!")
	require.NoError(t, a.MemcpyHtoD(p, unsafe.Pointer(&src[0]), 32))
	h, err := a.IPCGetMemHandle(p)
	require.NoError(t, err)
	_, err = a.IPCOpenMemHandle(h, cuda.IPCMemLazyEnablePeerAccess)
	require.ErrorIs(t, err, cuda.ErrInvalidContext, "own handle")
	q, err := b.IPCOpenMemHandle(h, cuda.IPCMemLazyEnablePeerAccess)
	require.NoError(t, err)
	out := make([]byte, 32)
	require.NoError(t, b.MemcpyDtoH(unsafe.Pointer(&out[0]), q, 32))
	require.Equal(t, src, out)
	require.NoError(t, b.IPCCloseMemHandle(q))

	plain, err := a.EventCreate(cuda.EventDisableTiming)
	require.NoError(t, err)
	_, err = a.IPCGetEventHandle(plain)
	require.ErrorIs(t, err, cuda.ErrInvalidValue, "not interprocess")
	_, err = a.EventCreate(cuda.EventInterprocess)
	require.ErrorIs(t, err, cuda.ErrInvalidValue, "interprocess needs disable-timing")
	shared, err := a.EventCreate(cuda.EventInterprocess | cuda.EventDisableTiming)
	require.NoError(t, err)
	eh, err := a.IPCGetEventHandle(shared)
	require.NoError(t, err)
	peerEv, err := b.IPCOpenEventHandle(eh)
	require.NoError(t, err)
	sa, err := a.StreamCreate(cuda.StreamNonBlocking)
	require.NoError(t, err)
	a.Hold()
	require.NoError(t, a.EventRecord(shared, sa))
	require.ErrorIs(t, b.EventQuery(peerEv), cuda.ErrNotReady, "b sees a's pending recording")
	a.Release()
	require.NoError(t, b.EventSynchronize(peerEv))
	require.NoError(t, b.EventQuery(peerEv))
}

// TestFakeStreamMemOps: a wait on a word of registered host memory holds
// the stream's later work until another stream (or the CPU) writes a value
// that passes its test; the write lands after the work queued before it.
func TestFakeStreamMemOps(t *testing.T) {
	f := cuda.NewFake()
	onThread(t, f)
	words := make([]uint64, 512) // 4 KiB of host memory: word 0 is the flag, word 8 a copy target
	hostMem := unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), len(words)*8)
	hp := unsafe.Pointer(&hostMem[0])
	require.NoError(t, f.MemHostRegister(hp, uint64(len(hostMem)), cuda.HostRegisterDeviceMap))
	flag, err := f.MemHostGetDevicePointer(hp, 0)
	require.NoError(t, err)
	waiter, err := f.StreamCreate(cuda.StreamNonBlocking)
	require.NoError(t, err)
	writer, err := f.StreamCreate(cuda.StreamNonBlocking)
	require.NoError(t, err)
	p, err := f.MemAlloc(8)
	require.NoError(t, err)

	// The waiter copies device memory to word 8 once the flag reaches 5.
	require.NoError(t, f.MemsetD8(p, 7, 8))
	require.NoError(t, f.StreamWaitValue64(waiter, flag, 5, cuda.StreamWaitValueGEQ))
	require.NoError(t, f.MemcpyDtoHAsync(unsafe.Pointer(&words[8]), p, 8, waiter))
	// The writer stores 4 (not enough), then 9 after a memset of p to 3.
	require.NoError(t, f.StreamWriteValue64(writer, flag, 4, cuda.StreamWriteValueDefault))
	require.NoError(t, f.StreamSynchronize(writer))
	time.Sleep(5 * time.Millisecond)
	require.ErrorIs(t, f.StreamQuery(waiter), cuda.ErrNotReady, "4 < 5: still waiting")
	require.Zero(t, words[8])
	require.NoError(t, f.MemsetD8Async(p, 3, 8, writer))
	require.NoError(t, f.StreamWriteValue64(writer, flag, 9, cuda.StreamWriteValueDefault))
	require.NoError(t, f.StreamSynchronize(waiter))
	require.Equal(t, uint64(0x0303030303030303), words[8], "the copy ran after the write, which ran after the memset")
	require.Equal(t, uint64(9), words[0])

	// EQ waits for that exact value; a word outside known memory, a
	// misaligned one and unknown flags are refused at once.
	require.NoError(t, f.StreamWaitValue64(waiter, flag, 9, cuda.StreamWaitValueEQ))
	require.NoError(t, f.StreamSynchronize(waiter))
	require.ErrorIs(t, f.StreamWaitValue64(waiter, flag+4, 1, cuda.StreamWaitValueGEQ), cuda.ErrInvalidValue)
	require.ErrorIs(t, f.StreamWriteValue64(writer, 0x10, 1, cuda.StreamWriteValueDefault), cuda.ErrIllegalAddress)
	require.ErrorIs(t, f.StreamWaitValue64(waiter, flag, 1, 0x40), cuda.ErrInvalidValue)
	require.ErrorIs(t, f.StreamWriteValue64(writer, flag, 1, 0x1), cuda.ErrInvalidValue)

	// A wait nobody satisfies ends when its stream is destroyed (the fake's
	// escape hatch, so a failed test cannot hang).
	require.NoError(t, f.StreamWaitValue64(waiter, flag, 100, cuda.StreamWaitValueGEQ))
	require.NoError(t, f.StreamDestroy(waiter))
	require.NoError(t, f.StreamDestroy(writer))
	require.NoError(t, f.MemHostUnregister(hp))
}
