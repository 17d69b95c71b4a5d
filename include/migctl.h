/*
 * migctl.h — the C ABI of libmigctl.so: migctl's trainer SDK (package
 * github.com/migctl/migctl/trainer) for programs that are not written in Go.
 * The Python package migctl_torch loads it with ctypes.
 *
 * A process started by `migctl run` calls migctl_init_from_env() once (its
 * group: every rank of the job, group 0), then issues collectives; every rank
 * must issue the same collectives in the same order with the same counts,
 * dtypes, ops and roots. migctl_new_group forms groups of some of the ranks
 * (see there); the collectives without a group argument are group 0's. The
 * ranks compare each call's kind, size, dtype, op and root: where a rank's
 * call differs from a peer's, every rank's call fails with
 * MIGCTL_ERR_INVALID (the text names both calls; a rank that had nothing to
 * wait for, such as a broadcast's root, may finish that call and fail at its
 * next one) and the group stays failed. Collectives
 * return at once with a handle (they only queue the work: never waiting for a
 * peer); migctl_wait() blocks until the collective has finished (the result
 * is then in the receive buffer) and frees the handle, migctl_test() polls
 * it. Every handle must be waited for exactly once, by one thread; at most
 * 4096 may be issued and not yet waited for. Bad arguments (dtype, op, root,
 * NULL buffers) and a CUDA error marking the caller's stream fail the issuing
 * call; what fails while the collective runs (a dead peer, device memory on
 * the host backend, too small a buffer) is the result of migctl_wait.
 *
 * Buffers: host memory (device = 0) or CUDA device memory of the group's
 * device in its primary context (device = 1, what PyTorch allocates), with the
 * CUstream its contents are produced on (0: the legacy default stream). A
 * collective on device memory waits for the work queued on that stream when
 * it was issued (an event recorded by the issuing call, never a device-wide
 * sync; none when the stream is idle), not for work queued there afterwards;
 * when it has finished, the result is in place, so work queued afterwards on
 * any stream sees it. Except, with MIGCTL_TUNING=smallon=device (outside a
 * swap job), a small all-reduce of device memory (up to the small-message
 * size, one stream for both buffers) made with migctl_run: it returns once
 * the all-reduce is queued on the GPU, as NCCL's collectives do, and its
 * result is in place for the work queued afterwards on that stream; other
 * streams and the host see it once they synchronize with the stream. If the
 * job fails while it is queued (a dead peer, the timeout), the stream goes
 * on with an undefined result and the next call reports the failure. The
 * same holds by default for a broadcast of device memory (one stream for
 * both buffers, at most migctl_queued_broadcast_bytes: one arena chunk, 0
 * in a swap job, on the CUDA IPC transport or with tracing) made with
 * migctl_run, on every rank: the root's stream copies its
 * data out and raises a flag, the others' streams wait for that flag and
 * copy in, and the call returns once that is queued (after waiting, on the
 * CPU, for every rank to have finished the call before, where the arena
 * needs it); MIGCTL_TUNING=bcast=cpu makes it wait for the end instead. The
 * issuing call leaves the calling thread's current
 * CUDA context as it was (a thread without one is left with the device's
 * primary context, as the CUDA runtime would). The buffers belong to the
 * collective until migctl_wait() returns for it.
 *
 * Errors: every function returns MIGCTL_OK or a negative MIGCTL_ERR_* code;
 * migctl_last_error() is the text of the last error on the calling thread.
 *
 * Threads and processes: the functions are safe to call from any thread. The
 * library installs no signal handlers of its own (the Go runtime keeps its
 * defaults for synchronous signals). A child forked from a process that
 * loaded the library (a PyTorch DataLoader worker) must not use it: there
 * every function returns MIGCTL_ERR_FORKED without entering the runtime
 * (the per-collective calls learn it from the handler the library registers
 * with pthread_atfork, which fork() and os.fork run; a child made by a raw
 * clone system call is caught by the other calls only).
 *
 * Loading: the library needs only libc (and loads libcuda.so.1 itself at run
 * time when the group uses a GPU): dlopen it, or link with -lmigctl.
 *
 * Versioning: MIGCTL_ABI_VERSION changes whenever a signature, a constant or
 * a semantic above changes; migctl_abi_version() is the library's.
 */
#ifndef MIGCTL_H
#define MIGCTL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MIGCTL_ABI_VERSION 17 /* 2: migctl_issue; errors of a running collective come from migctl_wait;
                              3: migctl_serve, migctl_init_group (a group per node of a multi-node job);
                              4: device collectives are ordered after the stream's work at the call
                                 (not when they start); migctl_stats;
                              5: migctl_run (issue and wait in one call); MIGCTL_STAT_RUNS;
                              6: migctl_run of a small device all-reduce on the devices
                                 (smallon=device) returns in stream order;
                              7: MIGCTL_STAT_DIRECT (migctl_run may run a collective on the
                                 calling thread);
                              8: calls that differ between ranks fail with MIGCTL_ERR_INVALID;
                                 migctl_set_timeout; a capturing stream fails the issue with
                                 MIGCTL_ERR_UNSUPPORTED;
                              9: groups of some of the ranks: migctl_new_group, migctl_free_group,
                                 migctl_group_rank/size, migctl_issue_on, migctl_run_on,
                                 migctl_set_timeout_on;
                             10: point-to-point transfers: MIGCTL_KIND_SEND, MIGCTL_KIND_RECV;
                             11: MIGCTL_STAT_DIRECT_TRANSFERS (a transfer may start on the issuing
                                 thread);
                             12: migctl_run of a broadcast of device memory of at most one arena
                                 chunk returns in stream order (MIGCTL_TUNING=bcast=cpu: not);
                             13: migctl_queued_broadcast_bytes;
                             14: MIGCTL_STAT_CHAINED (a large asynchronous all-reduce lets the
                                 collective issued after it start before it has finished);
                             15: migctl_wait_stream, MIGCTL_STAT_EARLY;
                             16: migctl_completes_early;
                             17: MIGCTL_STAT_QUEUED_BACK */

/* Result codes. */
#define MIGCTL_OK 0
#define MIGCTL_PENDING 1                 /* migctl_test / migctl_wait with a timeout: not finished yet */
#define MIGCTL_ERR_INVALID (-1)          /* bad argument: dtype, op, count, root, pointer; or calls
                                            that differ between ranks */
#define MIGCTL_ERR_NOT_INITIALIZED (-2)  /* migctl_init_from_env has not succeeded */
#define MIGCTL_ERR_TIMEOUT (-3)          /* the collective ran past its deadline (MIGCTL_TIMEOUT) */
#define MIGCTL_ERR_PEER_DEAD (-4)        /* another rank died */
#define MIGCTL_ERR_ABORTED (-5)          /* the group was aborted (by a rank or the launcher) */
#define MIGCTL_ERR_UNSUPPORTED (-6)      /* not possible on this group (device memory on the host backend),
                                            or on a stream being captured into a CUDA graph */
#define MIGCTL_ERR_CLOSED (-7)           /* migctl_finalize was called */
#define MIGCTL_ERR_FORKED (-8)           /* called in a child forked after the library was loaded */
#define MIGCTL_ERR_BAD_HANDLE (-9)       /* unknown or already waited-for handle */
#define MIGCTL_ERR_ALREADY_INITIALIZED (-10)
#define MIGCTL_ERR_INTERNAL (-99)

/* Element types (the trainer SDK's DType). */
#define MIGCTL_FLOAT32 0
#define MIGCTL_FLOAT16 1
#define MIGCTL_BFLOAT16 2
#define MIGCTL_FLOAT64 3
#define MIGCTL_INT32 4
#define MIGCTL_INT64 5
#define MIGCTL_UINT8 6

/* Reduction operators (MIGCTL_AVG on integers truncates). */
#define MIGCTL_SUM 0
#define MIGCTL_AVG 1
#define MIGCTL_MIN 2
#define MIGCTL_MAX 3

/* Where a buffer lives. */
#define MIGCTL_HOST 0
#define MIGCTL_DEVICE 1

/* A collective in flight (never 0). */
typedef uint64_t migctl_work_t;

/* The library's MIGCTL_ABI_VERSION. */
int migctl_abi_version(void);

/* Joins the group described by the launcher's environment (RANK, WORLD_SIZE,
 * MIGCTL_RDZV_ADDR, MIGCTL_JOB_TOKEN, MIGCTL_BACKEND, ...; see `migctl run
 * --help`). Blocks until every rank has joined. Without WORLD_SIZE the
 * process is a group of one. */
int migctl_init_from_env(void);

/* As migctl_init_from_env, with rank and size given (-1: from the
 * environment). */
int migctl_init(int rank, int size);

/* Several nodes (`migctl run --nnodes N`): a group spans one node (its ranks
 * share memory), so a program across nodes forms one group per node and runs
 * the inter-node stage itself (migctl_torch does, over gloo). One rank of the
 * node hosts the group's rendezvous with migctl_serve and hands the address to
 * the others (PyTorch: through its store); every rank of the node then calls
 * migctl_init_group with its rank among them (LOCAL_RANK), their number
 * (LOCAL_WORLD_SIZE), that address and a job name unique to the node (the
 * shared-memory segment's name). Both read the job token from
 * MIGCTL_JOB_TOKEN. */

/* Hosts, in this process until migctl_finalize, the rendezvous of a group of
 * size ranks on a new abstract Unix socket (nothing to clean up); writes its
 * address ("unix://@...", NUL-terminated) to addr (addr_len bytes; 64 are
 * enough). At most once per process. */
int migctl_serve(int size, char *addr, size_t addr_len);

/* As migctl_init with 0 <= rank < size, joining the group whose rendezvous
 * is at rdzv (NULL: MIGCTL_RDZV_ADDR) under the job name job (NULL:
 * MIGCTL_JOB). */
int migctl_init_group(int rank, int size, const char *rdzv, const char *job);

/* This process's rank and the group's size, local rank and local size (-1
 * before init). */
int migctl_rank(void);
int migctl_size(void);
int migctl_local_rank(void);
int migctl_local_size(void);

/* 1 when the group runs on CUDA device memory (MIGCTL_BACKEND=gpu), 0 on
 * host memory, -1 before init. */
int migctl_on_gpu(void);

/* recv = op over every rank's send (count elements; recv may be send). */
int migctl_allreduce(const void *send, void *recv, size_t count, int dtype, int op,
                     int device, uintptr_t stream, migctl_work_t *work);

/* Reduces every rank's send (size * recv_count elements) and leaves this
 * rank's block (recv_count elements) in recv. recv == send: in place, the
 * block stays at its place in send. */
int migctl_reduce_scatter(const void *send, void *recv, size_t recv_count, int dtype, int op,
                          int device, uintptr_t stream, migctl_work_t *work);

/* Concatenates every rank's send (send_count elements) in rank order into
 * recv (size * send_count elements). send == recv: this rank's input is block
 * rank of recv. */
int migctl_all_gather(const void *send, void *recv, size_t send_count, int dtype,
                      int device, uintptr_t stream, migctl_work_t *work);

/* recv (count elements) = root's send on every rank; send is read on root
 * only (NULL elsewhere); send == recv: in place. */
int migctl_broadcast(const void *send, void *recv, size_t count, int dtype, int root,
                     int device, uintptr_t stream, migctl_work_t *work);

/* Finishes once every rank has entered it. */
int migctl_barrier(migctl_work_t *work);

/* Collective kinds of migctl_issue. */
#define MIGCTL_KIND_ALLREDUCE 0
#define MIGCTL_KIND_REDUCE_SCATTER 1
#define MIGCTL_KIND_ALL_GATHER 2
#define MIGCTL_KIND_BROADCAST 3
#define MIGCTL_KIND_BARRIER 4
/* Point-to-point (PyTorch's dist.send/recv/isend/irecv, batch_isend_irecv:
 * pipeline parallelism): SEND sends send (count elements) to the rank root of
 * the group, RECV receives count elements from the rank root into recv; the
 * other buffer is ignored (may be NULL). Transfers between two ranks in one
 * direction are matched in the order they were issued and must agree on
 * count and dtype (a mismatch fails the receive with MIGCTL_ERR_INVALID, the
 * send then or at its next transfer, and later transfers in that direction).
 * Unlike the collectives they do not run in the process's issue order: each
 * direction between two ranks is a link of its own (formed at its first
 * transfer), so a transfer waits only for its peer, never for a collective
 * of any group, nor a collective for it, and two ranks may both send before
 * they receive. A send finishes once its buffer may be reused (the message is
 * at the peer or in shared memory between them). Ranks on one host only
 * (MIGCTL_ERR_UNSUPPORTED otherwise); root must not be the caller's rank
 * (MIGCTL_ERR_INVALID from migctl_wait). */
#define MIGCTL_KIND_SEND 5
#define MIGCTL_KIND_RECV 6

/* Any collective above in one call that returns its handle (> 0) or a
 * negative MIGCTL_ERR_* code: what an FFI binding calls (no out-parameter to
 * allocate per call). count is the count of that kind's entry point (recv_count
 * for reduce-scatter, send_count for all-gather); op is read by the
 * reductions, root by broadcast (the root) and by send and receive (the
 * peer); a barrier ignores the rest. Like every
 * collective it only queues the work: it never waits for a peer. */
int64_t migctl_issue(int kind, const void *send, void *recv, size_t count, int dtype, int op, int root,
                     int device, uintptr_t stream);

/* migctl_issue and migctl_wait(handle, -1) in one call, for synchronous
 * callers (torch's dist.all_reduce without async_op): the collective's
 * result, or the error code migctl_issue or migctl_wait would have given.
 * Unlike the others it waits for the peers. One call instead of two; a
 * small collective (at most 1 MiB; env MIGCTL_LIB_DIRECT_MAX, bytes, 0: never)
 * with nothing else in flight runs on the calling thread itself, else the
 * waiting thread, which has nothing else to do, may poll longer before it
 * sleeps. */
int migctl_run(int kind, const void *send, void *recv, size_t count, int dtype, int op, int root,
               int device, uintptr_t stream);

/* The largest broadcast, in bytes, of device memory that migctl_run (or
 * migctl_run_on) on group (0: the job's) queues on the device and returns
 * from before it ran, the stream ordered after it, when nothing else is in
 * flight; 0 where it queues none (MIGCTL_TUNING=bcast=cpu, the host backend,
 * the CUDA IPC transport, a swap job, a tracing rank); or a negative
 * MIGCTL_ERR_* code. Above it, or with other collectives in flight,
 * migctl_run of a broadcast waits for them and for the peers, so a binding
 * that must not wait (an asynchronous broadcast) issues it with
 * migctl_issue instead. */
int migctl_queued_broadcast_bytes(int group);

/* Waits for work up to timeout_ms (negative: no limit) and frees it; returns
 * the collective's result, or MIGCTL_PENDING (work still valid) when the
 * timeout passes first. */
int migctl_wait(migctl_work_t work, int64_t timeout_ms);

/* MIGCTL_PENDING while work runs, else its result (work stays valid: wait
 * for it to free it). */
int migctl_test(migctl_work_t work);

/* migctl_wait for a caller that orders its own CUDA stream after the
 * collective instead of waiting for it to end, as NCCL's callers do. It
 * waits up to timeout_ms (negative: no limit) until the collective's result
 * is determined and returns with the work queued on stream from now on
 * ordered after it on the device (cuStreamWaitEvent), and frees work. An
 * asynchronous all-reduce of device memory that the library stages through
 * host memory (one that MIGCTL_STAT_CHAINED counts) is determined once every
 * rank's reduction is done and this rank's last copies back are queued:
 * the call returns then, while those copies still run (counted in
 * MIGCTL_STAT_EARLY), and the CPU may go on queueing work behind them. A
 * failure of the collective after that (a local CUDA error, its deadline)
 * is reported by the next call on the group. Any other collective is
 * waited for as by migctl_wait (stream is then not used). The device memory
 * must stay allocated until the work on stream has passed this point.
 * Returns MIGCTL_OK, MIGCTL_PENDING (work still valid) when the timeout
 * passes first, or the collective's error. It returns early only with
 * MIGCTL_TUNING=complete=device (off by default: level with waiting in
 * DDP's step times on an H100, 2026-12-07; migctl_completes_early says
 * whether it is on); without, it waits as migctl_wait. */
int migctl_wait_stream(migctl_work_t work, uintptr_t stream, int64_t timeout_ms);

/* 1 where migctl_wait_stream may return before a collective of group (0:
 * the job's) has finished (MIGCTL_TUNING=complete=device, on a device that
 * orders streams, outside a swap job and the CUDA IPC transport), so that a
 * binding keeps stream bookkeeping only where it is used; 0 where it never
 * does; or a negative MIGCTL_ERR_* code. */
int migctl_completes_early(int group);

/* Counters of the library's work since it was loaded, for diagnosis
 * (times in nanoseconds, summed over the collectives): migctl_stats copies
 * the first n of them (MIGCTL_STAT_COUNT in this version) to out and returns
 * how many it keeps. */
#define MIGCTL_STAT_DONE 0            /* collectives finished */
#define MIGCTL_STAT_QUEUE_NS 1        /* from the issue to the dispatcher taking it (in issue order) */
#define MIGCTL_STAT_RUN_NS 2          /* from then to its end (the trainer SDK's call, with its waits) */
#define MIGCTL_STAT_WAITS 3           /* migctl_wait calls that returned a result */
#define MIGCTL_STAT_WAKE_NS 4         /* from the end (or the wait's start, if later) to the wait returning */
#define MIGCTL_STAT_WAIT_SLEEPS 5     /* waits that slept on the futex after spinning */
#define MIGCTL_STAT_DISPATCH_SLEEPS 6 /* times the dispatcher slept before an issue woke it */
#define MIGCTL_STAT_MARKS 7           /* device collectives issued with work queued on their stream (an event) */
#define MIGCTL_STAT_IDLE_MARKS 8      /* device collectives issued with their stream idle (nothing to wait for) */
#define MIGCTL_STAT_RUNS 9            /* collectives issued and waited for by migctl_run */
#define MIGCTL_STAT_DIRECT 10         /* of those, run on the calling thread (nothing else in flight) */
#define MIGCTL_STAT_DIRECT_TRANSFERS 11 /* transfers started on the issuing thread (nothing before them in flight) */
#define MIGCTL_STAT_CHAINED 12        /* all-reduces that let the next collective start before they finished */
#define MIGCTL_STAT_EARLY 13          /* migctl_wait_stream calls that returned before the collective finished */
#define MIGCTL_STAT_QUEUED_BACK 14    /* all-reduces whose copies back were queued at once, behind device waits
                                         for their reductions (MIGCTL_TUNING=complete=queued) */
#define MIGCTL_STAT_COUNT 15
int migctl_stats(uint64_t *out, size_t n);

/* Sets the deadline of every collective issued from now on (MIGCTL_TIMEOUT at
 * init), in milliseconds (> 0): a collective that has not finished that long
 * after it started fails with MIGCTL_ERR_TIMEOUT on every rank. Each rank sets
 * its own; PyTorch's init_process_group(timeout=...) sets it through
 * migctl_torch. */
int migctl_set_timeout(int64_t timeout_ms);

/* Groups of some of the ranks (PyTorch's dist.new_group: FSDP's hybrid
 * sharding, tensor- or pipeline-parallel groups), within one node.
 *
 * migctl_new_group forms one of the n ranks listed (their ranks in group 0;
 * ranks[i] becomes rank i of the new group) and returns its id (> 0), or a
 * negative MIGCTL_ERR_* code. Every listed rank calls it with the same ranks
 * and name (1 to 64 of [A-Za-z0-9._-], never used before in the job, not
 * beginning with "p2p-": the transfers' links), the
 * other ranks do not; it returns once all of them have (bounded by group 0's
 * timeout). It fails with MIGCTL_ERR_INVALID for a bad list (the caller not
 * in it, a rank twice or out of range), a name used before or members that
 * listed other ranks; with MIGCTL_ERR_UNSUPPORTED for ranks on several hosts.
 * The group shares the process's device and picks its own transport and
 * algorithm; at most MIGCTL_MAX_GROUPS - 1 are formed per process (ids are
 * not reused).
 *
 * migctl_issue_on, migctl_run_on and migctl_set_timeout_on are migctl_issue,
 * migctl_run and migctl_set_timeout on group (0 or an id); handles are
 * waited for with migctl_wait as any other. A process's collectives run one
 * at a time in the order they were issued, whatever their group: the ranks
 * must issue them so that no two wait on each other across groups (the
 * members of each group in the same order; as with NCCL, a program that runs
 * the same sequence of calls on every rank does).
 *
 * migctl_free_group(id) releases a group once the collective it runs (if
 * any) has finished: wait for its handles first, since those not yet started
 * then fail with MIGCTL_ERR_CLOSED, as does issuing on it afterwards. migctl_finalize
 * frees every group. migctl_group_rank and migctl_group_size are the rank and
 * size in group (-1 for an unknown one). */
#define MIGCTL_MAX_GROUPS 1024
int migctl_new_group(const int *ranks, int n, const char *name);
int migctl_free_group(int group);
int migctl_group_rank(int group);
int migctl_group_size(int group);
int64_t migctl_issue_on(int group, int kind, const void *send, void *recv, size_t count, int dtype, int op,
                        int root, int device, uintptr_t stream);
int migctl_run_on(int group, int kind, const void *send, void *recv, size_t count, int dtype, int op, int root,
                  int device, uintptr_t stream);
int migctl_set_timeout_on(int group, int64_t timeout_ms);

/* Fails the group's collectives on every rank with reason (a rank that cannot
 * go on releases the others at once instead of at their deadline). */
int migctl_abort(const char *reason);

/* Leaves the group (after the collectives in flight). Idempotent. */
int migctl_finalize(void);

/* The last error's text on the calling thread ("" if none); valid until the
 * thread's next call. */
const char *migctl_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* MIGCTL_H */
