/* internal.h — shared between the shim's translation units; not an ABI. */
#ifndef MIGSWAP_INTERNAL_H
#define MIGSWAP_INTERNAL_H

#include "cudadrv.h"
#include "migswap.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stddef.h>

#define MS_HIDDEN __attribute__((visibility("hidden")))

/* The real driver, resolved from libcuda.so.1 (never from ourselves). */
struct drv {
	void *lib;
	CUresult (*cuInit)(unsigned int);
	CUresult (*cuCtxGetCurrent)(CUcontext *);
	CUresult (*cuCtxSetCurrent)(CUcontext);
	CUresult (*cuCtxGetDevice)(CUdevice *);
	CUresult (*cuCtxSynchronize)(void);
	CUresult (*cuDeviceGet)(CUdevice *, int);
	CUresult (*cuDeviceGetUuid)(char *, CUdevice);
	CUresult (*cuMemGetAllocationGranularity)(size_t *, const CUmemAllocationProp *, int);
	CUresult (*cuMemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
	CUresult (*cuMemAddressFree)(CUdeviceptr, size_t);
	CUresult (*cuMemCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
	CUresult (*cuMemRelease)(CUmemGenericAllocationHandle);
	CUresult (*cuMemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
	CUresult (*cuMemUnmap)(CUdeviceptr, size_t);
	CUresult (*cuMemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
	CUresult (*cuMemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);
	CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
	CUresult (*cuMemHostAlloc)(void **, size_t, unsigned int);
	CUresult (*cuMemFreeHost)(void *);
	CUresult (*cuStreamCreate)(CUstream *, unsigned int);
	CUresult (*cuStreamSynchronize)(CUstream);
	CUresult (*cuEventCreate)(CUevent *, unsigned int);
	CUresult (*cuEventRecord)(CUevent, CUstream);
	CUresult (*cuEventQuery)(CUevent);
	CUresult (*cuEventSynchronize)(CUevent);
	CUresult (*cuStreamIsCapturing)(CUstream, int *);           /* optional */
	CUresult (*cuThreadExchangeStreamCaptureMode)(int *);      /* optional */
	CUresult (*cuGetErrorString)(CUresult, const char **);
	CUresult (*cuGetProcAddress)(const char *, void **, int, cuuint64_t);
	CUresult (*cuGetProcAddress_v2)(const char *, void **, int, cuuint64_t, int *);
};
MS_HIDDEN extern struct drv drv;

MS_HIDDEN extern int ms_log_on;
MS_HIDDEN void ms_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
MS_HIDDEN const char *ms_errstr(CUresult r);
MS_HIDDEN double ms_now(void);
MS_HIDDEN int ms_ensure_drv(void);

/* One VMM-backed allocation. */
struct ms_alloc {
	CUdeviceptr ptr;
	size_t size;    /* what the program asked for */
	size_t mapsize; /* granularity-rounded: reserved, created and mapped */
	CUmemGenericAllocationHandle handle; /* 0 while swapped out */
	CUcontext ctx;
	CUdevice dev;
	int ipc_exported;
	size_t host_off; /* offset of its copy in the pinned arena while out */
	uint64_t csum;
	struct ms_alloc *next;
};

/* The allocation table: a hash of ms_alloc by ptr, under ms_table_mu. */
#define MS_TABLE_NBUCKETS 4096 /* bucket_of takes the top 12 bits of a hash */
MS_HIDDEN extern pthread_mutex_t ms_table_mu;
MS_HIDDEN extern struct ms_alloc *ms_table[MS_TABLE_NBUCKETS];
MS_HIDDEN extern atomic_ullong ms_live_allocs, ms_live_bytes;

/* Things that make a swap unsafe (counts of live objects). */
MS_HIDDEN extern atomic_long ms_ipc_exported, ms_managed_live, ms_async_live, ms_app_vmm_live, ms_captures;

MS_HIDDEN extern atomic_int ms_mode;  /* enum migswap_mode */
MS_HIDDEN extern atomic_int ms_state; /* enum migswap_state */
MS_HIDDEN extern struct migswap_stats ms_stats_counters; /* the uint64 counters, updated atomically */

/* The gate every launch, copy and allocation passes through. */
MS_HIDDEN void ms_gate_close(void);
MS_HIDDEN int ms_gate_wait_idle(double timeout_s); /* 0 when no call is in flight */
MS_HIDDEN void ms_gate_open(void);

MS_HIDDEN const char *ms_unswappable_reason(void);
MS_HIDDEN CUresult ms_make_prop(CUdevice dev, CUmemAllocationProp *prop, CUmemAccessDesc *acc);

/* Swap engine (swap.c). Run on the control thread, one at a time. Return 0 on
 * success; on failure fill err. progress(arg, done, total) is called at most
 * every 100 ms. */
typedef void (*ms_progress_fn)(void *arg, uint64_t done, uint64_t total);
MS_HIDDEN int ms_swap_out(char *err, size_t errlen, uint64_t *bytes, ms_progress_fn progress, void *arg);
MS_HIDDEN int ms_swap_in(char *err, size_t errlen, uint64_t *bytes, ms_progress_fn progress, void *arg);
MS_HIDDEN void ms_swap_atfork_child(void);
/* ms_swap_prepin grows the pinned arena to cover the live allocations, ahead of
 * the first swap-out (MIGSWAP_PREPIN=1); control thread only. */
MS_HIDDEN void ms_swap_prepin(void);
MS_HIDDEN uint64_t ms_swap_arena_bytes(void);

/* Control connection (control.c). */
MS_HIDDEN int ms_control_connect(void); /* 1 when registered with a daemon */
MS_HIDDEN void ms_mps_env(void);        /* constructor: join the daemon's MPS control daemon */
MS_HIDDEN int ms_control_need(uint64_t bytes); /* 1 when the daemon granted */
MS_HIDDEN int ms_control_connected(void);
MS_HIDDEN void ms_control_usage_changed(void);
MS_HIDDEN void ms_control_atfork_prepare(void);
MS_HIDDEN void ms_control_atfork_parent(void);
MS_HIDDEN void ms_control_atfork_child(void);

/* ------------------------------------------------ priority launch gating
 * prio.c; PROTOCOL.md "Priority launch gating". The daemon hands every
 * shimmed process of a device the same shared page (a memfd over the control
 * socket) and a slot in it. A process with lower-priority neighbours
 * ("signals") sets its slot's bit in page->busy while it has launches in
 * flight (a watcher thread clears it once events recorded after them have
 * completed); a process with higher-priority neighbours reads page->busy &
 * mask before each launch and, when a bit is set, waits (policy gate) or lets
 * at most budget launches be in flight (policy budget). */
#define MS_PG_MAGIC 0x5047534dU /* "MSGP" read as a little-endian uint32 */
#define MS_PG_VERSION 1
#define MS_PG_SLOTS 64
#define MS_PG_SIZE 4096
struct ms_pg_page {
	uint32_t magic, version;
	_Atomic uint64_t busy;     /* bit i: slot i has work in flight */
	_Atomic uint32_t epoch;    /* bumped after a bit is cleared; futex word (shared) */
	_Atomic uint32_t waiters;  /* processes sleeping on epoch */
	uint8_t reserved[40];
	_Atomic uint32_t beat_ms[MS_PG_SLOTS]; /* CLOCK_MONOTONIC ms, low 32 bits: the slot's
						 * watcher last saw its work in flight */
};
enum { MS_PG_OFF = 0, MS_PG_GATE = 1, MS_PG_BUDGET = 2 };

MS_HIDDEN extern atomic_int ms_pg_on;       /* mask != 0 or signal: the slow path is needed */
MS_HIDDEN extern atomic_ullong ms_pg_mask;  /* slots of higher-priority processes */
MS_HIDDEN extern atomic_int ms_pg_signal;   /* publish this process's work in flight */
MS_HIDDEN extern struct ms_pg_page *_Atomic ms_pg_page;
MS_HIDDEN extern atomic_long ms_pg_calls;   /* signalled calls inside the driver now */
MS_HIDDEN extern atomic_int ms_pg_local_busy;

MS_HIDDEN int ms_prio_hold(CUstream s); /* waits while a higher slot is busy; budget token or 0 */
MS_HIDDEN int ms_prio_depth(CUstream s); /* keeps at most depth launches in flight; token */
MS_HIDDEN extern atomic_int ms_pg_depth;
MS_HIDDEN void ms_prio_set_busy(void);
MS_HIDDEN void ms_prio_note(CUstream s);
MS_HIDDEN void ms_prio_capture_seen(CUstream s); /* a capture begins on s: its captured launches are not counted */
MS_HIDDEN void ms_prio_budget_record(CUstream s, int tok);
MS_HIDDEN void ms_prio_stream_destroyed(CUstream s);

/* ms_prio_check runs before the swap gate: it holds a low-priority launch
 * while a higher-priority slot is busy. Cost when nothing is busy: three loads. */
static inline int ms_prio_check(CUstream s)
{
	uint64_t m = atomic_load_explicit(&ms_pg_mask, memory_order_relaxed);
	if (!m)
		return 0;
	struct ms_pg_page *pg = atomic_load_explicit(&ms_pg_page, memory_order_relaxed);
	if (__builtin_expect(pg != NULL && (atomic_load_explicit(&pg->busy, memory_order_acquire) & m) != 0, 0))
		return ms_prio_hold(s);
	if (__builtin_expect(atomic_load_explicit(&ms_pg_depth, memory_order_relaxed) != 0, 0))
		return ms_prio_depth(s);
	return 0;
}

/* ms_prio_pass: with gating on, may this call take the plain fast path?
 * Yes when it does not signal, has no depth limit and no higher slot is busy. */
static inline int ms_prio_pass(void)
{
	if (atomic_load_explicit(&ms_pg_signal, memory_order_relaxed) ||
	    atomic_load_explicit(&ms_pg_depth, memory_order_relaxed))
		return 0;
	uint64_t m = atomic_load_explicit(&ms_pg_mask, memory_order_relaxed);
	struct ms_pg_page *pg = atomic_load_explicit(&ms_pg_page, memory_order_relaxed);
	return !m || !pg || !(atomic_load_explicit(&pg->busy, memory_order_acquire) & m);
}

/* ms_prio_sig_enter/exit bracket the driver call of a signalling process. */
static inline int ms_prio_sig_enter(void)
{
	if (!atomic_load_explicit(&ms_pg_signal, memory_order_relaxed))
		return 0;
	atomic_fetch_add(&ms_pg_calls, 1);
	if (!atomic_load(&ms_pg_local_busy))
		ms_prio_set_busy();
	return 1;
}

static inline void ms_prio_sig_exit(CUstream s, int sig)
{
	if (sig) {
		ms_prio_note(s);
		atomic_fetch_sub(&ms_pg_calls, 1);
	}
}

/* Control thread: apply a `gate` message (page_fd >= 0 maps a new page). */
struct ms_prio_cfg {
	int policy, budget, depth, slot, signal;
	unsigned stale_ms;
	uint64_t mask;
};
MS_HIDDEN int ms_prio_apply(const struct ms_prio_cfg *c, int page_fd, char *err, size_t errlen);
/* ms_prio_quiesce waits until the watcher is not inside an event call (a
 * capture is about to begin; ms_captures is already raised). */
MS_HIDDEN void ms_prio_quiesce(void);
MS_HIDDEN void ms_prio_detach(void); /* the daemon went away: never hold, never signal */
MS_HIDDEN int ms_prio_stats_dirty(void);
MS_HIDDEN void ms_prio_get_stats(struct migswap_stats *s);
MS_HIDDEN void ms_prio_atfork_child(void);

#define MS_STAT_ADD(field, n) __atomic_add_fetch(&ms_stats_counters.field, (n), __ATOMIC_RELAXED)

#endif
