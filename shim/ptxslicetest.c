/*
 * ptxslicetest.c — the test program of PTX slicing (ptxslice.c). It links the
 * rewriter itself (built with -DMS_SLICE_PURE) and reaches the driver with
 * dlopen("libcuda.so.1") + dlsym, so under LD_PRELOAD=libmigswap.so every
 * module load and launch goes through the shim. Output: "KEY k=v ..." lines.
 *
 *   ptxslicetest rewrite IN [OUT]       rewrite IN; print MODULE and ENTRY lines; write OUT
 *   ptxslicetest plan GX GY GZ B        the slices of a grid; PLAN line (coverage checked)
 *   ptxslicetest launch GX GY GZ B params|extra
 *                                       ms_slice_launch against a recording driver; LAUNCH line
 *   ptxslicetest fatbin PTX             PTX found in synthetic fatbins around PTX; FATBIN lines
 *   ptxslicetest fake GX GY GZ [SEED [module|lib|kernelfn]]
 *                                       (fake driver) launch grid_probe over the grid; FAKE line
 *   ptxslicetest gpu-run KERN.ptx REPO.ptx SAMPLE.ptx...
 *                                       (GPU) run test kernels, print CASE lines with a hash
 *                                       of each output, to compare a run with slicing on
 *                                       against one with it off; JIT lines for the samples
 *   ptxslicetest gpu-delay KERN.ptx MODE SECONDS SPIN_US BLOCKS
 *                                       (GPU) preemption delay: a best-effort thread launches
 *                                       long spin kernels, a high-priority one tiny kernels;
 *                                       DELAY line with percentiles (see do_gpu_delay);
 *                                       MODE alone | be | be-prio | beonly; XDELAY_GAP_US=N
 *                                       makes the best-effort thread idle N us between kernels
 */
#define _GNU_SOURCE
#include "cudadrv.h"
#include "fakecuda.h"
#include "ptxslice.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static char *read_file(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	if (!f) {
		fprintf(stderr, "%s: %s\n", path, strerror(errno));
		exit(2);
	}
	size_t cap = 1 << 16, n = 0;
	char *b = malloc(cap + 1);
	for (;;) {
		size_t r = fread(b + n, 1, cap - n, f);
		n += r;
		if (n < cap)
			break;
		cap *= 2;
		b = realloc(b, cap + 1);
	}
	fclose(f);
	b[n] = 0;
	if (len)
		*len = n;
	return b;
}

/* ------------------------------------------------------------- rewrite */

static int do_rewrite(const char *in, const char *out)
{
	size_t n;
	char *p = read_file(in, &n);
	struct ms_ptx_module m;
	int r = ms_ptx_rewrite(p, n, &m);
	printf("MODULE ok=%d nentries=%d nsliceable=%d reason=\"%s\"\n", r == 0, m.nentries, m.nsliceable, m.reason);
	for (int i = 0; i < m.nentries; i++) {
		const struct ms_ptx_entry *e = &m.entries[i];
		printf("ENTRY name=%s sliceable=%d nparams=%d param_bytes=%u slice_offset=%u ctaid=%d nctaid=%d reason=\"%s\" "
		       "idempotent=%d idem_reason=\"%s\"\n",
		       e->name, e->sliceable, e->nparams, e->param_bytes, e->slice_offset, e->ctaid_reads, e->nctaid_reads,
		       e->reason, e->idempotent, e->idem_reason);
	}
	if (out && m.ptx) {
		FILE *f = fopen(out, "wb");
		if (!f || fwrite(m.ptx, 1, m.ptx_len, f) != m.ptx_len) {
			fprintf(stderr, "%s: %s\n", out, strerror(errno));
			return 2;
		}
		fclose(f);
	}
	ms_ptx_module_free(&m);
	free(p);
	return 0;
}

/* ---------------------------------------------------------------- plan */

static int do_plan(unsigned gx, unsigned gy, unsigned gz, unsigned b)
{
	unsigned grid[3] = { gx, gy, gz };
	unsigned long long total = (unsigned long long)gx * gy * gz;
	unsigned char *seen = calloc(total ? total : 1, 1);
	struct ms_slice_plan p;
	struct ms_slice s;
	ms_slice_plan_init(&p, grid, b);
	unsigned long long n = 0, biggest = 0, bad = 0;
	while (ms_slice_plan_next(&p, &s)) {
		n++;
		unsigned long long sz = (unsigned long long)s.dim[0] * s.dim[1] * s.dim[2];
		if (sz > biggest)
			biggest = sz;
		if (sz == 0 || sz > b)
			bad++;
		for (unsigned z = 0; z < s.dim[2]; z++)
			for (unsigned y = 0; y < s.dim[1]; y++)
				for (unsigned x = 0; x < s.dim[0]; x++) {
					unsigned X = x + s.off[0], Y = y + s.off[1], Z = z + s.off[2];
					if (X >= gx || Y >= gy || Z >= gz) {
						bad++;
						continue;
					}
					seen[X + (unsigned long long)gx * (Y + (unsigned long long)gy * Z)]++;
				}
	}
	unsigned long long once = 0;
	for (unsigned long long i = 0; i < total; i++)
		once += seen[i] == 1;
	printf("PLAN count=%llu planned=%llu blocks=%llu covered_once=%llu max_slice=%llu bad=%llu\n", n, p.count, total,
	       once, biggest, bad);
	free(seen);
	return 0;
}

/* --------------------------------------------------------------- launch */

/* ms_slice_launch with a recording "driver": every slice's grid, parameters
 * and parameter buffer are checked against the original launch. */
static struct {
	unsigned grid[3], max;
	int extra;
	unsigned char *seen;
	void *user[3];
	unsigned char ubuf[20];
	unsigned long long launches, bad;
	CUfunction twin;
} rec;

static CUresult rec_launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
			   unsigned sm, CUstream s, void **params, void **extra)
{
	const struct ms_slice_args *a;
	rec.launches++;
	if (f != rec.twin || bx != 32 || by != 2 || bz != 1 || sm != 100 || s != (CUstream)0x5)
		rec.bad++;
	if (rec.extra) {
		if (params || !extra || extra[0] != (void *)1 || extra[2] != (void *)2 || extra[4] != NULL ||
		    *(size_t *)extra[3] != 20 + sizeof(struct ms_slice_args) || memcmp(extra[1], rec.ubuf, 20) != 0)
			rec.bad++;
		a = (const struct ms_slice_args *)((unsigned char *)extra[1] + 20);
	} else {
		if (extra || !params || params[0] != rec.user[0] || params[1] != rec.user[1] || params[2] != rec.user[2])
			rec.bad++;
		a = params[3];
	}
	for (int i = 0; i < 3; i++)
		if (a->grid[i] != rec.grid[i])
			rec.bad++;
	if ((unsigned long long)gx * gy * gz > rec.max)
		rec.bad++;
	for (unsigned z = 0; z < gz; z++)
		for (unsigned y = 0; y < gy; y++)
			for (unsigned x = 0; x < gx; x++) {
				unsigned X = x + a->off[0], Y = y + a->off[1], Z = z + a->off[2];
				if (X >= rec.grid[0] || Y >= rec.grid[1] || Z >= rec.grid[2]) {
					rec.bad++;
					continue;
				}
				rec.seen[X + (unsigned long long)rec.grid[0] * (Y + (unsigned long long)rec.grid[1] * Z)]++;
			}
	return CUDA_SUCCESS;
}

static unsigned long long betweens;
static void rec_between(void *arg, unsigned long long done, unsigned long long total)
{
	(void)arg;
	if (done != betweens + 1 || done >= total)
		rec.bad++;
	betweens++;
}

static int do_launch(unsigned gx, unsigned gy, unsigned gz, unsigned b, int extra)
{
	/* a kernel (u64, u64, u32): 20 bytes of parameters, the slice parameter at 20 */
	struct ms_ptx_entry e = { .name = "k", .sliceable = 1, .nparams = 3, .param_bytes = 20, .slice_offset = 20 };
	unsigned long long total = (unsigned long long)gx * gy * gz;
	memset(&rec, 0, sizeof rec);
	rec.grid[0] = gx, rec.grid[1] = gy, rec.grid[2] = gz;
	rec.max = b;
	rec.extra = extra;
	rec.seen = calloc(total, 1);
	rec.twin = (CUfunction)0x77;
	unsigned long long p0 = 1, p1 = 2;
	unsigned p2 = 3;
	rec.user[0] = &p0, rec.user[1] = &p1, rec.user[2] = &p2;
	for (int i = 0; i < 20; i++)
		rec.ubuf[i] = (unsigned char)(i * 7 + 1);
	size_t usize = 20;
	void *ex[] = { (void *)1, rec.ubuf, (void *)2, &usize, NULL };
	struct ms_slice_policy pol = { b, 0, rec_between, NULL };
	unsigned long long n = 0;
	CUresult r = ms_slice_launch(rec_launch, rec.twin, &e, gx, gy, gz, 32, 2, 1, 100, (CUstream)0x5,
				     extra ? NULL : rec.user, extra ? ex : NULL, &pol, &n);
	unsigned long long once = 0;
	for (unsigned long long i = 0; i < total; i++)
		once += rec.seen[i] == 1;
	printf("LAUNCH result=%d slices=%llu launches=%llu betweens=%llu blocks=%llu covered_once=%llu bad=%llu\n", r, n,
	       rec.launches, betweens, total, once, rec.bad);
	free(rec.seen);
	return 0;
}

/* -------------------------------------------------------------- fatbin */

static size_t fb_entry(unsigned char *o, uint16_t kind, uint32_t arch, uint64_t flags, const void *data, uint32_t len)
{
	uint32_t padded = (len + 7) & ~7u, hs = 64;
	memset(o, 0, 64 + padded);
	memcpy(o, &kind, 2);
	uint16_t v = 0x0101;
	memcpy(o + 2, &v, 2);
	memcpy(o + 4, &hs, 4);
	uint64_t p64 = padded;
	memcpy(o + 8, &p64, 8);
	memcpy(o + 16, &len, 4);
	memcpy(o + 28, &arch, 4);
	memcpy(o + 40, &flags, 8);
	memcpy(o + 64, data, len);
	return 64 + padded;
}

static void fb_check(const char *name, const void *img, int cc, const char *want)
{
	const char *ptx = NULL;
	size_t len = 0;
	char why[256] = "";
	int kind = ms_image_kind(img);
	int r = ms_fatbin_ptx(img, cc, &ptx, &len, why, sizeof why);
	int match = r == 0 && want && len == strlen(want) && memcmp(ptx, want, len) == 0;
	printf("FATBIN case=%s kind=%d found=%d match=%d reason=\"%s\"\n", name, kind, r == 0, match, why);
}

static int do_fatbin(const char *path)
{
	size_t n;
	char *ptx = read_file(path, &n);
	char *ptx90 = malloc(n + 64);
	snprintf(ptx90, n + 64, "%s// for sm_90\n", ptx);
	size_t n90 = strlen(ptx90);
	unsigned char *img = calloc(1, 16 + 4 * (64 + n90 + 8) + 4096);
	static const char elf[] = "\x7f" "ELF fake machine code";
	size_t o = 16;
	o += fb_entry(img + o, 2, 90, 0, elf, sizeof elf);
	o += fb_entry(img + o, 1, 80, 0, ptx, (uint32_t)n + 1);  /* with its NUL, as nvcc stores it */
	o += fb_entry(img + o, 1, 90, 0, ptx90, (uint32_t)n90);  /* without */
	o += fb_entry(img + o, 1, 100, 0x8000, "\x28\xb5\x2f\xfd junk", 10); /* compressed */
	uint32_t magic = 0xBA55ED50u;
	uint16_t ver = 1, hs = 16;
	uint64_t fs = o - 16;
	memcpy(img, &magic, 4);
	memcpy(img + 4, &ver, 2);
	memcpy(img + 6, &hs, 2);
	memcpy(img + 8, &fs, 8);
	fb_check("cc90", img, 90, ptx90);
	fb_check("cc86", img, 86, ptx);
	fb_check("any", img, 0, ptx90);
	fb_check("cc75", img, 75, NULL);
	/* the wrapper cudart registers */
	struct {
		int magic, version;
		const void *data;
		void *name;
	} wrap = { (int)0x466243B1u, 1, img, NULL };
	fb_check("wrapper", &wrap, 90, ptx90);
	/* only compressed PTX */
	unsigned char *img2 = calloc(1, 16 + 64 + 16 + 64 + 32);
	o = 16;
	o += fb_entry(img2 + o, 1, 90, 0x8000, "\x28\xb5\x2f\xfd junk", 10);
	fs = o - 16;
	memcpy(img2, &magic, 4);
	memcpy(img2 + 4, &ver, 2);
	memcpy(img2 + 6, &hs, 2);
	memcpy(img2 + 8, &fs, 8);
	fb_check("compressed", img2, 90, NULL);
	/* only machine code */
	o = 16;
	o += fb_entry(img2 + o, 2, 90, 0, elf, sizeof elf);
	fs = o - 16;
	memcpy(img2 + 8, &fs, 8);
	fb_check("elfonly", img2, 90, NULL);
	printf("IMAGE ptx=%d cubin=%d other=%d\n", ms_image_kind(ptx), ms_image_kind(elf), ms_image_kind("fake-module"));
	return 0;
}

/* --------------------------------------------------------------- driver */

static struct {
	CUresult (*Init)(unsigned);
	CUresult (*DeviceGet)(CUdevice *, int);
	CUresult (*DeviceGetAttribute)(int *, int, CUdevice);
	CUresult (*PrimaryCtxRetain)(CUcontext *, CUdevice);
	CUresult (*CtxSetCurrent)(CUcontext);
	CUresult (*CtxSynchronize)(void);
	CUresult (*MemAlloc)(CUdeviceptr *, size_t);
	CUresult (*MemFree)(CUdeviceptr);
	CUresult (*MemcpyHtoD)(CUdeviceptr, const void *, size_t);
	CUresult (*MemcpyDtoH)(void *, CUdeviceptr, size_t);
	CUresult (*MemsetD8)(CUdeviceptr, unsigned char, size_t);
	CUresult (*ModuleLoadData)(CUmodule *, const void *);
	CUresult (*ModuleUnload)(CUmodule);
	CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
	CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
				 CUstream, void **, void **);
	CUresult (*StreamCreateWithPriority)(CUstream *, unsigned, int);
	CUresult (*StreamSynchronize)(CUstream);
	CUresult (*CtxGetStreamPriorityRange)(int *, int *);
	CUresult (*GetErrorString)(CUresult, const char **);
} cu;

static void *lib;

static void die(const char *what, CUresult r)
{
	const char *s = "";
	if (cu.GetErrorString)
		cu.GetErrorString(r, &s);
	printf("RESULT ok=0 error=\"%s\" code=%d (%s)\n", what, r, s ? s : "");
	fflush(stdout);
	exit(2);
}

#define CHECK(call)                                  \
	do {                                         \
		CUresult r_ = (call);                \
		if (r_ != CUDA_SUCCESS)              \
			die(#call, r_);              \
	} while (0)

static void open_driver(void)
{
	lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
	if (!lib) {
		printf("RESULT ok=0 error=\"dlopen: %s\"\n", dlerror());
		exit(2);
	}
#define R(field, sym) cu.field = dlsym(lib, sym)
	R(Init, "cuInit");
	R(DeviceGet, "cuDeviceGet");
	R(DeviceGetAttribute, "cuDeviceGetAttribute");
	R(PrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
	R(CtxSetCurrent, "cuCtxSetCurrent");
	R(CtxSynchronize, "cuCtxSynchronize");
	R(MemAlloc, "cuMemAlloc_v2");
	R(MemFree, "cuMemFree_v2");
	R(MemcpyHtoD, "cuMemcpyHtoD_v2");
	R(MemcpyDtoH, "cuMemcpyDtoH_v2");
	R(MemsetD8, "cuMemsetD8_v2");
	R(ModuleLoadData, "cuModuleLoadData");
	R(ModuleUnload, "cuModuleUnload");
	R(ModuleGetFunction, "cuModuleGetFunction");
	R(LaunchKernel, "cuLaunchKernel");
	R(StreamCreateWithPriority, "cuStreamCreateWithPriority");
	R(StreamSynchronize, "cuStreamSynchronize");
	R(CtxGetStreamPriorityRange, "cuCtxGetStreamPriorityRange");
	R(GetErrorString, "cuGetErrorString");
#undef R
	CUdevice dev;
	CUcontext ctx;
	CHECK(cu.Init(0));
	CHECK(cu.DeviceGet(&dev, 0));
	CHECK(cu.PrimaryCtxRetain(&ctx, dev));
	CHECK(cu.CtxSetCurrent(ctx));
}

static int (*slice_stats_fn)(struct migswap_slice_stats *);
static int (*slice_info_fn)(CUfunction, char *, size_t);

static void slice_syms(void)
{
	slice_stats_fn = (int (*)(struct migswap_slice_stats *))dlsym(RTLD_DEFAULT, "migswap_slice_get_stats");
	slice_info_fn = (int (*)(CUfunction, char *, size_t))dlsym(RTLD_DEFAULT, "migswap_slice_function_info");
}

static void print_slice_stats(void)
{
	struct migswap_slice_stats s;
	memset(&s, 0, sizeof s);
	if (slice_stats_fn)
		slice_stats_fn(&s);
	printf("SLICESTATS shim=%d modules_rewritten=%llu modules_skipped=%llu entries_sliceable=%llu entries_refused=%llu "
	       "functions_mapped=%llu sliced_launches=%llu slices=%llu fallbacks=%llu\n",
	       slice_stats_fn != NULL, (unsigned long long)s.modules_rewritten, (unsigned long long)s.modules_skipped,
	       (unsigned long long)s.entries_sliceable, (unsigned long long)s.entries_refused,
	       (unsigned long long)s.functions_mapped, (unsigned long long)s.sliced_launches,
	       (unsigned long long)s.slices, (unsigned long long)s.fallbacks);
}

static uint32_t probe_value(uint32_t seed, uint32_t x, uint32_t y, uint32_t z, uint32_t nx, uint32_t ny, uint32_t nz)
{
	return seed ^ (x * 0x9E3779B1u) ^ (y * 0x85EBCA77u) ^ (z * 0xC2B2AE3Du) ^ (nx * 0x27D4EB2Fu) ^
	       (ny * 0x165667B1u) ^ (nz * 0x61C88647u);
}

static uint64_t fnv(const void *p, size_t n)
{
	const unsigned char *b = p;
	uint64_t h = 1469598103934665603ULL;
	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 1099511628211ULL;
	return h;
}

/* A PTX module with grid_probe, as the fake expects it (the fake runs it as C). */
static const char probe_ptx[] = "//\n"
				".version 7.0\n"
				".target sm_80\n"
				".address_size 64\n"
				"\n"
				".visible .entry grid_probe(\n"
				"\t.param .u64 grid_probe_param_0,\n"
				"\t.param .u64 grid_probe_param_1,\n"
				"\t.param .u32 grid_probe_param_2\n"
				")\n"
				"{\n"
				"\t.reg .b32 \t%r<8>;\n"
				"\tmov.u32 \t%r1, %ctaid.x;\n"
				"\tmov.u32 \t%r2, %ctaid.y;\n"
				"\tmov.u32 \t%r3, %ctaid.z;\n"
				"\tmov.u32 \t%r4, %nctaid.x;\n"
				"\tmov.u32 \t%r5, %nctaid.y;\n"
				"\tmov.u32 \t%r6, %nctaid.z;\n"
				"\tret;\n"
				"}\n";

/* fake: grid_probe over the grid through whatever is preloaded; how: module
 * (cuModuleLoadData), lib (cuLibraryLoadData, launch the CUkernel) or
 * kernelfn (launch cuKernelGetFunction's function) */
static int do_fake(unsigned gx, unsigned gy, unsigned gz, uint32_t seed, const char *how)
{
	open_driver();
	slice_syms();
	int (*fake_stats)(struct fakecuda_stats *) = (int (*)(struct fakecuda_stats *))dlsym(lib, "fakecuda_get_stats");
	CUresult (*lib_load)(CUlibrary *, const void *, int *, void **, unsigned, int *, void **, unsigned) =
		(CUresult(*)(CUlibrary *, const void *, int *, void **, unsigned, int *, void **, unsigned))dlsym(lib, "cuLibraryLoadData");
	CUresult (*lib_kernel)(CUkernel *, CUlibrary, const char *) =
		(CUresult(*)(CUkernel *, CUlibrary, const char *))dlsym(lib, "cuLibraryGetKernel");
	CUresult (*kernel_fn)(CUfunction *, CUkernel) = (CUresult(*)(CUfunction *, CUkernel))dlsym(lib, "cuKernelGetFunction");
	CUresult (*lib_unload)(CUlibrary) = (CUresult(*)(CUlibrary))dlsym(lib, "cuLibraryUnload");
	CUmodule mod = NULL;
	CUlibrary l = NULL;
	CUfunction f;
	if (strcmp(how, "module") == 0) {
		CHECK(cu.ModuleLoadData(&mod, probe_ptx));
		CHECK(cu.ModuleGetFunction(&f, mod, "grid_probe"));
	} else {
		if (!lib_load || !lib_kernel || !kernel_fn || !lib_unload)
			die("no cuLibrary* in this driver", 0);
		CUkernel k;
		CHECK(lib_load(&l, probe_ptx, NULL, NULL, 0, NULL, NULL, 0));
		CHECK(lib_kernel(&k, l, "grid_probe"));
		f = (CUfunction)k;
		if (strcmp(how, "kernelfn") == 0)
			CHECK(kernel_fn(&f, k));
	}
	unsigned long long total = (unsigned long long)gx * gy * gz;
	CUdeviceptr count, val;
	CHECK(cu.MemAlloc(&count, total * 4));
	CHECK(cu.MemAlloc(&val, total * 4));
	CHECK(cu.MemsetD8(count, 0, total * 4));
	CHECK(cu.MemsetD8(val, 0, total * 4));
	struct fakecuda_stats st0, st1;
	memset(&st0, 0, sizeof st0);
	memset(&st1, 0, sizeof st1);
	if (fake_stats)
		fake_stats(&st0);
	void *params[] = { &count, &val, &seed };
	CHECK(cu.LaunchKernel(f, gx, gy, gz, 32, 1, 1, 0, NULL, params, NULL));
	CHECK(cu.CtxSynchronize());
	if (fake_stats)
		fake_stats(&st1);
	uint32_t *c = malloc(total * 4), *v = malloc(total * 4);
	CHECK(cu.MemcpyDtoH(c, count, total * 4));
	CHECK(cu.MemcpyDtoH(v, val, total * 4));
	unsigned long long miscount = 0, wrong = 0;
	for (unsigned z = 0; z < gz; z++)
		for (unsigned y = 0; y < gy; y++)
			for (unsigned x = 0; x < gx; x++) {
				unsigned long long i = x + (unsigned long long)gx * (y + (unsigned long long)gy * z);
				miscount += c[i] != 1;
				wrong += v[i] != probe_value(seed, x, y, z, gx, gy, gz);
			}
	char why[200] = "";
	int info = slice_info_fn ? slice_info_fn(f, why, sizeof why) : -2;
	printf("FAKE blocks=%llu miscount=%llu wrong=%llu hash=%016llx driver_launches=%llu info=%d why=\"%s\"\n", total,
	       miscount, wrong, (unsigned long long)fnv(v, total * 4), (unsigned long long)(st1.launches - st0.launches), info, why);
	print_slice_stats();
	if (mod)
		CHECK(cu.ModuleUnload(mod));
	else
		CHECK(lib_unload(l));
	return 0;
}

/* ----------------------------------------------------------------- GPU */

static CUdeviceptr dalloc(size_t n)
{
	CUdeviceptr p;
	CHECK(cu.MemAlloc(&p, n));
	CHECK(cu.MemsetD8(p, 0, n));
	return p;
}

static void fill_random(CUdeviceptr p, size_t n, uint64_t seed)
{
	unsigned char *h = malloc(n);
	uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 1;
	for (size_t i = 0; i < n; i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		h[i] = (unsigned char)x;
	}
	CHECK(cu.MemcpyHtoD(p, h, n));
	free(h);
}

static uint64_t dhash(CUdeviceptr p, size_t n)
{
	unsigned char *h = malloc(n);
	CHECK(cu.MemcpyDtoH(h, p, n));
	uint64_t r = fnv(h, n);
	free(h);
	return r;
}

static const char *slice_state(CUfunction f)
{
	static char buf[240];
	char why[200] = "";
	if (!slice_info_fn)
		return "noshim";
	int r = slice_info_fn(f, why, sizeof why);
	snprintf(buf, sizeof buf, "%s%s%s", r == 1 ? "twin" : r == 0 ? "none" : "off", why[0] ? ":" : "", why);
	for (char *c = buf; *c; c++)
		if (*c == ' ' || *c == '"')
			*c = '_';
	return buf;
}

/* the repo's reduction kernels: every op and type, k = 3 sources, n odd */
static void run_reduce(CUmodule m)
{
	static const struct {
		const char *dt;
		int size;
	} dts[] = { { "f32", 4 }, { "f16", 2 }, { "bf16", 2 }, { "f64", 8 }, { "i32", 4 }, { "i64", 8 }, { "u8", 1 } };
	static const char *ops[] = { "sum", "min", "max" };
	unsigned long long n = 3000001; /* odd: the vector body and the tail both run */
	for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
		size_t bytes = n * (size_t)dts[d].size;
		CUdeviceptr dst = dalloc(bytes + 64), src[3];
		for (int k = 0; k < 3; k++) {
			src[k] = dalloc(bytes + 64);
			fill_random(src[k], bytes, 100 + (uint64_t)k + 10 * d);
		}
		for (size_t o = 0; o < 3; o++) {
			char name[64];
			snprintf(name, sizeof name, "mig_reduce_%s_%s", ops[o], dts[d].dt);
			CUfunction f;
			CHECK(cu.ModuleGetFunction(&f, m, name));
			fill_random(dst, bytes, 7 + d);
			struct {
				CUdeviceptr p[8];
			} srcs = { { src[0], src[1], src[2], 0, 0, 0, 0, 0 } };
			int k = 3;
			void *params[] = { &dst, &srcs, &k, &n };
			/* 1500 blocks of 256: a grid-stride loop that wraps */
			CHECK(cu.LaunchKernel(f, 1500, 1, 1, 256, 1, 1, 0, NULL, params, NULL));
			CHECK(cu.CtxSynchronize());
			printf("CASE name=%s hash=%016llx slicing=%s\n", name, (unsigned long long)dhash(dst, bytes), slice_state(f));
			/* and an unaligned destination: the element-by-element path */
			CUdeviceptr dst1 = dst + (CUdeviceptr)dts[d].size;
			void *params1[] = { &dst1, &srcs, &k, &n };
			fill_random(dst, bytes, 9 + d);
			CHECK(cu.LaunchKernel(f, 700, 1, 1, 128, 1, 1, 0, NULL, params1, NULL));
			CHECK(cu.CtxSynchronize());
			printf("CASE name=%s_unaligned hash=%016llx\n", name, (unsigned long long)dhash(dst, bytes));
		}
		char name[64];
		snprintf(name, sizeof name, "mig_scale_%s", dts[d].dt);
		CUfunction f;
		CHECK(cu.ModuleGetFunction(&f, m, name));
		fill_random(dst, bytes, 11 + d);
		long long div = 3;
		void *params[] = { &dst, &n, &div };
		CHECK(cu.LaunchKernel(f, 1200, 1, 1, 256, 1, 1, 0, NULL, params, NULL));
		CHECK(cu.CtxSynchronize());
		printf("CASE name=%s hash=%016llx slicing=%s\n", name, (unsigned long long)dhash(dst, bytes), slice_state(f));
		/* the same through CU_LAUNCH_PARAM_BUFFER_POINTER: u64, u64, i64 packed */
		unsigned char pbuf[24];
		memcpy(pbuf, &dst, 8);
		memcpy(pbuf + 8, &n, 8);
		memcpy(pbuf + 16, &div, 8);
		size_t psize = sizeof pbuf;
		void *extra[] = { (void *)1, pbuf, (void *)2, &psize, NULL };
		fill_random(dst, bytes, 11 + d);
		CHECK(cu.LaunchKernel(f, 1200, 1, 1, 256, 1, 1, 0, NULL, NULL, extra));
		CHECK(cu.CtxSynchronize());
		printf("CASE name=%s_extra hash=%016llx\n", name, (unsigned long long)dhash(dst, bytes));
		cu.MemFree(dst);
		for (int k = 0; k < 3; k++)
			cu.MemFree(src[k]);
	}
}

/* a hand-written sample: every entry with one u64 parameter writes the probe
 * values (seed 0) for its grid; check them against the host */
static void run_sample(const char *path)
{
	size_t n;
	char *ptx = read_file(path, &n);
	const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
	struct ms_ptx_module info;
	ms_ptx_rewrite(ptx, n, &info);
	/* the rewritten text must JIT too (load it directly: this is the check
	 * of the rewriter's output, with or without the shim) */
	if (info.ptx) {
		CUmodule rm;
		CUresult r = cu.ModuleLoadData(&rm, info.ptx);
		printf("JIT sample=%s rewritten=1 ok=%d code=%d\n", base, r == CUDA_SUCCESS, r);
		if (r == CUDA_SUCCESS)
			cu.ModuleUnload(rm);
	}
	CUmodule m;
	CUresult r = cu.ModuleLoadData(&m, ptx);
	printf("JIT sample=%s rewritten=0 ok=%d code=%d\n", base, r == CUDA_SUCCESS, r);
	if (r != CUDA_SUCCESS) {
		ms_ptx_module_free(&info);
		free(ptx);
		return;
	}
	unsigned grids[][3] = { { 1000, 1, 1 }, { 37, 5, 3 }, { 8, 6, 5 }, { 4, 3, 70 } };
	for (int i = 0; i < info.nentries; i++) {
		const struct ms_ptx_entry *e = &info.entries[i];
		if (e->nparams != 1 && strcmp(e->name, "probe_params") != 0)
			continue;
		if (strncmp(e->name, "probe", 5) != 0)
			continue;
		CUfunction f;
		CHECK(cu.ModuleGetFunction(&f, m, e->name));
		for (size_t g = 0; g < sizeof grids / sizeof grids[0]; g++) {
			unsigned gx = grids[g][0], gy = grids[g][1], gz = grids[g][2];
			size_t total = (size_t)gx * gy * gz;
			CUdeviceptr out = dalloc(total * 4);
			if (strcmp(e->name, "probe_params") == 0) {
				/* (u8, u64 out, 12-byte struct, u32) through the parameter buffer */
				unsigned char pbuf[32] = { 0 };
				memcpy(pbuf + 8, &out, 8);
				size_t psize = sizeof pbuf;
				void *extra[] = { (void *)1, pbuf, (void *)2, &psize, NULL };
				CHECK(cu.LaunchKernel(f, gx, gy, gz, 32, 1, 1, 0, NULL, NULL, extra));
			} else {
				void *params[] = { &out };
				CHECK(cu.LaunchKernel(f, gx, gy, gz, 32, 1, 1, 0, NULL, params, NULL));
			}
			CHECK(cu.CtxSynchronize());
			uint32_t *h = malloc(total * 4);
			CHECK(cu.MemcpyDtoH(h, out, total * 4));
			size_t wrong = 0;
			for (unsigned z = 0; z < gz; z++)
				for (unsigned y = 0; y < gy; y++)
					for (unsigned x = 0; x < gx; x++)
						wrong += h[x + (size_t)gx * (y + (size_t)gy * z)] !=
							 probe_value(0, x, y, z, gx, gy, gz);
			printf("CASE name=%s/%s/%ux%ux%u hash=%016llx wrong=%zu slicing=%s\n", base, e->name, gx, gy, gz,
			       (unsigned long long)fnv(h, total * 4), wrong, slice_state(f));
			free(h);
			cu.MemFree(out);
		}
	}
	cu.ModuleUnload(m);
	ms_ptx_module_free(&info);
	free(ptx);
}

static int do_gpu_run(int argc, char **argv)
{
	open_driver();
	slice_syms();
	/* our test kernels (nvcc output): grid_probe over 2D/3D grids */
	char *kp = read_file(argv[0], NULL);
	CUmodule km;
	CHECK(cu.ModuleLoadData(&km, kp));
	CUfunction probe;
	CHECK(cu.ModuleGetFunction(&probe, km, "grid_probe"));
	unsigned grids[][3] = { { 100000, 1, 1 }, { 37, 5, 3 }, { 1000, 300, 1 }, { 64, 64, 40 } };
	for (size_t g = 0; g < sizeof grids / sizeof grids[0]; g++) {
		unsigned gx = grids[g][0], gy = grids[g][1], gz = grids[g][2];
		size_t total = (size_t)gx * gy * gz;
		CUdeviceptr count = dalloc(total * 4), val = dalloc(total * 4);
		uint32_t seed = 0x5eed + (uint32_t)g;
		void *params[] = { &count, &val, &seed };
		CHECK(cu.LaunchKernel(probe, gx, gy, gz, 64, 1, 1, 0, NULL, params, NULL));
		CHECK(cu.CtxSynchronize());
		uint32_t *c = malloc(total * 4), *v = malloc(total * 4);
		CHECK(cu.MemcpyDtoH(c, count, total * 4));
		CHECK(cu.MemcpyDtoH(v, val, total * 4));
		size_t miscount = 0, wrong = 0;
		for (unsigned z = 0; z < gz; z++)
			for (unsigned y = 0; y < gy; y++)
				for (unsigned x = 0; x < gx; x++) {
					size_t i = x + (size_t)gx * (y + (size_t)gy * z);
					miscount += c[i] != 1;
					wrong += v[i] != probe_value(seed, x, y, z, gx, gy, gz);
				}
		printf("CASE name=grid_probe/%ux%ux%u hash=%016llx miscount=%zu wrong=%zu slicing=%s\n", gx, gy, gz,
		       (unsigned long long)fnv(v, total * 4), miscount, wrong, slice_state(probe));
		free(c);
		free(v);
		cu.MemFree(count);
		cu.MemFree(val);
	}
	/* the same kernel through a CUDA 12 library, launched as its CUkernel */
	CUresult (*lib_load)(CUlibrary *, const void *, int *, void **, unsigned, int *, void **, unsigned) =
		(CUresult(*)(CUlibrary *, const void *, int *, void **, unsigned, int *, void **, unsigned))dlsym(lib, "cuLibraryLoadData");
	CUresult (*lib_kernel)(CUkernel *, CUlibrary, const char *) =
		(CUresult(*)(CUkernel *, CUlibrary, const char *))dlsym(lib, "cuLibraryGetKernel");
	if (lib_load && lib_kernel) {
		CUlibrary l;
		CUkernel k;
		CHECK(lib_load(&l, kp, NULL, NULL, 0, NULL, NULL, 0));
		CHECK(lib_kernel(&k, l, "grid_probe"));
		unsigned gx = 1000, gy = 300, gz = 1;
		size_t total = (size_t)gx * gy * gz;
		CUdeviceptr count = dalloc(total * 4), val = dalloc(total * 4);
		uint32_t seed = 0x11b;
		void *params[] = { &count, &val, &seed };
		CHECK(cu.LaunchKernel((CUfunction)k, gx, gy, gz, 64, 1, 1, 0, NULL, params, NULL));
		CHECK(cu.CtxSynchronize());
		uint32_t *c = malloc(total * 4), *v = malloc(total * 4);
		CHECK(cu.MemcpyDtoH(c, count, total * 4));
		CHECK(cu.MemcpyDtoH(v, val, total * 4));
		size_t miscount = 0, wrong = 0;
		for (unsigned y = 0; y < gy; y++)
			for (unsigned x = 0; x < gx; x++) {
				size_t i = x + (size_t)gx * y;
				miscount += c[i] != 1;
				wrong += v[i] != probe_value(seed, x, y, 0, gx, gy, gz);
			}
		printf("CASE name=grid_probe_library/%ux%ux%u hash=%016llx miscount=%zu wrong=%zu slicing=%s\n", gx, gy, gz,
		       (unsigned long long)fnv(v, total * 4), miscount, wrong, slice_state((CUfunction)k));
		free(c);
		free(v);
		cu.MemFree(count);
		cu.MemFree(val);
	}
	/* the repo's reduction kernels */
	char *rp = read_file(argv[1], NULL);
	CUmodule rm;
	CHECK(cu.ModuleLoadData(&rm, rp));
	run_reduce(rm);
	/* the hand-written samples */
	for (int i = 2; i < argc; i++)
		run_sample(argv[i]);
	print_slice_stats();
	printf("RESULT ok=1\n");
	return 0;
}

/* ----------------------------------------------------------- gpu-delay */

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

struct be_arg {
	CUfunction spin;
	CUstream s;
	unsigned blocks;
	unsigned long long spin_ns;
	CUdeviceptr out;
	volatile int stop;
	unsigned long long kernels;
	unsigned gap_us; /* idle time between two best-effort kernels (env XDELAY_GAP_US) */
};

static void *be_main(void *p)
{
	struct be_arg *a = p;
	while (!a->stop) {
		void *params[] = { &a->out, &a->spin_ns };
		CHECK(cu.LaunchKernel(a->spin, a->blocks, 1, 1, 128, 1, 1, 0, a->s, params, NULL));
		CHECK(cu.StreamSynchronize(a->s));
		a->kernels++;
		if (a->gap_us)
			usleep(a->gap_us);
	}
	return NULL;
}

/* delay: a best-effort thread (MODE be|alone) keeps launching a long kernel of
 * BLOCKS blocks that each spin SPIN_US on one stream; the high-priority thread
 * launches a one-block kernel every ~1 ms on another stream (the highest
 * stream priority when MODE ends in "-prio") and times launch -> the
 * kernel's completion seen by cuStreamSynchronize. */
static int do_gpu_delay(const char *kpath, const char *mode, double seconds, unsigned spin_us, unsigned blocks)
{
	open_driver();
	slice_syms();
	if (blocks == 0) { /* ~50 ms: 16 blocks of 128 threads resident per SM, SPIN_US each */
		CUdevice dev;
		int sms = 132;
		CHECK(cu.DeviceGet(&dev, 0));
		if (cu.DeviceGetAttribute)
			cu.DeviceGetAttribute(&sms, 16 /* MULTIPROCESSOR_COUNT */, dev);
		blocks = (unsigned)((unsigned long long)sms * 16 * 50000 / (spin_us ? spin_us : 1));
	}
	char *kp = read_file(kpath, NULL);
	CUmodule km;
	CHECK(cu.ModuleLoadData(&km, kp));
	CUfunction spin, tiny;
	CHECK(cu.ModuleGetFunction(&spin, km, "spin"));
	CHECK(cu.ModuleGetFunction(&tiny, km, "tiny"));
	int lo = 0, hi = 0;
	if (cu.CtxGetStreamPriorityRange)
		cu.CtxGetStreamPriorityRange(&lo, &hi);
	int prio = strstr(mode, "-prio") != NULL;
	int with_be = strncmp(mode, "alone", 5) != 0;
	int with_hp = strcmp(mode, "beonly") != 0; /* beonly: the best-effort side alone (another process measures) */
	CUstream sbe, shp;
	CHECK(cu.StreamCreateWithPriority(&sbe, CU_STREAM_NON_BLOCKING, lo));
	CHECK(cu.StreamCreateWithPriority(&shp, CU_STREAM_NON_BLOCKING, prio ? hi : lo));
	const char *gap = getenv("XDELAY_GAP_US");
	struct be_arg a = { spin, sbe, blocks, (unsigned long long)spin_us * 1000ULL, dalloc((size_t)blocks * 4), 0, 0,
			    gap ? (unsigned)strtoul(gap, NULL, 0) : 0 };
	CUdeviceptr t = dalloc(8);
	void *tp[] = { &t };
	/* warm up both kernels */
	CHECK(cu.LaunchKernel(tiny, 1, 1, 1, 32, 1, 1, 0, shp, tp, NULL));
	unsigned long long one = 1000;
	void *sp[] = { &a.out, &one };
	CHECK(cu.LaunchKernel(spin, blocks, 1, 1, 128, 1, 1, 0, sbe, sp, NULL));
	CHECK(cu.CtxSynchronize());
	pthread_t th;
	if (with_be) {
		pthread_create(&th, NULL, be_main, &a);
		usleep(20000);
	}
	size_t cap = (size_t)(seconds * 2000) + 16, n = 0;
	double *lat = malloc(cap * sizeof *lat);
	double end = now_s() + seconds;
	while (!with_hp && now_s() < end)
		usleep(10000);
	while (with_hp && now_s() < end && n < cap) {
		double t0 = now_s();
		CHECK(cu.LaunchKernel(tiny, 1, 1, 1, 32, 1, 1, 0, shp, tp, NULL));
		CHECK(cu.StreamSynchronize(shp));
		lat[n++] = (now_s() - t0) * 1e6;
		/* ~1 ms between requests, a little jitter so we do not phase-lock with slices */
		usleep(800 + (unsigned)(n * 37 % 400));
	}
	double be_s = seconds;
	if (with_be) {
		a.stop = 1;
		pthread_join(th, NULL);
	}
	if (n == 0)
		lat[n++] = 0;
	qsort(lat, n, sizeof *lat, cmp_d);
#define PCT(p) lat[(size_t)((double)(n - 1) * (p))]
	printf("DELAY mode=%s samples=%zu p50_us=%.1f p99_us=%.1f p999_us=%.1f max_us=%.1f be_kernels=%llu "
	       "be_kernels_per_s=%.2f spin_us=%u blocks=%u\n",
	       mode, n, PCT(0.5), PCT(0.99), PCT(0.999), lat[n - 1], a.kernels, (double)a.kernels / be_s, spin_us, blocks);
#undef PCT
	print_slice_stats();
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc >= 3 && strcmp(argv[1], "rewrite") == 0)
		return do_rewrite(argv[2], argc >= 4 ? argv[3] : NULL);
	if (argc == 6 && strcmp(argv[1], "plan") == 0)
		return do_plan((unsigned)atoi(argv[2]), (unsigned)atoi(argv[3]), (unsigned)atoi(argv[4]),
			       (unsigned)atoi(argv[5]));
	if (argc == 7 && strcmp(argv[1], "launch") == 0)
		return do_launch((unsigned)atoi(argv[2]), (unsigned)atoi(argv[3]), (unsigned)atoi(argv[4]),
				 (unsigned)atoi(argv[5]), strcmp(argv[6], "extra") == 0);
	if (argc == 3 && strcmp(argv[1], "fatbin") == 0)
		return do_fatbin(argv[2]);
	if (argc >= 5 && strcmp(argv[1], "fake") == 0)
		return do_fake((unsigned)atoi(argv[2]), (unsigned)atoi(argv[3]), (unsigned)atoi(argv[4]),
			       argc >= 6 ? (uint32_t)strtoul(argv[5], NULL, 0) : 7u, argc >= 7 ? argv[6] : "module");
	if (argc >= 4 && strcmp(argv[1], "gpu-run") == 0)
		return do_gpu_run(argc - 2, argv + 2);
	if (argc == 7 && strcmp(argv[1], "gpu-delay") == 0)
		return do_gpu_delay(argv[2], argv[3], atof(argv[4]), (unsigned)atoi(argv[5]), (unsigned)atoi(argv[6]));
	fprintf(stderr, "usage: see the comment at the top of ptxslicetest.c\n");
	return 2;
}
