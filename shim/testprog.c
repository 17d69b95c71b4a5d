/*
 * testprog.c — a CUDA driver-API program for the shim's tests. It reaches the
 * driver the way real programs do: by direct symbols (the _linked build), by
 * dlopen("libcuda.so.1") + dlsym, or by cuGetProcAddress (v1, v2, per-thread
 * stream). Run it with LD_PRELOAD=libmigswap.so and the fake libcuda.so.1 on
 * LD_LIBRARY_PATH. It prints "READY ..." when its memory is set up and
 * "RESULT key=value ..." lines the Go tests parse.
 *
 *   testprog RESOLVE basic            allocate, copy, launch, graph; report bookkeeping
 *   testprog RESOLVE loop NBUF BYTES [fork|threads]
 *                                     keep launching add_one until stdin says "stop"
 *                                     (or closes), then check every float; "threads":
 *                                     one launching thread per buffer
 *   testprog RESOLVE refuse ipc|async|managed   hold memory the shim cannot move
 *   testprog RESOLVE oom BYTES        one allocation; report its result code
 *   testprog RESOLVE hold BYTES       hold one allocation until stdin says "stop"
 *   testprog RESOLVE bench N [low|high]
 *                                     time N launches of a no-op kernel ("low"/"high":
 *                                     first wait until the daemon's gate settings make
 *                                     this process held / signalling)
 *   testprog RESOLVE prio             priority gating: commands on stdin, one at a time:
 *                                     "launch USEC N" queues N timed kernels (sleep_us)
 *                                     on its stream and prints LAUNCHED (how long the
 *                                     calls took, the most kernels in flight meanwhile);
 *                                     "sync" waits for them; "capture N [direct] [mixed]
 *                                     [slow]": N stream captures (global mode) while its
 *                                     stream is busy (mixed: the capturing stream, captured
 *                                     once before; slow: the fake answers the gate watcher's
 *                                     capture checks late), begun
 *                                     and ended through the shim or past it, prints CAPTURED
 *                                     with how many the driver invalidated and how many
 *                                     events were recorded on streams captures used; "stats" (answered
 *                                     at once, even while a launch is held); "stop"
 * RESOLVE: direct | dlsym | gpa | gpa1 | ptsz
 */
#define _GNU_SOURCE
#include "cudadrv.h"
#include "fakecuda.h"
#include "migswap.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* FN(field, export symbol, cuGetProcAddress name, version) */
#define FNS(FN)                                                                                  \
	FN(Init, cuInit, "cuInit", 2000)                                                         \
	FN(DeviceGet, cuDeviceGet, "cuDeviceGet", 2000)                                          \
	FN(PrimaryCtxRetain, cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 7000)         \
	FN(CtxSetCurrent, cuCtxSetCurrent, "cuCtxSetCurrent", 4000)                              \
	FN(MemAlloc, cuMemAlloc_v2, "cuMemAlloc", 3020)                                          \
	FN(MemAllocPitch, cuMemAllocPitch_v2, "cuMemAllocPitch", 3020)                           \
	FN(MemFree, cuMemFree_v2, "cuMemFree", 3020)                                             \
	FN(MemcpyHtoD, cuMemcpyHtoD_v2, "cuMemcpyHtoD", 3020)                                    \
	FN(MemcpyDtoH, cuMemcpyDtoH_v2, "cuMemcpyDtoH", 3020)                                    \
	FN(MemsetD32, cuMemsetD32_v2, "cuMemsetD32", 3020)                                       \
	FN(ModuleLoadData, cuModuleLoadData, "cuModuleLoadData", 2000)                           \
	FN(ModuleGetFunction, cuModuleGetFunction, "cuModuleGetFunction", 2000)                  \
	FN(LaunchKernel, cuLaunchKernel, "cuLaunchKernel", 4000)                                 \
	FN(LaunchKernelEx, cuLaunchKernelEx, "cuLaunchKernelEx", 11080)                          \
	FN(GraphCreate, cuGraphCreate, "cuGraphCreate", 10000)                                   \
	FN(GraphAddKernelNode, cuGraphAddKernelNode, "cuGraphAddKernelNode", 10000)              \
	FN(GraphInstantiate, cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags", 11040)  \
	FN(GraphLaunch, cuGraphLaunch, "cuGraphLaunch", 10000)                                   \
	FN(CtxSynchronize, cuCtxSynchronize, "cuCtxSynchronize", 2000)                           \
	FN(IpcGetMemHandle, cuIpcGetMemHandle, "cuIpcGetMemHandle", 4010)                        \
	FN(MemAllocAsync, cuMemAllocAsync, "cuMemAllocAsync", 11020)                             \
	FN(MemFreeAsync, cuMemFreeAsync, "cuMemFreeAsync", 11020)                                \
	FN(MemAllocManaged, cuMemAllocManaged, "cuMemAllocManaged", 6000)                         \
	FN(StreamCreate, cuStreamCreate, "cuStreamCreate", 2000)                                 \
	FN(StreamSynchronize, cuStreamSynchronize, "cuStreamSynchronize", 2000)                  \
	FN(StreamBeginCapture, cuStreamBeginCapture_v2, "cuStreamBeginCapture", 10010)           \
	FN(StreamEndCapture, cuStreamEndCapture, "cuStreamEndCapture", 10000)

static struct {
	CUresult (*Init)(unsigned);
	CUresult (*DeviceGet)(CUdevice *, int);
	CUresult (*PrimaryCtxRetain)(CUcontext *, CUdevice);
	CUresult (*CtxSetCurrent)(CUcontext);
	CUresult (*MemAlloc)(CUdeviceptr *, size_t);
	CUresult (*MemAllocPitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
	CUresult (*MemFree)(CUdeviceptr);
	CUresult (*MemcpyHtoD)(CUdeviceptr, const void *, size_t);
	CUresult (*MemcpyDtoH)(void *, CUdeviceptr, size_t);
	CUresult (*MemsetD32)(CUdeviceptr, unsigned, size_t);
	CUresult (*ModuleLoadData)(CUmodule *, const void *);
	CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
	CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
				 CUstream, void **, void **);
	CUresult (*LaunchKernelEx)(const CUlaunchConfig *, CUfunction, void **, void **);
	CUresult (*GraphCreate)(CUgraph *, unsigned);
	CUresult (*GraphAddKernelNode)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, const CUDA_KERNEL_NODE_PARAMS *);
	CUresult (*GraphInstantiate)(CUgraphExec *, CUgraph, unsigned long long);
	CUresult (*GraphLaunch)(CUgraphExec, CUstream);
	CUresult (*CtxSynchronize)(void);
	CUresult (*IpcGetMemHandle)(CUipcMemHandle *, CUdeviceptr);
	CUresult (*MemAllocAsync)(CUdeviceptr *, size_t, CUstream);
	CUresult (*MemFreeAsync)(CUdeviceptr, CUstream);
	CUresult (*MemAllocManaged)(CUdeviceptr *, size_t, unsigned);
	CUresult (*StreamCreate)(CUstream *, unsigned);
	CUresult (*StreamSynchronize)(CUstream);
	CUresult (*StreamBeginCapture)(CUstream, int);
	CUresult (*StreamEndCapture)(CUstream, CUgraph *);
} cu;

#ifdef LINKED
/* declared here, resolved by the dynamic linker: the direct-symbol path */
#define FN(field, sym, name, ver) extern int sym(void);
FNS(FN)
#undef FN
#endif

static void *lib;

static void die(const char *what, CUresult r)
{
	printf("RESULT ok=0 error=\"%s\" code=%d\n", what, r);
	fflush(stdout);
	exit(2);
}

#define CHECK(call)                                  \
	do {                                         \
		CUresult r_ = (call);                \
		if (r_ != CUDA_SUCCESS)              \
			die(#call, r_);              \
	} while (0)

static void resolve(const char *how)
{
	lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
	if (!lib) {
		printf("RESULT ok=0 error=\"dlopen: %s\"\n", dlerror());
		exit(2);
	}
	if (strcmp(how, "direct") == 0) {
#ifdef LINKED
#define FN(field, sym, name, ver) cu.field = (void *)sym;
		FNS(FN)
#undef FN
#else
		fprintf(stderr, "direct needs the _linked build\n");
		exit(2);
#endif
	} else if (strcmp(how, "dlsym") == 0) {
#define FN(field, sym, name, ver) cu.field = dlsym(lib, #sym);
		FNS(FN)
#undef FN
	} else {
		int v1 = strcmp(how, "gpa1") == 0;
		cuuint64_t flags = strcmp(how, "ptsz") == 0 ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0;
		CUresult (*gpa2)(const char *, void **, int, cuuint64_t, int *) = dlsym(lib, "cuGetProcAddress_v2");
		CUresult (*gpa1)(const char *, void **, int, cuuint64_t) = dlsym(lib, "cuGetProcAddress");
		if (!gpa1 || !gpa2)
			die("no cuGetProcAddress", 0);
		/* fetch cuGetProcAddress through itself, as cudart does */
		void *self = NULL;
		if (v1) {
			CHECK(gpa1("cuGetProcAddress", &self, 11030, 0));
			gpa1 = self;
		} else {
			CHECK(gpa2("cuGetProcAddress", &self, 12000, 0, NULL));
			gpa2 = self;
		}
#define FN(field, sym, name, ver)                                                        \
	if (v1)                                                                          \
		CHECK(gpa1(name, (void **)&cu.field, 12080, flags));                     \
	else                                                                             \
		CHECK(gpa2(name, (void **)&cu.field, 12080, flags, NULL));
		FNS(FN)
#undef FN
	}
#define FN(field, sym, name, ver) \
	if (!cu.field)            \
		die("unresolved " #sym, 0);
	FNS(FN)
#undef FN
}

static CUcontext ctx;
static CUfunction k_add_one, k_fill, k_noop, k_sleep_us;

static void open_ctx(void)
{
	CUdevice dev;
	CHECK(cu.Init(0));
	CHECK(cu.DeviceGet(&dev, 0));
	CHECK(cu.PrimaryCtxRetain(&ctx, dev));
	CHECK(cu.CtxSetCurrent(ctx));
}

/* setup opens the primary context and loads the kernels: the fake's by name,
 * or on a real GPU the PTX in $MIGSWAP_TEST_PTX (bench needs only "noop"). */
static void setup(void)
{
	CUmodule mod;
	open_ctx();
	const char *ptx = getenv("MIGSWAP_TEST_PTX");
	if (ptx && *ptx) {
		FILE *f = fopen(ptx, "rb");
		if (!f)
			die("opening $MIGSWAP_TEST_PTX", 0);
		static char img[1 << 16];
		size_t n = fread(img, 1, sizeof img - 1, f);
		fclose(f);
		img[n] = 0;
		CHECK(cu.ModuleLoadData(&mod, img));
		CHECK(cu.ModuleGetFunction(&k_noop, mod, "noop"));
		cu.ModuleGetFunction(&k_add_one, mod, "add_one");
		cu.ModuleGetFunction(&k_sleep_us, mod, "sleep_us"); /* prio needs it: spins usec on the GPU */
		return;
	}
	CHECK(cu.ModuleLoadData(&mod, "fake-module"));
	CHECK(cu.ModuleGetFunction(&k_add_one, mod, "add_one"));
	CHECK(cu.ModuleGetFunction(&k_fill, mod, "fill"));
	CHECK(cu.ModuleGetFunction(&k_noop, mod, "noop"));
	CHECK(cu.ModuleGetFunction(&k_sleep_us, mod, "sleep_us"));
}

static CUresult add_one(CUdeviceptr p, unsigned long long n)
{
	void *args[] = { &p, &n };
	return cu.LaunchKernel(k_add_one, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL);
}

static CUgraphExec graph_add_one(CUdeviceptr *bufs, int nbuf, unsigned long long n)
{
	CUgraph g;
	CUgraphExec e;
	CHECK(cu.GraphCreate(&g, 0));
	for (int i = 0; i < nbuf; i++) {
		void *args[] = { &bufs[i], &n };
		CUDA_KERNEL_NODE_PARAMS np = { k_add_one, 1, 1, 1, 1, 1, 1, 0, args, NULL };
		CHECK(cu.GraphAddKernelNode(NULL, g, NULL, 0, &np));
	}
	CHECK(cu.GraphInstantiate(&e, g, 0));
	return e;
}

static void report_stats(const char *prefix)
{
	struct migswap_stats s;
	int (*ms)(struct migswap_stats *) = (int (*)(struct migswap_stats *))dlsym(RTLD_DEFAULT, "migswap_get_stats");
	int (*fs)(struct fakecuda_stats *) = (int (*)(struct fakecuda_stats *))dlsym(lib, "fakecuda_get_stats");
	memset(&s, 0, sizeof s);
	if (ms)
		ms(&s);
	struct fakecuda_stats f;
	memset(&f, 0, sizeof f);
	if (fs)
		fs(&f);
	printf("%s shim=%d mode=%u state=%u connected=%u allocations=%llu bytes=%llu gated=%llu swaps_out=%llu "
	       "swaps_in=%llu arena=%llu in_use=%llu vmm_in_use=%llu vmm_creates=%llu plain_allocs=%llu launches=%llu "
	       "prio_holds=%llu prio_held_ns=%llu prio_busy_periods=%llu prio_busy_ns=%llu prio_mask=%llu prio_policy=%u "
	       "prio_budget=%u prio_slot=%d prio_signal=%u prio_depth=%u\n",
	       prefix, ms != NULL, s.mode, s.state, s.connected, (unsigned long long)s.allocations,
	       (unsigned long long)s.bytes, (unsigned long long)s.gated_calls, (unsigned long long)s.swaps_out,
	       (unsigned long long)s.swaps_in, (unsigned long long)s.arena_bytes, (unsigned long long)f.in_use, (unsigned long long)f.vmm_in_use,
	       (unsigned long long)f.vmm_creates, (unsigned long long)f.plain_allocs, (unsigned long long)f.launches,
	       (unsigned long long)s.prio_holds, (unsigned long long)s.prio_held_ns, (unsigned long long)s.prio_busy_periods,
	       (unsigned long long)s.prio_busy_ns, (unsigned long long)s.prio_mask, s.prio_policy, s.prio_budget, s.prio_slot,
	       s.prio_signal, s.prio_depth);
	fflush(stdout);
}

static int basic(void)
{
	setup();
	size_t na = (3u << 20) / 4 + 25; /* not a multiple of any granularity */
	CUdeviceptr a, b, c;
	size_t pitch;
	CHECK(cu.MemAlloc(&a, na * 4));
	CHECK(cu.MemAllocPitch(&b, &pitch, 1000 * 4, 10, 4));
	CHECK(cu.MemAlloc(&c, 1000));
	float *h = malloc(na * 4);
	for (size_t i = 0; i < na; i++)
		h[i] = (float)i;
	CHECK(cu.MemcpyHtoD(a, h, na * 4));
	for (int i = 0; i < 5; i++)
		CHECK(add_one(a, na));
	unsigned long long n = na;
	void *args[] = { &a, &n };
	CUlaunchConfig cfg = { 1, 1, 1, 1, 1, 1, 0, NULL, NULL, 0 };
	CHECK(cu.LaunchKernelEx(&cfg, k_add_one, args, NULL));
	CUgraphExec e = graph_add_one(&a, 1, na);
	for (int i = 0; i < 3; i++)
		CHECK(cu.GraphLaunch(e, NULL));
	CHECK(cu.MemsetD32(b, 0x3f800000u, pitch * 10 / 4));
	CHECK(cu.CtxSynchronize());
	CHECK(cu.MemcpyDtoH(h, a, na * 4));
	size_t wrong = 0;
	for (size_t i = 0; i < na; i++)
		wrong += h[i] != (float)i + 9.0f;
	float *hb = malloc(pitch * 10);
	CHECK(cu.MemcpyDtoH(hb, b, pitch * 10));
	for (size_t i = 0; i < pitch * 10 / 4; i++)
		wrong += hb[i] != 1.0f;
	printf("RESULT ok=%d wrong=%zu pitch=%zu a=%#llx b=%#llx c=%#llx\n", wrong == 0, wrong, pitch, a, b, c);
	report_stats("STATS");
	CHECK(cu.MemFree(a));
	CHECK(cu.MemFree(b));
	CHECK(cu.MemFree(c));
	report_stats("FREED");
	return wrong == 0 ? 0 : 3;
}

static volatile int stop;
static void report_stats(const char *prefix);

/* stdin: "stop" ends the run; "stats" prints a STATS_NOW line (from this
 * thread, which makes no CUDA call, so it answers while swapped out too). */
static void *stdin_reader(void *arg)
{
	(void)arg;
	char line[64];
	while (fgets(line, sizeof line, stdin)) {
		if (strncmp(line, "stop", 4) == 0)
			break;
		if (strncmp(line, "stats", 5) == 0)
			report_stats("STATS_NOW");
	}
	stop = 1;
	return NULL;
}

static float pattern(int b, size_t i) { return (float)(b * 1000 + (int)(i % 997)); }

static int child_main(void)
{
	/* a forked child: the parent's shim state must not be ours */
	report_stats("CHILD_AFTER_FORK");
	CUdeviceptr p;
	open_ctx();
	size_t n = 1 << 18;
	CHECK(cu.MemAlloc(&p, n * 4));
	float *h = calloc(n, 4);
	CHECK(cu.MemcpyHtoD(p, h, n * 4));
	for (int i = 0; i < 3; i++)
		CHECK(add_one(p, n));
	CHECK(cu.MemcpyDtoH(h, p, n * 4));
	size_t wrong = 0;
	for (size_t i = 0; i < n; i++)
		wrong += h[i] != 3.0f;
	report_stats("CHILD_STATS");
	printf("CHILD_RESULT ok=%d wrong=%zu pid=%d\n", wrong == 0, wrong, (int)getpid());
	fflush(stdout);
	usleep(300000); /* let the daemon see us registered */
	return wrong == 0 ? 0 : 3;
}

struct worker {
	CUdeviceptr buf;
	size_t n;
	int b;
	long iters, bad_probe;
	CUresult err;
};

/* worker launches add_one on its own buffer until stop, probing element 0. */
static void *worker_main(void *arg)
{
	struct worker *w = arg;
	CUresult r = cu.CtxSetCurrent(ctx);
	while (!stop && r == CUDA_SUCCESS) {
		r = add_one(w->buf, w->n);
		if (r)
			break;
		w->iters++;
		if (w->iters % 8 == 0) {
			float v;
			r = cu.MemcpyDtoH(&v, w->buf, 4);
			w->bad_probe += v != pattern(w->b, 0) + (float)w->iters;
		}
		usleep(100);
	}
	w->err = r;
	return NULL;
}

/* loop_threads: one thread per buffer, all launching while the daemon swaps. */
static int loop_threads(int nbuf, size_t bytes)
{
	setup();
	size_t n = bytes / 4;
	float *h = malloc(n * 4);
	struct worker *ws = calloc((size_t)nbuf, sizeof *ws);
	pthread_t *th = calloc((size_t)nbuf, sizeof *th);
	for (int b = 0; b < nbuf; b++) {
		ws[b].n = n;
		ws[b].b = b;
		CHECK(cu.MemAlloc(&ws[b].buf, n * 4));
		for (size_t i = 0; i < n; i++)
			h[i] = pattern(b, i);
		CHECK(cu.MemcpyHtoD(ws[b].buf, h, n * 4));
	}
	printf("READY pid=%d\n", (int)getpid());
	report_stats("READY_STATS");
	pthread_t rd;
	pthread_create(&rd, NULL, stdin_reader, NULL);
	for (int b = 0; b < nbuf; b++)
		pthread_create(&th[b], NULL, worker_main, &ws[b]);
	long iters = 0, bad_probe = 0;
	size_t wrong = 0;
	for (int b = 0; b < nbuf; b++) {
		pthread_join(th[b], NULL);
		CHECK(ws[b].err);
		CHECK(cu.MemcpyDtoH(h, ws[b].buf, n * 4));
		for (size_t i = 0; i < n; i++)
			wrong += h[i] != pattern(b, i) + (float)ws[b].iters;
		iters += ws[b].iters;
		bad_probe += ws[b].bad_probe;
	}
	report_stats("STATS");
	printf("RESULT ok=%d iters=%ld wrong=%zu bad_probe=%ld threads=%d\n", wrong == 0 && bad_probe == 0, iters, wrong,
	       bad_probe, nbuf);
	fflush(stdout);
	return wrong == 0 && bad_probe == 0 ? 0 : 3;
}

static int loop(int nbuf, size_t bytes, int do_fork)
{
	setup();
	size_t n = bytes / 4;
	CUdeviceptr *bufs = calloc((size_t)nbuf, sizeof *bufs);
	float *h = malloc(n * 4);
	for (int b = 0; b < nbuf; b++) {
		CHECK(cu.MemAlloc(&bufs[b], n * 4));
		for (size_t i = 0; i < n; i++)
			h[i] = pattern(b, i);
		CHECK(cu.MemcpyHtoD(bufs[b], h, n * 4));
	}
	CUgraphExec g = graph_add_one(bufs, nbuf, n);
	pid_t child = -1;
	if (do_fork) {
		fflush(stdout);
		child = fork();
		if (child == 0)
			_exit(child_main());
	}
	printf("READY pid=%d\n", (int)getpid());
	report_stats("READY_STATS");
	pthread_t rd;
	pthread_create(&rd, NULL, stdin_reader, NULL);
	long iters = 0, bad_probe = 0;
	while (!stop) {
		if (iters % 2)
			CHECK(cu.GraphLaunch(g, NULL));
		else
			for (int b = 0; b < nbuf; b++)
				CHECK(add_one(bufs[b], n));
		iters++;
		if (iters % 16 == 0) {
			float v;
			CHECK(cu.MemcpyDtoH(&v, bufs[0], 4));
			bad_probe += v != pattern(0, 0) + (float)iters;
		}
		usleep(200);
	}
	CHECK(cu.CtxSynchronize());
	size_t wrong = 0;
	for (int b = 0; b < nbuf; b++) {
		CHECK(cu.MemcpyDtoH(h, bufs[b], n * 4));
		for (size_t i = 0; i < n; i++)
			wrong += h[i] != pattern(b, i) + (float)iters;
	}
	int child_status = -1;
	if (child > 0) {
		int st;
		waitpid(child, &st, 0);
		child_status = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
	}
	report_stats("STATS");
	printf("RESULT ok=%d iters=%ld wrong=%zu bad_probe=%ld child_status=%d\n", wrong == 0 && bad_probe == 0, iters,
	       wrong, bad_probe, child_status);
	fflush(stdout);
	return wrong == 0 && bad_probe == 0 ? 0 : 3;
}

static int refuse(const char *kind)
{
	setup();
	CUdeviceptr p, q = 0;
	CHECK(cu.MemAlloc(&p, 1 << 20));
	if (strcmp(kind, "ipc") == 0) {
		CUipcMemHandle hd;
		CHECK(cu.IpcGetMemHandle(&hd, p));
	} else if (strcmp(kind, "async") == 0 || strcmp(kind, "async_free") == 0) {
		CHECK(cu.MemAllocAsync(&q, 1 << 20, NULL));
	} else if (strcmp(kind, "managed") == 0) {
		CHECK(cu.MemAllocManaged(&q, 1 << 20, 1));
	}
	const char *(*why)(void) = (const char *(*)(void))dlsym(RTLD_DEFAULT, "migswap_unswappable_reason");
	printf("READY pid=%d reason=\"%s\"\n", (int)getpid(), why && why() ? why() : "");
	fflush(stdout);
	pthread_t rd;
	pthread_create(&rd, NULL, stdin_reader, NULL);
	while (!stop) {
		CHECK(add_one(p, 1 << 18));
		usleep(1000);
	}
	if (strcmp(kind, "async") == 0 || strcmp(kind, "async_free") == 0) {
		/* either free makes the process swappable again */
		CHECK(kind[5] ? cu.MemFree(q) : cu.MemFreeAsync(q, NULL));
		printf("FREED_ASYNC reason=\"%s\"\n", why && why() ? why() : "");
	}
	report_stats("STATS");
	printf("RESULT ok=1\n");
	fflush(stdout);
	return 0;
}

static int hold(size_t bytes)
{
	setup();
	CUdeviceptr p = 0;
	CHECK(cu.MemAlloc(&p, bytes));
	printf("READY pid=%d\n", (int)getpid());
	fflush(stdout);
	pthread_t rd;
	pthread_create(&rd, NULL, stdin_reader, NULL);
	while (!stop)
		usleep(1000);
	CHECK(cu.MemFree(p));
	printf("RESULT ok=1\n");
	return 0;
}

static int oom(size_t bytes)
{
	setup();
	CUdeviceptr p = 0;
	CUresult r = cu.MemAlloc(&p, bytes);
	size_t wrong = 0;
	if (r == CUDA_SUCCESS) {
		CHECK(cu.MemsetD32(p, 0, bytes / 4));
		CHECK(add_one(p, bytes / 4));
		float v;
		CHECK(cu.MemcpyDtoH(&v, p + bytes - 4, 4));
		wrong = v != 1.0f;
	}
	report_stats("STATS");
	if (r == CUDA_SUCCESS)
		CHECK(cu.MemFree(p)); /* the fake's shared counter does not see process exit */
	printf("RESULT ok=%d code=%d wrong=%zu\n", r == CUDA_SUCCESS && wrong == 0, r, wrong);
	fflush(stdout);
	return 0;
}

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* wait_gate waits (up to 10 s) until the daemon's gate settings have made
 * this process held (low) or signalling (high). */
static void wait_gate(const char *role)
{
	int (*ms)(struct migswap_stats *) = (int (*)(struct migswap_stats *))dlsym(RTLD_DEFAULT, "migswap_get_stats");
	for (int i = 0; ms && i < 10000; i++) {
		struct migswap_stats s;
		memset(&s, 0, sizeof s);
		ms(&s);
		if ((strcmp(role, "low") == 0 && s.prio_mask) || (strcmp(role, "high") == 0 && s.prio_signal))
			return;
		usleep(1000);
	}
	die("the daemon's gate settings did not arrive", 0);
}

static int bench(long n, const char *role)
{
	setup();
	if (role)
		wait_gate(role);
	for (long i = 0; i < 1000; i++)
		CHECK(cu.LaunchKernel(k_noop, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
	double best = 1e9;
	for (int rep = 0; rep < 5; rep++) {
		double t0 = now();
		for (long i = 0; i < n; i++)
			cu.LaunchKernel(k_noop, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
		double ns = (now() - t0) * 1e9 / (double)n;
		if (ns < best)
			best = ns;
	}
	/* bursts of 32 launches, then an untimed synchronize: the launch call's own
	 * cost while the GPU's queue is not the bottleneck */
	double best_burst = 1e9;
	for (int rep = 0; rep < 3; rep++) {
		double tot = 0;
		for (long i = 0; i < n; i += 32) {
			double t0 = now();
			for (int j = 0; j < 32; j++)
				cu.LaunchKernel(k_noop, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
			tot += now() - t0;
			CHECK(cu.CtxSynchronize());
		}
		double ns = tot * 1e9 / (double)n;
		if (ns < best_burst)
			best_burst = ns;
	}
	/* the same launch through the shim and straight into the fake, in
	 * alternating rounds of one process: the difference is the shim's cost
	 * per launch, robust to a machine whose load changes between processes */
	double ab_shim = 1e9, ab_direct = 1e9;
	void *(*direct)(const char *) = (void *(*)(const char *))dlsym(lib, "fakecuda_direct");
	CUresult (*raw)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **,
			void **) = direct ? direct("cuLaunchKernel") : NULL;
	if (raw) {
		long m = n / 20 > 1000 ? n / 20 : 1000;
		for (int rep = 0; rep < 40; rep++) {
			double t0 = now();
			for (long i = 0; i < m; i++)
				cu.LaunchKernel(k_noop, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
			double t1 = now();
			for (long i = 0; i < m; i++)
				raw(k_noop, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
			double t2 = now();
			if ((t1 - t0) * 1e9 / (double)m < ab_shim)
				ab_shim = (t1 - t0) * 1e9 / (double)m;
			if ((t2 - t1) * 1e9 / (double)m < ab_direct)
				ab_direct = (t2 - t1) * 1e9 / (double)m;
		}
	}
	report_stats("STATS");
	printf("RESULT ok=1 launches=%ld ns_per_launch=%.2f ns_per_launch_burst=%.2f ns_ab_shim=%.2f ns_ab_direct=%.2f "
	       "ns_ab_overhead=%.2f\n",
	       n, best, best_burst, raw ? ab_shim : 0, raw ? ab_direct : 0, raw ? ab_shim - ab_direct : 0);
	return 0;
}

/* prio: see the header. The reader thread answers "stats" itself and hands
 * every other command to the main thread through a pipe, so a held launch
 * never delays a stats reply. */
static int cmd_pipe[2];

static void *prio_reader(void *arg)
{
	(void)arg;
	char line[128];
	while (fgets(line, sizeof line, stdin)) {
		if (strncmp(line, "stats", 5) == 0) {
			report_stats("STATS_NOW");
			continue;
		}
		if (write(cmd_pipe[1], line, strlen(line)) < 0)
			break;
		if (strncmp(line, "stop", 4) == 0)
			break;
	}
	close(cmd_pipe[1]);
	return NULL;
}

static int prio(void)
{
	setup();
	if (!k_sleep_us)
		die("no sleep_us kernel in the module", 0);
	CUstream st;
	CHECK(cu.StreamCreate(&st, 0));
	void (*inflight)(uint64_t *, uint64_t *, int) = (void (*)(uint64_t *, uint64_t *, int))dlsym(lib, "fakecuda_inflight");
	if (pipe(cmd_pipe) != 0)
		die("pipe", 0);
	const char *mp = getenv("CUDA_MPS_PIPE_DIRECTORY"), *mc = getenv("CUDA_MPS_CLIENT_PRIORITY");
	const char *ms = getenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE");
	printf("READY pid=%d mps_pipe=%s mps_prio=%s mps_sm=%s\n", (int)getpid(), mp && *mp ? mp : "-", mc && *mc ? mc : "-",
	       ms && *ms ? ms : "-");
	pthread_t rd;
	pthread_create(&rd, NULL, prio_reader, NULL);
	FILE *in = fdopen(cmd_pipe[0], "r");
	char line[128];
	while (fgets(line, sizeof line, in)) {
		unsigned long long usec = 0;
		long n = 1;
		if (sscanf(line, "launch %llu %ld", &usec, &n) >= 1) {
			uint64_t now_n = 0, max_n = 0;
			if (inflight)
				inflight(NULL, NULL, 1);
			double t0 = now();
			for (long i = 0; i < n; i++) {
				void *args[] = { &usec };
				CHECK(cu.LaunchKernel(k_sleep_us, 1, 1, 1, 1, 1, 1, 0, st, args, NULL));
			}
			double el = now() - t0;
			if (inflight)
				inflight(&now_n, &max_n, 0);
			printf("LAUNCHED n=%ld elapsed_us=%.0f maxinflight=%llu inflight=%llu\n", n, el * 1e6,
			       (unsigned long long)max_n, (unsigned long long)now_n);
		} else if (sscanf(line, "capture %ld", &n) == 1) {
			/* "capture N direct": begin and end through the fake's own
			 * entry points, past the shim, as a driver path it does not
			 * wrap would */
			CUresult (*begin)(CUstream, int) = cu.StreamBeginCapture;
			CUresult (*end)(CUstream, CUgraph *) = cu.StreamEndCapture;
			if (strstr(line, "direct")) {
				void *(*direct)(const char *) = (void *(*)(const char *))dlsym(lib, "fakecuda_direct");
				if (!direct || !(begin = direct("cuStreamBeginCapture")) || !(end = direct("cuStreamEndCapture")))
					die("fakecuda_direct", 0);
			}
			/* n rounds of: a timed kernel on st (keeps this process busy, so
			 * a signalling shim's watcher polls), then a global-mode capture
			 * of 3 kernels on a second stream, as torch.cuda.graph does */
			/* "capture N direct mixed": the timed kernel goes on the capturing
			 * stream itself, at a varying distance before the capture begins
			 * (a stream with real work and captures) */
			int mixed = strstr(line, "mixed") != NULL;
			CUstream cs;
			CHECK(cu.StreamCreate(&cs, 0));
			if (mixed) {
				/* a stream captured before: one long capture first, not counted
				 * (the watcher sees it, as it would a program's earlier capture) */
				unsigned long long u = 50;
				void *args[] = { &u };
				CHECK(begin(cs, 0));
				for (int j = 0; j < 10; j++) {
					CHECK(cu.LaunchKernel(k_sleep_us, 1, 1, 1, 1, 1, 1, 0, cs, args, NULL));
					usleep(100);
				}
				CUgraph g = NULL;
				CHECK(end(cs, &g));
				free(g);
			}
			void (*slow)(long) = NULL;
			if (strstr(line, "slow") &&
			    !(slow = (void (*)(long))dlsym(lib, "fakecuda_set_capture_check_delay")))
				die("fakecuda_set_capture_check_delay", 0);
			if (slow)
				slow(30);
			int (*stats)(struct fakecuda_stats *) = (int (*)(struct fakecuda_stats *))dlsym(lib, "fakecuda_get_stats");
			struct fakecuda_stats s0 = { 0 }, s1 = { 0 };
			if (stats)
				stats(&s0);
			long bad = 0, ok = 0;
			CUresult last = CUDA_SUCCESS;
			for (long i = 0; i < n; i++) {
				unsigned long long u = 50;
				void *args[] = { &u };
				CHECK(cu.LaunchKernel(k_sleep_us, 1, 1, 1, 1, 1, 1, 0, mixed ? cs : st, args, NULL));
				if (mixed && i % 4)
					usleep((useconds_t)(i * 7 % 60));
				CUresult r = begin(cs, 0);
				if (r != CUDA_SUCCESS)
					die("cuStreamBeginCapture", r);
				for (int j = 0; j < 3; j++) { /* a capture takes a while (torch: ms) */
					CHECK(cu.LaunchKernel(k_sleep_us, 1, 1, 1, 1, 1, 1, 0, cs, args, NULL));
					usleep(100);
				}
				CUgraph g = NULL;
				r = end(cs, &g);
				if (r == CUDA_SUCCESS)
					ok++, free(g);
				else
					bad++, last = r;
				if (i % 8 == 0)
					usleep(100);
			}
			CHECK(cu.StreamSynchronize(st));
			CHECK(cu.StreamSynchronize(cs));
			if (slow)
				slow(0);
			if (stats)
				stats(&s1);
			printf("CAPTURED ok=%ld invalidated=%ld last=%d records_after_capture=%llu\n", ok, bad, last,
			       (unsigned long long)(s1.records_after_capture - s0.records_after_capture));
		} else if (strncmp(line, "sync", 4) == 0) {
			double t0 = now();
			CHECK(cu.StreamSynchronize(st));
			printf("SYNCED elapsed_us=%.0f\n", (now() - t0) * 1e6);
		} else if (strncmp(line, "stop", 4) == 0) {
			break;
		}
	}
	report_stats("STATS");
	printf("RESULT ok=1\n");
	return 0;
}

/* pitch: cuMemAllocPitch with sizes whose product (or padded width) wraps
   around size_t; prints each call's result and the shim's allocations. */
static int pitch_overflow(void)
{
	setup();
	size_t pitch = 0;
	CUdeviceptr b = 0;
	CUresult wide = cu.MemAllocPitch(&b, &pitch, (size_t)1 << 32, ((size_t)1 << 32) + 1, 4);
	CUresult padded = cu.MemAllocPitch(&b, &pitch, SIZE_MAX - 10, 1, 4);
	printf("PITCH wide=%d padded=%d\n", (int)wide, (int)padded);
	report_stats("STATS");
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc < 3) {
		fprintf(stderr, "usage: %s direct|dlsym|gpa|gpa1|ptsz basic|loop|refuse|oom|bench ...\n", argv[0]);
		return 2;
	}
	resolve(argv[1]);
	const char *m = argv[2];
	if (strcmp(m, "basic") == 0)
		return basic();
	if (strcmp(m, "pitch") == 0)
		return pitch_overflow();
	if (strcmp(m, "loop") == 0 && argc >= 6 && strcmp(argv[5], "threads") == 0)
		return loop_threads(atoi(argv[3]), strtoull(argv[4], NULL, 0));
	if (strcmp(m, "loop") == 0 && argc >= 5)
		return loop(atoi(argv[3]), strtoull(argv[4], NULL, 0), argc > 5 && strcmp(argv[5], "fork") == 0);
	if (strcmp(m, "refuse") == 0 && argc >= 4)
		return refuse(argv[3]);
	if (strcmp(m, "hold") == 0 && argc >= 4)
		return hold(strtoull(argv[3], NULL, 0));
	if (strcmp(m, "oom") == 0 && argc >= 4)
		return oom(strtoull(argv[3], NULL, 0));
	if (strcmp(m, "bench") == 0 && argc >= 4)
		return bench(atol(argv[3]), argc >= 5 ? argv[4] : NULL);
	if (strcmp(m, "prio") == 0)
		return prio();
	fprintf(stderr, "bad arguments\n");
	return 2;
}
