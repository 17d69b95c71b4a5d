// The C entry points of libmigctl.so (include/migctl.h). Each one refuses to
// run in a child forked after the library was loaded (the Go runtime's threads
// do not exist there, so entering it could hang), then calls the Go export
// that does the work. The last error's text is kept per thread.
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "migctl.h"
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

int migctl_abi_version(void) { return MIGCTL_ABI_VERSION; }
const char *migctl_last_error(void) { return last_error; }

int migctl_init_from_env(void) { GUARD(MIGCTL_ERR_FORKED); return migctlGoInit(-1, -1); }
int migctl_init(int rank, int size) { GUARD(MIGCTL_ERR_FORKED); return migctlGoInit(rank, size); }
int migctl_rank(void) { GUARD(-1); return migctlGoInfo(0); }
int migctl_size(void) { GUARD(-1); return migctlGoInfo(1); }
int migctl_local_rank(void) { GUARD(-1); return migctlGoInfo(2); }
int migctl_local_size(void) { GUARD(-1); return migctlGoInfo(3); }
int migctl_on_gpu(void) { GUARD(-1); return migctlGoInfo(4); }

int migctl_allreduce(const void *send, void *recv, size_t count, int dtype, int op,
                     int device, uintptr_t stream, migctl_work_t *work) {
	GUARD(MIGCTL_ERR_FORKED);
	return migctlGoCollective(0, (void *)send, recv, count, dtype, op, 0, device, stream, work);
}

int migctl_reduce_scatter(const void *send, void *recv, size_t recv_count, int dtype, int op,
                          int device, uintptr_t stream, migctl_work_t *work) {
	GUARD(MIGCTL_ERR_FORKED);
	return migctlGoCollective(1, (void *)send, recv, recv_count, dtype, op, 0, device, stream, work);
}

int migctl_all_gather(const void *send, void *recv, size_t send_count, int dtype,
                      int device, uintptr_t stream, migctl_work_t *work) {
	GUARD(MIGCTL_ERR_FORKED);
	return migctlGoCollective(2, (void *)send, recv, send_count, dtype, 0, 0, device, stream, work);
}

int migctl_broadcast(const void *send, void *recv, size_t count, int dtype, int root,
                     int device, uintptr_t stream, migctl_work_t *work) {
	GUARD(MIGCTL_ERR_FORKED);
	return migctlGoCollective(3, (void *)send, recv, count, dtype, 0, root, device, stream, work);
}

int migctl_barrier(migctl_work_t *work) {
	GUARD(MIGCTL_ERR_FORKED);
	return migctlGoCollective(4, NULL, NULL, 0, 0, 0, 0, 0, 0, work);
}

int64_t migctl_issue(int kind, const void *send, void *recv, size_t count, int dtype, int op, int root,
                     int device, uintptr_t stream) {
	migctl_work_t w = 0;
	int rc;
	GUARD(MIGCTL_ERR_FORKED);
	if (kind < MIGCTL_KIND_ALLREDUCE || kind > MIGCTL_KIND_BARRIER) {
		static const char msg[] = "libmigctl: migctl_issue: unknown collective kind (want MIGCTL_KIND_*)";
		migctl_set_error(msg, sizeof msg - 1);
		return MIGCTL_ERR_INVALID;
	}
	if (kind == MIGCTL_KIND_BARRIER) return (rc = migctlGoCollective(4, NULL, NULL, 0, 0, 0, 0, 0, 0, &w)) ? rc : (int64_t)w;
	rc = migctlGoCollective(kind, (void *)send, recv, count, dtype, op, root, device, stream, &w);
	return rc ? rc : (int64_t)w;
}

int migctl_wait(migctl_work_t work, int64_t timeout_ms) { GUARD(MIGCTL_ERR_FORKED); return migctlGoWait(work, timeout_ms, 1); }
int migctl_test(migctl_work_t work) { GUARD(MIGCTL_ERR_FORKED); return migctlGoWait(work, 0, 0); }
int migctl_abort(const char *reason) { GUARD(MIGCTL_ERR_FORKED); return migctlGoAbort((char *)reason); }
int migctl_finalize(void) { GUARD(MIGCTL_ERR_FORKED); return migctlGoFinalize(); }
