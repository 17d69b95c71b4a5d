/* cabi.c on its own, the Go side stubbed (TestCompleteOrder): a direct
 * migctl_run that starts once the dispatcher lets the run lock go must find
 * the collective the dispatcher just completed done (migctl_test), as a
 * migctl_run through the ring does. The dispatcher's release of the run lock
 * is caught at its futex wake (the run word is set to "held with a sleeper"
 * first); there the main thread runs a barrier directly and tests the
 * earlier one. Prints "ok". */
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

static void *dispatcher(void *arg) {
	migctl_slot_t *s;
	while ((s = migctl_next()) != NULL) {
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
	CHECK(migctl_finalize() == MIGCTL_OK, "finalize");
	printf("ok\n");
	return 0;
}
