/*
 * migswap.c — libmigswap.so: interposition of the CUDA driver API, the gate,
 * the VMM-backed allocation table.
 *
 * How calls reach us:
 *   - direct symbols: we export the driver's names (cuMemAlloc_v2, cuLaunchKernel,
 *     ... and the _ptsz/_ptds variants); LD_PRELOAD puts us first;
 *   - dlsym: we define dlsym; for a driver name whose real lookup yields the
 *     driver's function we hand out ours (cudart does dlopen("libcuda.so.1") +
 *     dlsym("cuGetProcAddress_v2"));
 *   - cuGetProcAddress / _v2 (which cudaGetDriverEntryPoint uses): we ask the
 *     driver, and if it returned a function we interpose, we hand out a wrapper
 *     bound to exactly the pointer the driver returned (per-thread-stream and
 *     versioned variants included), using a few slots per function.
 * The real driver is dlopen("libcuda.so.1") and resolved with the real dlsym,
 * whose lookup scope never contains the preloaded shim.
 *
 * Modes: until the first cuInit/allocation we are undecided; then we try the
 * daemon's socket. No daemon: passthrough (every call goes to the driver as is;
 * the gate stays open). Daemon: allocations are VMM-backed and swappable.
 */
#define _GNU_SOURCE
#include "internal.h"
#include "ptxslice.h"

#include <dlfcn.h>
#include <link.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
#define UNPAREN(...) __VA_ARGS__

struct drv drv;
int ms_log_on;
atomic_int ms_mode;
atomic_int ms_state;
struct migswap_stats ms_stats_counters;
pthread_mutex_t ms_table_mu = PTHREAD_MUTEX_INITIALIZER;
struct ms_alloc *ms_table[MS_TABLE_NBUCKETS];
atomic_ullong ms_live_allocs, ms_live_bytes;
atomic_long ms_ipc_exported, ms_managed_live, ms_async_live, ms_app_vmm_live, ms_captures;

/* ------------------------------------------------------------------ utils */

void ms_log(const char *fmt, ...)
{
	if (!ms_log_on)
		return;
	char buf[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	fprintf(stderr, "migswap[%d]: %s\n", (int)getpid(), buf);
}

const char *ms_errstr(CUresult r)
{
	const char *s = NULL;
	if (drv.cuGetErrorString && drv.cuGetErrorString(r, &s) == CUDA_SUCCESS && s)
		return s;
	return "unknown CUDA error";
}

double ms_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ------------------------------------------------------------------- dlsym */

typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn real_dlsym_fn;

static void *real_dlsym(void *h, const char *name)
{
	if (!real_dlsym_fn) {
		real_dlsym_fn = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
		if (!real_dlsym_fn)
			real_dlsym_fn = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
	}
	return real_dlsym_fn ? real_dlsym_fn(h, name) : NULL;
}

/* ------------------------------------------------------------------- gate */

static atomic_int gate_closed;
static atomic_long gate_inflight;
static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv = PTHREAD_COND_INITIALIZER;

static inline void gate_enter(void)
{
	for (;;) {
		atomic_fetch_add(&gate_inflight, 1);
		if (__builtin_expect(!atomic_load(&gate_closed), 1))
			return;
		atomic_fetch_sub(&gate_inflight, 1);
		pthread_mutex_lock(&gate_mu);
		while (atomic_load(&gate_closed))
			pthread_cond_wait(&gate_cv, &gate_mu);
		pthread_mutex_unlock(&gate_mu);
	}
}

static inline void gate_exit(void)
{
	atomic_fetch_sub(&gate_inflight, 1);
}

void ms_gate_close(void)
{
	atomic_store(&gate_closed, 1);
}

int ms_gate_wait_idle(double timeout_s)
{
	double end = ms_now() + timeout_s;
	while (atomic_load(&gate_inflight) != 0) {
		if (ms_now() > end)
			return -1;
		struct timespec ts = { 0, 20000 };
		nanosleep(&ts, NULL);
	}
	return 0;
}

void ms_gate_open(void)
{
	pthread_mutex_lock(&gate_mu);
	atomic_store(&gate_closed, 0);
	pthread_cond_broadcast(&gate_cv);
	pthread_mutex_unlock(&gate_mu);
}

/* ------------------------------------------------------------------ driver */

static pthread_once_t drv_once = PTHREAD_ONCE_INIT;
static atomic_int drv_loaded;
static void load_hooks_real(void *lib);
static void init_hook_table(void);

#define LOAD(name, sym) drv.name = (void *)real_dlsym(drv.lib, sym)

static void load_driver(void)
{
	ms_log_on = getenv("MIGSWAP_LOG") && strcmp(getenv("MIGSWAP_LOG"), "1") == 0;
	drv.lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!drv.lib)
		drv.lib = dlopen("libcuda.so", RTLD_NOW | RTLD_LOCAL);
	if (!drv.lib) {
		ms_log("cannot load libcuda.so.1: %s", dlerror());
		return;
	}
	LOAD(cuInit, "cuInit");
	LOAD(cuCtxGetCurrent, "cuCtxGetCurrent");
	LOAD(cuCtxSetCurrent, "cuCtxSetCurrent");
	LOAD(cuCtxGetDevice, "cuCtxGetDevice");
	LOAD(cuCtxSynchronize, "cuCtxSynchronize");
	LOAD(cuDeviceGet, "cuDeviceGet");
	LOAD(cuDeviceGetUuid, "cuDeviceGetUuid_v2");
	if (!drv.cuDeviceGetUuid)
		LOAD(cuDeviceGetUuid, "cuDeviceGetUuid");
	LOAD(cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity");
	LOAD(cuMemAddressReserve, "cuMemAddressReserve");
	LOAD(cuMemAddressFree, "cuMemAddressFree");
	LOAD(cuMemCreate, "cuMemCreate");
	LOAD(cuMemRelease, "cuMemRelease");
	LOAD(cuMemMap, "cuMemMap");
	LOAD(cuMemUnmap, "cuMemUnmap");
	LOAD(cuMemSetAccess, "cuMemSetAccess");
	LOAD(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2");
	LOAD(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2");
	LOAD(cuMemHostAlloc, "cuMemHostAlloc");
	LOAD(cuMemFreeHost, "cuMemFreeHost");
	LOAD(cuStreamCreate, "cuStreamCreate");
	LOAD(cuStreamSynchronize, "cuStreamSynchronize");
	LOAD(cuEventCreate, "cuEventCreate");
	LOAD(cuEventRecord, "cuEventRecord");
	LOAD(cuEventQuery, "cuEventQuery");
	LOAD(cuEventSynchronize, "cuEventSynchronize");
	LOAD(cuStreamIsCapturing, "cuStreamIsCapturing");
	LOAD(cuThreadExchangeStreamCaptureMode, "cuThreadExchangeStreamCaptureMode");
	LOAD(cuGetErrorString, "cuGetErrorString");
	LOAD(cuGetProcAddress, "cuGetProcAddress");
	LOAD(cuGetProcAddress_v2, "cuGetProcAddress_v2");
	init_hook_table();
	load_hooks_real(drv.lib);
	atomic_store(&drv_loaded, 1);
}

int ms_ensure_drv(void)
{
	if (__builtin_expect(!atomic_load_explicit(&drv_loaded, memory_order_acquire), 0))
		pthread_once(&drv_once, load_driver);
	return drv.lib != NULL;
}

static int vmm_usable(void)
{
	return drv.cuMemCreate && drv.cuMemMap && drv.cuMemSetAccess && drv.cuMemAddressReserve &&
	       drv.cuMemUnmap && drv.cuMemRelease && drv.cuMemAddressFree && drv.cuMemGetAllocationGranularity &&
	       drv.cuCtxGetCurrent && drv.cuCtxGetDevice && drv.cuCtxSetCurrent && drv.cuCtxSynchronize &&
	       drv.cuMemcpyDtoHAsync && drv.cuMemcpyHtoDAsync && drv.cuMemHostAlloc && drv.cuStreamCreate &&
	       drv.cuStreamSynchronize;
}

/* ensure_mode decides passthrough vs VMM once (again in a forked child). */
static pthread_mutex_t mode_mu = PTHREAD_MUTEX_INITIALIZER;
static void ensure_mode(void)
{
	if (__builtin_expect(atomic_load(&ms_mode) != MIGSWAP_MODE_UNDECIDED, 1))
		return;
	pthread_mutex_lock(&mode_mu);
	if (atomic_load(&ms_mode) == MIGSWAP_MODE_UNDECIDED) {
		int m = MIGSWAP_MODE_PASSTHROUGH;
		if (ms_ensure_drv() && vmm_usable() && ms_control_connect())
			m = MIGSWAP_MODE_VMM;
		atomic_store(&ms_mode, m);
		ms_log("mode %s", m == MIGSWAP_MODE_VMM ? "vmm (registered with daemon)" : "passthrough");
	}
	pthread_mutex_unlock(&mode_mu);
}

/* ------------------------------------------------------------------ table */

static size_t bucket_of(CUdeviceptr p)
{
	return (size_t)(((p >> 16) * 0x9E3779B97F4A7C15ULL) >> 52) & (MS_TABLE_NBUCKETS - 1);
}

static void table_insert(struct ms_alloc *a)
{
	pthread_mutex_lock(&ms_table_mu);
	size_t b = bucket_of(a->ptr);
	a->next = ms_table[b];
	ms_table[b] = a;
	atomic_fetch_add(&ms_live_allocs, 1);
	atomic_fetch_add(&ms_live_bytes, a->mapsize);
	pthread_mutex_unlock(&ms_table_mu);
	ms_control_usage_changed();
}

/* table_find returns the allocation containing p; with remove, unlinks it. */
static struct ms_alloc *table_find(CUdeviceptr p, int remove)
{
	struct ms_alloc *found = NULL;
	pthread_mutex_lock(&ms_table_mu);
	for (struct ms_alloc **pp = &ms_table[bucket_of(p)]; *pp; pp = &(*pp)->next) {
		if ((*pp)->ptr == p) {
			found = *pp;
			if (remove) {
				*pp = found->next;
				atomic_fetch_sub(&ms_live_allocs, 1);
				atomic_fetch_sub(&ms_live_bytes, found->mapsize);
			}
			break;
		}
	}
	if (!found && !remove) {
		/* an interior pointer: scan (rare: only cuIpcGetMemHandle) */
		for (size_t i = 0; i < MS_TABLE_NBUCKETS && !found; i++)
			for (struct ms_alloc *a = ms_table[i]; a; a = a->next)
				if (p >= a->ptr && p < a->ptr + a->mapsize) {
					found = a;
					break;
				}
	}
	pthread_mutex_unlock(&ms_table_mu);
	if (found && remove)
		ms_control_usage_changed();
	return found;
}

const char *ms_unswappable_reason(void)
{
	if (atomic_load(&ms_ipc_exported) > 0)
		return "IPC-exported memory (cuIpcGetMemHandle) cannot be moved: other processes map it";
	if (atomic_load(&ms_managed_live) > 0)
		return "managed memory (cuMemAllocManaged) is not swapped by the shim";
	if (atomic_load(&ms_async_live) > 0)
		return "stream-ordered allocations from memory pools (cuMemAllocAsync/FromPoolAsync) are live";
	if (atomic_load(&ms_app_vmm_live) > 0)
		return "the program manages VMM memory itself (cuMemCreate)";
	if (atomic_load(&ms_captures) > 0)
		return "a stream capture is in progress; retry later";
	return NULL;
}

EXPORT const char *migswap_unswappable_reason(void)
{
	return ms_unswappable_reason();
}

EXPORT int migswap_get_stats(struct migswap_stats *out)
{
	struct migswap_stats s;
	memset(&s, 0, sizeof s);
	s.abi_version = MIGSWAP_ABI_VERSION;
	s.mode = (uint32_t)atomic_load(&ms_mode);
	s.state = (uint32_t)atomic_load(&ms_state);
	s.connected = (uint32_t)ms_control_connected();
	s.allocations = atomic_load(&ms_live_allocs);
	s.bytes = atomic_load(&ms_live_bytes);
#define C(f) s.f = __atomic_load_n(&ms_stats_counters.f, __ATOMIC_RELAXED)
	C(gated_calls);
	C(swaps_out);
	C(swaps_in);
	C(bytes_out);
	C(bytes_in);
	C(refusals);
	C(needs);
#undef C
	s.arena_bytes = ms_swap_arena_bytes();
	ms_prio_get_stats(&s);
	*out = s;
	return 0;
}

/* ------------------------------------------------------------------- VMM */

static size_t gran_cache[64];

CUresult ms_make_prop(CUdevice dev, CUmemAllocationProp *prop, CUmemAccessDesc *acc)
{
	memset(prop, 0, sizeof *prop);
	prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop->location.id = dev;
	if (acc) {
		memset(acc, 0, sizeof *acc);
		acc->location = prop->location;
		acc->flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	}
	return CUDA_SUCCESS;
}

static CUresult granularity(CUdevice dev, size_t *g)
{
	if (dev >= 0 && dev < 64 && gran_cache[dev]) {
		*g = gran_cache[dev];
		return CUDA_SUCCESS;
	}
	CUmemAllocationProp prop;
	ms_make_prop(dev, &prop, NULL);
	CUresult r = drv.cuMemGetAllocationGranularity(g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
	if (r == CUDA_SUCCESS && dev >= 0 && dev < 64)
		gran_cache[dev] = *g;
	return r;
}

static CUresult vmm_alloc_once(CUdeviceptr *dptr, size_t size, size_t *mapsize_out)
{
	CUcontext ctx = NULL;
	CUdevice dev = 0;
	if (drv.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx)
		return CUDA_ERROR_INVALID_CONTEXT;
	CUresult r = drv.cuCtxGetDevice(&dev);
	if (r)
		return r;
	size_t g;
	if ((r = granularity(dev, &g)))
		return r;
	size_t mapsize = (size + g - 1) / g * g;
	*mapsize_out = mapsize;
	CUdeviceptr va = 0;
	if ((r = drv.cuMemAddressReserve(&va, mapsize, g, 0, 0)))
		return r;
	CUmemAllocationProp prop;
	CUmemAccessDesc acc;
	ms_make_prop(dev, &prop, &acc);
	CUmemGenericAllocationHandle h = 0;
	if ((r = drv.cuMemCreate(&h, mapsize, &prop, 0))) {
		drv.cuMemAddressFree(va, mapsize);
		return r;
	}
	if ((r = drv.cuMemMap(va, mapsize, 0, h, 0))) {
		drv.cuMemRelease(h);
		drv.cuMemAddressFree(va, mapsize);
		return r;
	}
	if ((r = drv.cuMemSetAccess(va, mapsize, &acc, 1))) {
		drv.cuMemUnmap(va, mapsize);
		drv.cuMemRelease(h);
		drv.cuMemAddressFree(va, mapsize);
		return r;
	}
	struct ms_alloc *a = calloc(1, sizeof *a);
	if (!a) {
		drv.cuMemUnmap(va, mapsize);
		drv.cuMemRelease(h);
		drv.cuMemAddressFree(va, mapsize);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	a->ptr = va;
	a->size = size;
	a->mapsize = mapsize;
	a->handle = h;
	a->ctx = ctx;
	a->dev = dev;
	table_insert(a);
	*dptr = va;
	return CUDA_SUCCESS;
}

/* vmm_alloc: called inside the gate. On OUT_OF_MEMORY it asks the daemon for
 * memory (outside the gate, so a swap of this process cannot deadlock) and
 * retries once if granted. */
static CUresult vmm_alloc(CUdeviceptr *dptr, size_t size)
{
	if (!dptr || size == 0)
		return CUDA_ERROR_INVALID_VALUE;
	size_t mapsize = size;
	CUresult r = vmm_alloc_once(dptr, size, &mapsize);
	if (r == CUDA_ERROR_OUT_OF_MEMORY && ms_control_connected()) {
		gate_exit();
		int granted = ms_control_need(mapsize);
		gate_enter();
		if (granted)
			r = vmm_alloc_once(dptr, size, &mapsize);
	}
	return r;
}

static CUresult vmm_free(struct ms_alloc *a)
{
	/* cudaFree semantics: outstanding work may still use the memory. */
	CUcontext cur = NULL;
	drv.cuCtxGetCurrent(&cur);
	if (cur != a->ctx)
		drv.cuCtxSetCurrent(a->ctx);
	drv.cuCtxSynchronize();
	CUresult r = CUDA_SUCCESS;
	if (a->handle) {
		r = drv.cuMemUnmap(a->ptr, a->mapsize);
		if (r == CUDA_SUCCESS)
			r = drv.cuMemRelease(a->handle);
	}
	CUresult r2 = drv.cuMemAddressFree(a->ptr, a->mapsize);
	if (cur != a->ctx)
		drv.cuCtxSetCurrent(cur);
	free(a);
	return r ? r : r2;
}

/* ------------------------------------------------------------------ hooks */

#define NSLOT 4 /* slot 0: the exported symbol; 1..3: bound by cuGetProcAddress */

struct hook {
	const char *export_name;
	const char *gpa_name;
	int minver;
	void *fn[NSLOT];
	void *_Atomic real[NSLOT];
};

/* X(id, export, gpa name, min version, PARAMS, ARGS) */
#define GATED_HOOKS(X)                                                                                             \
	X(launch, cuLaunchKernel, "cuLaunchKernel", 0,                                                             \
	  (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned sm, \
	   CUstream s, void **p, void **e),                                                                        \
	  (f, gx, gy, gz, bx, by, bz, sm, s, p, e))                                                                \
	X(launch_ptsz, cuLaunchKernel_ptsz, "cuLaunchKernel", 0,                                                   \
	  (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned sm, \
	   CUstream s, void **p, void **e),                                                                        \
	  (f, gx, gy, gz, bx, by, bz, sm, s, p, e))                                                                \
	X(launchex, cuLaunchKernelEx, "cuLaunchKernelEx", 0,                                                       \
	  (const CUlaunchConfig *c, CUfunction f, void **p, void **e), (c, f, p, e))                                \
	X(launchex_ptsz, cuLaunchKernelEx_ptsz, "cuLaunchKernelEx", 0,                                             \
	  (const CUlaunchConfig *c, CUfunction f, void **p, void **e), (c, f, p, e))                                \
	X(launchcoop, cuLaunchCooperativeKernel, "cuLaunchCooperativeKernel", 0,                                   \
	  (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned sm, \
	   CUstream s, void **p),                                                                                  \
	  (f, gx, gy, gz, bx, by, bz, sm, s, p))                                                                   \
	X(launchcoop_ptsz, cuLaunchCooperativeKernel_ptsz, "cuLaunchCooperativeKernel", 0,                         \
	  (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned sm, \
	   CUstream s, void **p),                                                                                  \
	  (f, gx, gy, gz, bx, by, bz, sm, s, p))                                                                   \
	X(graphlaunch, cuGraphLaunch, "cuGraphLaunch", 0, (CUgraphExec g, CUstream s), (g, s))                     \
	X(graphlaunch_ptsz, cuGraphLaunch_ptsz, "cuGraphLaunch", 0, (CUgraphExec g, CUstream s), (g, s))           \
	X(memcpy, cuMemcpy, "cuMemcpy", 0, (CUdeviceptr d, CUdeviceptr s, size_t n), (d, s, n))                    \
	X(memcpy_ptds, cuMemcpy_ptds, "cuMemcpy", 0, (CUdeviceptr d, CUdeviceptr s, size_t n), (d, s, n))          \
	X(memcpyasync, cuMemcpyAsync, "cuMemcpyAsync", 0, (CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st),   \
	  (d, s, n, st))                                                                                           \
	X(memcpyasync_ptsz, cuMemcpyAsync_ptsz, "cuMemcpyAsync", 0,                                                \
	  (CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st), (d, s, n, st))                                    \
	X(htod, cuMemcpyHtoD_v2, "cuMemcpyHtoD", 3020, (CUdeviceptr d, const void *s, size_t n), (d, s, n))        \
	X(htod_ptds, cuMemcpyHtoD_v2_ptds, "cuMemcpyHtoD", 3020, (CUdeviceptr d, const void *s, size_t n),         \
	  (d, s, n))                                                                                               \
	X(dtoh, cuMemcpyDtoH_v2, "cuMemcpyDtoH", 3020, (void *d, CUdeviceptr s, size_t n), (d, s, n))              \
	X(dtoh_ptds, cuMemcpyDtoH_v2_ptds, "cuMemcpyDtoH", 3020, (void *d, CUdeviceptr s, size_t n), (d, s, n))    \
	X(dtod, cuMemcpyDtoD_v2, "cuMemcpyDtoD", 3020, (CUdeviceptr d, CUdeviceptr s, size_t n), (d, s, n))        \
	X(dtod_ptds, cuMemcpyDtoD_v2_ptds, "cuMemcpyDtoD", 3020, (CUdeviceptr d, CUdeviceptr s, size_t n),         \
	  (d, s, n))                                                                                               \
	X(htodasync, cuMemcpyHtoDAsync_v2, "cuMemcpyHtoDAsync", 3020,                                              \
	  (CUdeviceptr d, const void *s, size_t n, CUstream st), (d, s, n, st))                                    \
	X(htodasync_ptsz, cuMemcpyHtoDAsync_v2_ptsz, "cuMemcpyHtoDAsync", 3020,                                    \
	  (CUdeviceptr d, const void *s, size_t n, CUstream st), (d, s, n, st))                                    \
	X(dtohasync, cuMemcpyDtoHAsync_v2, "cuMemcpyDtoHAsync", 3020,                                              \
	  (void *d, CUdeviceptr s, size_t n, CUstream st), (d, s, n, st))                                          \
	X(dtohasync_ptsz, cuMemcpyDtoHAsync_v2_ptsz, "cuMemcpyDtoHAsync", 3020,                                    \
	  (void *d, CUdeviceptr s, size_t n, CUstream st), (d, s, n, st))                                          \
	X(dtodasync, cuMemcpyDtoDAsync_v2, "cuMemcpyDtoDAsync", 3020,                                              \
	  (CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st), (d, s, n, st))                                    \
	X(dtodasync_ptsz, cuMemcpyDtoDAsync_v2_ptsz, "cuMemcpyDtoDAsync", 3020,                                    \
	  (CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st), (d, s, n, st))                                    \
	X(m2d, cuMemcpy2D_v2, "cuMemcpy2D", 3020, (const CUDA_MEMCPY2D *p), (p))                                   \
	X(m2d_ptds, cuMemcpy2D_v2_ptds, "cuMemcpy2D", 3020, (const CUDA_MEMCPY2D *p), (p))                         \
	X(m2du, cuMemcpy2DUnaligned_v2, "cuMemcpy2DUnaligned", 3020, (const CUDA_MEMCPY2D *p), (p))                \
	X(m2du_ptds, cuMemcpy2DUnaligned_v2_ptds, "cuMemcpy2DUnaligned", 3020, (const CUDA_MEMCPY2D *p), (p))      \
	X(m2da, cuMemcpy2DAsync_v2, "cuMemcpy2DAsync", 3020, (const CUDA_MEMCPY2D *p, CUstream s), (p, s))         \
	X(m2da_ptsz, cuMemcpy2DAsync_v2_ptsz, "cuMemcpy2DAsync", 3020, (const CUDA_MEMCPY2D *p, CUstream s),       \
	  (p, s))                                                                                                  \
	X(m3d, cuMemcpy3D_v2, "cuMemcpy3D", 3020, (const CUDA_MEMCPY3D *p), (p))                                   \
	X(m3d_ptds, cuMemcpy3D_v2_ptds, "cuMemcpy3D", 3020, (const CUDA_MEMCPY3D *p), (p))                         \
	X(m3da, cuMemcpy3DAsync_v2, "cuMemcpy3DAsync", 3020, (const CUDA_MEMCPY3D *p, CUstream s), (p, s))         \
	X(m3da_ptsz, cuMemcpy3DAsync_v2_ptsz, "cuMemcpy3DAsync", 3020, (const CUDA_MEMCPY3D *p, CUstream s),       \
	  (p, s))                                                                                                  \
	X(peer, cuMemcpyPeer, "cuMemcpyPeer", 0,                                                                   \
	  (CUdeviceptr d, CUcontext dc, CUdeviceptr s, CUcontext sc, size_t n), (d, dc, s, sc, n))                 \
	X(peer_ptds, cuMemcpyPeer_ptds, "cuMemcpyPeer", 0,                                                         \
	  (CUdeviceptr d, CUcontext dc, CUdeviceptr s, CUcontext sc, size_t n), (d, dc, s, sc, n))                 \
	X(peerasync, cuMemcpyPeerAsync, "cuMemcpyPeerAsync", 0,                                                    \
	  (CUdeviceptr d, CUcontext dc, CUdeviceptr s, CUcontext sc, size_t n, CUstream st),                       \
	  (d, dc, s, sc, n, st))                                                                                   \
	X(peerasync_ptsz, cuMemcpyPeerAsync_ptsz, "cuMemcpyPeerAsync", 0,                                          \
	  (CUdeviceptr d, CUcontext dc, CUdeviceptr s, CUcontext sc, size_t n, CUstream st),                       \
	  (d, dc, s, sc, n, st))                                                                                   \
	X(d8, cuMemsetD8_v2, "cuMemsetD8", 3020, (CUdeviceptr d, unsigned char v, size_t n), (d, v, n))            \
	X(d8_ptds, cuMemsetD8_v2_ptds, "cuMemsetD8", 3020, (CUdeviceptr d, unsigned char v, size_t n), (d, v, n))  \
	X(d16, cuMemsetD16_v2, "cuMemsetD16", 3020, (CUdeviceptr d, unsigned short v, size_t n), (d, v, n))        \
	X(d16_ptds, cuMemsetD16_v2_ptds, "cuMemsetD16", 3020, (CUdeviceptr d, unsigned short v, size_t n),         \
	  (d, v, n))                                                                                               \
	X(d32, cuMemsetD32_v2, "cuMemsetD32", 3020, (CUdeviceptr d, unsigned int v, size_t n), (d, v, n))          \
	X(d32_ptds, cuMemsetD32_v2_ptds, "cuMemsetD32", 3020, (CUdeviceptr d, unsigned int v, size_t n),           \
	  (d, v, n))                                                                                               \
	X(d8a, cuMemsetD8Async, "cuMemsetD8Async", 0, (CUdeviceptr d, unsigned char v, size_t n, CUstream s),      \
	  (d, v, n, s))                                                                                            \
	X(d8a_ptsz, cuMemsetD8Async_ptsz, "cuMemsetD8Async", 0,                                                    \
	  (CUdeviceptr d, unsigned char v, size_t n, CUstream s), (d, v, n, s))                                    \
	X(d16a, cuMemsetD16Async, "cuMemsetD16Async", 0, (CUdeviceptr d, unsigned short v, size_t n, CUstream s),  \
	  (d, v, n, s))                                                                                            \
	X(d16a_ptsz, cuMemsetD16Async_ptsz, "cuMemsetD16Async", 0,                                                 \
	  (CUdeviceptr d, unsigned short v, size_t n, CUstream s), (d, v, n, s))                                   \
	X(d32a, cuMemsetD32Async, "cuMemsetD32Async", 0, (CUdeviceptr d, unsigned int v, size_t n, CUstream s),    \
	  (d, v, n, s))                                                                                            \
	X(d32a_ptsz, cuMemsetD32Async_ptsz, "cuMemsetD32Async", 0,                                                 \
	  (CUdeviceptr d, unsigned int v, size_t n, CUstream s), (d, v, n, s))                                     \
	X(d2d8, cuMemsetD2D8_v2, "cuMemsetD2D8", 3020,                                                             \
	  (CUdeviceptr d, size_t pitch, unsigned char v, size_t w, size_t h), (d, pitch, v, w, h))                 \
	X(d2d16, cuMemsetD2D16_v2, "cuMemsetD2D16", 3020,                                                          \
	  (CUdeviceptr d, size_t pitch, unsigned short v, size_t w, size_t h), (d, pitch, v, w, h))                \
	X(d2d32, cuMemsetD2D32_v2, "cuMemsetD2D32", 3020,                                                          \
	  (CUdeviceptr d, size_t pitch, unsigned int v, size_t w, size_t h), (d, pitch, v, w, h))                  \
	X(d2d8a, cuMemsetD2D8Async, "cuMemsetD2D8Async", 0,                                                        \
	  (CUdeviceptr d, size_t pitch, unsigned char v, size_t w, size_t h, CUstream s), (d, pitch, v, w, h, s))  \
	X(d2d16a, cuMemsetD2D16Async, "cuMemsetD2D16Async", 0,                                                     \
	  (CUdeviceptr d, size_t pitch, unsigned short v, size_t w, size_t h, CUstream s), (d, pitch, v, w, h, s)) \
	X(d2d32a, cuMemsetD2D32Async, "cuMemsetD2D32Async", 0,                                                     \
	  (CUdeviceptr d, size_t pitch, unsigned int v, size_t w, size_t h, CUstream s), (d, pitch, v, w, h, s))   \
	X(wv32, cuStreamWriteValue32_v2, "cuStreamWriteValue32", 11070,                                            \
	  (CUstream s, CUdeviceptr a, unsigned int v, unsigned int fl), (s, a, v, fl))                             \
	X(wv64, cuStreamWriteValue64_v2, "cuStreamWriteValue64", 11070,                                            \
	  (CUstream s, CUdeviceptr a, cuuint64_t v, unsigned int fl), (s, a, v, fl))                               \
	X(wt32, cuStreamWaitValue32_v2, "cuStreamWaitValue32", 11070,                                              \
	  (CUstream s, CUdeviceptr a, unsigned int v, unsigned int fl), (s, a, v, fl))                             \
	X(wt64, cuStreamWaitValue64_v2, "cuStreamWaitValue64", 11070,                                              \
	  (CUstream s, CUdeviceptr a, cuuint64_t v, unsigned int fl), (s, a, v, fl))

#define CUSTOM_HOOKS(X)                                                                                            \
	X(init, cuInit, "cuInit", 0, (unsigned int flags), (flags))                                                \
	X(memalloc, cuMemAlloc_v2, "cuMemAlloc", 3020, (CUdeviceptr * d, size_t n), (d, n))                        \
	X(memallocpitch, cuMemAllocPitch_v2, "cuMemAllocPitch", 3020,                                              \
	  (CUdeviceptr * d, size_t *pitch, size_t w, size_t h, unsigned int esz), (d, pitch, w, h, esz))           \
	X(memfree, cuMemFree_v2, "cuMemFree", 3020, (CUdeviceptr d), (d))                                          \
	X(allocasync, cuMemAllocAsync, "cuMemAllocAsync", 0, (CUdeviceptr * d, size_t n, CUstream s), (d, n, s))   \
	X(allocasync_ptsz, cuMemAllocAsync_ptsz, "cuMemAllocAsync", 0, (CUdeviceptr * d, size_t n, CUstream s),    \
	  (d, n, s))                                                                                               \
	X(allocpool, cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", 0,                                        \
	  (CUdeviceptr * d, size_t n, CUmemoryPool p, CUstream s), (d, n, p, s))                                   \
	X(allocpool_ptsz, cuMemAllocFromPoolAsync_ptsz, "cuMemAllocFromPoolAsync", 0,                              \
	  (CUdeviceptr * d, size_t n, CUmemoryPool p, CUstream s), (d, n, p, s))                                   \
	X(freeasync, cuMemFreeAsync, "cuMemFreeAsync", 0, (CUdeviceptr d, CUstream s), (d, s))                     \
	X(freeasync_ptsz, cuMemFreeAsync_ptsz, "cuMemFreeAsync", 0, (CUdeviceptr d, CUstream s), (d, s))           \
	X(managed, cuMemAllocManaged, "cuMemAllocManaged", 0, (CUdeviceptr * d, size_t n, unsigned int fl),        \
	  (d, n, fl))                                                                                              \
	X(ipcget, cuIpcGetMemHandle, "cuIpcGetMemHandle", 0, (CUipcMemHandle * h, CUdeviceptr d), (h, d))          \
	X(memcreate, cuMemCreate, "cuMemCreate", 0,                                                                \
	  (CUmemGenericAllocationHandle * h, size_t n, const CUmemAllocationProp *p, unsigned long long fl),       \
	  (h, n, p, fl))                                                                                           \
	X(memrelease, cuMemRelease, "cuMemRelease", 0, (CUmemGenericAllocationHandle h), (h))                      \
	X(begincap, cuStreamBeginCapture_v2, "cuStreamBeginCapture", 10010, (CUstream s, int mode), (s, mode))     \
	X(begincap_ptsz, cuStreamBeginCapture_v2_ptsz, "cuStreamBeginCapture", 10010, (CUstream s, int mode),      \
	  (s, mode))                                                                                               \
	X(endcap, cuStreamEndCapture, "cuStreamEndCapture", 0, (CUstream s, CUgraph * g), (s, g))                  \
	X(endcap_ptsz, cuStreamEndCapture_ptsz, "cuStreamEndCapture", 0, (CUstream s, CUgraph * g), (s, g))        \
	X(streamdestroy, cuStreamDestroy_v2, "cuStreamDestroy", 4000, (CUstream s), (s))                           \
	X(modload, cuModuleLoadData, "cuModuleLoadData", 0, (CUmodule * m, const void *img), (m, img))            \
	X(modloadex, cuModuleLoadDataEx, "cuModuleLoadDataEx", 0,                                                  \
	  (CUmodule * m, const void *img, unsigned n, int *o, void **v), (m, img, n, o, v))                        \
	X(modgetfn, cuModuleGetFunction, "cuModuleGetFunction", 0, (CUfunction * f, CUmodule m, const char *nm),   \
	  (f, m, nm))                                                                                              \
	X(modunload, cuModuleUnload, "cuModuleUnload", 0, (CUmodule m), (m))                                       \
	X(libload, cuLibraryLoadData, "cuLibraryLoadData", 12000,                                                 \
	  (CUlibrary * l, const void *c, int *jo, void **jv, unsigned nj, int *lo, void **lv, unsigned nl),        \
	  (l, c, jo, jv, nj, lo, lv, nl))                                                                          \
	X(libgetkernel, cuLibraryGetKernel, "cuLibraryGetKernel", 12000, (CUkernel * k, CUlibrary l, const char *nm), \
	  (k, l, nm))                                                                                              \
	X(kernelgetfn, cuKernelGetFunction, "cuKernelGetFunction", 12000, (CUfunction * f, CUkernel k), (f, k))    \
	X(libunload, cuLibraryUnload, "cuLibraryUnload", 12000, (CUlibrary l), (l))

#define ALL_HOOKS(X) GATED_HOOKS(X) CUSTOM_HOOKS(X)

enum {
#define X(id, exp, gpa, mv, PARAMS, ARGS) H_##id,
	ALL_HOOKS(X)
#undef X
	H_COUNT
};

static struct hook hooks[H_COUNT];

/* typedefs and body prototypes */
#define X(id, exp, gpa, mv, PARAMS, ARGS)                                                                      \
	typedef CUresult(*id##_t) PARAMS;                                                                          \
	static CUresult id##_body(id##_t real, UNPAREN PARAMS);
ALL_HOOKS(X)
#undef X

/* The stream each gated call runs on, for priority gating (prio.c): 0 is the
 * legacy/per-thread default stream, which synchronous calls use. */
#define MS_STREAM_launch s
#define MS_STREAM_launch_ptsz s
#define MS_STREAM_launchex (c ? c->hStream : NULL)
#define MS_STREAM_launchex_ptsz (c ? c->hStream : NULL)
#define MS_STREAM_launchcoop s
#define MS_STREAM_launchcoop_ptsz s
#define MS_STREAM_graphlaunch s
#define MS_STREAM_graphlaunch_ptsz s
#define MS_STREAM_memcpy NULL
#define MS_STREAM_memcpy_ptds NULL
#define MS_STREAM_memcpyasync st
#define MS_STREAM_memcpyasync_ptsz st
#define MS_STREAM_htod NULL
#define MS_STREAM_htod_ptds NULL
#define MS_STREAM_dtoh NULL
#define MS_STREAM_dtoh_ptds NULL
#define MS_STREAM_dtod NULL
#define MS_STREAM_dtod_ptds NULL
#define MS_STREAM_htodasync st
#define MS_STREAM_htodasync_ptsz st
#define MS_STREAM_dtohasync st
#define MS_STREAM_dtohasync_ptsz st
#define MS_STREAM_dtodasync st
#define MS_STREAM_dtodasync_ptsz st
#define MS_STREAM_m2d NULL
#define MS_STREAM_m2d_ptds NULL
#define MS_STREAM_m2du NULL
#define MS_STREAM_m2du_ptds NULL
#define MS_STREAM_m2da s
#define MS_STREAM_m2da_ptsz s
#define MS_STREAM_m3d NULL
#define MS_STREAM_m3d_ptds NULL
#define MS_STREAM_m3da s
#define MS_STREAM_m3da_ptsz s
#define MS_STREAM_peer NULL
#define MS_STREAM_peer_ptds NULL
#define MS_STREAM_peerasync st
#define MS_STREAM_peerasync_ptsz st
#define MS_STREAM_d8 NULL
#define MS_STREAM_d8_ptds NULL
#define MS_STREAM_d16 NULL
#define MS_STREAM_d16_ptds NULL
#define MS_STREAM_d32 NULL
#define MS_STREAM_d32_ptds NULL
#define MS_STREAM_d8a s
#define MS_STREAM_d8a_ptsz s
#define MS_STREAM_d16a s
#define MS_STREAM_d16a_ptsz s
#define MS_STREAM_d32a s
#define MS_STREAM_d32a_ptsz s
#define MS_STREAM_d2d8 NULL
#define MS_STREAM_d2d16 NULL
#define MS_STREAM_d2d32 NULL
#define MS_STREAM_d2d8a s
#define MS_STREAM_d2d16a s
#define MS_STREAM_d2d32a s
#define MS_STREAM_wv32 s
#define MS_STREAM_wv64 s
#define MS_STREAM_wt32 s
#define MS_STREAM_wt64 s

/* cuLaunchKernel's gated bodies are named launch_gated_body and
 * launch_ptsz_gated_body; launch_body/launch_ptsz_body (below) put PTX
 * slicing (ptxslice.c) in front of them. */
#define launch_body launch_gated_body
#define launch_ptsz_body launch_ptsz_gated_body

/* gated bodies: the fast path is two atomic increments and two loads. With
 * priority gating on (ms_pg_on), ms_prio_pass's few loads decide whether the
 * call may take the same fast path (nothing above it busy, no depth limit, not
 * signalling); otherwise the out-of-line prio body runs prio.c's check before
 * the swap gate and its bookkeeping around the driver call. */
#define X(id, exp, gpa, mv, PARAMS, ARGS)                                                                      \
	static __attribute__((noinline)) CUresult id##_prio_body(id##_t real, UNPAREN PARAMS)                     \
	{                                                                                                          \
		CUstream strm_ = MS_STREAM_##id;                                                                   \
		int tok_ = ms_prio_check(strm_);                                                                   \
		gate_enter();                                                                                      \
		int sig_ = ms_prio_sig_enter();                                                                    \
		CUresult r = real ARGS;                                                                            \
		ms_prio_sig_exit(strm_, sig_);                                                                     \
		gate_exit();                                                                                       \
		if (tok_)                                                                                          \
			ms_prio_budget_record(strm_, tok_);                                                        \
		MS_STAT_ADD(gated_calls, 1);                                                                       \
		return r;                                                                                          \
	}                                                                                                          \
	static CUresult id##_body(id##_t real, UNPAREN PARAMS)                                                     \
	{                                                                                                          \
		if (__builtin_expect(!real, 0))                                                                    \
			return CUDA_ERROR_NOT_FOUND;                                                               \
		if (__builtin_expect(atomic_load_explicit(&ms_pg_on, memory_order_relaxed), 0) && !ms_prio_pass())  \
			return id##_prio_body(real, UNPAREN ARGS);                                                 \
		gate_enter();                                                                                      \
		CUresult r = real ARGS;                                                                            \
		gate_exit();                                                                                       \
		MS_STAT_ADD(gated_calls, 1);                                                                       \
		return r;                                                                                          \
	}
GATED_HOOKS(X)
#undef X
#undef launch_body
#undef launch_ptsz_body

/* PTX slicing: a cuLaunchKernel of a function with a rewritten twin runs as
 * slices of blocks, each a launch of its own through the gated body (so the
 * priority gate and a swap can come between two slices). Off (one load) unless
 * MIGSWAP_SLICE_BLOCKS > 0. */
static __thread launch_t slice_real;
static CUresult slice_one(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
			  unsigned sm, CUstream s, void **p, void **e)
{
	return launch_gated_body(slice_real, f, gx, gy, gz, bx, by, bz, sm, s, p, e);
}
static CUresult launch_body(launch_t real, CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
			    unsigned by, unsigned bz, unsigned sm, CUstream s, void **p, void **e)
{
	if (__builtin_expect(ms_slice_on, 0) && real) {
		CUresult r;
		slice_real = real;
		if (ms_slice_try_launch(slice_one, f, gx, gy, gz, bx, by, bz, sm, s, p, e, NULL, NULL, &r))
			return r;
	}
	return launch_gated_body(real, f, gx, gy, gz, bx, by, bz, sm, s, p, e);
}
static CUresult launch_ptsz_body(launch_ptsz_t real, CUfunction f, unsigned gx, unsigned gy, unsigned gz,
				 unsigned bx, unsigned by, unsigned bz, unsigned sm, CUstream s, void **p, void **e)
{
	if (__builtin_expect(ms_slice_on, 0) && real) {
		CUresult r;
		slice_real = (launch_t)real;
		if (ms_slice_try_launch(slice_one, f, gx, gy, gz, bx, by, bz, sm, s, p, e, NULL, NULL, &r))
			return r;
	}
	return launch_ptsz_gated_body(real, f, gx, gy, gz, bx, by, bz, sm, s, p, e);
}

static inline void *slot0_real(int h)
{
	ms_ensure_drv();
	return atomic_load_explicit(&hooks[h].real[0], memory_order_relaxed);
}

/* the exported symbol (slot 0) and the slots cuGetProcAddress hands out */
#define X(id, exp, gpa, mv, PARAMS, ARGS)                                                                      \
	EXPORT CUresult exp PARAMS { return id##_body((id##_t)slot0_real(H_##id), UNPAREN ARGS); }                 \
	static CUresult id##_s1 PARAMS { return id##_body((id##_t)hooks[H_##id].real[1], UNPAREN ARGS); }          \
	static CUresult id##_s2 PARAMS { return id##_body((id##_t)hooks[H_##id].real[2], UNPAREN ARGS); }          \
	static CUresult id##_s3 PARAMS { return id##_body((id##_t)hooks[H_##id].real[3], UNPAREN ARGS); }
ALL_HOOKS(X)
#undef X

static void init_hook_table(void)
{
#define X(id, exp, gpa, mv, PARAMS, ARGS)                                                                      \
	hooks[H_##id].export_name = #exp;                                                                          \
	hooks[H_##id].gpa_name = gpa;                                                                              \
	hooks[H_##id].minver = mv;                                                                             \
	hooks[H_##id].fn[0] = (void *)exp;                                                                         \
	hooks[H_##id].fn[1] = (void *)id##_s1;                                                                     \
	hooks[H_##id].fn[2] = (void *)id##_s2;                                                                     \
	hooks[H_##id].fn[3] = (void *)id##_s3;
	ALL_HOOKS(X)
#undef X
}

static void load_hooks_real(void *lib)
{
	for (int i = 0; i < H_COUNT; i++)
		atomic_store(&hooks[i].real[0], real_dlsym(lib, hooks[i].export_name));
}

static pthread_mutex_t slot_mu = PTHREAD_MUTEX_INITIALIZER;

/* substitute returns our wrapper for a driver function pointer the driver
 * returned for symbol, or real itself when we do not interpose it. */
static void *substitute(const char *symbol, void *real, int ver);

/* --------------------------------------------------- cuGetProcAddress, dlsym */

typedef CUresult (*gpa1_t)(const char *, void **, int, cuuint64_t);
typedef CUresult (*gpa2_t)(const char *, void **, int, cuuint64_t, int *);

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int ver, cuuint64_t flags, int *status)
{
	if (!ms_ensure_drv() || !drv.cuGetProcAddress_v2)
		return CUDA_ERROR_NOT_FOUND;
	CUresult r = drv.cuGetProcAddress_v2(symbol, pfn, ver, flags, status);
	if (r == CUDA_SUCCESS && pfn && *pfn && symbol)
		*pfn = substitute(symbol, *pfn, ver);
	return r;
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int ver, cuuint64_t flags)
{
	if (!ms_ensure_drv() || !drv.cuGetProcAddress)
		return CUDA_ERROR_NOT_FOUND;
	CUresult r = drv.cuGetProcAddress(symbol, pfn, ver, flags);
	if (r == CUDA_SUCCESS && pfn && *pfn && symbol)
		*pfn = substitute(symbol, *pfn, ver);
	return r;
}

static void *substitute(const char *symbol, void *real, int ver)
{
	if (symbol[0] != 'c' || symbol[1] != 'u')
		return real;
	if (real == (void *)drv.cuGetProcAddress_v2)
		return (void *)cuGetProcAddress_v2;
	if (real == (void *)drv.cuGetProcAddress)
		return (void *)cuGetProcAddress;
	int first = -1;
	for (int i = 0; i < H_COUNT; i++) {
		struct hook *h = &hooks[i];
		if (strcmp(h->gpa_name, symbol) != 0)
			continue;
		if (ver < h->minver)
			return real; /* an older ABI than the one we wrap */
		for (int k = 0; k < NSLOT; k++)
			if (atomic_load(&h->real[k]) == real)
				return h->fn[k];
		if (first < 0)
			first = i;
	}
	if (first < 0)
		return real;
	struct hook *h = &hooks[first];
	void *out = real;
	pthread_mutex_lock(&slot_mu);
	for (int k = 1; k < NSLOT; k++) {
		void *cur = atomic_load(&h->real[k]);
		if (cur == real) {
			out = h->fn[k];
			break;
		}
		if (!cur) {
			atomic_store(&h->real[k], real);
			out = h->fn[k];
			break;
		}
	}
	pthread_mutex_unlock(&slot_mu);
	if (out == real)
		ms_log("no free slot to interpose %s; passing it through", symbol);
	return out;
}

/* dlsym_next resolves RTLD_NEXT for the caller at caller_addr: the first
 * object after the caller's in the load order that defines name. (Handing
 * RTLD_NEXT to the real dlsym would search after the shim instead, and a
 * library that wraps a function with dlsym(RTLD_NEXT) would find itself.) */
static void *dlsym_next(const char *name, const void *caller_addr)
{
	Dl_info di;
	struct link_map *lm = NULL;
	if (!dladdr1(caller_addr, &di, (void **)&lm, RTLD_DL_LINKMAP) || !lm)
		return real_dlsym(RTLD_NEXT, name);
	for (struct link_map *m = lm->l_next; m; m = m->l_next) {
		if (!m->l_name || !m->l_name[0])
			continue;
		void *h = dlopen(m->l_name, RTLD_LAZY | RTLD_NOLOAD);
		if (!h)
			continue;
		void *sym = real_dlsym(h, name);
		dlclose(h);
		struct link_map *owner = NULL;
		Dl_info si;
		if (sym && dladdr1(sym, &si, (void **)&owner, RTLD_DL_LINKMAP) && owner == m)
			return sym;
	}
	return NULL;
}

/* hook_by_export returns the hook exported under name, -1 for none. */
static int hook_by_export(const char *name)
{
	for (int i = 0; i < H_COUNT; i++)
		if (hooks[i].export_name && strcmp(hooks[i].export_name, name) == 0)
			return i;
	return -1;
}

EXPORT void *dlsym(void *handle, const char *name)
{
	if (handle == RTLD_NEXT)
		return dlsym_next(name, __builtin_return_address(0));
	void *real = real_dlsym(handle, name);
	if (!real || name[0] != 'c' || name[1] != 'u')
		return real;
	/* only driver names we interpose load the driver (cuserid is not CUDA) */
	int gpa2 = strcmp(name, "cuGetProcAddress_v2") == 0, gpa1 = strcmp(name, "cuGetProcAddress") == 0;
	int h = gpa1 || gpa2 ? -1 : hook_by_export(name);
	if ((!gpa1 && !gpa2 && h < 0) || !ms_ensure_drv())
		return real;
	if (gpa2)
		return real == (void *)drv.cuGetProcAddress_v2 ? (void *)cuGetProcAddress_v2 : real;
	if (gpa1)
		return real == (void *)drv.cuGetProcAddress ? (void *)cuGetProcAddress : real;
	return real == atomic_load(&hooks[h].real[0]) ? hooks[h].fn[0] : real;
}

/* ------------------------------------------------------------ custom bodies */

static CUresult init_body(init_t real, unsigned int flags)
{
	if (!real)
		return CUDA_ERROR_NOT_INITIALIZED;
	CUresult r = real(flags);
	if (r == CUDA_SUCCESS)
		ensure_mode();
	return r;
}

static CUresult memalloc_body(memalloc_t real, CUdeviceptr *d, size_t n)
{
	ensure_mode();
	if (atomic_load(&ms_mode) != MIGSWAP_MODE_VMM)
		return real ? real(d, n) : CUDA_ERROR_NOT_FOUND;
	gate_enter();
	CUresult r = vmm_alloc(d, n);
	gate_exit();
	return r;
}

static CUresult memallocpitch_body(memallocpitch_t real, CUdeviceptr *d, size_t *pitch, size_t w, size_t h,
				   unsigned int esz)
{
	ensure_mode();
	if (atomic_load(&ms_mode) != MIGSWAP_MODE_VMM)
		return real ? real(d, pitch, w, h, esz) : CUDA_ERROR_NOT_FOUND;
	if (!d || !pitch || w == 0 || h == 0 || (esz != 4 && esz != 8 && esz != 16))
		return CUDA_ERROR_INVALID_VALUE;
	/* rows padded to 512 bytes, times h: a size that wraps is refused, not
	   allocated smaller than asked */
	if (w > SIZE_MAX - 511)
		return CUDA_ERROR_INVALID_VALUE;
	size_t p = (w + 511) & ~(size_t)511;
	if (h > SIZE_MAX / p)
		return CUDA_ERROR_INVALID_VALUE;
	gate_enter();
	CUresult r = vmm_alloc(d, p * h);
	gate_exit();
	if (r == CUDA_SUCCESS)
		*pitch = p;
	return r;
}

static int async_untrack(CUdeviceptr p);

static CUresult memfree_body(memfree_t real, CUdeviceptr d)
{
	if (d == 0)
		return real ? real(d) : CUDA_SUCCESS;
	gate_enter();
	struct ms_alloc *a = table_find(d, 1);
	CUresult r;
	if (a) {
		if (a->ipc_exported)
			atomic_fetch_sub(&ms_ipc_exported, 1);
		r = vmm_free(a);
	} else {
		r = real ? real(d) : CUDA_ERROR_INVALID_VALUE;
		if (r == CUDA_SUCCESS && atomic_load(&ms_async_live) > 0)
			async_untrack(d); /* a stream-ordered allocation freed with cuMemFree */
	}
	gate_exit();
	return r;
}

/* Stream-ordered allocations stay with the driver; while any is live a swap
 * is refused. A pointer of ours freed with cuMemFreeAsync is freed after the
 * stream's work (synchronously). */
static atomic_ullong async_ptrs[4096];

static void async_track(CUdeviceptr p)
{
	atomic_fetch_add(&ms_async_live, 1);
	for (size_t i = 0; i < 4096; i++) {
		unsigned long long z = 0;
		if (atomic_compare_exchange_strong(&async_ptrs[i], &z, p))
			return;
	}
}

static int async_untrack(CUdeviceptr p)
{
	for (size_t i = 0; i < 4096; i++) {
		unsigned long long v = p;
		if (atomic_compare_exchange_strong(&async_ptrs[i], &v, 0)) {
			atomic_fetch_sub(&ms_async_live, 1);
			return 1;
		}
	}
	return 0;
}

static CUresult allocasync_common(CUresult r, CUdeviceptr *d)
{
	if (r == CUDA_SUCCESS && atomic_load(&ms_mode) == MIGSWAP_MODE_VMM)
		async_track(*d);
	return r;
}

static CUresult allocasync_body(allocasync_t real, CUdeviceptr *d, size_t n, CUstream s)
{
	ensure_mode();
	return allocasync_common(real ? real(d, n, s) : CUDA_ERROR_NOT_FOUND, d);
}
static CUresult allocasync_ptsz_body(allocasync_ptsz_t real, CUdeviceptr *d, size_t n, CUstream s)
{
	ensure_mode();
	return allocasync_common(real ? real(d, n, s) : CUDA_ERROR_NOT_FOUND, d);
}
static CUresult allocpool_body(allocpool_t real, CUdeviceptr *d, size_t n, CUmemoryPool p, CUstream s)
{
	ensure_mode();
	return allocasync_common(real ? real(d, n, p, s) : CUDA_ERROR_NOT_FOUND, d);
}
static CUresult allocpool_ptsz_body(allocpool_ptsz_t real, CUdeviceptr *d, size_t n, CUmemoryPool p, CUstream s)
{
	ensure_mode();
	return allocasync_common(real ? real(d, n, p, s) : CUDA_ERROR_NOT_FOUND, d);
}

static CUresult freeasync_common(CUresult (*real)(CUdeviceptr, CUstream), CUdeviceptr d, CUstream s)
{
	if (d && atomic_load(&ms_mode) == MIGSWAP_MODE_VMM) {
		gate_enter();
		struct ms_alloc *a = table_find(d, 1);
		if (a) {
			drv.cuStreamSynchronize(s);
			if (a->ipc_exported)
				atomic_fetch_sub(&ms_ipc_exported, 1);
			CUresult r = vmm_free(a);
			gate_exit();
			return r;
		}
		gate_exit();
		async_untrack(d);
	}
	return real ? real(d, s) : CUDA_ERROR_NOT_FOUND;
}
static CUresult freeasync_body(freeasync_t real, CUdeviceptr d, CUstream s) { return freeasync_common(real, d, s); }
static CUresult freeasync_ptsz_body(freeasync_ptsz_t real, CUdeviceptr d, CUstream s)
{
	return freeasync_common(real, d, s);
}

static CUresult managed_body(managed_t real, CUdeviceptr *d, size_t n, unsigned int fl)
{
	ensure_mode();
	CUresult r = real ? real(d, n, fl) : CUDA_ERROR_NOT_FOUND;
	if (r == CUDA_SUCCESS && atomic_load(&ms_mode) == MIGSWAP_MODE_VMM) {
		/* managed memory is never freed through a path we can match cheaply to
		 * this count, so it marks the process unswappable for good */
		atomic_fetch_add(&ms_managed_live, 1);
	}
	return r;
}

static CUresult ipcget_body(ipcget_t real, CUipcMemHandle *h, CUdeviceptr d)
{
	CUresult r = real ? real(h, d) : CUDA_ERROR_NOT_FOUND;
	if (r == CUDA_SUCCESS && atomic_load(&ms_mode) == MIGSWAP_MODE_VMM) {
		struct ms_alloc *a = table_find(d, 0);
		pthread_mutex_lock(&ms_table_mu);
		if (a && !a->ipc_exported) {
			a->ipc_exported = 1;
			atomic_fetch_add(&ms_ipc_exported, 1);
		} else if (!a) {
			atomic_fetch_add(&ms_ipc_exported, 1); /* not ours: be safe */
		}
		pthread_mutex_unlock(&ms_table_mu);
	}
	return r;
}

static CUresult memcreate_body(memcreate_t real, CUmemGenericAllocationHandle *h, size_t n,
			       const CUmemAllocationProp *p, unsigned long long fl)
{
	CUresult r = real ? real(h, n, p, fl) : CUDA_ERROR_NOT_FOUND;
	if (r == CUDA_SUCCESS && atomic_load(&ms_mode) == MIGSWAP_MODE_VMM)
		atomic_fetch_add(&ms_app_vmm_live, 1);
	return r;
}

static CUresult memrelease_body(memrelease_t real, CUmemGenericAllocationHandle h)
{
	CUresult r = real ? real(h) : CUDA_ERROR_NOT_FOUND;
	if (r == CUDA_SUCCESS && atomic_load(&ms_app_vmm_live) > 0)
		atomic_fetch_sub(&ms_app_vmm_live, 1);
	return r;
}

static CUresult begincap_common(CUresult (*real)(CUstream, int), CUstream s, int mode)
{
	gate_enter();
	/* counted before the capture starts, and the priority watcher let out of
	 * any event call it is in the middle of (ms_prio_quiesce), so that it
	 * never records or queries an event while a capture is in progress */
	atomic_fetch_add(&ms_captures, 1);
	ms_prio_quiesce();
	CUresult r = real ? real(s, mode) : CUDA_ERROR_NOT_FOUND;
	if (r != CUDA_SUCCESS)
		atomic_fetch_sub(&ms_captures, 1);
	else
		ms_prio_capture_seen(s);
	ms_log("capture: begin on stream %p mode %d: %s", (void *)s, mode, ms_errstr(r));
	gate_exit();
	return r;
}
static CUresult begincap_body(begincap_t real, CUstream s, int mode) { return begincap_common(real, s, mode); }
static CUresult begincap_ptsz_body(begincap_ptsz_t real, CUstream s, int mode) { return begincap_common(real, s, mode); }

static CUresult endcap_common(CUresult (*real)(CUstream, CUgraph *), CUstream s, CUgraph *g)
{
	CUresult r = real ? real(s, g) : CUDA_ERROR_NOT_FOUND;
	long c = atomic_load(&ms_captures);
	while (c > 0 && !atomic_compare_exchange_weak(&ms_captures, &c, c - 1))
		;
	ms_log("capture: end on stream %p: %s", (void *)s, ms_errstr(r));
	return r;
}
static CUresult endcap_body(endcap_t real, CUstream s, CUgraph *g) { return endcap_common(real, s, g); }
static CUresult endcap_ptsz_body(endcap_ptsz_t real, CUstream s, CUgraph *g) { return endcap_common(real, s, g); }

/* Module and library loads and lookups: ptxslice.c loads a rewritten twin and
 * maps the functions when slicing is on; otherwise straight to the driver. */
static CUresult modload_body(modload_t real, CUmodule *m, const void *img) { return ms_slice_module_load(real, m, img); }
static CUresult modloadex_body(modloadex_t real, CUmodule *m, const void *img, unsigned n, int *o, void **v)
{
	return ms_slice_module_loadex(real, m, img, n, o, v);
}
static CUresult modgetfn_body(modgetfn_t real, CUfunction *f, CUmodule m, const char *nm)
{
	return ms_slice_module_getfn(real, f, m, nm);
}
static CUresult modunload_body(modunload_t real, CUmodule m) { return ms_slice_module_unload(real, m); }
static CUresult libload_body(libload_t real, CUlibrary *l, const void *c, int *jo, void **jv, unsigned nj, int *lo,
			    void **lv, unsigned nl)
{
	return ms_slice_library_load(real, l, c, jo, jv, nj, lo, lv, nl);
}
static CUresult libgetkernel_body(libgetkernel_t real, CUkernel *k, CUlibrary l, const char *nm)
{
	return ms_slice_library_getkernel(real, k, l, nm);
}
static CUresult kernelgetfn_body(kernelgetfn_t real, CUfunction *f, CUkernel k) { return ms_slice_kernel_getfn(real, f, k); }
static CUresult libunload_body(libunload_t real, CUlibrary l) { return ms_slice_library_unload(real, l); }

/* A destroyed stream can no longer be recorded on by the gate's watcher. */
static CUresult streamdestroy_body(streamdestroy_t real, CUstream s)
{
	if (atomic_load(&ms_pg_on) || atomic_load(&ms_pg_local_busy))
		ms_prio_stream_destroyed(s);
	return real ? real(s) : CUDA_ERROR_NOT_FOUND;
}

/* -------------------------------------------------------------- lifecycle */

/* Lock order: mode_mu before the control locks (ensure_mode holds mode_mu
 * while ms_control_connect sends the hello under write_mu), then ms_table_mu. */
static void atfork_prepare(void)
{
	pthread_mutex_lock(&mode_mu);
	ms_control_atfork_prepare();
	pthread_mutex_lock(&ms_table_mu);
}

static void atfork_parent(void)
{
	pthread_mutex_unlock(&ms_table_mu);
	ms_control_atfork_parent();
	pthread_mutex_unlock(&mode_mu);
}

/* The child shares nothing with the parent's control connection or CUDA
 * state: it starts undecided and registers anew if it uses CUDA. */
static void atfork_child(void)
{
	pthread_mutex_init(&ms_table_mu, NULL);
	pthread_mutex_init(&mode_mu, NULL);
	pthread_mutex_init(&gate_mu, NULL);
	pthread_cond_init(&gate_cv, NULL);
	pthread_mutex_init(&slot_mu, NULL);
	for (size_t i = 0; i < MS_TABLE_NBUCKETS; i++) {
		struct ms_alloc *a = ms_table[i];
		while (a) {
			struct ms_alloc *n = a->next;
			free(a);
			a = n;
		}
		ms_table[i] = NULL;
	}
	atomic_store(&ms_live_allocs, 0);
	atomic_store(&ms_live_bytes, 0);
	atomic_store(&ms_ipc_exported, 0);
	atomic_store(&ms_managed_live, 0);
	atomic_store(&ms_async_live, 0);
	atomic_store(&ms_app_vmm_live, 0);
	atomic_store(&ms_captures, 0);
	for (size_t i = 0; i < 4096; i++)
		atomic_store(&async_ptrs[i], 0);
	atomic_store(&gate_inflight, 0);
	atomic_store(&gate_closed, 0);
	atomic_store(&ms_state, MIGSWAP_STATE_RESIDENT);
	atomic_store(&ms_mode, MIGSWAP_MODE_UNDECIDED);
	memset(&ms_stats_counters, 0, sizeof ms_stats_counters);
	ms_swap_atfork_child();
	ms_prio_atfork_child();
	ms_slice_atfork_child();
	ms_control_atfork_child();
}

__attribute__((destructor)) static void migswap_dtor(void)
{
	if (!ms_log_on || atomic_load(&ms_mode) == MIGSWAP_MODE_UNDECIDED)
		return;
	struct migswap_stats s;
	migswap_get_stats(&s);
	ms_log("exit: mode=%u gated_calls=%llu allocations=%llu bytes=%llu swaps_out=%llu swaps_in=%llu refusals=%llu "
	       "needs=%llu",
	       s.mode, (unsigned long long)s.gated_calls, (unsigned long long)s.allocations,
	       (unsigned long long)s.bytes, (unsigned long long)s.swaps_out, (unsigned long long)s.swaps_in,
	       (unsigned long long)s.refusals, (unsigned long long)s.needs);
}

__attribute__((constructor)) static void migswap_ctor(void)
{
	init_hook_table();
	real_dlsym(NULL, "dlsym"); /* resolve the real dlsym early */
	ms_mps_env();
	pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}
