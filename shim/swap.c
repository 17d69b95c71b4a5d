/*
 * swap.c — the swap engine of libmigswap.so.
 *
 * Swap-out: close the gate (new launches, copies and allocations wait), wait
 * until no intercepted call is in flight, drain the context, copy every
 * allocation into a pinned host arena with chunked async copies alternating
 * over two streams, then unmap and release the physical memory (the virtual
 * ranges stay reserved). Swap-in: create physical memory, map it at the same
 * addresses, copy back, (optionally) verify checksums, open the gate.
 * Both run on the control thread, one at a time.
 */
#define _GNU_SOURCE
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHUNK ((size_t)64 << 20)
#define BATCH ((size_t)1 << 30)
#define ARENA_ALIGN 4096

static void *arena;
static size_t arena_size;
static CUstream streams[2];
static CUcontext streams_ctx;
static int checksum_on = -1;

static int checksum_enabled(void)
{
	if (checksum_on < 0) {
		const char *e = getenv("MIGSWAP_CHECKSUM");
		checksum_on = e && strcmp(e, "1") == 0;
	}
	return checksum_on;
}

/* checksum: 4-lane multiply-xor over 8-byte words, then the tail bytes. */
static uint64_t checksum(const void *p, size_t n)
{
	const uint64_t *w = p;
	size_t nw = n / 8;
	uint64_t h[4] = { 0x9E3779B97F4A7C15ULL, 0xC2B2AE3D27D4EB4FULL, 0x165667B19E3779F9ULL, 0x27D4EB2F165667C5ULL };
	size_t i = 0;
	for (; i + 4 <= nw; i += 4) {
		for (int k = 0; k < 4; k++) {
			h[k] ^= w[i + k];
			h[k] *= 0x100000001B3ULL;
			h[k] ^= h[k] >> 29;
		}
	}
	for (; i < nw; i++) {
		h[0] ^= w[i];
		h[0] *= 0x100000001B3ULL;
		h[0] ^= h[0] >> 29;
	}
	const unsigned char *b = (const unsigned char *)p + nw * 8;
	for (size_t j = 0; j < n % 8; j++) {
		h[1] ^= b[j];
		h[1] *= 0x100000001B3ULL;
	}
	return h[0] ^ (h[1] * 3) ^ (h[2] * 5) ^ (h[3] * 7) ^ n;
}

/* Parallel checksums: every allocation is cut into CSUM_BLOCK blocks hashed by
 * a few threads; an allocation's checksum folds its block hashes in order. */
#define CSUM_BLOCK ((size_t)16 << 20)

struct csum_job {
	struct ms_alloc **v;
	size_t n;
	size_t *first_block; /* per allocation: index of its first block */
	size_t nblocks;
	uint64_t *hashes;
	atomic_size_t next;
};

static void *csum_worker(void *arg)
{
	struct csum_job *j = arg;
	size_t ai = 0;
	for (;;) {
		size_t b = atomic_fetch_add(&j->next, 1);
		if (b >= j->nblocks)
			return NULL;
		while (ai + 1 < j->n && j->first_block[ai + 1] <= b)
			ai++;
		while (ai > 0 && j->first_block[ai] > b)
			ai--;
		struct ms_alloc *a = j->v[ai];
		size_t off = (b - j->first_block[ai]) * CSUM_BLOCK;
		size_t len = a->size - off < CSUM_BLOCK ? a->size - off : CSUM_BLOCK;
		j->hashes[b] = checksum((char *)arena + a->host_off + off, len);
	}
}

/* checksum_all computes the checksum of every allocation's arena copy into
 * out[i]; 0 on success. */
static int checksum_all(struct ms_alloc **v, size_t n, uint64_t *out)
{
	struct csum_job j;
	memset(&j, 0, sizeof j);
	j.v = v;
	j.n = n;
	j.first_block = calloc(n + 1, sizeof(size_t));
	if (!j.first_block)
		return -1;
	for (size_t i = 0; i < n; i++) {
		j.first_block[i] = j.nblocks;
		j.nblocks += v[i]->size ? (v[i]->size + CSUM_BLOCK - 1) / CSUM_BLOCK : 1;
	}
	j.first_block[n] = j.nblocks;
	j.hashes = calloc(j.nblocks ? j.nblocks : 1, sizeof(uint64_t));
	if (!j.hashes) {
		free(j.first_block);
		return -1;
	}
	long nt = sysconf(_SC_NPROCESSORS_ONLN);
	if (nt > 8)
		nt = 8;
	if (nt < 1)
		nt = 1;
	pthread_t th[8];
	long started = 0;
	for (long i = 1; i < nt; i++)
		if (pthread_create(&th[started], NULL, csum_worker, &j) == 0)
			started++;
	csum_worker(&j);
	for (long i = 0; i < started; i++)
		pthread_join(th[i], NULL);
	for (size_t i = 0; i < n; i++) {
		uint64_t h = v[i]->size;
		for (size_t b = j.first_block[i]; b < j.first_block[i + 1]; b++)
			h = (h ^ j.hashes[b]) * 0x100000001B3ULL + b - j.first_block[i];
		out[i] = h;
	}
	free(j.hashes);
	free(j.first_block);
	return 0;
}

/* snapshot returns the live allocations (caller frees the array). */
static struct ms_alloc **snapshot(size_t *n)
{
	pthread_mutex_lock(&ms_table_mu);
	size_t cap = atomic_load(&ms_live_allocs), k = 0;
	struct ms_alloc **v = calloc(cap ? cap : 1, sizeof *v);
	if (v)
		for (size_t i = 0; i < MS_TABLE_NBUCKETS; i++)
			for (struct ms_alloc *a = ms_table[i]; a && k < cap; a = a->next)
				v[k++] = a;
	pthread_mutex_unlock(&ms_table_mu);
	*n = k;
	return v;
}

static int fail(char *err, size_t errlen, const char *what, CUresult r)
{
	if (r)
		snprintf(err, errlen, "%s: %s (CUDA error %d)", what, ms_errstr(r), r);
	else
		snprintf(err, errlen, "%s", what);
	MS_STAT_ADD(refusals, 1);
	ms_log("swap failed: %s", err);
	return -1;
}

static CUresult ensure_streams(CUcontext ctx)
{
	if (streams[0] && streams_ctx == ctx)
		return CUDA_SUCCESS;
	CUresult r;
	for (int i = 0; i < 2; i++)
		if ((r = drv.cuStreamCreate(&streams[i], CU_STREAM_NON_BLOCKING)))
			return r;
	streams_ctx = ctx;
	return CUDA_SUCCESS;
}

static CUresult ensure_arena(size_t need)
{
	if (arena && arena_size >= need)
		return CUDA_SUCCESS;
	if (arena) {
		drv.cuMemFreeHost(arena);
		arena = NULL;
		arena_size = 0;
	}
	size_t want = need + need / 8;
	want = (want + ((size_t)2 << 20) - 1) & ~(((size_t)2 << 20) - 1);
	double t0 = ms_now();
	CUresult r = drv.cuMemHostAlloc(&arena, want, CU_MEMHOSTALLOC_PORTABLE);
	if (r) {
		arena = NULL;
		return r;
	}
	arena_size = want;
	ms_log("pinned arena of %zu bytes in %.3f s", want, ms_now() - t0);
	return CUDA_SUCCESS;
}

/* copy moves every allocation between device and arena in chunks alternating
 * over two streams, synchronising every BATCH bytes (progress) and at the end. */
static CUresult copy_all(struct ms_alloc **v, size_t n, int to_host, uint64_t total, ms_progress_fn progress, void *arg)
{
	size_t since_sync = 0, done = 0;
	int k = 0;
	double last = ms_now();
	CUresult r = CUDA_SUCCESS;
	for (size_t i = 0; i < n && !r; i++) {
		struct ms_alloc *a = v[i];
		for (size_t off = 0; off < a->size && !r; off += CHUNK) {
			size_t len = a->size - off < CHUNK ? a->size - off : CHUNK;
			char *h = (char *)arena + a->host_off + off;
			CUstream s = streams[k++ & 1];
			r = to_host ? drv.cuMemcpyDtoHAsync(h, a->ptr + off, len, s)
				    : drv.cuMemcpyHtoDAsync(a->ptr + off, h, len, s);
			since_sync += len;
			done += len;
			if (!r && since_sync >= BATCH) {
				r = drv.cuStreamSynchronize(streams[0]);
				if (!r)
					r = drv.cuStreamSynchronize(streams[1]);
				since_sync = 0;
				if (progress && ms_now() - last >= 0.1) {
					progress(arg, done, total);
					last = ms_now();
				}
			}
		}
	}
	CUresult r0 = drv.cuStreamSynchronize(streams[0]);
	CUresult r1 = drv.cuStreamSynchronize(streams[1]);
	return r ? r : r0 ? r0 : r1;
}

static int same_ctx(struct ms_alloc **v, size_t n)
{
	for (size_t i = 1; i < n; i++)
		if (v[i]->ctx != v[0]->ctx)
			return 0;
	return 1;
}

int ms_swap_out(char *err, size_t errlen, uint64_t *bytes, ms_progress_fn progress, void *arg)
{
	*bytes = 0;
	int st = atomic_load(&ms_state);
	if (st == MIGSWAP_STATE_SWAPPED_OUT)
		return 0;
	if (st == MIGSWAP_STATE_CORRUPT)
		return fail(err, errlen, "memory failed verification on an earlier swap-in; the process stays blocked", 0);
	if (atomic_load(&ms_mode) != MIGSWAP_MODE_VMM)
		return fail(err, errlen, "the shim runs in passthrough mode", 0);
	const char *why = ms_unswappable_reason();
	if (why)
		return fail(err, errlen, why, 0);

	atomic_store(&ms_state, MIGSWAP_STATE_SWAPPING_OUT);
	ms_gate_close();
	if (ms_gate_wait_idle(60.0) != 0) {
		ms_gate_open();
		atomic_store(&ms_state, MIGSWAP_STATE_RESIDENT);
		return fail(err, errlen, "timed out waiting for in-flight CUDA calls to return", 0);
	}
	if ((why = ms_unswappable_reason())) {
		ms_gate_open();
		atomic_store(&ms_state, MIGSWAP_STATE_RESIDENT);
		return fail(err, errlen, why, 0);
	}
	size_t n;
	struct ms_alloc **v = snapshot(&n);
	if (!v) {
		ms_gate_open();
		atomic_store(&ms_state, MIGSWAP_STATE_RESIDENT);
		return fail(err, errlen, "out of host memory", 0);
	}
	int rc = 0;
	CUresult r;
	if (n == 0) {
		atomic_store(&ms_state, MIGSWAP_STATE_SWAPPED_OUT);
		MS_STAT_ADD(swaps_out, 1);
		free(v);
		return 0;
	}
	if (!same_ctx(v, n)) {
		rc = fail(err, errlen, "allocations live in more than one CUDA context", 0);
		goto reopen;
	}
	drv.cuCtxSetCurrent(v[0]->ctx);
	if ((r = drv.cuCtxSynchronize())) {
		rc = fail(err, errlen, "draining the process's streams", r);
		goto reopen;
	}
	uint64_t total = 0;
	size_t off = 0;
	for (size_t i = 0; i < n; i++) {
		v[i]->host_off = off;
		off += (v[i]->size + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
		total += v[i]->size;
	}
	if ((r = ensure_arena(off))) {
		rc = fail(err, errlen, "allocating the pinned host arena", r);
		goto reopen;
	}
	if ((r = ensure_streams(v[0]->ctx))) {
		rc = fail(err, errlen, "creating copy streams", r);
		goto reopen;
	}
	if ((r = copy_all(v, n, 1, total, progress, arg))) {
		rc = fail(err, errlen, "copying device memory to host", r);
		goto reopen;
	}
	if (checksum_enabled()) {
		uint64_t *cs = calloc(n, sizeof *cs);
		if (!cs || checksum_all(v, n, cs) != 0) {
			free(cs);
			rc = fail(err, errlen, "out of host memory for checksums", 0);
			goto reopen;
		}
		for (size_t i = 0; i < n; i++)
			v[i]->csum = cs[i];
		free(cs);
	}
	for (size_t i = 0; i < n; i++) {
		if ((r = drv.cuMemUnmap(v[i]->ptr, v[i]->mapsize))) {
			ms_log("unmap of %#llx failed: %s; it stays resident", v[i]->ptr, ms_errstr(r));
			continue;
		}
		if ((r = drv.cuMemRelease(v[i]->handle)))
			ms_log("release of %#llx failed: %s", v[i]->ptr, ms_errstr(r));
		v[i]->handle = 0;
	}
	atomic_store(&ms_state, MIGSWAP_STATE_SWAPPED_OUT);
	MS_STAT_ADD(swaps_out, 1);
	MS_STAT_ADD(bytes_out, total);
	*bytes = total;
	if (progress)
		progress(arg, total, total);
	free(v);
	return 0;
reopen:
	free(v);
	atomic_store(&ms_state, MIGSWAP_STATE_RESIDENT);
	ms_gate_open();
	return rc;
}

int ms_swap_in(char *err, size_t errlen, uint64_t *bytes, ms_progress_fn progress, void *arg)
{
	*bytes = 0;
	int st = atomic_load(&ms_state);
	if (st == MIGSWAP_STATE_RESIDENT)
		return 0;
	if (st == MIGSWAP_STATE_CORRUPT)
		return fail(err, errlen, "memory failed verification on an earlier swap-in; the process stays blocked", 0);
	if (st != MIGSWAP_STATE_SWAPPED_OUT)
		return fail(err, errlen, "a swap is in progress", 0);
	atomic_store(&ms_state, MIGSWAP_STATE_SWAPPING_IN);
	size_t n;
	struct ms_alloc **v = snapshot(&n);
	if (!v) {
		atomic_store(&ms_state, MIGSWAP_STATE_SWAPPED_OUT);
		return fail(err, errlen, "out of host memory", 0);
	}
	if (n == 0) {
		free(v);
		goto resume;
	}
	drv.cuCtxSetCurrent(v[0]->ctx);
	CUresult r;
	uint64_t total = 0;
	unsigned char *mine = calloc(n, 1);
	if (!mine) {
		free(v);
		atomic_store(&ms_state, MIGSWAP_STATE_SWAPPED_OUT);
		return fail(err, errlen, "out of host memory", 0);
	}
	for (size_t i = 0; i < n; i++) {
		struct ms_alloc *a = v[i];
		total += a->size;
		if (a->handle)
			continue; /* stayed resident */
		CUmemAllocationProp prop;
		CUmemAccessDesc acc;
		ms_make_prop(a->dev, &prop, &acc);
		CUmemGenericAllocationHandle h = 0;
		if ((r = drv.cuMemCreate(&h, a->mapsize, &prop, 0)))
			goto undo;
		if ((r = drv.cuMemMap(a->ptr, a->mapsize, 0, h, 0))) {
			drv.cuMemRelease(h);
			goto undo;
		}
		if ((r = drv.cuMemSetAccess(a->ptr, a->mapsize, &acc, 1))) {
			drv.cuMemUnmap(a->ptr, a->mapsize);
			drv.cuMemRelease(h);
			goto undo;
		}
		a->handle = h;
		mine[i] = 1;
		continue;
	undo:
		/* give back what this attempt took; stay swapped out and blocked */
		for (size_t j = 0; j < i; j++) {
			if (mine[j]) {
				drv.cuMemUnmap(v[j]->ptr, v[j]->mapsize);
				drv.cuMemRelease(v[j]->handle);
				v[j]->handle = 0;
			}
		}
		free(v);
		free(mine);
		atomic_store(&ms_state, MIGSWAP_STATE_SWAPPED_OUT);
		uint64_t need = atomic_load(&ms_live_bytes);
		char what[256];
		snprintf(what, sizeof what,
			 "cannot get %llu bytes of device memory back; the process stays swapped out and blocked",
			 (unsigned long long)need);
		return fail(err, errlen, what, r);
	}
	free(mine);
	if ((r = ensure_streams(v[0]->ctx)) || (r = copy_all(v, n, 0, total, progress, arg))) {
		free(v);
		atomic_store(&ms_state, MIGSWAP_STATE_CORRUPT);
		return fail(err, errlen, "copying host memory back to the device; the process stays blocked", r);
	}
	if (checksum_enabled()) {
		/* read the device back into the arena and compare with swap-out */
		if ((r = copy_all(v, n, 1, total, NULL, NULL))) {
			free(v);
			atomic_store(&ms_state, MIGSWAP_STATE_CORRUPT);
			return fail(err, errlen, "reading back for verification; the process stays blocked", r);
		}
		uint64_t *cs = calloc(n, sizeof *cs);
		if (!cs || checksum_all(v, n, cs) != 0) {
			free(cs);
			free(v);
			atomic_store(&ms_state, MIGSWAP_STATE_CORRUPT);
			return fail(err, errlen, "out of host memory for checksums; the process stays blocked", 0);
		}
		for (size_t i = 0; i < n; i++) {
			uint64_t c = cs[i];
			if (c != v[i]->csum) {
				free(cs);
				char what[256];
				snprintf(what, sizeof what,
					 "checksum mismatch in allocation %#llx (%zu bytes) after swap-in; the process stays blocked",
					 v[i]->ptr, v[i]->size);
				free(v);
				atomic_store(&ms_state, MIGSWAP_STATE_CORRUPT);
				return fail(err, errlen, what, 0);
			}
		}
		free(cs);
	}
	free(v);
	*bytes = total;
	MS_STAT_ADD(bytes_in, total);
	if (progress)
		progress(arg, total, total);
resume:
	MS_STAT_ADD(swaps_in, 1);
	atomic_store(&ms_state, MIGSWAP_STATE_RESIDENT);
	ms_gate_open();
	return 0;
}

void ms_swap_atfork_child(void)
{
	/* the arena and streams belong to the parent's context */
	arena = NULL;
	arena_size = 0;
	streams[0] = streams[1] = NULL;
	streams_ctx = NULL;
}

uint64_t ms_swap_arena_bytes(void)
{
	return arena_size;
}

void ms_swap_prepin(void)
{
	if (atomic_load(&ms_state) != MIGSWAP_STATE_RESIDENT || atomic_load(&ms_mode) != MIGSWAP_MODE_VMM)
		return;
	uint64_t live = atomic_load(&ms_live_bytes);
	if (live == 0 || (arena && arena_size >= live))
		return;
	CUcontext ctx = NULL;
	pthread_mutex_lock(&ms_table_mu);
	for (size_t i = 0; i < MS_TABLE_NBUCKETS && !ctx; i++)
		if (ms_table[i])
			ctx = ms_table[i]->ctx;
	pthread_mutex_unlock(&ms_table_mu);
	if (!ctx)
		return;
	drv.cuCtxSetCurrent(ctx);
	CUresult r = ensure_arena(live);
	if (r)
		ms_log("pre-pinning %llu bytes failed: %s", (unsigned long long)live, ms_errstr(r));
}
