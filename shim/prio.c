/*
 * prio.c — priority launch gating (PROTOCOL.md "Priority launch gating").
 *
 * Two roles, chosen by the daemon's `gate` message:
 *   - signal (a process with lower-priority neighbours on its device): every
 *     intercepted launch/copy/memset sets this process's bit in the device's
 *     shared page if it is not set yet (one syscall-free atomic OR per idle →
 *     busy transition) and bumps a per-stream launch count. A watcher thread
 *     records one event per stream that has new launches, queries the events
 *     at a low rate (20 µs backing off to 200 µs) and clears the bit when every
 *     stream's last launch has completed and no call is inside the driver.
 *     It refreshes the slot's heartbeat (beat_ms) while the work lasts.
 *   - held (a process with higher-priority neighbours): before each launch it
 *     loads page->busy & mask; while that is non-zero it waits on the page's
 *     epoch (a shared futex the clearing side wakes), or, with policy budget
 *     N, lets a launch through while fewer than N of the launches it let
 *     through are still in flight (an event recorded after each). A busy bit
 *     whose heartbeat is older than stale_ms is ignored (a stopped or hung
 *     process); the daemon clears the bit of a process whose connection ends.
 *     With depth M it also keeps at most M launches in flight while not held
 *     (an event after each), so that the backlog a higher-priority launch
 *     finds queued ahead of it on the GPU stays short.
 */
#define _GNU_SOURCE
#include "internal.h"

#include <errno.h>
#include <sched.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

atomic_int ms_pg_on;
atomic_ullong ms_pg_mask;
atomic_int ms_pg_signal;
struct ms_pg_page *_Atomic ms_pg_page;
atomic_long ms_pg_calls;
atomic_int ms_pg_local_busy;
atomic_int ms_pg_depth; /* > 0: at most this many launches in flight while a higher-priority neighbour exists */

static atomic_int pg_slot = -1;
static atomic_int pg_policy, pg_budget;
static atomic_uint pg_stale_ms;
static atomic_int stats_dirty;

/* ------------------------------------------------------------------ futex */

static void futex_wait(_Atomic uint32_t *addr, uint32_t val, long timeout_ns, int shared)
{
	struct timespec ts = { timeout_ns / 1000000000L, timeout_ns % 1000000000L };
	syscall(SYS_futex, (uint32_t *)addr, shared ? FUTEX_WAIT : FUTEX_WAIT_PRIVATE, val, timeout_ns ? &ts : NULL,
		NULL, 0);
}

static void futex_wake(_Atomic uint32_t *addr, int shared)
{
	syscall(SYS_futex, (uint32_t *)addr, shared ? FUTEX_WAKE : FUTEX_WAKE_PRIVATE, 0x7fffffff, NULL, NULL, 0);
}

static uint32_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint32_t)((uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u);
}

static void sleep_us(long us)
{
	struct timespec ts = { us / 1000000L, (us % 1000000L) * 1000L };
	nanosleep(&ts, NULL);
}

/* ------------------------------------------------------ the signal side */

/* The streams this process launched on: open addressing by handle; the
 * legacy/per-thread default streams (handles 0, 1, 2) share one entry and are
 * recorded on the legacy stream, which waits for every blocking stream. */
#define NSTRM 64
#define LEGACY_KEY ((uintptr_t)1)
struct strm {
	_Atomic uintptr_t key; /* 0 empty */
	atomic_ullong seq;     /* launches that returned */
	atomic_int dead;       /* the program destroyed the stream */
	atomic_int capt;       /* a capture was seen on it: launches into a capture are not counted */
	/* watcher only (under tbl_mu): */
	CUcontext ctx;
	CUevent ev;
	uint64_t recorded, covered;
	int waiting;
};
static struct strm tbl[NSTRM];
static pthread_mutex_t tbl_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_ullong ovf_seq; /* launches on streams that found no entry */
static uint64_t ovf_covered;
static CUcontext ovf_ctx;

static pthread_t watcher;
static atomic_int watcher_started, watcher_sleeping;
static atomic_uint watcher_wake; /* futex word (private) */
static atomic_ullong busy_ns, busy_periods;

static inline uintptr_t key_of(CUstream s)
{
	uintptr_t k = (uintptr_t)s;
	return k <= 2 ? LEGACY_KEY : k;
}

static inline unsigned hash_of(uintptr_t k)
{
	return (unsigned)(((k >> 4) * 0x9E3779B97F4A7C15ULL) >> 58);
}

static struct strm *strm_insert(uintptr_t k)
{
	struct strm *out = NULL;
	CUcontext ctx = NULL;
	if (drv.cuCtxGetCurrent)
		drv.cuCtxGetCurrent(&ctx);
	pthread_mutex_lock(&tbl_mu);
	unsigned h = hash_of(k);
	for (unsigned i = 0; i < NSTRM; i++) {
		struct strm *e = &tbl[(h + i) & (NSTRM - 1)];
		uintptr_t cur = atomic_load(&e->key);
		if (cur == k) {
			out = e;
			break;
		}
		if (cur == 0) {
			e->ctx = ctx;
			e->ev = NULL;
			e->recorded = e->covered = atomic_load(&e->seq);
			e->waiting = 0;
			atomic_store(&e->dead, 0);
			atomic_store(&e->capt, 0);
			atomic_store_explicit(&e->key, k, memory_order_release);
			out = e;
			break;
		}
	}
	if (!out && !ovf_ctx)
		ovf_ctx = ctx;
	pthread_mutex_unlock(&tbl_mu);
	return out;
}

/* revive_locked: an entry whose stream was destroyed now stands for a new
 * stream with the recycled handle (under tbl_mu; nothing if it is live). */
static void revive_locked(struct strm *e)
{
	if (!atomic_load(&e->dead))
		return;
	CUcontext ctx = NULL;
	drv.cuCtxGetCurrent(&ctx);
	e->ctx = ctx;
	atomic_store(&e->capt, 0);
	atomic_store(&e->dead, 0);
}

/* capture_status: the driver's answer for s (CUDA_SUCCESS and 0 in *st
 * without cuStreamIsCapturing). */
static CUresult capture_status(CUstream s, int *st)
{
	*st = 0;
	return drv.cuStreamIsCapturing ? drv.cuStreamIsCapturing(s, st) : CUDA_SUCCESS;
}

/* in_capture: the driver says s is being captured now. Asked only for streams
 * that have seen a capture (one driver call on their launches). */
static int in_capture(CUstream s)
{
	int st;
	return capture_status(s, &st) == CUDA_SUCCESS && st != 0;
}

/* note_recorded counts a launch on a stream that has seen a capture and
 * records the stream's event right behind it, on the launching thread: the
 * watcher only queries it. A record from the watcher's thread could meet a
 * capture begun past the shim's hooks between its capture check and its
 * record; here the launch just went outside a capture, and a capture the
 * program begins from this thread comes after this call. */
static void note_recorded(struct strm *e, CUstream s)
{
	pthread_mutex_lock(&tbl_mu);
	uint64_t q = atomic_fetch_add(&e->seq, 1) + 1;
	if (!e->ev && drv.cuEventCreate(&e->ev, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS)
		e->ev = NULL;
	if (e->ev && drv.cuEventRecord(e->ev, s) == CUDA_SUCCESS) {
		e->recorded = q;
		e->waiting = 1;
	}
	/* else the watcher records it as for any stream */
	pthread_mutex_unlock(&tbl_mu);
}

/* A launch into a capture runs nothing until its graph is launched (which is
 * counted on the graph's stream), so it is not counted, and a stream that
 * has seen a capture gets its events from the launching thread
 * (note_recorded): the watcher records no event on such a stream, which
 * closes the window between its capture check and its record in which a
 * capture begun past the shim's hooks could start. Such streams pay one
 * capture query and one event record per launch. */
void ms_prio_note(CUstream s)
{
	uintptr_t k = key_of(s);
	unsigned h = hash_of(k);
	for (unsigned i = 0; i < NSTRM; i++) {
		struct strm *e = &tbl[(h + i) & (NSTRM - 1)];
		uintptr_t cur = atomic_load_explicit(&e->key, memory_order_acquire);
		if (cur == k) {
			if (__builtin_expect(atomic_load_explicit(&e->dead, memory_order_relaxed), 0)) {
				pthread_mutex_lock(&tbl_mu);
				revive_locked(e);
				pthread_mutex_unlock(&tbl_mu);
			}
			if (__builtin_expect(atomic_load_explicit(&e->capt, memory_order_relaxed), 0)) {
				if (!in_capture(s))
					note_recorded(e, s);
				return;
			}
			atomic_fetch_add(&e->seq, 1);
			return;
		}
		if (cur == 0)
			break;
	}
	struct strm *e = strm_insert(k);
	if (e)
		atomic_fetch_add(&e->seq, 1);
	else
		atomic_fetch_add(&ovf_seq, 1);
}

/* ms_prio_capture_seen: a capture begins on s (the shim's hook saw it). */
void ms_prio_capture_seen(CUstream s)
{
	uintptr_t k = key_of(s);
	if (k == LEGACY_KEY || !atomic_load_explicit(&ms_pg_signal, memory_order_relaxed))
		return;
	struct strm *e = strm_insert(k);
	if (!e)
		return;
	pthread_mutex_lock(&tbl_mu);
	revive_locked(e);
	atomic_store(&e->capt, 1);
	pthread_mutex_unlock(&tbl_mu);
}

void ms_prio_stream_destroyed(CUstream s)
{
	uintptr_t k = key_of(s);
	if (k == LEGACY_KEY)
		return;
	pthread_mutex_lock(&tbl_mu);
	unsigned h = hash_of(k);
	for (unsigned i = 0; i < NSTRM; i++) {
		struct strm *e = &tbl[(h + i) & (NSTRM - 1)];
		uintptr_t cur = atomic_load(&e->key);
		if (cur == 0)
			break;
		if (cur == k) {
			/* its work ends on its own; we can no longer record on it */
			atomic_store(&e->dead, 1);
			e->recorded = e->covered = atomic_load(&e->seq);
			e->waiting = 0;
			break;
		}
	}
	pthread_mutex_unlock(&tbl_mu);
}

static void *watcher_main(void *arg);

void ms_prio_set_busy(void)
{
	if (atomic_exchange(&ms_pg_local_busy, 1))
		return;
	struct ms_pg_page *pg = atomic_load(&ms_pg_page);
	int slot = atomic_load(&pg_slot);
	if (pg && slot >= 0) {
		atomic_store(&pg->beat_ms[slot], now_ms());
		atomic_fetch_or(&pg->busy, 1ULL << slot);
	}
	atomic_fetch_add(&busy_periods, 1);
	atomic_store(&stats_dirty, 1);
	if (atomic_load(&watcher_sleeping)) {
		atomic_fetch_add(&watcher_wake, 1);
		futex_wake(&watcher_wake, 0);
	}
}

/* pending_launches: some stream has launches its events do not cover yet. */
static int pending_launches(void)
{
	for (unsigned i = 0; i < NSTRM; i++) {
		struct strm *e = &tbl[i];
		if (atomic_load(&e->key) && !atomic_load(&e->dead) && atomic_load(&e->seq) > e->covered)
			return 1;
	}
	return atomic_load(&ovf_seq) > ovf_covered;
}

/* The watcher is inside poll_streams (its event calls). A capture's begin
 * raises ms_captures, then waits for this to drop (ms_prio_quiesce); the
 * watcher raises it, then reads ms_captures: with both sequentially
 * consistent, one of the two always sees the other. */
static atomic_int polling;

void ms_prio_quiesce(void)
{
	while (atomic_load(&polling))
		sched_yield();
}

/* capturing: the driver says s is being captured (or cannot say: the legacy
 * stream while another stream is captured in global mode). A capture the
 * shim's hook did not see (a path into the driver it does not wrap) is still
 * not touched. */
static int capturing(CUstream s)
{
	int st;
	return capture_status(s, &st) != CUDA_SUCCESS || st != 0;
}

static int poll_streams_locked(void);

/* poll_streams records an event on every stream with new launches and queries
 * the ones recorded before; returns 1 while some are not complete. */
static int poll_streams(void)
{
	/* no event calls while a stream capture is in progress (a global-mode
	 * capture forbids calls from other threads that could touch it): the
	 * bit stays set until the capture ends */
	atomic_store(&polling, 1);
	int pending = atomic_load(&ms_captures) > 0 ? 1 : poll_streams_locked();
	atomic_store(&polling, 0);
	return pending;
}

static int poll_streams_locked(void)
{
	int pending = 0;
	CUcontext cur = NULL;
	pthread_mutex_lock(&tbl_mu);
	for (unsigned i = 0; i < NSTRM; i++) {
		struct strm *e = &tbl[i];
		uintptr_t k = atomic_load(&e->key);
		if (!k || atomic_load(&e->dead))
			continue;
		uint64_t s = atomic_load(&e->seq);
		if (s > e->recorded) {
			if (e->ctx != cur && drv.cuCtxSetCurrent(e->ctx) == CUDA_SUCCESS)
				cur = e->ctx;
			if (!e->ev && drv.cuEventCreate(&e->ev, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS)
				e->ev = NULL;
			CUstream h = k == LEGACY_KEY ? NULL : (CUstream)k;
			CUresult rr = CUDA_ERROR_NOT_READY;
			if (e->ev && capturing(h)) {
				if (k != LEGACY_KEY)
					atomic_store(&e->capt, 1);
				pending = 1; /* look again once the capture is over */
				continue;
			}
			if (e->ev && (rr = drv.cuEventRecord(e->ev, h)) == CUDA_SUCCESS) {
				e->recorded = s;
				e->waiting = 1;
			} else {
				static atomic_int said;
				if (e->ev && !atomic_exchange(&said, 1))
					ms_log("gate: cannot record an event on stream %p (%s): its launches count as done",
					       (void *)h, ms_errstr(rr));
				e->recorded = e->covered = s; /* cannot track: treat as done */
				e->waiting = 0;
			}
		}
		if (e->waiting) {
			if (e->ctx != cur && drv.cuCtxSetCurrent(e->ctx) == CUDA_SUCCESS)
				cur = e->ctx;
			CUresult q = drv.cuEventQuery(e->ev);
			if (q == CUDA_ERROR_NOT_READY) {
				pending = 1;
			} else {
				e->covered = e->recorded;
				e->waiting = 0;
			}
		}
	}
	pthread_mutex_unlock(&tbl_mu);
	uint64_t o = atomic_load(&ovf_seq);
	if (o > ovf_covered) {
		/* more streams than entries: wait for the whole context */
		if (ovf_ctx)
			drv.cuCtxSetCurrent(ovf_ctx);
		drv.cuCtxSynchronize();
		ovf_covered = o;
	}
	return pending;
}

static void *watcher_main(void *arg)
{
	(void)arg;
	/* this thread's calls must never count as "unsafe" for another thread's
	 * global-mode capture (cudaStreamCaptureModeRelaxed = 2) */
	if (drv.cuThreadExchangeStreamCaptureMode) {
		int m = 2;
		drv.cuThreadExchangeStreamCaptureMode(&m);
	}
	for (;;) {
		while (!atomic_load(&ms_pg_local_busy)) {
			uint32_t w = atomic_load(&watcher_wake);
			atomic_store(&watcher_sleeping, 1);
			if (!atomic_load(&ms_pg_local_busy))
				futex_wait(&watcher_wake, w, 1000000000L, 0);
			atomic_store(&watcher_sleeping, 0);
		}
		double t0 = ms_now();
		long backoff = 20;
		for (;;) {
			struct ms_pg_page *pg = atomic_load(&ms_pg_page);
			int slot = atomic_load(&pg_slot);
			if (pg && slot >= 0)
				atomic_store(&pg->beat_ms[slot], now_ms());
			int pending = poll_streams();
			if (pending || atomic_load(&ms_pg_calls) > 0 || pending_launches()) {
				sleep_us(backoff);
				if (backoff < 200)
					backoff *= 2;
				continue;
			}
			/* idle: clear, then look again (a launch may have set it meanwhile) */
			atomic_store(&ms_pg_local_busy, 0);
			if (pg && slot >= 0) {
				atomic_fetch_and(&pg->busy, ~(1ULL << slot));
				atomic_fetch_add(&pg->epoch, 1);
				if (atomic_load(&pg->waiters))
					futex_wake(&pg->epoch, 1);
			}
			if (atomic_load(&ms_pg_calls) > 0 || pending_launches()) {
				atomic_store(&ms_pg_local_busy, 1);
				if (pg && slot >= 0)
					atomic_fetch_or(&pg->busy, 1ULL << slot);
				continue;
			}
			atomic_fetch_add(&busy_ns, (unsigned long long)((ms_now() - t0) * 1e9));
			atomic_store(&stats_dirty, 1);
			break;
		}
	}
	return NULL;
}

static int start_watcher(void)
{
	if (atomic_exchange(&watcher_started, 1))
		return 0;
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	int rc = pthread_create(&watcher, NULL, watcher_main, NULL);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc != 0) {
		atomic_store(&watcher_started, 0);
		return -1;
	}
	pthread_detach(watcher);
	return 0;
}

/* -------------------------------------------------------- the held side */

static atomic_ullong holds, held_ns;

/* Budget: the launches let through while held, each with an event recorded
 * after it; a slot is reserved before the launch and recorded after it. */
#define NRING 64
static pthread_mutex_t ring_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
	CUevent ev;
	int state; /* 0 free/done, 1 reserved, 2 recorded */
} ring[NRING];
static unsigned ring_head, ring_tail;

static int budget_take(int n)
{
	int tok = 0;
	pthread_mutex_lock(&ring_mu);
	while (ring_tail != ring_head) {
		unsigned i = ring_head % NRING;
		if (ring[i].state == 1)
			break;
		if (ring[i].state == 2 && drv.cuEventQuery(ring[i].ev) == CUDA_ERROR_NOT_READY)
			break;
		ring[i].state = 0;
		ring_head++;
	}
	if ((int)(ring_tail - ring_head) < n) {
		unsigned i = ring_tail++ % NRING;
		ring[i].state = 1;
		tok = (int)i + 1;
	}
	pthread_mutex_unlock(&ring_mu);
	return tok;
}

void ms_prio_budget_record(CUstream s, int tok)
{
	unsigned i = (unsigned)(tok - 1) % NRING;
	CUevent ev = ring[i].ev;
	int ok = 0;
	if (!ev && drv.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS)
		ev = NULL;
	if (ev && atomic_load(&ms_captures) == 0)
		ok = drv.cuEventRecord(ev, key_of(s) == LEGACY_KEY ? NULL : s) == CUDA_SUCCESS;
	pthread_mutex_lock(&ring_mu);
	ring[i].ev = ev;
	ring[i].state = ok ? 2 : 0;
	pthread_mutex_unlock(&ring_mu);
}

/* ms_prio_depth: not held, but at most depth launches in flight: wait for
 * the oldest while the ring is full (or until a higher slot turns busy). */
int ms_prio_depth(CUstream s)
{
	for (;;) {
		int n = atomic_load(&ms_pg_depth);
		if (n <= 0 || !atomic_load(&ms_pg_mask))
			return 0;
		int tok = budget_take(n < NRING ? n : NRING);
		if (tok)
			return tok;
		CUevent ev = NULL;
		pthread_mutex_lock(&ring_mu);
		unsigned i = ring_head % NRING;
		if (ring_tail != ring_head && ring[i].state == 2)
			ev = ring[i].ev;
		pthread_mutex_unlock(&ring_mu);
		if (ev && drv.cuEventSynchronize)
			drv.cuEventSynchronize(ev); /* precise: short training kernels do not wait a timer tick */
		else
			sleep_us(20);
		struct ms_pg_page *pg = atomic_load(&ms_pg_page);
		if (pg && (atomic_load(&pg->busy) & atomic_load(&ms_pg_mask)))
			return ms_prio_hold(s);
	}
}

/* busy_bits returns the set bits of b whose heartbeat is fresh. */
static uint64_t fresh_bits(struct ms_pg_page *pg, uint64_t b, unsigned stale_ms)
{
	if (!stale_ms)
		return b;
	uint32_t now = now_ms();
	for (int i = 0; i < MS_PG_SLOTS; i++)
		if ((b >> i & 1) && now - atomic_load(&pg->beat_ms[i]) > stale_ms)
			b &= ~(1ULL << i);
	return b;
}

int ms_prio_hold(CUstream s)
{
	struct ms_pg_page *pg = atomic_load(&ms_pg_page);
	double t0 = 0;
	int tok = 0;
	while (pg) {
		uint32_t ep = atomic_load(&pg->epoch);
		uint64_t b = atomic_load(&pg->busy) & atomic_load(&ms_pg_mask);
		if (b)
			b = fresh_bits(pg, b, atomic_load(&pg_stale_ms));
		int policy = atomic_load(&pg_policy);
		if (!b || policy == MS_PG_OFF)
			break;
		if (policy == MS_PG_BUDGET) {
			int n = atomic_load(&pg_budget);
			if (n > 0 && (tok = budget_take(n < NRING ? n : NRING)) != 0)
				break;
		}
		if (t0 == 0)
			t0 = ms_now();
		atomic_fetch_add(&pg->waiters, 1);
		/* gate: woken by the clearing side; the timeout re-checks heartbeats.
		 * budget: also re-checks its own launches' events. */
		futex_wait(&pg->epoch, ep, policy == MS_PG_BUDGET ? 100000L : 2000000L, 1);
		atomic_fetch_sub(&pg->waiters, 1);
		pg = atomic_load(&ms_pg_page);
	}
	if (t0 != 0) {
		atomic_fetch_add(&holds, 1);
		atomic_fetch_add(&held_ns, (unsigned long long)((ms_now() - t0) * 1e9));
		atomic_store(&stats_dirty, 1);
	}
	if (!tok && atomic_load(&ms_pg_depth) > 0)
		return ms_prio_depth(s); /* released: the depth limit still counts this launch */
	return tok;
}

/* -------------------------------------------------------------- control */

static void update_on(void)
{
	atomic_store(&ms_pg_on, atomic_load(&ms_pg_mask) != 0 || atomic_load(&ms_pg_signal) != 0);
}

static void clear_own_bit(void)
{
	struct ms_pg_page *pg = atomic_load(&ms_pg_page);
	int slot = atomic_load(&pg_slot);
	if (pg && slot >= 0 && (atomic_load(&pg->busy) >> slot & 1)) {
		atomic_fetch_and(&pg->busy, ~(1ULL << slot));
		atomic_fetch_add(&pg->epoch, 1);
		futex_wake(&pg->epoch, 1);
	}
}

int ms_prio_apply(const struct ms_prio_cfg *c, int page_fd, char *err, size_t errlen)
{
	if (page_fd >= 0) {
		struct ms_pg_page *pg = mmap(NULL, MS_PG_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, page_fd, 0);
		close(page_fd);
		if (pg == MAP_FAILED) {
			snprintf(err, errlen, "mapping the gate page: %s", strerror(errno));
			return -1;
		}
		if (pg->magic != MS_PG_MAGIC || pg->version != MS_PG_VERSION) {
			munmap(pg, MS_PG_SIZE);
			snprintf(err, errlen, "the gate page has magic %#x version %u, want %#x version %u", pg->magic,
				 pg->version, MS_PG_MAGIC, MS_PG_VERSION);
			return -1;
		}
		atomic_store(&ms_pg_mask, 0);
		atomic_store(&ms_pg_signal, 0);
		update_on();
		struct ms_pg_page *old = atomic_exchange(&ms_pg_page, pg);
		(void)old; /* a launch may still read it: keep the old mapping */
	}
	if (!atomic_load(&ms_pg_page)) {
		snprintf(err, errlen, "gate message without a page");
		return -1;
	}
	if (c->slot < -1 || c->slot >= MS_PG_SLOTS) {
		snprintf(err, errlen, "gate slot %d out of range", c->slot);
		return -1;
	}
	if (c->slot != atomic_load(&pg_slot)) {
		clear_own_bit();
		atomic_store(&pg_slot, c->slot);
		if (c->slot >= 0 && atomic_load(&ms_pg_local_busy)) {
			struct ms_pg_page *pg = atomic_load(&ms_pg_page);
			atomic_store(&pg->beat_ms[c->slot], now_ms());
			atomic_fetch_or(&pg->busy, 1ULL << c->slot);
		}
	}
	atomic_store(&pg_policy, c->policy);
	atomic_store(&pg_budget, c->budget < 0 ? 0 : c->budget);
	atomic_store(&ms_pg_depth, c->policy == MS_PG_OFF || c->depth < 0 ? 0 : c->depth);
	atomic_store(&pg_stale_ms, c->stale_ms);
	int sig = c->signal && c->slot >= 0;
	if (sig && start_watcher() != 0) {
		snprintf(err, errlen, "cannot start the gate watcher thread");
		sig = 0;
	}
	atomic_store(&ms_pg_signal, sig);
	atomic_store(&ms_pg_mask, c->policy == MS_PG_OFF ? 0 : c->mask);
	update_on();
	atomic_store(&stats_dirty, 1);
	ms_log("gate: policy %d budget %d depth %d slot %d mask %#llx signal %d stale %u ms", c->policy, c->budget,
	       c->depth, c->slot, (unsigned long long)c->mask, sig, c->stale_ms);
	return 0;
}

void ms_prio_detach(void)
{
	atomic_store(&ms_pg_depth, 0);
	atomic_store(&ms_pg_mask, 0);
	atomic_store(&ms_pg_signal, 0);
	update_on();
	clear_own_bit();
	atomic_store(&pg_slot, -1);
}

int ms_prio_stats_dirty(void)
{
	return atomic_exchange(&stats_dirty, 0);
}

void ms_prio_get_stats(struct migswap_stats *s)
{
	s->prio_holds = atomic_load(&holds);
	s->prio_held_ns = atomic_load(&held_ns);
	s->prio_busy_periods = atomic_load(&busy_periods);
	s->prio_busy_ns = atomic_load(&busy_ns);
	s->prio_mask = atomic_load(&ms_pg_mask);
	s->prio_policy = (uint32_t)atomic_load(&pg_policy);
	s->prio_budget = (uint32_t)atomic_load(&pg_budget);
	s->prio_depth = (uint32_t)atomic_load(&ms_pg_depth);
	s->prio_slot = atomic_load(&pg_slot);
	s->prio_signal = (uint32_t)atomic_load(&ms_pg_signal);
}

/* The child of a fork has no slot, no watcher and no page of its own. */
void ms_prio_atfork_child(void)
{
	atomic_store(&ms_pg_mask, 0);
	atomic_store(&ms_pg_signal, 0);
	atomic_store(&ms_pg_on, 0);
	struct ms_pg_page *pg = atomic_exchange(&ms_pg_page, NULL);
	if (pg)
		munmap(pg, MS_PG_SIZE);
	atomic_store(&pg_slot, -1);
	atomic_store(&pg_policy, 0);
	atomic_store(&pg_budget, 0);
	atomic_store(&ms_pg_depth, 0);
	atomic_store(&ms_pg_calls, 0);
	atomic_store(&ms_pg_local_busy, 0);
	atomic_store(&watcher_started, 0);
	atomic_store(&watcher_sleeping, 0);
	atomic_store(&holds, 0);
	atomic_store(&held_ns, 0);
	atomic_store(&busy_ns, 0);
	atomic_store(&busy_periods, 0);
	atomic_store(&stats_dirty, 0);
	pthread_mutex_init(&tbl_mu, NULL);
	pthread_mutex_init(&ring_mu, NULL);
	memset(tbl, 0, sizeof tbl);
	memset(ring, 0, sizeof ring);
	ring_head = ring_tail = 0;
	atomic_store(&ovf_seq, 0);
	ovf_covered = 0;
	ovf_ctx = NULL;
}
