/*
 * fakecuda.c — a fake CUDA driver (libcuda.so.1) backed by host memory, for
 * testing libmigswap.so without a GPU. See fakecuda.h for the environment.
 *
 * Device pointers are host addresses, so data really moves:
 *   - cuMemAlloc* maps anonymous memory;
 *   - cuMemAddressReserve maps PROT_NONE; cuMemCreate makes a memfd of the size
 *     ("physical memory"); cuMemMap maps the memfd at the address (MAP_FIXED);
 *     cuMemSetAccess makes it read/write; cuMemUnmap puts PROT_NONE back;
 *     cuMemRelease closes the memfd. Touching unmapped memory faults, so a
 *     kernel or copy that slips past the shim while it is swapped out crashes.
 *   - Kernels are C functions looked up by name in any "module": noop(),
 *     add_one(float *p, u64 n), fill(float *p, u64 n, float v) run at once,
 *     in the launching call; sleep_us(u64 usec) is timed: it occupies its
 *     stream for usec of wall time without blocking the caller, and events,
 *     stream/context synchronize and queries follow it (see "streams and
 *     events" below). Everything else is synchronous.
 *     grid_probe(u32 *count, u32 *val, u32 seed) runs every block of its grid
 *     (see k_grid_probe); a module whose image carries the slicing parameter
 *     __ms_slice (shim/ptxslice.c rewrote it) gets the variant that reads it.
 *   - A CUDA graph is a list of kernel nodes run in order by cuGraphLaunch.
 *
 * Built with -Wl,-Bsymbolic so the fake's own calls and the pointers returned by
 * its cuGetProcAddress never resolve to an LD_PRELOADed interposer.
 */
#define _GNU_SOURCE
#include "cudadrv.h"
#include "fakecuda.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct fakecuda_stats local_stats;
static struct fakecuda_stats *st = &local_stats;
static size_t granularity = 2 << 20;
static int initialised;

struct ctx_obj { int magic; };
static struct ctx_obj the_ctx = { 0x1234 };
static __thread CUcontext current_ctx;

static void stats_init_locked(void)
{
	uint64_t cap = 1ULL << 30;
	const char *e = getenv("FAKECUDA_MEM_BYTES");
	if (e && *e)
		cap = strtoull(e, NULL, 0);
	e = getenv("FAKECUDA_GRANULARITY");
	if (e && *e)
		granularity = strtoull(e, NULL, 0);
	e = getenv("FAKECUDA_STATS");
	if (e && *e) {
		int fd = open(e, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
		if (fd >= 0 && ftruncate(fd, sizeof(struct fakecuda_stats)) == 0) {
			void *p = mmap(NULL, sizeof(struct fakecuda_stats), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
			if (p != MAP_FAILED) {
				st = p;
				uint64_t zero = 0;
				if (__atomic_compare_exchange_n(&st->magic, &zero, FAKECUDA_STATS_MAGIC, 0,
								__ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
					__atomic_store_n(&st->capacity, cap, __ATOMIC_SEQ_CST);
			}
		}
		if (fd >= 0)
			close(fd);
	}
	if (st == &local_stats) {
		st->magic = FAKECUDA_STATS_MAGIC;
		st->capacity = cap;
	}
}

static void ensure_stats(void)
{
	pthread_mutex_lock(&mu);
	if (!initialised) {
		stats_init_locked();
		initialised = 1;
	}
	pthread_mutex_unlock(&mu);
}

/* charge reserves n bytes of device capacity; 0 when it does not fit. */
static int charge(uint64_t n, int vmm)
{
	ensure_stats();
	uint64_t cur = __atomic_load_n(&st->in_use, __ATOMIC_SEQ_CST);
	for (;;) {
		if (cur + n > st->capacity)
			return 0;
		if (__atomic_compare_exchange_n(&st->in_use, &cur, cur + n, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
			break;
	}
	uint64_t now = cur + n, pk = __atomic_load_n(&st->peak, __ATOMIC_SEQ_CST);
	while (now > pk && !__atomic_compare_exchange_n(&st->peak, &pk, now, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
		;
	if (vmm)
		__atomic_add_fetch(&st->vmm_in_use, n, __ATOMIC_SEQ_CST);
	return 1;
}

static void uncharge(uint64_t n, int vmm)
{
	__atomic_sub_fetch(&st->in_use, n, __ATOMIC_SEQ_CST);
	if (vmm)
		__atomic_sub_fetch(&st->vmm_in_use, n, __ATOMIC_SEQ_CST);
}

EXPORT uint64_t fakecuda_bytes_in_use(void)
{
	ensure_stats();
	return __atomic_load_n(&st->in_use, __ATOMIC_SEQ_CST);
}

EXPORT int fakecuda_get_stats(struct fakecuda_stats *out)
{
	ensure_stats();
	memcpy(out, st, sizeof(*out));
	return 0;
}

/* ---- plain allocations ---- */

struct plain { CUdeviceptr p; size_t size; struct plain *next; };
static struct plain *plains;

static CUresult plain_alloc(CUdeviceptr *dptr, size_t size)
{
	if (!dptr || size == 0)
		return CUDA_ERROR_INVALID_VALUE;
	size_t sz = (size + 4095) & ~(size_t)4095;
	if (!charge(sz, 0))
		return CUDA_ERROR_OUT_OF_MEMORY;
	void *p = mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		uncharge(sz, 0);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	struct plain *r = malloc(sizeof(*r));
	r->p = (CUdeviceptr)(uintptr_t)p;
	r->size = sz;
	pthread_mutex_lock(&mu);
	r->next = plains;
	plains = r;
	pthread_mutex_unlock(&mu);
	__atomic_add_fetch(&st->plain_allocs, 1, __ATOMIC_SEQ_CST);
	*dptr = r->p;
	return CUDA_SUCCESS;
}

static CUresult plain_free(CUdeviceptr p)
{
	if (p == 0)
		return CUDA_SUCCESS;
	pthread_mutex_lock(&mu);
	struct plain **pp = &plains, *r = NULL;
	for (; *pp; pp = &(*pp)->next) {
		if ((*pp)->p == p) {
			r = *pp;
			*pp = r->next;
			break;
		}
	}
	pthread_mutex_unlock(&mu);
	if (!r)
		return CUDA_ERROR_INVALID_VALUE;
	munmap((void *)(uintptr_t)r->p, r->size);
	uncharge(r->size, 0);
	free(r);
	return CUDA_SUCCESS;
}

/* ---- init, devices, contexts ---- */

EXPORT CUresult cuInit(unsigned int flags)
{
	(void)flags;
	ensure_stats();
	return CUDA_SUCCESS;
}
EXPORT CUresult cuDriverGetVersion(int *v) { *v = 12080; return CUDA_SUCCESS; }
EXPORT CUresult cuDeviceGetCount(int *n) { *n = 1; return CUDA_SUCCESS; }
EXPORT CUresult cuDeviceGet(CUdevice *d, int ordinal)
{
	if (ordinal != 0)
		return CUDA_ERROR_INVALID_VALUE;
	*d = 0;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice d)
{
	(void)d;
	snprintf(name, (size_t)len, "Fake CUDA Device");
	return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetUuid(char uuid[16], CUdevice d)
{
	(void)d;
	for (int i = 0; i < 16; i++)
		uuid[i] = (char)(0xf0 + i);
	return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetUuid_v2(char uuid[16], CUdevice d) { return cuDeviceGetUuid(uuid, d); }
EXPORT CUresult cuDeviceTotalMem_v2(size_t *b, CUdevice d)
{
	(void)d;
	ensure_stats();
	*b = st->capacity;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetAttribute(int *v, int attrib, CUdevice d)
{
	(void)attrib, (void)d;
	*v = 1;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d)
{
	(void)d;
	*c = (CUcontext)&the_ctx;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { (void)d; return CUDA_SUCCESS; }
EXPORT CUresult cuCtxCreate_v2(CUcontext *c, unsigned int flags, CUdevice d)
{
	(void)flags, (void)d;
	*c = (CUcontext)&the_ctx;
	current_ctx = *c;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxDestroy_v2(CUcontext c) { (void)c; return CUDA_SUCCESS; }
EXPORT CUresult cuCtxSetCurrent(CUcontext c) { current_ctx = c; return CUDA_SUCCESS; }
EXPORT CUresult cuCtxGetCurrent(CUcontext *c) { *c = current_ctx; return CUDA_SUCCESS; }
EXPORT CUresult cuCtxGetDevice(CUdevice *d)
{
	if (!current_ctx)
		return CUDA_ERROR_INVALID_CONTEXT;
	*d = 0;
	return CUDA_SUCCESS;
}
static void sleep_until(double t);
static double all_done_at;
static CUresult capture_check_on(CUstream s, int whole);
EXPORT CUresult cuCtxSynchronize(void)
{
	if (!current_ctx)
		return CUDA_ERROR_INVALID_CONTEXT;
	CUresult cr = capture_check_on(NULL, 1);
	if (cr != CUDA_SUCCESS)
		return cr;
	pthread_mutex_lock(&mu);
	double t = all_done_at;
	pthread_mutex_unlock(&mu);
	sleep_until(t);
	return CUDA_SUCCESS;
}
EXPORT CUresult cuGetErrorString(CUresult r, const char **s)
{
	switch (r) {
	case CUDA_SUCCESS: *s = "no error"; break;
	case CUDA_ERROR_OUT_OF_MEMORY: *s = "out of memory"; break;
	case CUDA_ERROR_INVALID_VALUE: *s = "invalid argument"; break;
	default: *s = "fake cuda error"; break;
	}
	return CUDA_SUCCESS;
}
EXPORT CUresult cuGetErrorName(CUresult r, const char **s) { return cuGetErrorString(r, s); }
EXPORT CUresult cuMemGetInfo_v2(size_t *freeb, size_t *total)
{
	ensure_stats();
	*total = st->capacity;
	*freeb = st->capacity - __atomic_load_n(&st->in_use, __ATOMIC_SEQ_CST);
	return CUDA_SUCCESS;
}

/* ---- memory ---- */

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *d, size_t n) { return plain_alloc(d, n); }
EXPORT CUresult cuMemFree_v2(CUdeviceptr d) { return plain_free(d); }
EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *d, size_t *pitch, size_t w, size_t h, unsigned int esz)
{
	(void)esz;
	*pitch = (w + 511) & ~(size_t)511;
	return plain_alloc(d, *pitch * h);
}
EXPORT CUresult cuMemAllocManaged(CUdeviceptr *d, size_t n, unsigned int flags) { (void)flags; return plain_alloc(d, n); }
EXPORT CUresult cuMemAllocAsync(CUdeviceptr *d, size_t n, CUstream s) { (void)s; return plain_alloc(d, n); }
EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *d, size_t n, CUstream s) { (void)s; return plain_alloc(d, n); }
EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *d, size_t n, CUmemoryPool p, CUstream s) { (void)p, (void)s; return plain_alloc(d, n); }
EXPORT CUresult cuMemFreeAsync(CUdeviceptr d, CUstream s) { (void)s; return plain_free(d); }
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr d, CUstream s) { (void)s; return plain_free(d); }
EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr d)
{
	memset(h, 0, sizeof(*h));
	memcpy(h->reserved, &d, sizeof(d));
	return CUDA_SUCCESS;
}
EXPORT CUresult cuMemHostAlloc(void **p, size_t n, unsigned int flags)
{
	(void)flags;
	void *m = mmap(NULL, n ? n : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*p = m;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuMemAllocHost_v2(void **p, size_t n) { return cuMemHostAlloc(p, n, 0); }
EXPORT CUresult cuMemFreeHost(void *p)
{
	(void)p; /* host buffers are few and small in tests; keep them mapped */
	return CUDA_SUCCESS;
}

/* ---- VMM ---- */

struct phys { int fd; size_t size; };
struct reservation { CUdeviceptr base; size_t size; void *raw; size_t rawsize; struct reservation *next; };
static struct reservation *reservations;

EXPORT CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop, int option)
{
	(void)prop, (void)option;
	ensure_stats();
	*g = granularity;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr, unsigned long long flags)
{
	(void)addr, (void)flags;
	ensure_stats();
	if (size == 0 || size % granularity)
		return CUDA_ERROR_INVALID_VALUE;
	if (align < granularity)
		align = granularity;
	size_t raw = size + align;
	void *m = mmap(NULL, raw, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (m == MAP_FAILED)
		return CUDA_ERROR_OUT_OF_MEMORY;
	uintptr_t b = ((uintptr_t)m + align - 1) & ~(uintptr_t)(align - 1);
	struct reservation *r = malloc(sizeof(*r));
	r->base = b;
	r->size = size;
	r->raw = m;
	r->rawsize = raw;
	pthread_mutex_lock(&mu);
	r->next = reservations;
	reservations = r;
	pthread_mutex_unlock(&mu);
	*ptr = b;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
	pthread_mutex_lock(&mu);
	struct reservation **pp = &reservations, *r = NULL;
	for (; *pp; pp = &(*pp)->next) {
		if ((*pp)->base == ptr && (*pp)->size == size) {
			r = *pp;
			*pp = r->next;
			break;
		}
	}
	pthread_mutex_unlock(&mu);
	if (!r)
		return CUDA_ERROR_INVALID_VALUE;
	munmap(r->raw, r->rawsize);
	free(r);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop, unsigned long long flags)
{
	(void)flags;
	ensure_stats();
	if (!h || !prop || size == 0 || size % granularity || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
	    prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop->location.id != 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (!charge(size, 1))
		return CUDA_ERROR_OUT_OF_MEMORY;
	int fd = memfd_create("fakecuda-phys", MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
		if (fd >= 0)
			close(fd);
		uncharge(size, 1);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	struct phys *p = malloc(sizeof(*p));
	p->fd = fd;
	p->size = size;
	*h = (CUmemGenericAllocationHandle)(uintptr_t)p;
	__atomic_add_fetch(&st->vmm_creates, 1, __ATOMIC_SEQ_CST);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h)
{
	struct phys *p = (struct phys *)(uintptr_t)h;
	if (!p)
		return CUDA_ERROR_INVALID_VALUE;
	close(p->fd);
	uncharge(p->size, 1);
	free(p);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h, unsigned long long flags)
{
	(void)flags;
	struct phys *p = (struct phys *)(uintptr_t)h;
	if (!p || offset + size > p->size || ptr % granularity)
		return CUDA_ERROR_INVALID_VALUE;
	void *m = mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, p->fd, (off_t)offset);
	if (m == MAP_FAILED)
		return CUDA_ERROR_INVALID_VALUE;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
	if (!desc || count == 0)
		return CUDA_ERROR_INVALID_VALUE;
	int prot = desc[0].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? PROT_READ | PROT_WRITE : PROT_READ;
	if (mprotect((void *)(uintptr_t)ptr, size, prot) != 0)
		return CUDA_ERROR_INVALID_VALUE;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
	void *m = mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
	return m == MAP_FAILED ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

/* ---- copies and memsets (synchronous) ---- */

#define P(x) ((void *)(uintptr_t)(x))
EXPORT CUresult cuMemcpy(CUdeviceptr d, CUdeviceptr s, size_t n) { memmove(P(d), P(s), n); return CUDA_SUCCESS; }
EXPORT CUresult cuMemcpyAsync(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st_) { (void)st_; return cuMemcpy(d, s, n); }
EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n) { memcpy(P(d), s, n); return CUDA_SUCCESS; }
EXPORT CUresult cuMemcpyDtoH_v2(void *d, CUdeviceptr s, size_t n) { memcpy(d, P(s), n); return CUDA_SUCCESS; }
EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n) { memmove(P(d), P(s), n); return CUDA_SUCCESS; }
/* FAKECUDA_CORRUPT_HTOD_ASYNC=N flips one byte of the N-th asynchronous
 * host-to-device copy (the shim's swap-in path), to test checksums. */
static long corrupt_countdown = -1;
EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, CUstream x)
{
	(void)x;
	memcpy(P(d), s, n);
	pthread_mutex_lock(&mu);
	if (corrupt_countdown < 0) {
		const char *e = getenv("FAKECUDA_CORRUPT_HTOD_ASYNC");
		corrupt_countdown = e && *e ? strtol(e, NULL, 0) : 0;
	}
	if (corrupt_countdown > 0 && --corrupt_countdown == 0 && n > 0)
		((unsigned char *)P(d))[n / 2] ^= 0x40;
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}
EXPORT CUresult cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, CUstream x) { (void)x; return cuMemcpyDtoH_v2(d, s, n); }
EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream x) { (void)x; return cuMemcpyDtoD_v2(d, s, n); }
EXPORT CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) { memset(P(d), v, n); return CUDA_SUCCESS; }
EXPORT CUresult cuMemsetD32_v2(CUdeviceptr d, unsigned int v, size_t n)
{
	unsigned int *p = P(d);
	for (size_t i = 0; i < n; i++)
		p[i] = v;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream x) { (void)x; return cuMemsetD8_v2(d, v, n); }
EXPORT CUresult cuMemsetD32Async(CUdeviceptr d, unsigned int v, size_t n, CUstream x) { (void)x; return cuMemsetD32_v2(d, v, n); }

/* ---- streams and events ----
 * Everything but the timed kernel sleep_us runs synchronously. sleep_us(u64
 * usec) takes usec of wall time on its stream without blocking the caller:
 * each stream has a done_at time (its queued timed work ends then), an event
 * recorded on it completes at the stream's done_at, and the synchronize calls
 * sleep until then. The NULL/legacy stream (handles 0, 1, 2) waits for every
 * stream, as the legacy default stream does. */

struct stream_obj { int magic; double done_at; };

/* Stream capture, as far as the shim's tests need it: one capture at a time;
 * launches into the capturing stream are recorded, not run; in the global mode
 * (0) a call from another thread that would touch the capture (an event
 * recorded on the capturing stream or on the legacy stream, which waits for
 * every stream; a context synchronize) invalidates it, as the real driver
 * does: the call fails with CUDA_ERROR_STREAM_CAPTURE_IMPLICIT and the capture
 * ends with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED. */
static pthread_mutex_t cap_mu = PTHREAD_MUTEX_INITIALIZER;
static CUstream cap_stream;
static int cap_mode, cap_invalid;
static pthread_t cap_thread;
static CUstream cap_used[16]; /* streams some capture has used (records_after_capture) */

/* cap_used_slot: s's entry in cap_used, or with add a free one taken for it;
 * NULL if neither (under cap_mu). */
static CUstream *cap_used_slot(CUstream s, int add)
{
	CUstream *free_slot = NULL;
	for (int i = 0; i < 16; i++) {
		if (cap_used[i] == s)
			return &cap_used[i];
		if (!cap_used[i] && !free_slot)
			free_slot = &cap_used[i];
	}
	if (add && free_slot)
		*free_slot = s;
	return add ? free_slot : NULL;
}

static int is_legacy(CUstream s);
/* capture_check: CUDA_SUCCESS, or the error a call touching s (NULL with
 * whole == 1: the whole context) gets while a capture is in progress. */
static CUresult capture_check_on(CUstream s, int whole)
{
	CUresult r = CUDA_SUCCESS;
	pthread_mutex_lock(&cap_mu);
	if (cap_stream && cap_mode == 0 &&
	    (whole || is_legacy(s) || (s == cap_stream && !pthread_equal(cap_thread, pthread_self())))) {
		cap_invalid = 1;
		r = 906; /* CUDA_ERROR_STREAM_CAPTURE_IMPLICIT */
	}
	pthread_mutex_unlock(&cap_mu);
	return r;
}
static CUresult capture_check(CUstream s) { return capture_check_on(s, 0); }
static int captured(CUstream s)
{
	pthread_mutex_lock(&cap_mu);
	int c = cap_stream && s == cap_stream;
	pthread_mutex_unlock(&cap_mu);
	return c;
}
static double legacy_done_at; /* and all_done_at: under mu */

static double fnow(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_until(double t)
{
	for (;;) {
		double d = t - fnow();
		if (d <= 0)
			return;
		struct timespec ts = { (time_t)d, (long)((d - (double)(time_t)d) * 1e9) };
		nanosleep(&ts, NULL);
	}
}

static int is_legacy(CUstream s) { return (uintptr_t)s <= 2; }

/* stream_done_at: when the timed work queued on s ends (under mu). */
static double stream_done_at(CUstream s)
{
	if (is_legacy(s))
		return all_done_at > legacy_done_at ? all_done_at : legacy_done_at;
	return ((struct stream_obj *)s)->done_at;
}

/* In-flight timed kernels of this process, for tests of launch budgets: the
 * completion times of the last 4096, and the most ever in flight at a launch. */
static double inflight_end[4096];
static unsigned inflight_n;
static uint64_t inflight_max;

EXPORT CUresult cuStreamCreate(CUstream *s, unsigned int flags)
{
	(void)flags;
	*s = (CUstream)calloc(1, sizeof(struct stream_obj));
	return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamDestroy_v2(CUstream s)
{
	pthread_mutex_lock(&cap_mu);
	CUstream *u = s ? cap_used_slot(s, 0) : NULL;
	if (u)
		*u = NULL;
	pthread_mutex_unlock(&cap_mu);
	if (!is_legacy(s))
		free(s);
	return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamSynchronize(CUstream s)
{
	pthread_mutex_lock(&mu);
	double t = stream_done_at(s);
	pthread_mutex_unlock(&mu);
	sleep_until(t);
	return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamQuery(CUstream s)
{
	pthread_mutex_lock(&mu);
	double t = stream_done_at(s);
	pthread_mutex_unlock(&mu);
	return fnow() >= t ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
struct event_obj { double t; };
EXPORT CUresult cuEventCreate(CUevent *e, unsigned int flags)
{
	(void)flags;
	*e = (CUevent)calloc(1, sizeof(struct event_obj));
	return CUDA_SUCCESS;
}
EXPORT CUresult cuEventDestroy_v2(CUevent e) { free(e); return CUDA_SUCCESS; }
EXPORT CUresult cuEventRecord(CUevent e, CUstream s)
{
	if (!e)
		return CUDA_ERROR_INVALID_HANDLE;
	CUresult cr = capture_check(s);
	if (cr != CUDA_SUCCESS)
		return cr;
	pthread_mutex_lock(&cap_mu);
	if (s && cap_used_slot(s, 0))
		__atomic_add_fetch(&st->records_after_capture, 1, __ATOMIC_SEQ_CST);
	pthread_mutex_unlock(&cap_mu);
	pthread_mutex_lock(&mu);
	((struct event_obj *)e)->t = stream_done_at(s);
	__atomic_add_fetch(&st->event_records, 1, __ATOMIC_SEQ_CST);
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}
EXPORT CUresult cuEventSynchronize(CUevent e)
{
	if (!e)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&mu);
	double t = ((struct event_obj *)e)->t;
	pthread_mutex_unlock(&mu);
	sleep_until(t);
	return CUDA_SUCCESS;
}
EXPORT CUresult cuEventQuery(CUevent e)
{
	if (!e)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&mu);
	double t = ((struct event_obj *)e)->t;
	pthread_mutex_unlock(&mu);
	return fnow() >= t ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
EXPORT CUresult cuStreamBeginCapture_v2(CUstream s, int mode)
{
	if (is_legacy(s))
		return 900; /* CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED */
	pthread_mutex_lock(&cap_mu);
	CUresult r = CUDA_SUCCESS;
	if (cap_stream)
		r = 905; /* one capture at a time in this fake (CUDA_ERROR_STREAM_CAPTURE_ISOLATION) */
	else
		cap_stream = s, cap_mode = mode, cap_thread = pthread_self(), cap_invalid = 0;
	if (r == CUDA_SUCCESS)
		cap_used_slot(s, 1);
	pthread_mutex_unlock(&cap_mu);
	return r;
}
static __thread int thread_cap_mode; /* cuThreadExchangeStreamCaptureMode: 0 global (default) */
static long capture_check_delay_us;
EXPORT void fakecuda_set_capture_check_delay(long us) { __atomic_store_n(&capture_check_delay_us, us, __ATOMIC_RELAXED); }
EXPORT CUresult cuStreamIsCapturing(CUstream s, int *status)
{
	long delay_us = __atomic_load_n(&capture_check_delay_us, __ATOMIC_RELAXED);
	if (!status)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&cap_mu);
	CUresult r = CUDA_SUCCESS;
	*status = 0;
	if (cap_stream && s == cap_stream)
		*status = 1; /* CU_STREAM_CAPTURE_STATUS_ACTIVE */
	else if (cap_stream && is_legacy(s) && cap_mode == 0)
		r = 906; /* the legacy stream would join the capture: CUDA_ERROR_STREAM_CAPTURE_IMPLICIT */
	pthread_mutex_unlock(&cap_mu);
	if (delay_us > 0 && thread_cap_mode == 2 && r == CUDA_SUCCESS && *status == 0)
		usleep((useconds_t)delay_us); /* a slow answer to a relaxed-mode thread: a capture may begin meanwhile */
	return r;
}
EXPORT CUresult cuThreadExchangeStreamCaptureMode(int *mode)
{
	if (!mode)
		return CUDA_ERROR_INVALID_VALUE;
	int old = thread_cap_mode;
	thread_cap_mode = *mode;
	*mode = old;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamEndCapture(CUstream s, CUgraph *g)
{
	pthread_mutex_lock(&cap_mu);
	if (!cap_stream || s != cap_stream || !pthread_equal(cap_thread, pthread_self())) {
		pthread_mutex_unlock(&cap_mu);
		return 903; /* CUDA_ERROR_STREAM_CAPTURE_UNMATCHED */
	}
	int bad = cap_invalid;
	cap_stream = NULL;
	pthread_mutex_unlock(&cap_mu);
	if (g)
		*g = bad ? NULL : (CUgraph)calloc(1, 64); /* an empty graph: enough for the shim's tests */
	if (bad)
		__atomic_add_fetch(&st->captures_invalidated, 1, __ATOMIC_SEQ_CST);
	return bad ? 901 /* CUDA_ERROR_STREAM_CAPTURE_INVALIDATED */ : CUDA_SUCCESS;
}

/* fakecuda_inflight reports this process's timed kernels in flight now and
 * the most there were at any launch since the last reset (reset != 0 clears it). */
EXPORT void fakecuda_inflight(uint64_t *now_n, uint64_t *max_n, int reset)
{
	pthread_mutex_lock(&mu);
	double t = fnow();
	uint64_t n = 0;
	unsigned lim = inflight_n < 4096 ? inflight_n : 4096;
	for (unsigned i = 0; i < lim; i++)
		n += inflight_end[i] > t;
	if (now_n)
		*now_n = n;
	if (max_n)
		*max_n = inflight_max;
	if (reset)
		inflight_max = n;
	pthread_mutex_unlock(&mu);
}

/* timed_launch queues usec of work on s and counts what is in flight. With
 * FAKECUDA_SHARED_DEVICE=1 the kernel also queues behind every process's
 * timed kernels on the shared device timeline. */
static int shared_device = -1;
static void timed_launch(CUstream s, unsigned long long usec)
{
	pthread_mutex_lock(&mu);
	double t = fnow(), start = stream_done_at(s);
	if (start < t)
		start = t;
	double end = start + (double)usec * 1e-6;
	if (shared_device < 0) {
		const char *e = getenv("FAKECUDA_SHARED_DEVICE");
		shared_device = e && strcmp(e, "1") == 0 && st != &local_stats;
	}
	if (shared_device) {
		uint64_t cur = __atomic_load_n(&st->device_done_ns, __ATOMIC_SEQ_CST), want;
		do {
			double dstart = (double)cur * 1e-9 > start ? (double)cur * 1e-9 : start;
			end = dstart + (double)usec * 1e-6;
			want = (uint64_t)(end * 1e9);
		} while (!__atomic_compare_exchange_n(&st->device_done_ns, &cur, want, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST));
	}
	if (is_legacy(s))
		legacy_done_at = end;
	else
		((struct stream_obj *)s)->done_at = end;
	if (end > all_done_at)
		all_done_at = end;
	inflight_end[inflight_n++ % 4096] = end;
	uint64_t n = 0;
	unsigned lim = inflight_n < 4096 ? inflight_n : 4096;
	for (unsigned i = 0; i < lim; i++)
		n += inflight_end[i] > t;
	if (n > inflight_max)
		inflight_max = n;
	pthread_mutex_unlock(&mu);
}

/* ---- modules and kernels ---- */

typedef void (*kernel_fn)(void **params);
struct kernel { const char *name; kernel_fn fn; int nparams; size_t psize[4]; };

static void k_noop(void **params) { (void)params; }
static void k_add_one(void **params)
{
	float *p = P(*(CUdeviceptr *)params[0]);
	unsigned long long n = *(unsigned long long *)params[1];
	for (unsigned long long i = 0; i < n; i++)
		p[i] += 1.0f;
}
static void k_fill(void **params)
{
	float *p = P(*(CUdeviceptr *)params[0]);
	unsigned long long n = *(unsigned long long *)params[1];
	float v = *(float *)params[2];
	for (unsigned long long i = 0; i < n; i++)
		p[i] = v;
}

static void k_sleep_us(void **params) { (void)params; } /* timed: see timed_launch */

/* grid_probe(u32 *count, u32 *val, u32 seed): block (x,y,z) of grid (nx,ny,nz)
 * adds 1 to count[i] and stores a hash of (seed, x, y, z, nx, ny, nz) in val[i],
 * i = x + nx*(y + ny*z), for every block of the launch grid. The sliced
 * variant (a PTX rewritten by shim/ptxslice.c) has a fourth parameter, struct
 * ms_slice_args {u32 off[3], grid[3]}: its blocks are (off + b) of the grid. */
static __thread unsigned launch_grid[3] = { 1, 1, 1 };
static void grid_probe(void **params, const uint32_t off[3], const uint32_t grid[3])
{
	uint32_t *count = P(*(CUdeviceptr *)params[0]), *val = P(*(CUdeviceptr *)params[1]);
	uint32_t seed = *(uint32_t *)params[2];
	for (uint32_t bz = 0; bz < launch_grid[2]; bz++)
		for (uint32_t by = 0; by < launch_grid[1]; by++)
			for (uint32_t bx = 0; bx < launch_grid[0]; bx++) {
				uint32_t x = bx + off[0], y = by + off[1], z = bz + off[2];
				uint64_t i = x + (uint64_t)grid[0] * (y + (uint64_t)grid[1] * z);
				count[i] += 1;
				val[i] = seed ^ (x * 0x9E3779B1u) ^ (y * 0x85EBCA77u) ^ (z * 0xC2B2AE3Du) ^
					 (grid[0] * 0x27D4EB2Fu) ^ (grid[1] * 0x165667B1u) ^ (grid[2] * 0x61C88647u);
			}
}
static void k_grid_probe(void **params)
{
	uint32_t off[3] = { 0, 0, 0 };
	grid_probe(params, off, launch_grid);
}
static void k_grid_probe_sliced(void **params)
{
	const uint32_t *a = params[3];
	grid_probe(params, a, a + 3);
}

static struct kernel kernels[] = {
	{ "noop", k_noop, 0, { 0 } },
	{ "sleep_us", k_sleep_us, 1, { 8 } },
	{ "add_one", k_add_one, 2, { 8, 8 } },
	{ "fill", k_fill, 3, { 8, 8, 4 } },
	{ "grid_probe", k_grid_probe, 3, { 8, 8, 4 } },
	{ "grid_probe@sliced", k_grid_probe_sliced, 4, { 8, 8, 4, 0 } },
};

struct module_obj { int magic; int sliced; };
EXPORT CUresult cuModuleLoadData(CUmodule *m, const void *image)
{
	struct module_obj *o = calloc(1, sizeof(struct module_obj));
	o->sliced = image && strstr(image, "__ms_slice") != NULL; /* test images are strings */
	*m = (CUmodule)o;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuModuleUnload(CUmodule m) { free(m); return CUDA_SUCCESS; }
EXPORT CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name)
{
	char sliced[64];
	if (m && ((struct module_obj *)m)->sliced && strcmp(name, "grid_probe") == 0)
		name = strcpy(sliced, "grid_probe@sliced");
	for (size_t i = 0; i < sizeof(kernels) / sizeof(kernels[0]); i++) {
		if (strcmp(kernels[i].name, name) == 0) {
			*f = (CUfunction)&kernels[i];
			return CUDA_SUCCESS;
		}
	}
	return CUDA_ERROR_NOT_FOUND;
}

/* CUDA 12 libraries: a library is a module, a kernel its function. */
EXPORT CUresult cuLibraryLoadData(CUmodule *l, const void *code, void *jo, void **jv, unsigned nj, void *lo, void **lv,
				  unsigned nl)
{
	(void)jo, (void)jv, (void)nj, (void)lo, (void)lv, (void)nl;
	return cuModuleLoadData(l, code);
}
EXPORT CUresult cuLibraryGetKernel(CUfunction *k, CUmodule l, const char *name) { return cuModuleGetFunction(k, l, name); }
EXPORT CUresult cuKernelGetFunction(CUfunction *f, CUfunction k) { *f = k; return CUDA_SUCCESS; }
EXPORT CUresult cuLibraryUnload(CUmodule l) { return cuModuleUnload(l); }

static CUresult run_kernel_on(CUfunction f, void **params, CUstream s)
{
	struct kernel *k = (struct kernel *)f;
	if (!k)
		return CUDA_ERROR_INVALID_HANDLE;
	if (k->nparams && !params)
		return CUDA_ERROR_INVALID_VALUE;
	if (captured(s)) /* recorded into the capture's graph, not run */
		return CUDA_SUCCESS;
	if (k->fn == k_sleep_us)
		timed_launch(s, *(unsigned long long *)params[0]);
	else
		k->fn(params);
	__atomic_add_fetch(&st->launches, 1, __ATOMIC_SEQ_CST);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
			       unsigned shmem, CUstream s, void **params, void **extra)
{
	(void)bx, (void)by, (void)bz, (void)shmem, (void)extra;
	ensure_stats();
	launch_grid[0] = gx, launch_grid[1] = gy, launch_grid[2] = gz;
	return run_kernel_on(f, params, s);
}
/* A distinct entry point, as the real driver has, for per-thread default streams. */
EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
				    unsigned shmem, CUstream s, void **params, void **extra)
{
	(void)bx, (void)by, (void)bz, (void)shmem, (void)extra;
	ensure_stats();
	launch_grid[0] = gx, launch_grid[1] = gy, launch_grid[2] = gz;
	return run_kernel_on(f, params, s);
}
EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *cfg, CUfunction f, void **params, void **extra)
{
	(void)extra;
	ensure_stats();
	return run_kernel_on(f, params, cfg ? cfg->hStream : NULL);
}

/* ---- graphs ---- */

#define MAX_NODES 64
struct gnode { struct kernel *k; unsigned char args[4][8]; };
struct graph_obj { int n; struct gnode nodes[MAX_NODES]; };

EXPORT CUresult cuGraphCreate(CUgraph *g, unsigned int flags)
{
	(void)flags;
	*g = (CUgraph)calloc(1, sizeof(struct graph_obj));
	return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphAddKernelNode_v2(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t ndeps,
					const CUDA_KERNEL_NODE_PARAMS *np)
{
	(void)deps, (void)ndeps;
	struct graph_obj *gr = (struct graph_obj *)g;
	if (!gr || !np || gr->n == MAX_NODES)
		return CUDA_ERROR_INVALID_VALUE;
	struct gnode *n = &gr->nodes[gr->n];
	n->k = (struct kernel *)np->func;
	for (int i = 0; i < n->k->nparams; i++)
		memcpy(n->args[i], np->kernelParams[i], n->k->psize[i]); /* captured by value, like the driver */
	if (node)
		*node = (CUgraphNode)(uintptr_t)(gr->n + 1);
	gr->n++;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphAddKernelNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t ndeps,
				     const CUDA_KERNEL_NODE_PARAMS *np)
{
	return cuGraphAddKernelNode_v2(node, g, deps, ndeps, np);
}
EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g, unsigned long long flags)
{
	(void)flags;
	struct graph_obj *c = malloc(sizeof(*c));
	memcpy(c, g, sizeof(*c));
	*e = (CUgraphExec)c;
	return CUDA_SUCCESS;
}
static CUresult graph_launch(CUgraphExec e, CUstream s)
{
	struct graph_obj *g = (struct graph_obj *)e;
	if (!g)
		return CUDA_ERROR_INVALID_HANDLE;
	ensure_stats();
	for (int i = 0; i < g->n; i++) {
		void *ptrs[4];
		for (int j = 0; j < 4; j++)
			ptrs[j] = g->nodes[i].args[j];
		CUresult r = run_kernel_on((CUfunction)g->nodes[i].k, ptrs, s);
		if (r)
			return r;
	}
	return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphLaunch(CUgraphExec e, CUstream s) { return graph_launch(e, s); }
EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec e, CUstream s) { return graph_launch(e, s); }
EXPORT CUresult cuGraphExecDestroy(CUgraphExec e) { free(e); return CUDA_SUCCESS; }
EXPORT CUresult cuGraphDestroy(CUgraph g) { free(g); return CUDA_SUCCESS; }

/* ---- cuGetProcAddress ---- */

struct proc { const char *name; int minver; void *fn; void *ptsz; };
#define E(n) { #n, 0, (void *)n, NULL }
#define V2(n, ver) { #n, ver, (void *)n##_v2, NULL }
static const struct proc procs[] = {
	E(cuInit), E(cuDriverGetVersion), E(cuDeviceGetCount), E(cuDeviceGet), E(cuDeviceGetName),
	E(cuDeviceGetAttribute), { "cuDeviceGetUuid", 0, (void *)cuDeviceGetUuid_v2, NULL },
	E(cuDevicePrimaryCtxRetain),
	V2(cuDeviceTotalMem, 3020), V2(cuDevicePrimaryCtxRelease, 11000),
	V2(cuCtxCreate, 3020), V2(cuCtxDestroy, 4000), E(cuCtxSetCurrent), E(cuCtxGetCurrent), E(cuCtxGetDevice),
	E(cuCtxSynchronize), E(cuGetErrorString), E(cuGetErrorName), V2(cuMemGetInfo, 3020),
	V2(cuMemAlloc, 3020), V2(cuMemFree, 3020), V2(cuMemAllocPitch, 3020), E(cuMemAllocManaged),
	{ "cuMemAllocAsync", 0, (void *)cuMemAllocAsync, (void *)cuMemAllocAsync_ptsz },
	E(cuMemAllocFromPoolAsync),
	{ "cuMemFreeAsync", 0, (void *)cuMemFreeAsync, (void *)cuMemFreeAsync_ptsz },
	E(cuIpcGetMemHandle), E(cuMemHostAlloc), V2(cuMemAllocHost, 3020), E(cuMemFreeHost),
	E(cuMemGetAllocationGranularity), E(cuMemAddressReserve), E(cuMemAddressFree), E(cuMemCreate),
	E(cuMemRelease), E(cuMemMap), E(cuMemSetAccess), E(cuMemUnmap), E(cuMemcpy), E(cuMemcpyAsync),
	V2(cuMemcpyHtoD, 3020), V2(cuMemcpyDtoH, 3020), V2(cuMemcpyDtoD, 3020), V2(cuMemcpyHtoDAsync, 3020),
	V2(cuMemcpyDtoHAsync, 3020), V2(cuMemcpyDtoDAsync, 3020), V2(cuMemsetD8, 3020), V2(cuMemsetD32, 3020),
	E(cuMemsetD8Async), E(cuMemsetD32Async), E(cuStreamCreate), V2(cuStreamDestroy, 4000),
	E(cuStreamSynchronize), E(cuStreamQuery), E(cuEventCreate), V2(cuEventDestroy, 4000), E(cuEventRecord),
	E(cuEventSynchronize), E(cuEventQuery), V2(cuStreamBeginCapture, 10010), E(cuStreamEndCapture),
	E(cuStreamIsCapturing), E(cuThreadExchangeStreamCaptureMode),
	E(cuModuleLoadData), E(cuModuleUnload), E(cuModuleGetFunction),
	{ "cuLaunchKernel", 0, (void *)cuLaunchKernel, (void *)cuLaunchKernel_ptsz },
	E(cuLaunchKernelEx), E(cuGraphCreate), V2(cuGraphAddKernelNode, 12000), E(cuGraphInstantiateWithFlags),
	{ "cuGraphLaunch", 0, (void *)cuGraphLaunch, (void *)cuGraphLaunch_ptsz },
	E(cuGraphExecDestroy), E(cuGraphDestroy),
	{ "cuGetProcAddress", 12000, NULL, NULL }, /* filled in below */
};

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int ver, cuuint64_t flags, int *status);
EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int ver, cuuint64_t flags);

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int ver, cuuint64_t flags, int *status)
{
	if (status)
		*status = 0;
	if (!symbol || !pfn)
		return CUDA_ERROR_INVALID_VALUE;
	*pfn = NULL;
	if (strcmp(symbol, "cuGetProcAddress") == 0) {
		*pfn = ver >= 12000 ? (void *)cuGetProcAddress_v2 : (void *)cuGetProcAddress;
		return CUDA_SUCCESS;
	}
	for (size_t i = 0; i < sizeof(procs) / sizeof(procs[0]); i++) {
		const struct proc *p = &procs[i];
		if (strcmp(p->name, symbol) != 0 || !p->fn)
			continue;
		if (ver < p->minver) {
			if (status)
				*status = 2; /* CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT */
			return CUDA_ERROR_NOT_FOUND;
		}
		*pfn = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) && p->ptsz ? p->ptsz : p->fn;
		return CUDA_SUCCESS;
	}
	if (status)
		*status = 1; /* CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND */
	return CUDA_ERROR_NOT_FOUND;
}

/* fakecuda_direct returns the fake's own function for a driver name, past
 * any interposer (for benchmarks that compare a call with and without it). */
EXPORT void *fakecuda_direct(const char *symbol)
{
	for (size_t i = 0; i < sizeof(procs) / sizeof(procs[0]); i++)
		if (procs[i].fn && strcmp(procs[i].name, symbol) == 0)
			return procs[i].fn;
	return NULL;
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int ver, cuuint64_t flags)
{
	return cuGetProcAddress_v2(symbol, pfn, ver, flags, NULL);
}
