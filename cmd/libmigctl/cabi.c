// The C entry points of libmigctl.so (include/migctl.h). Each one refuses to
// run in a child forked after the library was loaded (the Go runtime's threads
// do not exist there, so entering it could hang). The last error's text is
// kept per thread.
//
// Collectives never enter the Go runtime on the caller's thread: an issue
// validates its arguments, fills the next slot of a ring (the handle names
// the slot) and wakes the dispatcher, a Go goroutine (main.go) that takes the
// slots in order, runs each collective through the trainer SDK and marks the
// slot done; migctl_wait sleeps on the slot's futex word. A cgo callback that
// blocks on a Go channel costs a hand-off of its locked thread both ways
// (~40 us per collective); this path costs a futex wake each way at most.
// The one call into Go on the caller's thread is for device buffers on the
// gpu backend: it marks the caller's stream at the call (nothing when the
// stream is idle, else an event; it never blocks), so that the collective
// waits for the work queued before the call and not for later work.
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "migctl.h"
#include "cabi.h"
#include "_cgo_export.h"

static pid_t loaded_pid;
static volatile int forked;
static __thread char last_error[1024];

static void child_after_fork(void) { forked = 1; }

__attribute__((constructor)) static void migctl_loaded(void) {
	loaded_pid = getpid();
	pthread_atfork(NULL, NULL, child_after_fork);
}

// migctl_set_error is called by the Go side on the calling thread.
void migctl_set_error(const char *msg, size_t n) {
	if (n >= sizeof last_error) n = sizeof last_error - 1;
	memcpy(last_error, msg, n);
	last_error[n] = 0;
}

static int set_error(int code, const char *msg) {
	migctl_set_error(msg, strlen(msg));
	return code;
}

static int in_child(void) {
	if (forked || getpid() != loaded_pid) {
		static const char msg[] = "libmigctl: called in a process forked from the one that loaded it "
		                          "(a DataLoader worker?): only the training process may run collectives";
		migctl_set_error(msg, sizeof msg - 1);
		return 1;
	}
	last_error[0] = 0;
	return 0;
}

#define GUARD(fallback) if (in_child()) return (fallback)

// in_child_fast is in_child for the per-collective calls (issue, run, wait,
// test, stats): the flag of the fork handler only. getpid() is a system call
// (glibc no longer caches it: ~0.1-1 us, twice per collective); every fork
// through the C library (os.fork, multiprocessing, DataLoader workers) runs
// the handler, and the child's first other call (rank, init, ...) checks the
// pid as well.
static inline int in_child_fast(void) {
	if (__builtin_expect(forked, 0)) return in_child();
	last_error[0] = 0;
	return 0;
}

#define GUARD_FAST(fallback) if (in_child_fast()) return (fallback)

static long futex(uint32_t *w, int op, uint32_t v, const struct timespec *t) {
	return syscall(SYS_futex, w, op | FUTEX_PRIVATE_FLAG, v, t, NULL, 0);
}

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

// spin_ns is how long a waiter (migctl_wait, and the dispatcher between
// collectives) polls before it sleeps on a futex: 20 us, as the shm
// transport's waits, when the process's CPUs leave two per local rank (a
// small collective finishes within it, and a sleeper costs a futex wake and
// a context switch, ~10-30 us); 0 on fewer CPUs, where a spinning thread
// takes the core a peer needs (2 ranks on 2 CPUs: an 8 KiB all-reduce took
// 155 us with the spin, 80-110 us without). MIGCTL_LIB_SPIN_US overrides
// it, MIGCTL_LIB_DISPATCH_SPIN_US the dispatcher's. With
// MIGCTL_LIB_SPIN_MAX_US=M (an experiment, off by default) a waiter spins
// until the collective's expected end (issued + 5/4 of the recent
// collectives' mean run time + spin_ns), at most M us: a small collective
// longer than spin_ns (7 ranks through a GPU) could end while its waiter
// still spins, without a futex wake. On the 2-CPU CI machine (one rank,
// other jobs running) it showed no gain, at times 2-3x slower, within that
// machine's noise: off until the GPU machine has measured it
// (scripts/h200-session.d/torch-overhead.sh).
//
// Where the CPUs leave three per local rank (the dispatcher, the Go threads
// its collective's waits wake, the caller), two waits spin longer: the
// dispatcher 50 us for the next issue (a synchronous caller's next
// collective comes ~15-25 us after the last returned: torch's wrapper and
// Python's; with 20 us half of them found it asleep on one H200), and
// migctl_run's waiter, whose thread has nothing else to do, until the
// collective's expected end (as above), at most run_spin_max_ns = 200 us
// (MIGCTL_LIB_RUN_SPIN_MAX_US; 0: as migctl_wait). 7 ranks on 16 CPUs keep
// the plain spins.
//
// A plain spin that cannot succeed is skipped (the thread sleeps at once,
// leaving the core to the ranks' collectives): a waiter's when the
// collective is expected to end more than two spins later (issued + the
// recent mean run time: 7 ranks through one H200, ~140 us, slept after the
// spin 98% of the time), the dispatcher's when the recent gaps between a
// collective's end and the next issue are longer than two spins (94% there).
// MIGCTL_LIB_SPIN_US and MIGCTL_LIB_DISPATCH_SPIN_US, when set, always spin.
static int64_t spin_ns = 20000;
static int64_t spin_max_ns = 0;
static int64_t disp_spin_ns = 20000;
static int64_t run_spin_max_ns = 0;
static int adaptive = 0;
static int spin_fixed, disp_spin_fixed; // set in the environment: never skipped
static int64_t last_done_ns, gap_ewma_ns; // the dispatcher's: its last collective's end, mean gap to the next issue
static int64_t run_ewma_ns; // mean run time of recent collectives (the dispatcher's and direct runs')
// direct_max is the largest collective (bytes) that migctl_run may run on
// the calling thread (0: never; see migctl_run).
static size_t direct_max;
// transfer_here: a transfer issued with nothing before it in flight starts
// on the issuing thread (issue), not through the dispatcher;
// MIGCTL_LIB_TRANSFER_HERE=0 turns it off.
static int transfer_here = 1;

static int env_us(const char *name, int64_t *ns) {
	const char *env = getenv(name);
	if (env == NULL || *env == 0) return 0;
	*ns = strtol(env, NULL, 10) * 1000L;
	if (*ns < 0) *ns = 0;
	return 1;
}

static void choose_spin(int local_size, int gomaxprocs) {
	cpu_set_t set;
	int cpus = 0;
	if (sched_getaffinity(0, sizeof set, &set) == 0) cpus = CPU_COUNT(&set);
	if (local_size < 1) local_size = 1;
	int roomy = cpus >= 3 * local_size;
	spin_ns = cpus >= 2 * local_size ? 20000 : 0;
	spin_fixed = env_us("MIGCTL_LIB_SPIN_US", &spin_ns);
	adaptive = env_us("MIGCTL_LIB_SPIN_MAX_US", &spin_max_ns) && spin_max_ns > spin_ns && spin_ns > 0;
	disp_spin_ns = roomy && spin_ns > 0 ? 50000 : spin_ns;
	disp_spin_fixed = env_us("MIGCTL_LIB_DISPATCH_SPIN_US", &disp_spin_ns);
	run_spin_max_ns = roomy ? 200000 : 0;
	env_us("MIGCTL_LIB_RUN_SPIN_MAX_US", &run_spin_max_ns);
	// migctl_run on the calling thread (direct) wherever the Go runtime has
	// a second P (its polling then never yields: comm.HoldYields). Against
	// the ring, 8 KiB: one H200, 7 ranks on GPU 0, 53-63 us vs 71-128; host
	// backend on 2 CPUs, 1/2/3 ranks, 5.0-5.5/6.7/67 us vs 15-33/152/282
	// (the host streams run inline meanwhile). MIGCTL_LIB_DIRECT_MAX (bytes,
	// 0: never) overrides.
	direct_max = gomaxprocs >= 2 ? 1 << 20 : 0;
	const char *env = getenv("MIGCTL_LIB_DIRECT_MAX");
	if (env != NULL && *env != 0) {
		long long v = strtoll(env, NULL, 10);
		direct_max = v > 0 ? (size_t)v : 0;
	}
	env = getenv("MIGCTL_LIB_TRANSFER_HERE");
	if (env != NULL && *env != 0) transfer_here = strtol(env, NULL, 10) != 0;
}

// --- counters (migctl_stats) ---------------------------------------------------

static uint64_t stats[MIGCTL_STAT_COUNT];

static inline void stat_add(int i, uint64_t v) { __atomic_add_fetch(&stats[i], v, __ATOMIC_RELAXED); }

static int64_t mono_ns(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000000000L + t.tv_nsec;
}

// spin_u32 polls *w until it is v or the clock passes end.
static int spin_u32(uint32_t *w, uint32_t v, int64_t end) {
	for (int i = 0;; i++) {
		if (__atomic_load_n(w, __ATOMIC_ACQUIRE) == v) return 1;
		if ((i & 63) == 63 && mono_ns() >= end) return 0;
		relax();
	}
}

// spin_end is when a waiter for s that starts now stops spinning (see
// spin_ns): until the collective's expected end, at most max_ns, when
// max_ns > spin_ns > 0.
static int64_t spin_end(const migctl_slot_t *s, int64_t now, int64_t max_ns) {
	int64_t end = now + spin_ns;
	if (max_ns > spin_ns && spin_ns > 0) {
		int64_t expect = s->t_issue + __atomic_load_n(&run_ewma_ns, __ATOMIC_RELAXED) * 5 / 4 + spin_ns;
		if (expect > end) end = expect;
		if (end > now + max_ns) end = now + max_ns;
	}
	return end;
}

// --- the ring of collectives -------------------------------------------------

static migctl_slot_t ring[MIGCTL_SLOTS];
static pthread_mutex_t issue_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t issued;      // the last handle issued (written under issue_mu)
static uint32_t issued_seq;  // the dispatcher's futex word: bumped by every issue and by stop
static uint32_t disp_asleep; // the dispatcher sleeps (or is about to) on issued_seq
static uint64_t taken;       // the last handle taken: by the dispatcher, or by issue for a transfer it
                             // starts itself (written under the run lock)
static int stopping;         // finalize: the dispatcher returns once the ring is drained
static int state;            // 0 not initialised, 1 ready, 2 finalized
static int group_on_gpu;     // the groups run on CUDA device memory
// The size of each group by id (0: the process's; others from
// migctl_new_group); 0 where there is none (never formed, or freed).
static int group_sizes[MIGCTL_MAX_GROUPS];

static int size_of(int group) {
	if (group < 0 || group >= MIGCTL_MAX_GROUPS) return 0;
	return __atomic_load_n(&group_sizes[group], __ATOMIC_ACQUIRE);
}

// One collective runs at a time, in issue order: the dispatcher's (from
// taking a slot to completing it) or a direct migctl_run's (see there). The
// lock is a futex word, not a pthread mutex: the dispatcher is a goroutine,
// whose take and complete may run on different threads. 0 free, 1 held,
// 2 held with a sleeper.
static uint32_t run_word;

static void run_lock(void) {
	uint32_t v = 0;
	if (__atomic_compare_exchange_n(&run_word, &v, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) return;
	for (int i = 0; i < 1000; i++) { // a direct run is short: poll a while first
		relax();
		v = 0;
		if (__atomic_compare_exchange_n(&run_word, &v, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) return;
	}
	while (__atomic_exchange_n(&run_word, 2, __ATOMIC_ACQUIRE) != 0) futex(&run_word, FUTEX_WAIT, 2, NULL);
}

static int run_trylock(void) {
	uint32_t v = 0;
	return __atomic_compare_exchange_n(&run_word, &v, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED);
}

static void run_unlock(void) {
	if (__atomic_exchange_n(&run_word, 0, __ATOMIC_RELEASE) == 2) futex(&run_word, FUTEX_WAKE, 1, NULL);
}

static void wake_dispatcher(void) {
	__atomic_add_fetch(&issued_seq, 1, __ATOMIC_SEQ_CST);
	if (__atomic_load_n(&disp_asleep, __ATOMIC_SEQ_CST)) futex(&issued_seq, FUTEX_WAKE, 1, NULL);
}

// check_state says whether the library is ready for calls (MIGCTL_OK or the error).
static int check_state(void) {
	int st = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
	if (st == 0) return set_error(MIGCTL_ERR_NOT_INITIALIZED, "libmigctl: not initialised: call migctl_init_from_env first");
	if (st == 2) return set_error(MIGCTL_ERR_CLOSED, "libmigctl: migctl_finalize was called: the group is closed");
	return MIGCTL_OK;
}

// check_call validates a collective's arguments: the group's size, or the error.
static const size_t elem_size[] = {4, 2, 2, 8, 4, 8, 1}; // MIGCTL_FLOAT32..MIGCTL_UINT8

static int check_call(int group, int kind, void *send, void *recv, size_t count, int dtype, int op, int root,
                      int device) {
	int rc = check_state();
	if (rc < 0) return rc;
	int size = size_of(group);
	if (size <= 0 && group > 0 && group < MIGCTL_MAX_GROUPS)
		return set_error(MIGCTL_ERR_CLOSED, "libmigctl: that group was freed (migctl_free_group) or never formed");
	if (size <= 0)
		return set_error(MIGCTL_ERR_INVALID,
		                 "libmigctl: unknown group: want 0 (the process's group) or an id of migctl_new_group");
	if (kind < MIGCTL_KIND_ALLREDUCE || kind > MIGCTL_KIND_RECV)
		return set_error(MIGCTL_ERR_INVALID, "libmigctl: migctl_issue: unknown collective kind (want MIGCTL_KIND_*)");
	if (kind != MIGCTL_KIND_BARRIER) {
		if (dtype < MIGCTL_FLOAT32 || dtype > MIGCTL_UINT8)
			return set_error(MIGCTL_ERR_INVALID, "libmigctl: bad dtype: want MIGCTL_FLOAT32..MIGCTL_UINT8");
		if ((kind == MIGCTL_KIND_ALLREDUCE || kind == MIGCTL_KIND_REDUCE_SCATTER) && (op < MIGCTL_SUM || op > MIGCTL_MAX))
			return set_error(MIGCTL_ERR_INVALID, "libmigctl: bad op: want MIGCTL_SUM, AVG, MIN or MAX");
		int need_send = kind != MIGCTL_KIND_BROADCAST && kind != MIGCTL_KIND_RECV;
		int need_recv = kind != MIGCTL_KIND_SEND;
		if (count > 0 && ((need_recv && recv == NULL) || (need_send && send == NULL)))
			return set_error(MIGCTL_ERR_INVALID, "libmigctl: NULL buffer for a non-empty collective");
		if (kind == MIGCTL_KIND_BROADCAST && (root < 0 || root >= size))
			return set_error(MIGCTL_ERR_INVALID, "libmigctl: broadcast root out of range: want 0..size-1");
		if ((kind == MIGCTL_KIND_SEND || kind == MIGCTL_KIND_RECV) && (root < 0 || root >= size))
			return set_error(MIGCTL_ERR_INVALID, "libmigctl: send/receive peer out of range: want 0..size-1");
		if (device != MIGCTL_HOST && device != MIGCTL_DEVICE)
			return set_error(MIGCTL_ERR_INVALID, "libmigctl: bad device: want MIGCTL_HOST (0) or MIGCTL_DEVICE (1)");
		// The largest buffer (size * count elements for all-gather and
		// reduce-scatter) must fit in int64 bytes: the Go side slices it.
		size_t blocks = kind == MIGCTL_KIND_ALL_GATHER || kind == MIGCTL_KIND_REDUCE_SCATTER ? (size_t)size : 1;
		if (count > (size_t)INT64_MAX / elem_size[dtype] / blocks)
			return set_error(MIGCTL_ERR_INVALID, "libmigctl: count too large (the buffer's bytes overflow)");
	}
	return size;
}

// mark marks the caller's stream now, at the call, for device memory on the
// gpu backend (the dispatcher reaches the collective later): the mark's id
// for the Go side (0: nothing to wait for) or the error (its text set). On
// the host backend device memory fails when the collective runs.
static int64_t mark(int kind, size_t count, int device, uintptr_t stream) {
	if (device == MIGCTL_HOST || !group_on_gpu || kind == MIGCTL_KIND_BARRIER || count == 0) return 0;
	int64_t o = migctlGoOrder(stream);
	if (o >= 0) stat_add(o != 0 ? MIGCTL_STAT_MARKS : MIGCTL_STAT_IDLE_MARKS, 1);
	return o;
}

// note_run folds a collective's run time into run_ewma_ns (its runner holds
// the run lock).
static void note_run(int64_t run) {
	int64_t ewma = __atomic_load_n(&run_ewma_ns, __ATOMIC_RELAXED);
	__atomic_store_n(&run_ewma_ns, ewma == 0 ? run : ewma + (run - ewma) / 8, __ATOMIC_RELAXED);
}

static int64_t issue(int group, int kind, void *send, void *recv, size_t count, int dtype, int op, int root,
                     int device, uintptr_t stream, int streamed) {
	int64_t rc = check_call(group, kind, send, recv, count, dtype, op, root, device);
	if (rc < 0) return rc;
	int64_t o = mark(kind, count, device, stream);
	if (o < 0) return o; // the text is set
	uint64_t order = (uint64_t)o;
	int64_t now = mono_ns();
	pthread_mutex_lock(&issue_mu);
	if (state != 1) { // finalized meanwhile
		pthread_mutex_unlock(&issue_mu);
		if (order != 0) migctlGoDropOrder(order);
		return set_error(MIGCTL_ERR_CLOSED, "libmigctl: migctl_finalize was called: the group is closed");
	}
	uint64_t h = issued + 1;
	migctl_slot_t *s = &ring[h % MIGCTL_SLOTS];
	if (__atomic_load_n(&s->id, __ATOMIC_ACQUIRE) != 0) {
		pthread_mutex_unlock(&issue_mu);
		if (order != 0) migctlGoDropOrder(order);
		return set_error(MIGCTL_ERR_INVALID, "libmigctl: too many collectives in flight (4096 issued and not "
		                                     "waited for): migctl_wait for every handle");
	}
	s->group = group;
	s->kind = kind;
	s->send = send;
	s->recv = recv;
	s->count = count;
	s->dtype = dtype;
	s->op = op;
	s->root = root;
	s->device = device;
	s->stream = stream;
	s->order = order;
	s->streamed = streamed;
	s->t_issue = now;
	s->t_take = s->t_done = 0;
	s->code = 0;
	s->err = NULL;
	s->word = 0;
	s->rword = 0;
	s->ready = 0;
	// A transfer with nothing queued or running before it is started here,
	// on the calling thread, which takes its slot as the dispatcher would
	// (holding the run lock: the dispatcher, which takes slots only under
	// it, then skips the slot); anything else, or a transfer behind other
	// work, waits in the ring for the dispatcher.
	int here = (kind == MIGCTL_KIND_SEND || kind == MIGCTL_KIND_RECV) && transfer_here &&
	           __atomic_load_n(&taken, __ATOMIC_ACQUIRE) == issued && run_trylock();
	__atomic_store_n(&s->id, h, __ATOMIC_RELEASE);
	__atomic_store_n(&issued, h, __ATOMIC_RELEASE);
	if (here) {
		s->t_take = now;
		__atomic_store_n(&taken, h, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&issue_mu);
	if (!here) {
		wake_dispatcher();
		return (int64_t)h;
	}
	stat_add(MIGCTL_STAT_DIRECT_TRANSFERS, 1);
	migctlGoTransfer(s); // queues it on its link and returns; completes the slot only on failure
	run_unlock();
	return (int64_t)h;
}

// migctl_next is the dispatcher's: the next issued slot in order, waiting
// for one (a short spin, then the futex); NULL once stopping with the ring
// drained.
migctl_slot_t *migctl_next(void) {
	uint64_t want = taken + 1;
	int64_t end = 0;
	for (int spin = 0;; spin++) {
		if (__atomic_load_n(&issued, __ATOMIC_ACQUIRE) >= want) {
			run_lock(); // after a direct run that holds it (issued before this one)
			uint64_t t = __atomic_load_n(&taken, __ATOMIC_ACQUIRE);
			if (t >= want) { // a transfer started by its caller (issue) took it
				run_unlock();
				want = t + 1;
				continue;
			}
			__atomic_store_n(&taken, want, __ATOMIC_RELEASE);
			migctl_slot_t *s = &ring[want % MIGCTL_SLOTS];
			s->t_take = mono_ns();
			if (last_done_ns != 0) {
				int64_t gap = s->t_issue > last_done_ns ? s->t_issue - last_done_ns : 0;
				gap_ewma_ns += (gap - gap_ewma_ns) / 8;
			}
			return s;
		}
		if (__atomic_load_n(&stopping, __ATOMIC_ACQUIRE)) return NULL;
		if ((spin & 63) != 63) {
			relax();
			continue;
		}
		int64_t now = mono_ns();
		if (end == 0) end = now + (!disp_spin_fixed && gap_ewma_ns > 2 * disp_spin_ns ? 0 : disp_spin_ns);
		if (now < end) continue;
		uint32_t seq = __atomic_load_n(&issued_seq, __ATOMIC_SEQ_CST);
		__atomic_store_n(&disp_asleep, 1, __ATOMIC_SEQ_CST);
		if (__atomic_load_n(&issued, __ATOMIC_SEQ_CST) < want && !__atomic_load_n(&stopping, __ATOMIC_SEQ_CST)) {
			stat_add(MIGCTL_STAT_DISPATCH_SLEEPS, 1);
			futex(&issued_seq, FUTEX_WAIT, seq, NULL);
		}
		__atomic_store_n(&disp_asleep, 0, __ATOMIC_SEQ_CST);
		end = 0;
	}
}

// finish marks s finished with code (and its text) and wakes its waiter;
// the dispatcher's own collectives (ran: it held the run lock for s) also
// let the run lock go.
static void finish(migctl_slot_t *s, int code, const char *msg, size_t n, int ran) {
	if (code != MIGCTL_OK) {
		char *e = malloc(n + 1);
		if (e != NULL) {
			memcpy(e, msg, n);
			e[n] = 0;
		}
		s->err = e;
	}
	s->code = code;
	s->t_done = mono_ns();
	int64_t run = s->t_done - s->t_take;
	if (ran) {
		last_done_ns = s->t_done;
		note_run(run);
	}
	stat_add(MIGCTL_STAT_DONE, 1);
	stat_add(MIGCTL_STAT_QUEUE_NS, (uint64_t)(s->t_take - s->t_issue));
	stat_add(MIGCTL_STAT_RUN_NS, (uint64_t)run);
	// A migctl_wait_stream asleep until the result is ready wakes (and then
	// waits for the word below, the result not queued early).
	if (__atomic_exchange_n(&s->rword, 1, __ATOMIC_ACQ_REL) == 2) futex(&s->rword, FUTEX_WAKE, INT_MAX, NULL);
	// Done before the run lock goes: a direct migctl_run that takes it next
	// returns with this collective done, as one after it in the ring does.
	uint32_t was = __atomic_exchange_n(&s->word, 1, __ATOMIC_ACQ_REL);
	if (ran) run_unlock();
	if (was == 2) {
		futex(&s->word, FUTEX_WAKE, INT_MAX, NULL);
	} else if (was == 3) {
		// Its waiter returned when the result was ready (migctl_wait_stream)
		// and left the slot to this: nobody reads its result.
		free(s->err);
		s->err = NULL;
		__atomic_store_n(&s->id, 0, __ATOMIC_RELEASE);
	}
}

// migctl_ready is the Go side's: s's result is determined and queued on the
// device (its event is the Go side's, migctlGoOrderReady); a
// migctl_wait_stream may return before s is done.
void migctl_ready(migctl_slot_t *s) {
	__atomic_store_n(&s->ready, 1, __ATOMIC_RELEASE);
	if (__atomic_exchange_n(&s->rword, 1, __ATOMIC_ACQ_REL) == 2) futex(&s->rword, FUTEX_WAKE, INT_MAX, NULL);
}

// migctl_complete is the dispatcher's: s finished with code (and its text).
void migctl_complete(migctl_slot_t *s, int code, const char *msg, size_t n) { finish(s, code, msg, n, 1); }

// migctl_hand_off is the dispatcher's: s (a point-to-point transfer, which
// waits for its peer only) runs on beside the collectives issued after it,
// which may now be taken; migctl_complete_handed completes it, from any
// thread.
void migctl_hand_off(migctl_slot_t *s) {
	(void)s;
	run_unlock();
}

// migctl_hand_off_chained is migctl_hand_off for an all-reduce that lets the
// collectives issued after it start before it has finished (the trainer
// SDK chains it: trainer.Group.Chains), counted in MIGCTL_STAT_CHAINED.
void migctl_hand_off_chained(migctl_slot_t *s) {
	stat_add(MIGCTL_STAT_CHAINED, 1);
	migctl_hand_off(s);
}

void migctl_complete_handed(migctl_slot_t *s, int code, const char *msg, size_t n) { finish(s, code, msg, n, 0); }

// migctl_stop_dispatcher makes migctl_next return NULL once the ring is drained.
void migctl_stop_dispatcher(void) {
	__atomic_store_n(&stopping, 1, __ATOMIC_SEQ_CST);
	wake_dispatcher();
}

static migctl_slot_t *lookup(migctl_work_t h) {
	migctl_slot_t *s = &ring[h % MIGCTL_SLOTS];
	if (h == 0 || h > __atomic_load_n(&issued, __ATOMIC_ACQUIRE) || __atomic_load_n(&s->id, __ATOMIC_ACQUIRE) != h) {
		set_error(MIGCTL_ERR_BAD_HANDLE, "libmigctl: unknown work handle (already waited for, or never issued)");
		return NULL;
	}
	return s;
}

// hopeless says that a plain spin (spin_ns from now) for s would end before
// s does: it is expected more than two spins later (see spin_ns).
static int hopeless(const migctl_slot_t *s, int64_t now) {
	int64_t ewma = __atomic_load_n(&run_ewma_ns, __ATOMIC_RELAXED);
	return !spin_fixed && ewma > 0 && s->t_issue + ewma - now > 2 * spin_ns;
}

static int wait_u32(migctl_slot_t *s, uint32_t *w, int64_t timeout_ms, int64_t spin_max_ns);

// wait_word waits until s is done, up to timeout_ms (negative: no limit);
// 0 when the time ran out first. It polls first (spin_end, at most
// spin_max_ns).
static int wait_word(migctl_slot_t *s, int64_t timeout_ms, int64_t spin_max_ns) {
	return wait_u32(s, &s->word, timeout_ms, spin_max_ns);
}

// wait_u32 is wait_word for a word of s that goes from 0 to 1 (2: 0 with a
// sleeper on it): word or rword.
static int wait_u32(migctl_slot_t *s, uint32_t *w, int64_t timeout_ms, int64_t spin_max_ns) {
	struct timespec end = {0, 0}, now, rel;
	if (__atomic_load_n(w, __ATOMIC_ACQUIRE) == 1) return 1;
	int64_t t = spin_ns > 0 && timeout_ms != 0 ? mono_ns() : 0;
	if (t != 0 && !(spin_max_ns <= spin_ns && hopeless(s, t))) {
		int64_t e = spin_end(s, t, spin_max_ns);
		if (timeout_ms > 0 && e > t + timeout_ms * 1000000L) e = t + timeout_ms * 1000000L;
		if (spin_u32(w, 1, e)) return 1;
	}
	if (timeout_ms == 0) return 0;
	stat_add(MIGCTL_STAT_WAIT_SLEEPS, 1);
	if (timeout_ms > 0) {
		clock_gettime(CLOCK_MONOTONIC, &end);
		end.tv_sec += timeout_ms / 1000;
		end.tv_nsec += (timeout_ms % 1000) * 1000000L;
		if (end.tv_nsec >= 1000000000L) {
			end.tv_sec++;
			end.tv_nsec -= 1000000000L;
		}
	}
	for (;;) {
		uint32_t v = 0;
		// 0 -> 2: a sleeper is on the word (migctl_complete wakes only then)
		if (!__atomic_compare_exchange_n(w, &v, 2, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE) && v == 1) return 1;
		struct timespec *tp = NULL;
		if (timeout_ms > 0) {
			clock_gettime(CLOCK_MONOTONIC, &now);
			rel.tv_sec = end.tv_sec - now.tv_sec;
			rel.tv_nsec = end.tv_nsec - now.tv_nsec;
			if (rel.tv_nsec < 0) {
				rel.tv_sec--;
				rel.tv_nsec += 1000000000L;
			}
			if (rel.tv_sec < 0) return __atomic_load_n(w, __ATOMIC_ACQUIRE) == 1;
			tp = &rel;
		}
		futex(w, FUTEX_WAIT, 2, tp);
		if (__atomic_load_n(w, __ATOMIC_ACQUIRE) == 1) return 1;
	}
}

// result returns a finished slot's code with its text as the thread's last
// error; free: release the slot (its handle becomes unknown).
static int result(migctl_slot_t *s, migctl_work_t h, int free_it) {
	if (!free_it) {
		int code = s->code;
		if (code != MIGCTL_OK && s->err != NULL) set_error(code, s->err);
		return code;
	}
	uint64_t want = h;
	if (!__atomic_compare_exchange_n(&s->id, &want, UINT64_MAX, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
		return set_error(MIGCTL_ERR_BAD_HANDLE, "libmigctl: unknown work handle (already waited for, or never issued)");
	int code = s->code;
	if (s->err != NULL) {
		if (code != MIGCTL_OK) set_error(code, s->err);
		free(s->err);
		s->err = NULL;
	}
	__atomic_store_n(&s->id, 0, __ATOMIC_RELEASE);
	return code;
}

// --- entry points ------------------------------------------------------------

int migctl_abi_version(void) { return MIGCTL_ABI_VERSION; }

int migctl_stats(uint64_t *out, size_t n) {
	GUARD_FAST(MIGCTL_ERR_FORKED);
	if (out == NULL && n > 0) return set_error(MIGCTL_ERR_INVALID, "libmigctl: migctl_stats: NULL buffer");
	for (size_t i = 0; i < n && i < MIGCTL_STAT_COUNT; i++) out[i] = __atomic_load_n(&stats[i], __ATOMIC_RELAXED);
	// Counted by the executors (Go), not here.
	if (n > MIGCTL_STAT_QUEUED_BACK) out[MIGCTL_STAT_QUEUED_BACK] = migctlGoQueuedBack();
	return MIGCTL_STAT_COUNT;
}
const char *migctl_last_error(void) { return last_error; }

static int init(int rank, int size, const char *rdzv, const char *job) {
	int rc = migctlGoInit(rank, size, (char *)rdzv, (char *)job);
	if (rc == MIGCTL_OK && __atomic_load_n(&state, __ATOMIC_ACQUIRE) == 0) {
		__atomic_store_n(&group_sizes[0], migctlGoInfo(0, 1), __ATOMIC_RELEASE);
		group_on_gpu = migctlGoInfo(0, 4) == 1;
		choose_spin(migctlGoInfo(0, 3), migctlGoInfo(0, 5));
		__atomic_store_n(&state, 1, __ATOMIC_RELEASE);
	}
	return rc;
}

int migctl_init_from_env(void) { GUARD(MIGCTL_ERR_FORKED); return init(-1, -1, NULL, NULL); }
int migctl_init(int rank, int size) { GUARD(MIGCTL_ERR_FORKED); return init(rank, size, NULL, NULL); }

int migctl_init_group(int rank, int size, const char *rdzv, const char *job) {
	GUARD(MIGCTL_ERR_FORKED);
	if (rank < 0 || size < 1 || rank >= size)
		return set_error(MIGCTL_ERR_INVALID, "libmigctl: migctl_init_group: want 0 <= rank < size");
	return init(rank, size, rdzv, job);
}

int migctl_serve(int size, char *addr, size_t addr_len) {
	GUARD(MIGCTL_ERR_FORKED);
	if (size < 1) return set_error(MIGCTL_ERR_INVALID, "libmigctl: migctl_serve: want size >= 1");
	return migctlGoServe(size, addr, addr_len);
}
int migctl_rank(void) { GUARD(-1); return migctlGoInfo(0, 0); }
int migctl_size(void) { GUARD(-1); return migctlGoInfo(0, 1); }
int migctl_local_rank(void) { GUARD(-1); return migctlGoInfo(0, 2); }
int migctl_local_size(void) { GUARD(-1); return migctlGoInfo(0, 3); }
int migctl_on_gpu(void) { GUARD(-1); return migctlGoInfo(0, 4); }
int migctl_group_rank(int group) { GUARD(-1); return migctlGoInfo(group, 0); }
int migctl_group_size(int group) { GUARD(-1); return migctlGoInfo(group, 1); }
int migctl_queued_broadcast_bytes(int group) {
	GUARD(MIGCTL_ERR_FORKED);
	int rc = check_state();
	if (rc < 0) return rc;
	return migctlGoInfo(group, 6);
}
int migctl_completes_early(int group) {
	GUARD(MIGCTL_ERR_FORKED);
	int rc = check_state();
	if (rc < 0) return rc;
	return migctlGoInfo(group, 7);
}

int migctl_new_group(const int *ranks, int n, const char *name) {
	GUARD(MIGCTL_ERR_FORKED);
	int rc = check_state();
	if (rc < 0) return rc;
	if (ranks == NULL || n < 1 || name == NULL)
		return set_error(MIGCTL_ERR_INVALID, "libmigctl: migctl_new_group: want ranks (n >= 1) and a name");
	int id = migctlGoNewGroup((int *)ranks, n, (char *)name);
	if (id > 0 && id < MIGCTL_MAX_GROUPS) __atomic_store_n(&group_sizes[id], n, __ATOMIC_RELEASE);
	return id;
}

int migctl_free_group(int group) {
	GUARD(MIGCTL_ERR_FORKED);
	if (group <= 0 || group >= MIGCTL_MAX_GROUPS || size_of(group) == 0)
		return set_error(MIGCTL_ERR_INVALID, "libmigctl: migctl_free_group: not a group of migctl_new_group (or freed)");
	__atomic_store_n(&group_sizes[group], 0, __ATOMIC_RELEASE); // issues refused from now on
	return migctlGoFreeGroup(group);
}

static int out(int64_t h, migctl_work_t *work) {
	if (h < 0) return (int)h;
	*work = (migctl_work_t)h;
	return MIGCTL_OK;
}

#define NULL_WORK()                                                                                 \
	do {                                                                                            \
		if (work == NULL) return set_error(MIGCTL_ERR_INVALID, "libmigctl: the work argument is NULL"); \
		*work = 0;                                                                                  \
	} while (0)

int migctl_allreduce(const void *send, void *recv, size_t count, int dtype, int op,
                     int device, uintptr_t stream, migctl_work_t *work) {
	GUARD_FAST(MIGCTL_ERR_FORKED);
	NULL_WORK();
	return out(issue(0, MIGCTL_KIND_ALLREDUCE, (void *)send, recv, count, dtype, op, 0, device, stream, 0), work);
}

int migctl_reduce_scatter(const void *send, void *recv, size_t recv_count, int dtype, int op,
                          int device, uintptr_t stream, migctl_work_t *work) {
	GUARD_FAST(MIGCTL_ERR_FORKED);
	NULL_WORK();
	return out(issue(0, MIGCTL_KIND_REDUCE_SCATTER, (void *)send, recv, recv_count, dtype, op, 0, device, stream, 0), work);
}

int migctl_all_gather(const void *send, void *recv, size_t send_count, int dtype,
                      int device, uintptr_t stream, migctl_work_t *work) {
	GUARD_FAST(MIGCTL_ERR_FORKED);
	NULL_WORK();
	return out(issue(0, MIGCTL_KIND_ALL_GATHER, (void *)send, recv, send_count, dtype, 0, 0, device, stream, 0), work);
}

int migctl_broadcast(const void *send, void *recv, size_t count, int dtype, int root,
                     int device, uintptr_t stream, migctl_work_t *work) {
	GUARD_FAST(MIGCTL_ERR_FORKED);
	NULL_WORK();
	return out(issue(0, MIGCTL_KIND_BROADCAST, (void *)send, recv, count, dtype, 0, root, device, stream, 0), work);
}

int migctl_barrier(migctl_work_t *work) {
	GUARD_FAST(MIGCTL_ERR_FORKED);
	NULL_WORK();
	return out(issue(0, MIGCTL_KIND_BARRIER, NULL, NULL, 0, 0, 0, 0, 0, 0, 0), work);
}

int64_t migctl_issue(int kind, const void *send, void *recv, size_t count, int dtype, int op, int root,
                     int device, uintptr_t stream) {
	GUARD_FAST(MIGCTL_ERR_FORKED);
	return issue(0, kind, (void *)send, recv, count, dtype, op, root, device, stream, 0);
}

int64_t migctl_issue_on(int group, int kind, const void *send, void *recv, size_t count, int dtype, int op, int root,
                        int device, uintptr_t stream) {
	GUARD_FAST(MIGCTL_ERR_FORKED);
	return issue(group, kind, (void *)send, recv, count, dtype, op, root, device, stream, 0);
}

// wait_for is migctl_wait of a valid handle; the waiter spins at most
// max_spin_ns (wait_word).
static int wait_for(migctl_slot_t *s, migctl_work_t work, int64_t timeout_ms, int64_t max_spin_ns) {
	int64_t start = mono_ns();
	if (!wait_word(s, timeout_ms, max_spin_ns)) return MIGCTL_PENDING;
	int64_t now = mono_ns(), done = s->t_done;
	stat_add(MIGCTL_STAT_WAITS, 1);
	stat_add(MIGCTL_STAT_WAKE_NS, (uint64_t)(now - (done > start ? done : start)));
	return result(s, work, 1);
}

int migctl_wait(migctl_work_t work, int64_t timeout_ms) {
	GUARD_FAST(MIGCTL_ERR_FORKED);
	migctl_slot_t *s = lookup(work);
	if (s == NULL) return MIGCTL_ERR_BAD_HANDLE;
	return wait_for(s, work, timeout_ms, adaptive ? spin_max_ns : 0);
}

// A slot whose waiter returned before it finished (migctl_wait_stream) has
// this bit in its id: its handle is unknown, and the slot stays taken until
// finish frees it.
#define DETACHED (UINT64_C(1) << 63)

int migctl_wait_stream(migctl_work_t work, uintptr_t stream, int64_t timeout_ms) {
	GUARD_FAST(MIGCTL_ERR_FORKED);
	migctl_slot_t *s = lookup(work);
	if (s == NULL) return MIGCTL_ERR_BAD_HANDLE;
	int64_t max_spin = adaptive ? spin_max_ns : 0;
	int64_t start = timeout_ms > 0 ? mono_ns() : 0;
	if (!wait_u32(s, &s->rword, timeout_ms, max_spin)) return MIGCTL_PENDING;
	if (__atomic_load_n(&s->ready, __ATOMIC_ACQUIRE) && __atomic_load_n(&s->word, __ATOMIC_ACQUIRE) == 0 &&
	    migctlGoOrderReady(work, stream) == MIGCTL_OK) {
		// The stream waits for the result on the device: leave the slot to
		// finish (word 3), unless it has finished meanwhile. The id changes
		// first, so that finish, which frees a slot left to it, comes after.
		__atomic_store_n(&s->id, work | DETACHED, __ATOMIC_RELEASE);
		uint32_t v = 0;
		if (__atomic_compare_exchange_n(&s->word, &v, 3, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
			stat_add(MIGCTL_STAT_EARLY, 1);
			return MIGCTL_OK;
		}
		__atomic_store_n(&s->id, work, __ATOMIC_RELEASE);
	}
	if (timeout_ms > 0) {
		int64_t left = timeout_ms - (mono_ns() - start) / 1000000;
		timeout_ms = left > 0 ? left : 0;
	}
	return wait_for(s, work, timeout_ms, max_spin);
}

// direct runs a synchronous collective on the calling thread when nothing
// issued before it is queued or running and it is at most direct_max bytes:
// the collective's result (its text set), or DIRECT_NO for the ring. The
// issue lock held while the ring is seen empty and the run lock taken
// keeps the order: a collective issued meanwhile waits in the ring, and the
// dispatcher takes it only after this one (run_lock).
#define DIRECT_NO 1000

static int direct(int group, int kind, void *send, void *recv, size_t count, int dtype, int op, int root,
                  int device, uintptr_t stream) {
	// a transfer waits for its peer, not in the process's order: the ring's
	if (direct_max == 0 || kind == MIGCTL_KIND_SEND || kind == MIGCTL_KIND_RECV) return DIRECT_NO;
	int size = check_call(group, kind, send, recv, count, dtype, op, root, device);
	if (size < 0) return size;
	size_t bytes = kind == MIGCTL_KIND_BARRIER ? 0 : count * elem_size[dtype];
	if (kind == MIGCTL_KIND_ALL_GATHER || kind == MIGCTL_KIND_REDUCE_SCATTER) bytes *= (size_t)size;
	if (bytes > direct_max) return DIRECT_NO;
	pthread_mutex_lock(&issue_mu);
	int ok = state == 1 && __atomic_load_n(&taken, __ATOMIC_ACQUIRE) == issued && run_trylock();
	pthread_mutex_unlock(&issue_mu);
	if (!ok) return DIRECT_NO;
	int64_t order = mark(kind, count, device, stream);
	if (order < 0) {
		run_unlock();
		return (int)order;
	}
	int64_t start = mono_ns();
	int code = migctlGoDirect(group, kind, send, recv, count, dtype, op, root, device, stream, (uint64_t)order);
	int64_t run = mono_ns() - start;
	note_run(run);
	run_unlock();
	stat_add(MIGCTL_STAT_DONE, 1);
	stat_add(MIGCTL_STAT_RUN_NS, (uint64_t)run);
	stat_add(MIGCTL_STAT_WAITS, 1);
	stat_add(MIGCTL_STAT_RUNS, 1);
	stat_add(MIGCTL_STAT_DIRECT, 1);
	return code;
}

// migctl_run is migctl_issue and migctl_wait in one call: no return to the
// caller between them. With nothing else queued or running, a collective
// of at most direct_max bytes runs on the calling thread itself (direct):
// no hand-off to the dispatcher and no wake of a sleeping waiter, ~7 us each
// on one H200's host (the trainer's waits then poll without yielding, see
// comm.HoldYields: a yield of a cgo callback's goroutine, which is locked to
// the C thread, hands the thread's P away and back). Otherwise it goes
// through the ring like any other, and the waiting thread, which has nothing
// else to do, may poll longer before it sleeps (run_spin_max_ns).
static int run(int group, int kind, const void *send, void *recv, size_t count, int dtype, int op, int root,
               int device, uintptr_t stream) {
	int rc = direct(group, kind, (void *)send, recv, count, dtype, op, root, device, stream);
	if (rc != DIRECT_NO) return rc;
	int64_t h = issue(group, kind, (void *)send, recv, count, dtype, op, root, device, stream, 1);
	if (h < 0) return (int)h;
	stat_add(MIGCTL_STAT_RUNS, 1);
	return wait_for(&ring[h % MIGCTL_SLOTS], (migctl_work_t)h, -1,
	                run_spin_max_ns > 0 ? run_spin_max_ns : (adaptive ? spin_max_ns : 0));
}

int migctl_run(int kind, const void *send, void *recv, size_t count, int dtype, int op, int root, int device,
               uintptr_t stream) {
	GUARD_FAST(MIGCTL_ERR_FORKED);
	return run(0, kind, send, recv, count, dtype, op, root, device, stream);
}

int migctl_run_on(int group, int kind, const void *send, void *recv, size_t count, int dtype, int op, int root,
                  int device, uintptr_t stream) {
	GUARD_FAST(MIGCTL_ERR_FORKED);
	return run(group, kind, send, recv, count, dtype, op, root, device, stream);
}

int migctl_test(migctl_work_t work) {
	GUARD_FAST(MIGCTL_ERR_FORKED);
	migctl_slot_t *s = lookup(work);
	if (s == NULL) return MIGCTL_ERR_BAD_HANDLE;
	if (__atomic_load_n(&s->word, __ATOMIC_ACQUIRE) != 1) return MIGCTL_PENDING;
	return result(s, work, 0);
}

int migctl_abort(const char *reason) { GUARD(MIGCTL_ERR_FORKED); return migctlGoAbort((char *)reason); }

int migctl_set_timeout(int64_t timeout_ms) {
	GUARD(MIGCTL_ERR_FORKED);
	return migctlGoSetTimeout(0, timeout_ms);
}

int migctl_set_timeout_on(int group, int64_t timeout_ms) {
	GUARD(MIGCTL_ERR_FORKED);
	return migctlGoSetTimeout(group, timeout_ms);
}

int migctl_finalize(void) {
	GUARD(MIGCTL_ERR_FORKED);
	pthread_mutex_lock(&issue_mu); // no issue is half done: the dispatcher drains every issued one
	__atomic_store_n(&state, 2, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&issue_mu);
	return migctlGoFinalize();
}
