//go:build cgo

package cuda

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>

// Our own declarations of the driver ABI (cuda.h is not needed): CUresult
// is int, CUdevice int, CUdeviceptr unsigned long long, every other handle a
// pointer. Handles cross into Go as uintptr_t.
typedef int CUresult;
typedef struct { char reserved[64]; } mig_ipc64;
typedef struct { char bytes[16]; } mig_uuid;

#define MIG_MISSING (-1)

static void *mig_lib;

static CUresult (*p_cuInit)(unsigned int);
static CUresult (*p_cuDriverGetVersion)(int *);
static CUresult (*p_cuDeviceGetCount)(int *);
static CUresult (*p_cuDeviceGet)(int *, int);
static CUresult (*p_cuDeviceGetName)(char *, int, int);
static CUresult (*p_cuDeviceGetUuid_v2)(mig_uuid *, int);
static CUresult (*p_cuDeviceGetUuid)(mig_uuid *, int);
static CUresult (*p_cuDeviceGetPCIBusId)(char *, int, int);
static CUresult (*p_cuDeviceGetAttribute)(int *, int, int);
static CUresult (*p_cuDeviceTotalMem_v2)(size_t *, int);
static CUresult (*p_cuDeviceCanAccessPeer)(int *, int, int);
static CUresult (*p_cuDevicePrimaryCtxRetain)(void **, int);
static CUresult (*p_cuDevicePrimaryCtxRelease_v2)(int);
static CUresult (*p_cuCtxSetCurrent)(void *);
static CUresult (*p_cuCtxGetCurrent)(void **);
static CUresult (*p_cuCtxSynchronize)(void);
static CUresult (*p_cuMemAlloc_v2)(unsigned long long *, size_t);
static CUresult (*p_cuMemFree_v2)(unsigned long long);
static CUresult (*p_cuMemGetInfo_v2)(size_t *, size_t *);
static CUresult (*p_cuMemsetD8_v2)(unsigned long long, unsigned char, size_t);
static CUresult (*p_cuMemsetD8Async)(unsigned long long, unsigned char, size_t, void *);
static CUresult (*p_cuMemHostRegister_v2)(void *, size_t, unsigned int);
static CUresult (*p_cuMemHostUnregister)(void *);
static CUresult (*p_cuMemHostGetDevicePointer_v2)(unsigned long long *, void *, unsigned int);
static CUresult (*p_cuMemcpyHtoD_v2)(unsigned long long, const void *, size_t);
static CUresult (*p_cuMemcpyDtoH_v2)(void *, unsigned long long, size_t);
static CUresult (*p_cuMemcpyHtoDAsync_v2)(unsigned long long, const void *, size_t, void *);
static CUresult (*p_cuMemcpyDtoHAsync_v2)(void *, unsigned long long, size_t, void *);
static CUresult (*p_cuMemcpyDtoDAsync_v2)(unsigned long long, unsigned long long, size_t, void *);
// CUDA_MEMCPY2D, field for field (memory types: 1 host, 2 device).
typedef struct {
	size_t srcXInBytes, srcY; int srcMemoryType; const void *srcHost; unsigned long long srcDevice; void *srcArray; size_t srcPitch;
	size_t dstXInBytes, dstY; int dstMemoryType; void *dstHost; unsigned long long dstDevice; void *dstArray; size_t dstPitch;
	size_t WidthInBytes, Height;
} mig_memcpy2d;
static CUresult (*p_cuMemcpy2DAsync_v2)(const mig_memcpy2d *, void *);
static CUresult (*p_cuStreamCreate)(void **, unsigned int);
static CUresult (*p_cuStreamDestroy_v2)(void *);
static CUresult (*p_cuStreamQuery)(void *);
static CUresult (*p_cuStreamSynchronize)(void *);
static CUresult (*p_cuStreamWaitEvent)(void *, void *, unsigned int);
static CUresult (*p_cuStreamWaitValue64_v2)(void *, unsigned long long, unsigned long long, unsigned int);
static CUresult (*p_cuStreamWriteValue64_v2)(void *, unsigned long long, unsigned long long, unsigned int);
static CUresult (*p_cuEventCreate)(void **, unsigned int);
static CUresult (*p_cuEventDestroy_v2)(void *);
static CUresult (*p_cuEventRecord)(void *, void *);
static CUresult (*p_cuEventQuery)(void *);
static CUresult (*p_cuEventSynchronize)(void *);
static CUresult (*p_cuIpcGetMemHandle)(mig_ipc64 *, unsigned long long);
static CUresult (*p_cuIpcOpenMemHandle_v2)(unsigned long long *, mig_ipc64, unsigned int);
static CUresult (*p_cuIpcCloseMemHandle)(unsigned long long);
static CUresult (*p_cuIpcGetEventHandle)(mig_ipc64 *, void *);
static CUresult (*p_cuIpcOpenEventHandle)(void **, mig_ipc64);
static CUresult (*p_cuModuleLoadData)(void **, const void *);
static CUresult (*p_cuModuleUnload)(void *);
static CUresult (*p_cuModuleGetFunction)(void **, void *, const char *);
static CUresult (*p_cuLaunchKernel)(void *, unsigned int, unsigned int, unsigned int,
	unsigned int, unsigned int, unsigned int, unsigned int, void *, void **, void **);

#define SYM(name) *(void **)(&p_##name) = dlsym(mig_lib, #name)

// mig_open loads libcuda and resolves every entry point; 0 on success.
static int mig_open(const char *path) {
	mig_lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!mig_lib) return 1;
	SYM(cuInit); SYM(cuDriverGetVersion); SYM(cuDeviceGetCount); SYM(cuDeviceGet);
	SYM(cuDeviceGetName); SYM(cuDeviceGetUuid_v2); SYM(cuDeviceGetUuid);
	SYM(cuDeviceGetPCIBusId); SYM(cuDeviceGetAttribute); SYM(cuDeviceTotalMem_v2);
	SYM(cuDeviceCanAccessPeer); SYM(cuDevicePrimaryCtxRetain); SYM(cuDevicePrimaryCtxRelease_v2);
	SYM(cuCtxSetCurrent); SYM(cuCtxGetCurrent); SYM(cuCtxSynchronize);
	SYM(cuMemAlloc_v2); SYM(cuMemFree_v2); SYM(cuMemGetInfo_v2); SYM(cuMemsetD8_v2); SYM(cuMemsetD8Async);
	SYM(cuMemHostRegister_v2); SYM(cuMemHostUnregister); SYM(cuMemHostGetDevicePointer_v2);
	SYM(cuMemcpyHtoD_v2); SYM(cuMemcpyDtoH_v2); SYM(cuMemcpyHtoDAsync_v2); SYM(cuMemcpyDtoHAsync_v2);
	SYM(cuMemcpyDtoDAsync_v2); SYM(cuMemcpy2DAsync_v2); SYM(cuStreamCreate); SYM(cuStreamDestroy_v2); SYM(cuStreamQuery);
	SYM(cuStreamSynchronize); SYM(cuStreamWaitEvent); SYM(cuStreamWaitValue64_v2); SYM(cuStreamWriteValue64_v2); SYM(cuEventCreate); SYM(cuEventDestroy_v2);
	SYM(cuEventRecord); SYM(cuEventQuery); SYM(cuEventSynchronize); SYM(cuIpcGetMemHandle);
	SYM(cuIpcOpenMemHandle_v2); SYM(cuIpcCloseMemHandle); SYM(cuIpcGetEventHandle);
	SYM(cuIpcOpenEventHandle); SYM(cuModuleLoadData); SYM(cuModuleUnload); SYM(cuModuleGetFunction);
	SYM(cuLaunchKernel);
	return 0;
}

#define P(x) ((void *)(x))
#define CALL(name, ...) (p_##name ? p_##name(__VA_ARGS__) : MIG_MISSING)

static int w_init(unsigned int f) { return CALL(cuInit, f); }
static int w_driverVersion(int *v) { return CALL(cuDriverGetVersion, v); }
static int w_deviceCount(int *n) { return CALL(cuDeviceGetCount, n); }
static int w_deviceGet(int *d, int o) { return CALL(cuDeviceGet, d, o); }
static int w_deviceName(char *b, int n, int d) { return CALL(cuDeviceGetName, b, n, d); }
static int w_deviceUUID(void *u, int d) { return CALL(cuDeviceGetUuid_v2, (mig_uuid *)u, d); }
static int w_deviceUUIDv1(void *u, int d) { return CALL(cuDeviceGetUuid, (mig_uuid *)u, d); }
static int w_deviceBusID(char *b, int n, int d) { return CALL(cuDeviceGetPCIBusId, b, n, d); }
static int w_deviceAttr(int *v, int a, int d) { return CALL(cuDeviceGetAttribute, v, a, d); }
static int w_deviceTotalMem(size_t *v, int d) { return CALL(cuDeviceTotalMem_v2, v, d); }
static int w_canAccessPeer(int *v, int d, int p) { return CALL(cuDeviceCanAccessPeer, v, d, p); }
static int w_primaryRetain(uintptr_t *c, int d) { void *x = 0; int r = CALL(cuDevicePrimaryCtxRetain, &x, d); *c = (uintptr_t)x; return r; }
static int w_primaryRelease(int d) { return CALL(cuDevicePrimaryCtxRelease_v2, d); }
static int w_ctxSetCurrent(uintptr_t c) { return CALL(cuCtxSetCurrent, P(c)); }
static int w_ctxGetCurrent(uintptr_t *c) { void *x = 0; int r = CALL(cuCtxGetCurrent, &x); *c = (uintptr_t)x; return r; }
static int w_ctxSynchronize(void) { return p_cuCtxSynchronize ? p_cuCtxSynchronize() : MIG_MISSING; }
static int w_memAlloc(unsigned long long *p, size_t n) { return CALL(cuMemAlloc_v2, p, n); }
static int w_memFree(unsigned long long p) { return CALL(cuMemFree_v2, p); }
static int w_memInfo(size_t *f, size_t *t) { return CALL(cuMemGetInfo_v2, f, t); }
static int w_memsetD8(unsigned long long p, unsigned char v, size_t n) { return CALL(cuMemsetD8_v2, p, v, n); }
static int w_memsetD8Async(unsigned long long p, unsigned char v, size_t n, uintptr_t s) { return CALL(cuMemsetD8Async, p, v, n, P(s)); }
static int w_hostRegister(void *p, size_t n, unsigned int f) { return CALL(cuMemHostRegister_v2, p, n, f); }
static int w_hostUnregister(void *p) { return CALL(cuMemHostUnregister, p); }
static int w_hostDevPtr(unsigned long long *d, void *p, unsigned int f) { return CALL(cuMemHostGetDevicePointer_v2, d, p, f); }
static int w_htod(unsigned long long d, void *s, size_t n) { return CALL(cuMemcpyHtoD_v2, d, s, n); }
static int w_dtoh(void *d, unsigned long long s, size_t n) { return CALL(cuMemcpyDtoH_v2, d, s, n); }
static int w_htodAsync(unsigned long long d, void *s, size_t n, uintptr_t st) { return CALL(cuMemcpyHtoDAsync_v2, d, s, n, P(st)); }
static int w_dtohAsync(void *d, unsigned long long s, size_t n, uintptr_t st) { return CALL(cuMemcpyDtoHAsync_v2, d, s, n, P(st)); }
static int w_dtodAsync(unsigned long long d, unsigned long long s, size_t n, uintptr_t st) { return CALL(cuMemcpyDtoDAsync_v2, d, s, n, P(st)); }
static int w_htod2dAsync(unsigned long long d, size_t dp, const void *s, size_t sp, size_t w, size_t h, uintptr_t st) {
	mig_memcpy2d c;
	memset(&c, 0, sizeof c);
	c.srcMemoryType = 1; c.srcHost = s; c.srcPitch = sp;
	c.dstMemoryType = 2; c.dstDevice = d; c.dstPitch = dp;
	c.WidthInBytes = w; c.Height = h;
	return CALL(cuMemcpy2DAsync_v2, &c, P(st));
}
static int w_streamCreate(uintptr_t *s, unsigned int f) { void *x = 0; int r = CALL(cuStreamCreate, &x, f); *s = (uintptr_t)x; return r; }
static int w_streamDestroy(uintptr_t s) { return CALL(cuStreamDestroy_v2, P(s)); }
static int w_streamQuery(uintptr_t s) { return CALL(cuStreamQuery, P(s)); }
static int w_streamSync(uintptr_t s) { return CALL(cuStreamSynchronize, P(s)); }
static int w_streamWaitEvent(uintptr_t s, uintptr_t e, unsigned int f) { return CALL(cuStreamWaitEvent, P(s), P(e), f); }
static int w_streamWaitValue64(uintptr_t s, unsigned long long a, unsigned long long v, unsigned int f) { return CALL(cuStreamWaitValue64_v2, P(s), a, v, f); }
static int w_streamWriteValue64(uintptr_t s, unsigned long long a, unsigned long long v, unsigned int f) { return CALL(cuStreamWriteValue64_v2, P(s), a, v, f); }
static int w_eventCreate(uintptr_t *e, unsigned int f) { void *x = 0; int r = CALL(cuEventCreate, &x, f); *e = (uintptr_t)x; return r; }
static int w_eventDestroy(uintptr_t e) { return CALL(cuEventDestroy_v2, P(e)); }
static int w_eventRecord(uintptr_t e, uintptr_t s) { return CALL(cuEventRecord, P(e), P(s)); }
static int w_eventQuery(uintptr_t e) { return CALL(cuEventQuery, P(e)); }
static int w_eventSync(uintptr_t e) { return CALL(cuEventSynchronize, P(e)); }
static int w_ipcGetMem(void *h, unsigned long long p) { return CALL(cuIpcGetMemHandle, (mig_ipc64 *)h, p); }
static int w_ipcOpenMem(unsigned long long *p, void *h, unsigned int f) {
	mig_ipc64 v; memcpy(&v, h, sizeof v); return CALL(cuIpcOpenMemHandle_v2, p, v, f);
}
static int w_ipcCloseMem(unsigned long long p) { return CALL(cuIpcCloseMemHandle, p); }
static int w_ipcGetEvent(void *h, uintptr_t e) { return CALL(cuIpcGetEventHandle, (mig_ipc64 *)h, P(e)); }
static int w_ipcOpenEvent(uintptr_t *e, void *h) {
	mig_ipc64 v; memcpy(&v, h, sizeof v); void *x = 0; int r = CALL(cuIpcOpenEventHandle, &x, v); *e = (uintptr_t)x; return r;
}
static int w_moduleLoadData(uintptr_t *m, const void *img) { void *x = 0; int r = CALL(cuModuleLoadData, &x, img); *m = (uintptr_t)x; return r; }
static int w_moduleUnload(uintptr_t m) { return CALL(cuModuleUnload, P(m)); }
static int w_moduleGetFunction(uintptr_t *f, uintptr_t m, const char *n) { void *x = 0; int r = CALL(cuModuleGetFunction, &x, P(m), n); *f = (uintptr_t)x; return r; }
// w_launch builds the kernelParams array from a packed buffer and offsets
// (Go memory holding no pointers) so no Go pointer is stored in C memory.
static int w_launch(uintptr_t f, unsigned int gx, unsigned int gy, unsigned int gz,
		unsigned int bx, unsigned int by, unsigned int bz, unsigned int shm, uintptr_t s,
		unsigned char *buf, unsigned short *off, int n) {
	void *params[32];
	for (int i = 0; i < n && i < 32; i++) params[i] = buf + off[i];
	return CALL(cuLaunchKernel, P(f), gx, gy, gz, bx, by, bz, shm, P(s), params, NULL);
}
*/
import "C"

import (
	"fmt"
	"sync"
	"unsafe"
)

// LibraryName is the driver library Open loads.
const LibraryName = "libcuda.so.1"

type driver struct{}

var _ Interface = driver{}

var (
	openOnce sync.Once
	openErr  error
)

// Open loads libcuda.so.1 (once per process) and returns the Interface
// backed by it. It returns ErrLibraryNotFound when the library cannot be
// loaded. Open does not call Init.
func Open() (Interface, error) {
	openOnce.Do(func() {
		name := C.CString(LibraryName)
		defer C.free(unsafe.Pointer(name))
		if C.mig_open(name) != 0 {
			openErr = fmt.Errorf("%w: %s", ErrLibraryNotFound, C.GoString(C.dlerror()))
		}
	})
	if openErr != nil {
		return nil, openErr
	}
	return driver{}, nil
}

func r(code C.int) error { return resultError(int(code)) }

func (driver) Init(flags uint32) error { return r(C.w_init(C.uint(flags))) }

func (driver) DriverGetVersion() (int, error) {
	var v C.int
	err := r(C.w_driverVersion(&v))
	return int(v), err
}

func (driver) DeviceGetCount() (int, error) {
	var n C.int
	err := r(C.w_deviceCount(&n))
	return int(n), err
}

func (driver) DeviceGet(ordinal int) (Device, error) {
	var d C.int
	err := r(C.w_deviceGet(&d, C.int(ordinal)))
	return Device(d), err
}

func (driver) DeviceGetName(d Device) (string, error) {
	var buf [256]C.char
	if err := r(C.w_deviceName(&buf[0], C.int(len(buf)), C.int(d))); err != nil {
		return "", err
	}
	return C.GoString(&buf[0]), nil
}

func (driver) DeviceGetUUID(d Device) (UUID, error) {
	var u UUID
	err := r(C.w_deviceUUID(unsafe.Pointer(&u[0]), C.int(d)))
	return u, err
}

func (driver) DeviceGetUUIDv1(d Device) (UUID, error) {
	var u UUID
	err := r(C.w_deviceUUIDv1(unsafe.Pointer(&u[0]), C.int(d)))
	return u, err
}

func (driver) DeviceGetPCIBusID(d Device) (string, error) {
	var buf [64]C.char
	if err := r(C.w_deviceBusID(&buf[0], C.int(len(buf)), C.int(d))); err != nil {
		return "", err
	}
	return C.GoString(&buf[0]), nil
}

func (driver) DeviceGetAttribute(attr DeviceAttribute, d Device) (int, error) {
	var v C.int
	err := r(C.w_deviceAttr(&v, C.int(attr), C.int(d)))
	return int(v), err
}

func (driver) DeviceTotalMem(d Device) (uint64, error) {
	var v C.size_t
	err := r(C.w_deviceTotalMem(&v, C.int(d)))
	return uint64(v), err
}

func (driver) DeviceCanAccessPeer(d, peer Device) (bool, error) {
	var v C.int
	err := r(C.w_canAccessPeer(&v, C.int(d), C.int(peer)))
	return v != 0, err
}

func (driver) DevicePrimaryCtxRetain(d Device) (Context, error) {
	var c C.uintptr_t
	err := r(C.w_primaryRetain(&c, C.int(d)))
	return Context(c), err
}

func (driver) DevicePrimaryCtxRelease(d Device) error { return r(C.w_primaryRelease(C.int(d))) }

func (driver) CtxSetCurrent(c Context) error { return r(C.w_ctxSetCurrent(C.uintptr_t(c))) }

func (driver) CtxGetCurrent() (Context, error) {
	var c C.uintptr_t
	err := r(C.w_ctxGetCurrent(&c))
	return Context(c), err
}

func (driver) CtxSynchronize() error { return r(C.w_ctxSynchronize()) }

func (driver) MemAlloc(n uint64) (DevicePtr, error) {
	var p C.ulonglong
	err := r(C.w_memAlloc(&p, C.size_t(n)))
	return DevicePtr(p), err
}

func (driver) MemFree(p DevicePtr) error { return r(C.w_memFree(C.ulonglong(p))) }

func (driver) MemGetInfo() (uint64, uint64, error) {
	var f, t C.size_t
	err := r(C.w_memInfo(&f, &t))
	return uint64(f), uint64(t), err
}

func (driver) MemsetD8(p DevicePtr, v uint8, n uint64) error {
	return r(C.w_memsetD8(C.ulonglong(p), C.uchar(v), C.size_t(n)))
}

func (driver) MemsetD8Async(p DevicePtr, v uint8, n uint64, s Stream) error {
	return r(C.w_memsetD8Async(C.ulonglong(p), C.uchar(v), C.size_t(n), C.uintptr_t(s)))
}

func (driver) MemHostRegister(p unsafe.Pointer, n uint64, flags uint32) error {
	return r(C.w_hostRegister(p, C.size_t(n), C.uint(flags)))
}

func (driver) MemHostUnregister(p unsafe.Pointer) error { return r(C.w_hostUnregister(p)) }

func (driver) MemHostGetDevicePointer(p unsafe.Pointer, flags uint32) (DevicePtr, error) {
	var d C.ulonglong
	err := r(C.w_hostDevPtr(&d, p, C.uint(flags)))
	return DevicePtr(d), err
}

func (driver) MemcpyHtoD(dst DevicePtr, src unsafe.Pointer, n uint64) error {
	return r(C.w_htod(C.ulonglong(dst), src, C.size_t(n)))
}

func (driver) MemcpyDtoH(dst unsafe.Pointer, src DevicePtr, n uint64) error {
	return r(C.w_dtoh(dst, C.ulonglong(src), C.size_t(n)))
}

func (driver) MemcpyHtoDAsync(dst DevicePtr, src unsafe.Pointer, n uint64, s Stream) error {
	return r(C.w_htodAsync(C.ulonglong(dst), src, C.size_t(n), C.uintptr_t(s)))
}

func (driver) MemcpyDtoHAsync(dst unsafe.Pointer, src DevicePtr, n uint64, s Stream) error {
	return r(C.w_dtohAsync(dst, C.ulonglong(src), C.size_t(n), C.uintptr_t(s)))
}

func (driver) MemcpyDtoDAsync(dst, src DevicePtr, n uint64, s Stream) error {
	return r(C.w_dtodAsync(C.ulonglong(dst), C.ulonglong(src), C.size_t(n), C.uintptr_t(s)))
}

func (driver) Memcpy2DHtoDAsync(dst DevicePtr, dpitch uint64, src unsafe.Pointer, spitch, width, height uint64, s Stream) error {
	return r(C.w_htod2dAsync(C.ulonglong(dst), C.size_t(dpitch), src, C.size_t(spitch), C.size_t(width), C.size_t(height), C.uintptr_t(s)))
}

func (driver) StreamCreate(flags uint32) (Stream, error) {
	var s C.uintptr_t
	err := r(C.w_streamCreate(&s, C.uint(flags)))
	return Stream(s), err
}

func (driver) StreamDestroy(s Stream) error { return r(C.w_streamDestroy(C.uintptr_t(s))) }
func (driver) StreamQuery(s Stream) error   { return r(C.w_streamQuery(C.uintptr_t(s))) }
func (driver) StreamSynchronize(s Stream) error {
	return r(C.w_streamSync(C.uintptr_t(s)))
}

func (driver) StreamWaitEvent(s Stream, e Event, flags uint32) error {
	return r(C.w_streamWaitEvent(C.uintptr_t(s), C.uintptr_t(e), C.uint(flags)))
}

func (driver) StreamWaitValue64(s Stream, addr DevicePtr, v uint64, flags uint32) error {
	return r(C.w_streamWaitValue64(C.uintptr_t(s), C.ulonglong(addr), C.ulonglong(v), C.uint(flags)))
}

func (driver) StreamWriteValue64(s Stream, addr DevicePtr, v uint64, flags uint32) error {
	return r(C.w_streamWriteValue64(C.uintptr_t(s), C.ulonglong(addr), C.ulonglong(v), C.uint(flags)))
}

func (driver) EventCreate(flags uint32) (Event, error) {
	var e C.uintptr_t
	err := r(C.w_eventCreate(&e, C.uint(flags)))
	return Event(e), err
}

func (driver) EventDestroy(e Event) error { return r(C.w_eventDestroy(C.uintptr_t(e))) }

func (driver) EventRecord(e Event, s Stream) error {
	return r(C.w_eventRecord(C.uintptr_t(e), C.uintptr_t(s)))
}

func (driver) EventQuery(e Event) error       { return r(C.w_eventQuery(C.uintptr_t(e))) }
func (driver) EventSynchronize(e Event) error { return r(C.w_eventSync(C.uintptr_t(e))) }

func (driver) IPCGetMemHandle(p DevicePtr) (IPCMemHandle, error) {
	var h IPCMemHandle
	err := r(C.w_ipcGetMem(unsafe.Pointer(&h[0]), C.ulonglong(p)))
	return h, err
}

func (driver) IPCOpenMemHandle(h IPCMemHandle, flags uint32) (DevicePtr, error) {
	var p C.ulonglong
	err := r(C.w_ipcOpenMem(&p, unsafe.Pointer(&h[0]), C.uint(flags)))
	return DevicePtr(p), err
}

func (driver) IPCCloseMemHandle(p DevicePtr) error { return r(C.w_ipcCloseMem(C.ulonglong(p))) }

func (driver) IPCGetEventHandle(e Event) (IPCEventHandle, error) {
	var h IPCEventHandle
	err := r(C.w_ipcGetEvent(unsafe.Pointer(&h[0]), C.uintptr_t(e)))
	return h, err
}

func (driver) IPCOpenEventHandle(h IPCEventHandle) (Event, error) {
	var e C.uintptr_t
	err := r(C.w_ipcOpenEvent(&e, unsafe.Pointer(&h[0])))
	return Event(e), err
}

func (driver) ModuleLoadData(image []byte) (Module, error) {
	if len(image) == 0 {
		return 0, ErrInvalidImage
	}
	// PTX must be NUL-terminated; a copy in C memory also keeps Go memory out
	// of the driver's hands.
	img := C.malloc(C.size_t(len(image) + 1))
	defer C.free(img)
	buf := unsafe.Slice((*byte)(img), len(image)+1)
	copy(buf, image)
	buf[len(image)] = 0
	var m C.uintptr_t
	err := r(C.w_moduleLoadData(&m, img))
	return Module(m), err
}

func (driver) ModuleUnload(m Module) error { return r(C.w_moduleUnload(C.uintptr_t(m))) }

func (driver) ModuleGetFunction(m Module, name string) (Function, error) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var f C.uintptr_t
	err := r(C.w_moduleGetFunction(&f, C.uintptr_t(m), cname))
	return Function(f), err
}

func (driver) LaunchKernel(f Function, grid, block Dim3, sharedMem uint32, s Stream, args *Args) error {
	if args.Overflow() {
		return fmt.Errorf("launching kernel: %w: more than %d parameters or %d bytes", ErrInvalidValue, MaxArgs, MaxArgBytes)
	}
	return r(C.w_launch(C.uintptr_t(f), C.uint(grid.X), C.uint(grid.Y), C.uint(grid.Z),
		C.uint(block.X), C.uint(block.Y), C.uint(block.Z), C.uint(sharedMem), C.uintptr_t(s),
		(*C.uchar)(unsafe.Pointer(&args.buf[0])), (*C.ushort)(unsafe.Pointer(&args.off[0])), C.int(args.n)))
}
