/*
 * fakecuda.h — the test-only extras of the fake libcuda.so (fakecuda.c).
 *
 * The fake is a host-memory CUDA driver: "device pointers" are real host
 * addresses, VMM maps memfd-backed "physical memory" at reserved addresses, and
 * kernels are C functions looked up by name (see fakecuda.c for the list).
 *
 * Environment:
 *   FAKECUDA_MEM_BYTES    device capacity in bytes (default 1 GiB); allocations
 *                         beyond it fail with CUDA_ERROR_OUT_OF_MEMORY.
 *   FAKECUDA_GRANULARITY  VMM granularity in bytes (default 2 MiB, a power of two).
 *   FAKECUDA_STATS        path of a file holding struct fakecuda_stats, mapped
 *                         shared: every process using the same file shares one
 *                         "device" (capacity and bytes in use), and a test can
 *                         read the counters from outside. Created if absent.
 *   FAKECUDA_SHARED_DEVICE=1  timed kernels (sleep_us) of every process sharing the
 *                         FAKECUDA_STATS file run one after another on one device
 *                         timeline, first come first served (a GPU with no time
 *                         slicing): a kernel queued behind others' starts when they end.
 */
#ifndef MIGSWAP_FAKECUDA_H
#define MIGSWAP_FAKECUDA_H

#include <stdint.h>

#define FAKECUDA_STATS_MAGIC 0x4144554345414bULL /* "KAECUDA" */

/* Layout of the FAKECUDA_STATS file: little-endian uint64 words. */
struct fakecuda_stats {
	uint64_t magic;        /* FAKECUDA_STATS_MAGIC once initialised */
	uint64_t capacity;     /* bytes */
	uint64_t in_use;       /* bytes held: cuMemAlloc* plus cuMemCreate handles */
	uint64_t peak;         /* high-water mark of in_use */
	uint64_t launches;     /* kernels run (direct launches and graph nodes) */
	uint64_t vmm_creates;  /* cuMemCreate calls that succeeded */
	uint64_t plain_allocs; /* cuMemAlloc/Pitch/Managed/Async calls that succeeded */
	uint64_t vmm_in_use;   /* bytes of in_use held by cuMemCreate handles */
	uint64_t event_records; /* cuEventRecord calls (all processes on the device) */
	uint64_t device_done_ns; /* FAKECUDA_SHARED_DEVICE=1: CLOCK_MONOTONIC ns when the device's
				  * queued timed kernels (every process's) end */
	uint64_t captures_invalidated; /* stream captures another thread's call invalidated */
	uint64_t records_after_capture; /* cuEventRecord calls on a stream some capture has used */
};

uint64_t fakecuda_bytes_in_use(void);
int fakecuda_get_stats(struct fakecuda_stats *out);
/* This process's timed kernels (sleep_us) in flight now, and the most in
 * flight at any launch since the last reset; reset != 0 starts a new maximum. */
void fakecuda_inflight(uint64_t *now_n, uint64_t *max_n, int reset);
/* The fake's own function for a driver name (e.g. "cuLaunchKernel"), past any
 * LD_PRELOADed interposer; NULL if unknown. */
void *fakecuda_direct(const char *symbol);
/* From now on cuStreamIsCapturing answers "not capturing" to a thread in
 * relaxed capture mode (the shim's gate watcher) us µs late (0: at once),
 * which widens the window in which a capture may begin after the check. */
void fakecuda_set_capture_check_delay(long us);

#endif
