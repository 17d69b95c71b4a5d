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
 * by its caller, each slot once. Prints "ok". */
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
		if (__atomic_load_n(&hold, __ATOMIC_SEQ_CST)) sem_wait(&gate);
		if (__atomic_load_n(&armed, __ATOMIC_SEQ_CST)) __atomic_store_n(&run_word, 2, __ATOMIC_SEQ_CST);
		migctl_complete(s, MIGCTL_OK, NULL, 0);
	}
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

	CHECK(migctl_finalize() == MIGCTL_OK, "finalize");
	printf("ok\n");
	return 0;
}
