/* cabi.c on its own, the Go side stubbed (TestCompleteOrder): a direct
 * migctl_run that starts once the dispatcher lets the run lock go must find
 * the collective the dispatcher just completed done (migctl_test), as a
 * migctl_run through the ring does. The dispatcher's release of the run lock
 * is caught at its futex wake (the run word is set to "held with a sleeper"
 * first); there the main thread runs a barrier directly and tests the
 * earlier one. Then transfers: one issued with nothing in flight starts on
 * the issuing thread and never reaches the dispatcher; one issued behind a
 * collective still running waits in the ring and reaches the dispatcher
 * after it; the dispatcher takes what is issued after a transfer started
 * by its caller, each slot once. Last, migctl_wait_stream: it returns while
 * a readied collective still runs, having ordered the stream (the Go side's
 * migctlGoOrderReady), and leaves the slot to the dispatcher's completion,
 * which frees it, a failure too; it waits as migctl_wait for one not
 * readied (its timeout too) and for one the Go side declines. Prints "ok". */
#define _GNU_SOURCE
#include <linux/futex.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

// What cgo's _cgo_export.h declares (the test's own is empty).
int migctlGoInit(int rank, int size, char *rdzv, char *job);
int migctlGoInfo(int group, int what);
int64_t migctlGoOrder(uintptr_t stream);
void migctlGoDropOrder(uint64_t id);
int migctlGoDirect(int group, int kind, void *send, void *recv, size_t count, int dtype, int op, int root,
                   int device, uintptr_t stream, uint64_t order);
int migctlGoNewGroup(int *ranks, int n, char *name);
int migctlGoFreeGroup(int group);
int migctlGoAbort(char *reason);
int migctlGoSetTimeout(int group, int64_t ms);
int migctlGoServe(int size, char *out, size_t outLen);
int migctlGoFinalize(void);
int migctlGoOrderReady(uint64_t id, uintptr_t stream);
uint64_t migctlGoQueuedBack(void);

static long hooked_syscall(long nr, uint32_t *w, int op, uint32_t v, const void *t, void *u, int v3);
#define syscall hooked_syscall
#include "../cabi.h"
void migctlGoTransfer(migctl_slot_t *s);
#include "../cabi.c"
#undef syscall

// --- the Go side (cmd/libmigctl/main.go), stubbed: a group of one on the host backend

static int directs;

int migctlGoInit(int rank, int size, char *rdzv, char *job) { return MIGCTL_OK; }
int migctlGoInfo(int group, int what) {
	switch (what) {
	case 1: case 3: return 1; // size, local size
	case 5: return 2;         // GOMAXPROCS
	}
	return 0;
}
int64_t migctlGoOrder(uintptr_t stream) { return 0; }
void migctlGoDropOrder(uint64_t id) {}
int migctlGoDirect(int group, int kind, void *send, void *recv, size_t count, int dtype, int op, int root,
                   int device, uintptr_t stream, uint64_t order) {
	directs++;
	return MIGCTL_OK;
}
int migctlGoAbort(char *reason) { return MIGCTL_OK; }
int migctlGoSetTimeout(int group, int64_t ms) { return MIGCTL_OK; }
int migctlGoNewGroup(int *ranks, int n, char *name) { return MIGCTL_ERR_UNSUPPORTED; }
int migctlGoFreeGroup(int group) { return MIGCTL_OK; }
int migctlGoServe(int size, char *out, size_t outLen) { return MIGCTL_OK; }
uint64_t migctlGoQueuedBack(void) { return 42; }

// migctl_wait_stream's calls to order a stream: the last handle and stream,
// how many, and what they return.
static uint64_t ordered_id;
static uintptr_t ordered_stream;
static int ordered_n, order_rc = MIGCTL_OK;
int migctlGoOrderReady(uint64_t id, uintptr_t stream) {
	ordered_id = id;
	ordered_stream = stream;
	ordered_n++;
	return order_rc;
}

// Transfers started by their callers (issue): the handle and whether the
// call came on the main thread. They finish at once.
static uint64_t here_ids[8];
static int here_n, here_off_main;
static pthread_t main_thread;
void migctlGoTransfer(migctl_slot_t *s) {
	if (!pthread_equal(pthread_self(), main_thread)) here_off_main++;
	if (here_n < 8) here_ids[here_n++] = s->id;
	migctl_complete_handed(s, MIGCTL_OK, NULL, 0);
}

static pthread_t disp;
int migctlGoFinalize(void) {
	migctl_stop_dispatcher();
	pthread_join(disp, NULL);
	return MIGCTL_OK;
}

// --- the test

static sem_t released, resume;
static int armed; // the next release of the run lock stops at its wake

static long hooked_syscall(long nr, uint32_t *w, int op, uint32_t v, const void *t, void *u, int v3) {
	if (nr == SYS_futex && w == &run_word && (op & FUTEX_CMD_MASK) == FUTEX_WAKE &&
	    __atomic_exchange_n(&armed, 0, __ATOMIC_SEQ_CST)) {
		sem_post(&released);
		sem_wait(&resume);
	}
	return syscall(nr, w, op, v, t, u, v3);
}

// What the dispatcher took, in order; while hold is set it keeps the
// collective it took running until gate is posted.
static uint64_t taken_ids[64];
static int taken_kinds[64], taken_n, hold;
static sem_t gate;
// ready_first: a held collective is readied (migctl_ready) before it waits
// for gate; it then completes with done_code; completed counts completions.
static int ready_first, done_code = MIGCTL_OK, completed;

static void *dispatcher(void *arg) {
	migctl_slot_t *s;
	while ((s = migctl_next()) != NULL) {
		if (taken_n < 64) {
			taken_ids[taken_n] = s->id;
			taken_kinds[taken_n++] = s->kind;
		}
		if (s->kind == MIGCTL_KIND_SEND || s->kind == MIGCTL_KIND_RECV) { // as main.go: queued, handed off
			migctl_hand_off(s);
			migctl_complete_handed(s, MIGCTL_OK, NULL, 0);
			continue;
		}
		if (__atomic_load_n(&hold, __ATOMIC_SEQ_CST)) {
			if (__atomic_load_n(&ready_first, __ATOMIC_SEQ_CST)) migctl_ready(s);
			sem_wait(&gate);
		}
		if (__atomic_load_n(&armed, __ATOMIC_SEQ_CST)) __atomic_store_n(&run_word, 2, __ATOMIC_SEQ_CST);
		__atomic_add_fetch(&completed, 1, __ATOMIC_SEQ_CST);
		int code = __atomic_load_n(&done_code, __ATOMIC_SEQ_CST);
		migctl_complete(s, code, code == MIGCTL_OK ? NULL : "failed late", code == MIGCTL_OK ? 0 : 11);
	}
	return NULL;
}

// open_gate_later lets the held collective go after 30 ms.
static void *open_gate_later(void *arg) {
	usleep(30000);
	sem_post(&gate);
	return NULL;
}

#define CHECK(cond, what)                                                              \
	do {                                                                               \
		if (!(cond)) {                                                                 \
			fprintf(stderr, "%s failed (%s)\n", what, migctl_last_error());            \
			exit(1);                                                                   \
		}                                                                              \
	} while (0)

int main(void) {
	setenv("MIGCTL_LIB_DIRECT_MAX", "1048576", 1);
	sem_init(&released, 0, 0);
	sem_init(&resume, 0, 0);
	sem_init(&gate, 0, 0);
	main_thread = pthread_self();
	CHECK(migctl_init(0, 1) == MIGCTL_OK, "init");
	CHECK(pthread_create(&disp, NULL, dispatcher, NULL) == 0, "dispatcher");
	CHECK(migctl_run(MIGCTL_KIND_BARRIER, NULL, NULL, 0, 0, 0, 0, 0, 0) == MIGCTL_OK && directs == 1,
	      "a run with nothing in flight, direct");
	for (int i = 0; i < 3; i++) {
		__atomic_store_n(&armed, 1, __ATOMIC_SEQ_CST);
		int64_t h = migctl_issue(MIGCTL_KIND_BARRIER, NULL, NULL, 0, 0, 0, 0, 0, 0);
		CHECK(h > 0, "issue");
		sem_wait(&released); // the dispatcher completes h and lets the run lock go
		int before = directs;
		CHECK(migctl_run(MIGCTL_KIND_BARRIER, NULL, NULL, 0, 0, 0, 0, 0, 0) == MIGCTL_OK, "run");
		CHECK(directs == before + 1, "the run after the release went direct");
		int st = migctl_test(h);
		sem_post(&resume);
		if (st != MIGCTL_OK) {
			fprintf(stderr, "a direct run returned while the collective issued before it tests %d (want done, %d)\n",
			        st, MIGCTL_OK);
			return 1;
		}
		CHECK(migctl_wait(h, -1) == MIGCTL_OK, "wait");
	}

	// Transfers. Nothing in flight: the issuing thread starts it.
	static float buf[4];
	int before = taken_n;
	int64_t t1 = migctl_issue(MIGCTL_KIND_SEND, buf, NULL, 4, MIGCTL_FLOAT32, 0, 0, MIGCTL_HOST, 0);
	CHECK(t1 > 0 && here_n == 1 && here_ids[0] == (uint64_t)t1 && here_off_main == 0,
	      "a transfer with nothing in flight starts on the issuing thread");
	CHECK(migctl_wait(t1, -1) == MIGCTL_OK, "wait for the transfer");
	uint64_t st[MIGCTL_STAT_COUNT];
	CHECK(migctl_stats(st, MIGCTL_STAT_COUNT) == MIGCTL_STAT_COUNT && st[MIGCTL_STAT_DIRECT_TRANSFERS] == 1,
	      "stats count the transfer started here");
	CHECK(st[MIGCTL_STAT_QUEUED_BACK] == 42, "stats take the queued-back count from the Go side");
	uint64_t few[MIGCTL_STAT_QUEUED_BACK] = {0};
	CHECK(migctl_stats(few, MIGCTL_STAT_QUEUED_BACK) == MIGCTL_STAT_COUNT && few[MIGCTL_STAT_DIRECT_TRANSFERS] == 1,
	      "stats copy no more than asked for");
	// Behind a collective still running: the ring, after it.
	__atomic_store_n(&hold, 1, __ATOMIC_SEQ_CST);
	int64_t b1 = migctl_issue(MIGCTL_KIND_BARRIER, NULL, NULL, 0, 0, 0, 0, 0, 0);
	int64_t t2 = migctl_issue(MIGCTL_KIND_RECV, NULL, buf, 4, MIGCTL_FLOAT32, 0, 0, MIGCTL_HOST, 0);
	CHECK(b1 > 0 && t2 > 0 && here_n == 1, "a transfer behind a running collective waits in the ring");
	__atomic_store_n(&hold, 0, __ATOMIC_SEQ_CST);
	sem_post(&gate);
	CHECK(migctl_wait(b1, -1) == MIGCTL_OK && migctl_wait(t2, -1) == MIGCTL_OK, "waits");
	// Idle again: a transfer here, then a barrier the dispatcher takes (once).
	int64_t t3 = migctl_issue(MIGCTL_KIND_SEND, buf, NULL, 4, MIGCTL_FLOAT32, 0, 0, MIGCTL_HOST, 0);
	CHECK(t3 > 0 && here_n == 2 && here_ids[1] == (uint64_t)t3, "the next transfer with nothing in flight, here");
	int64_t b2 = migctl_issue(MIGCTL_KIND_BARRIER, NULL, NULL, 0, 0, 0, 0, 0, 0);
	CHECK(migctl_wait(t3, -1) == MIGCTL_OK && migctl_wait(b2, -1) == MIGCTL_OK, "waits after");
	int64_t b3 = migctl_issue(MIGCTL_KIND_BARRIER, NULL, NULL, 0, 0, 0, 0, 0, 0);
	CHECK(migctl_wait(b3, -1) == MIGCTL_OK, "one more");
	uint64_t want[] = {(uint64_t)b1, (uint64_t)t2, (uint64_t)b2, (uint64_t)b3};
	if (taken_n - before != 4) {
		fprintf(stderr, "the dispatcher took %d slots after the transfers began, want 4 (b1 t2 b2 b3)\n", taken_n - before);
		return 1;
	}
	for (int i = 0; i < 4; i++)
		if (taken_ids[before + i] != want[i]) {
			fprintf(stderr, "the dispatcher's slot %d is handle %llu, want %llu\n", i,
			        (unsigned long long)taken_ids[before + i], (unsigned long long)want[i]);
			return 1;
		}
	CHECK(taken_kinds[before + 1] == MIGCTL_KIND_RECV, "the transfer behind the barrier reached the dispatcher");

	// migctl_wait_stream of a collective readied while it runs: it returns
	// with the stream ordered, the collective still running, its handle
	// gone; the completion frees the slot (a failure's text too).
	while (sem_trywait(&gate) == 0) { // a post for b1 that the dispatcher took after hold went back to 0
	}
	for (int fail = 0; fail < 2; fail++) {
		__atomic_store_n(&hold, 1, __ATOMIC_SEQ_CST);
		__atomic_store_n(&ready_first, 1, __ATOMIC_SEQ_CST);
		__atomic_store_n(&done_code, fail ? MIGCTL_ERR_TIMEOUT : MIGCTL_OK, __ATOMIC_SEQ_CST);
		int done_before = __atomic_load_n(&completed, __ATOMIC_SEQ_CST), n_before = ordered_n;
		int64_t r = migctl_issue(MIGCTL_KIND_BARRIER, NULL, NULL, 0, 0, 0, 0, 0, 0);
		CHECK(r > 0, "issue a collective to ready");
		CHECK(migctl_wait_stream(r, 0x5eed, -1) == MIGCTL_OK, "wait_stream of a readied collective");
		CHECK(__atomic_load_n(&completed, __ATOMIC_SEQ_CST) == done_before, "wait_stream returned before the end");
		CHECK(ordered_n == n_before + 1 && ordered_id == (uint64_t)r && ordered_stream == 0x5eed,
		      "wait_stream ordered the caller's stream after the readied collective");
		CHECK(migctl_test(r) == MIGCTL_ERR_BAD_HANDLE, "the handle is gone after wait_stream");
		migctl_slot_t *slot = &ring[r % MIGCTL_SLOTS];
		CHECK(__atomic_load_n(&slot->id, __ATOMIC_SEQ_CST) != 0, "the slot stays taken while it runs");
		__atomic_store_n(&hold, 0, __ATOMIC_SEQ_CST);
		__atomic_store_n(&ready_first, 0, __ATOMIC_SEQ_CST);
		sem_post(&gate);
		for (int i = 0; i < 5000 && __atomic_load_n(&slot->id, __ATOMIC_SEQ_CST) != 0; i++) usleep(1000);
		CHECK(__atomic_load_n(&slot->id, __ATOMIC_SEQ_CST) == 0 && slot->err == NULL, "the completion freed the slot");
	}
	__atomic_store_n(&done_code, MIGCTL_OK, __ATOMIC_SEQ_CST);
	CHECK(migctl_stats(st, MIGCTL_STAT_COUNT) == MIGCTL_STAT_COUNT && st[MIGCTL_STAT_EARLY] == 2,
	      "stats count the early returns");
	// Not readied: the timeout passes (the handle stays), then it waits for the end.
	__atomic_store_n(&hold, 1, __ATOMIC_SEQ_CST);
	int n_before = ordered_n;
	int64_t r2 = migctl_issue(MIGCTL_KIND_BARRIER, NULL, NULL, 0, 0, 0, 0, 0, 0);
	CHECK(migctl_wait_stream(r2, 0x5eed, 20) == MIGCTL_PENDING, "wait_stream times out on a collective not ready");
	__atomic_store_n(&hold, 0, __ATOMIC_SEQ_CST);
	sem_post(&gate);
	CHECK(migctl_wait_stream(r2, 0x5eed, -1) == MIGCTL_OK && ordered_n == n_before,
	      "wait_stream of a collective never readied: its end, no stream ordered");
	// Readied, but the Go side has nothing to order after: it waits for the end.
	__atomic_store_n(&hold, 1, __ATOMIC_SEQ_CST);
	__atomic_store_n(&ready_first, 1, __ATOMIC_SEQ_CST);
	order_rc = MIGCTL_PENDING;
	int done_before = __atomic_load_n(&completed, __ATOMIC_SEQ_CST);
	int64_t r3 = migctl_issue(MIGCTL_KIND_BARRIER, NULL, NULL, 0, 0, 0, 0, 0, 0);
	pthread_t opener;
	CHECK(pthread_create(&opener, NULL, open_gate_later, NULL) == 0, "gate opener");
	CHECK(migctl_wait_stream(r3, 0x5eed, -1) == MIGCTL_OK, "wait_stream declined by the Go side");
	CHECK(__atomic_load_n(&completed, __ATOMIC_SEQ_CST) == done_before + 1, "it returned only after the end");
	pthread_join(opener, NULL);
	__atomic_store_n(&hold, 0, __ATOMIC_SEQ_CST);
	__atomic_store_n(&ready_first, 0, __ATOMIC_SEQ_CST);

	CHECK(migctl_finalize() == MIGCTL_OK, "finalize");
	printf("ok\n");
	return 0;
}
