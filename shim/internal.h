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
MS_HIDDEN int ms_control_need(uint64_t bytes); /* 1 when the daemon granted */
MS_HIDDEN int ms_control_connected(void);
MS_HIDDEN void ms_control_usage_changed(void);
MS_HIDDEN void ms_control_atfork_prepare(void);
MS_HIDDEN void ms_control_atfork_parent(void);
MS_HIDDEN void ms_control_atfork_child(void);

#define MS_STAT_ADD(field, n) __atomic_add_fetch(&ms_stats_counters.field, (n), __ATOMIC_RELAXED)

#endif
