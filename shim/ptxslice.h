/*
 * ptxslice.h — launching long kernels in slices of blocks (issue 10, item 3).
 *
 * A high-priority launch cannot interrupt a kernel that is already running,
 * but it can run between two launches. So a best-effort kernel whose PTX we
 * have is launched as K grids of at most B blocks each, on the same stream,
 * one after the other: a high-priority kernel waits for at most one slice.
 *
 * For a slice to compute exactly what its blocks compute in the full launch,
 * the kernel must see its block index and grid size as in the full launch.
 * The rewriter gives every .entry one more parameter,
 *
 *     .param .align 4 .b8 __ms_slice[24]   (struct ms_slice_args)
 *
 * and reads %ctaid.{x,y,z} as %ctaid + off and %nctaid.{x,y,z} as the
 * original grid. Everything else in the kernel is left as it was. A kernel
 * the rewriter cannot prove it rewrote correctly (cluster or cooperative
 * launch, grid-wide special registers, dynamic parallelism, a callee that
 * reads %ctaid, an external callee, a form of %ctaid it does not know) is left
 * unsliced, with the reason recorded.
 *
 * The shim keeps the program's module as loaded and loads the rewritten PTX
 * as a second ("twin") module. The program's CUfunction stays what it was:
 * graph nodes, cooperative launches, cuLaunchKernelEx and anything else we do
 * not slice use it untouched. Only cuLaunchKernel of a function with a twin
 * is turned into slices of the twin.
 *
 * Settings (environment, read once at the first module load):
 *   MIGSWAP_SLICE_BLOCKS=N    blocks per slice; 0 (default) turns slicing off
 *   MIGSWAP_SLICE_INFLIGHT=D  slices queued on the stream before the launching
 *                             thread waits for the oldest (default 2; 0 = no
 *                             limit: every slice is queued at once)
 *   MIGSWAP_SLICE_WHOLE_WAVES=0  do not round slices to whole waves (blocks
 *                             resident at once, from the occupancy API), and
 *                             slice grids that fit in one wave (for tests)
 * By default a slice is a whole number of waves (at least one), and a grid
 * that fits in one wave is never sliced: a kernel that relies on all its
 * blocks being resident at once (which CUDA does not promise outside
 * cooperative launches) keeps working.
 * Not a stable ABI: only the shim and its tests include this header; the
 * exported migswap_slice_* functions are for tests and tools.
 */
#ifndef MIGSWAP_PTXSLICE_H
#define MIGSWAP_PTXSLICE_H

#include "cudadrv.h"

#include <stddef.h>
#include <stdint.h>

#define MS_SLICE_PARAM "__ms_slice"
#define MS_SLICE_PREFIX "__ms_"

/* The parameter the rewriter appends: 24 bytes, 4-byte aligned. */
struct ms_slice_args {
	uint32_t off[3];  /* block offset of this slice in the original grid */
	uint32_t grid[3]; /* the original grid */
};

/* ------------------------------------------------------------ the rewriter */

struct ms_ptx_entry {
	char *name;
	int sliceable;         /* 1: rewritten in the output PTX */
	char reason[200];      /* why not, when sliceable == 0 */
	int nparams;           /* parameters of the original kernel */
	uint32_t param_bytes;  /* end of the original parameters in the parameter buffer */
	uint32_t slice_offset; /* offset of __ms_slice in the rewritten kernel's buffer */
	int ctaid_reads;       /* %ctaid reads rewritten */
	int nctaid_reads;      /* %nctaid reads rewritten */
	/* Static idempotence (for the transaction question of issue 10 item 3, not
	 * used by slicing): 1 when the kernel provably never reads global memory
	 * it writes, so it could be re-run from scratch after an abort. Assumes
	 * distinct pointer parameters do not alias; atomics, unknown memory
	 * operations and calls of unknown functions make it unproven. */
	int idempotent;
	char idem_reason[120]; /* why not, when idempotent == 0 */
};

struct ms_ptx_module {
	char *ptx; /* the rewritten PTX (NUL-terminated), NULL when no entry was rewritten */
	size_t ptx_len;
	int nentries;
	struct ms_ptx_entry *entries;
	int nsliceable;
	char reason[256]; /* module-level: why nothing was rewritten (parse error, ...) */
};

/* ms_ptx_rewrite parses len bytes of PTX text (need not be NUL-terminated)
 * and fills *out (free with ms_ptx_module_free). Returns 0 when the module
 * was parsed (out->nsliceable entries rewritten, possibly 0), -1 when it
 * could not be parsed (out->reason says why; nothing is rewritten). Pure: no
 * CUDA calls, no globals. */
int ms_ptx_rewrite(const char *ptx, size_t len, struct ms_ptx_module *out);
void ms_ptx_module_free(struct ms_ptx_module *m);
const struct ms_ptx_entry *ms_ptx_find(const struct ms_ptx_module *m, const char *name);

/* What a module image handed to cuModuleLoadData is. */
enum ms_image_kind {
	MS_IMAGE_UNKNOWN = 0,
	MS_IMAGE_PTX = 1,    /* NUL-terminated PTX text */
	MS_IMAGE_FATBIN = 2, /* fatbin container (or its wrapper) */
	MS_IMAGE_CUBIN = 3,  /* ELF */
};
int ms_image_kind(const void *image);

/* ms_fatbin_ptx finds the PTX of a fatbin image (or of a fatbin wrapper):
 * the uncompressed PTX entry with the highest architecture <= cc (major*10 +
 * minor; 0: any). Returns 0 and sets ptx and len (pointing into the image), or
 * -1 with the reason (no PTX, only compressed PTX, malformed). */
int ms_fatbin_ptx(const void *image, int cc, const char **ptx, size_t *len, char *reason, size_t rlen);

/* ------------------------------------------------------------ slice plans */

/* A slice is a box of blocks of the original grid: x fastest, then y, then z.
 * Slices are whole z-planes when a plane fits in max_blocks, else whole rows
 * of one plane, else runs of one row; every block is in exactly one slice. */
struct ms_slice {
	unsigned off[3];
	unsigned dim[3];
};

struct ms_slice_plan {
	unsigned grid[3];
	unsigned max_blocks;
	unsigned long long count; /* number of slices */
	unsigned long long next;  /* index of the next slice */
	struct ms_slice cur;
};

void ms_slice_plan_init(struct ms_slice_plan *p, const unsigned grid[3], unsigned max_blocks);
/* ms_slice_plan_next stores the next slice in *s; 0 when there is none. */
int ms_slice_plan_next(struct ms_slice_plan *p, struct ms_slice *s);

/* ------------------------------------------------------------ the launcher */

typedef CUresult (*ms_launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
				 CUstream, void **, void **);

struct ms_slice_policy {
	unsigned max_blocks;   /* blocks per slice; a grid of at most this many is one launch */
	unsigned max_inflight; /* slices queued on the stream before waiting; 0: no limit */
	/* between, when set, runs before every slice but the first (the launching
	 * thread; it may block: a higher-priority process's gate) */
	void (*between)(void *arg, unsigned long long done, unsigned long long total);
	void *arg;
};

/* ms_slice_launch launches twin (a rewritten kernel described by e) over the
 * grid gx*gy*gz as slices on stream s, appending struct ms_slice_args to
 * kernelParams (or to the CU_LAUNCH_PARAM_BUFFER_POINTER buffer of extra).
 * launch is the driver's cuLaunchKernel. *nslices gets the slices launched.
 * Returns the first error; a failure after the first slice leaves the earlier
 * slices launched (the kernel ran in part). */
CUresult ms_slice_launch(ms_launch_fn launch, CUfunction twin, const struct ms_ptx_entry *e, unsigned gx,
			 unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned smem, CUstream s,
			 void **params, void **extra, const struct ms_slice_policy *pol, unsigned long long *nslices);

/* ------------------------------------------------- the shim's hooks (state) */

/* Real driver entry points the hooks were called with. */
typedef CUresult (*ms_modload_fn)(CUmodule *, const void *);
typedef CUresult (*ms_modloadex_fn)(CUmodule *, const void *, unsigned, int *, void **);
typedef CUresult (*ms_modgetfn_fn)(CUfunction *, CUmodule, const char *);
typedef CUresult (*ms_modunload_fn)(CUmodule);
typedef struct CUlib_st *CUlibrary;  /* CUDA 12 libraries (context-independent modules) */
typedef struct CUkern_st *CUkernel;
typedef CUresult (*ms_libload_fn)(CUlibrary *, const void *, int *, void **, unsigned, int *, void **, unsigned);
typedef CUresult (*ms_libgetkernel_fn)(CUkernel *, CUlibrary, const char *);
typedef CUresult (*ms_kernelgetfn_fn)(CUfunction *, CUkernel);
typedef CUresult (*ms_libunload_fn)(CUlibrary);

/* ms_slice_on is nonzero when MIGSWAP_SLICE_BLOCKS > 0 (after ms_slice_config). */
extern int ms_slice_on __attribute__((visibility("hidden")));
void ms_slice_config(void) __attribute__((visibility("hidden")));

/* Module and function hooks: call the driver (real), then, when slicing is
 * on, load the twin / map the function. They return what the driver did. */
CUresult ms_slice_module_load(ms_modload_fn real, CUmodule *m, const void *image) __attribute__((visibility("hidden")));
CUresult ms_slice_module_loadex(ms_modloadex_fn real, CUmodule *m, const void *image, unsigned n, int *opts,
				void **vals) __attribute__((visibility("hidden")));
CUresult ms_slice_module_getfn(ms_modgetfn_fn real, CUfunction *f, CUmodule m, const char *name)
	__attribute__((visibility("hidden")));
CUresult ms_slice_module_unload(ms_modunload_fn real, CUmodule m) __attribute__((visibility("hidden")));
/* The same for libraries: cuLibraryLoadData (the twin is a library), a
 * CUkernel from cuLibraryGetKernel (launchable as a CUfunction) and the
 * CUfunction cuKernelGetFunction gives for it. */
CUresult ms_slice_library_load(ms_libload_fn real, CUlibrary *l, const void *code, int *jo, void **jv, unsigned nj,
			       int *lo, void **lv, unsigned nl) __attribute__((visibility("hidden")));
CUresult ms_slice_library_getkernel(ms_libgetkernel_fn real, CUkernel *k, CUlibrary l, const char *name)
	__attribute__((visibility("hidden")));
CUresult ms_slice_kernel_getfn(ms_kernelgetfn_fn real, CUfunction *f, CUkernel k) __attribute__((visibility("hidden")));
CUresult ms_slice_library_unload(ms_libunload_fn real, CUlibrary l) __attribute__((visibility("hidden")));

/* ms_slice_try_launch launches f in slices when it has a twin and its grid is
 * larger than MIGSWAP_SLICE_BLOCKS: returns 1 with *res set. Returns 0 (and
 * launches nothing) otherwise: the caller launches f itself. between/arg as
 * in struct ms_slice_policy (NULL: none). */
int ms_slice_try_launch(ms_launch_fn real, CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
			unsigned by, unsigned bz, unsigned smem, CUstream s, void **params, void **extra,
			void (*between)(void *, unsigned long long, unsigned long long), void *arg, CUresult *res)
	__attribute__((visibility("hidden")));

void ms_slice_atfork_child(void) __attribute__((visibility("hidden")));

/* ------------------------------------------ exported for tests and tools */

struct migswap_slice_stats {
	uint64_t modules_rewritten; /* twin modules loaded */
	uint64_t modules_skipped;   /* PTX/fatbin images not rewritten (see MIGSWAP_LOG=1) */
	uint64_t entries_sliceable; /* entries rewritten, over all twins */
	uint64_t entries_refused;   /* entries left unsliced */
	uint64_t functions_mapped;  /* CUfunctions with a twin */
	uint64_t sliced_launches;   /* cuLaunchKernel calls turned into slices */
	uint64_t slices;            /* slices launched */
	uint64_t fallbacks;         /* first slice failed: launched unsliced instead */
};

/* migswap_slice_get_stats fills *out; returns 0. */
int migswap_slice_get_stats(struct migswap_slice_stats *out);
/* migswap_slice_function_info: 1 when f has a twin, 0 when not (reason says
 * why when known: "not rewritten: ..."), -1 when slicing is off. */
int migswap_slice_function_info(CUfunction f, char *reason, size_t len);

#endif
