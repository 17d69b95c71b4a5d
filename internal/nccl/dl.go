//go:build cgo

package nccl

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>

// Our own declarations of the NCCL ABI (nccl.h is not needed): ncclResult_t,
// ncclDataType_t and ncclRedOp_t are ints, ncclComm_t and cudaStream_t
// pointers, ncclUniqueId a 128-byte struct passed by value to
// ncclCommInitRank. Handles cross into Go as uintptr_t.
typedef struct { char internal[128]; } mig_nccl_id;

#define MIG_MISSING (-1)

static void *mig_nccl;

static int (*p_ncclGetVersion)(int *);
static int (*p_ncclGetUniqueId)(mig_nccl_id *);
static int (*p_ncclCommInitRank)(void **, int, mig_nccl_id, int);
static int (*p_ncclCommDestroy)(void *);
static int (*p_ncclCommAbort)(void *);
static int (*p_ncclCommGetAsyncError)(void *, int *);
static const char *(*p_ncclGetErrorString)(int);
static const char *(*p_ncclGetLastError)(void *);
static int (*p_ncclAllReduce)(const void *, void *, size_t, int, int, void *, void *);
static int (*p_ncclAllGather)(const void *, void *, size_t, int, void *, void *);
static int (*p_ncclReduceScatter)(const void *, void *, size_t, int, int, void *, void *);
static int (*p_ncclBroadcast)(const void *, void *, size_t, int, int, void *, void *);
static int (*p_ncclGroupStart)(void);
static int (*p_ncclGroupEnd)(void);

#define SYM(name) *(void **)(&p_##name) = dlsym(mig_nccl, #name)

// mig_nccl_open loads the library and resolves the entry points: 0 on
// success, 1 when dlopen fails, 2 when the file is not NCCL.
static int mig_nccl_open(const char *path) {
	mig_nccl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!mig_nccl) return 1;
	SYM(ncclGetVersion); SYM(ncclGetUniqueId); SYM(ncclCommInitRank); SYM(ncclCommDestroy);
	SYM(ncclCommAbort); SYM(ncclCommGetAsyncError); SYM(ncclGetErrorString); SYM(ncclGetLastError);
	SYM(ncclAllReduce); SYM(ncclAllGather); SYM(ncclReduceScatter); SYM(ncclBroadcast);
	SYM(ncclGroupStart); SYM(ncclGroupEnd);
	if (!p_ncclGetVersion || !p_ncclCommInitRank || !p_ncclAllReduce) return 2;
	return 0;
}

#define P(x) ((void *)(x))
#define CALL(name, ...) (p_##name ? p_##name(__VA_ARGS__) : MIG_MISSING)

static int w_version(int *v) { return CALL(ncclGetVersion, v); }
static int w_uniqueId(void *id) { return CALL(ncclGetUniqueId, (mig_nccl_id *)id); }
static int w_init(uintptr_t *c, int n, void *id, int r) {
	mig_nccl_id v; memcpy(&v, id, sizeof v); void *x = 0;
	int rc = CALL(ncclCommInitRank, &x, n, v, r); *c = (uintptr_t)x; return rc;
}
static int w_destroy(uintptr_t c) { return CALL(ncclCommDestroy, P(c)); }
static int w_abort(uintptr_t c) { return CALL(ncclCommAbort, P(c)); }
static int w_asyncError(uintptr_t c, int *e) { return CALL(ncclCommGetAsyncError, P(c), e); }
static const char *w_errorString(int r) { return p_ncclGetErrorString ? p_ncclGetErrorString(r) : NULL; }
static const char *w_lastError(uintptr_t c) { return p_ncclGetLastError ? p_ncclGetLastError(P(c)) : NULL; }
static int w_allReduce(uintptr_t s, uintptr_t r, size_t n, int dt, int op, uintptr_t c, uintptr_t st) {
	return CALL(ncclAllReduce, P(s), P(r), n, dt, op, P(c), P(st));
}
static int w_allGather(uintptr_t s, uintptr_t r, size_t n, int dt, uintptr_t c, uintptr_t st) {
	return CALL(ncclAllGather, P(s), P(r), n, dt, P(c), P(st));
}
static int w_reduceScatter(uintptr_t s, uintptr_t r, size_t n, int dt, int op, uintptr_t c, uintptr_t st) {
	return CALL(ncclReduceScatter, P(s), P(r), n, dt, op, P(c), P(st));
}
static int w_broadcast(uintptr_t s, uintptr_t r, size_t n, int dt, int root, uintptr_t c, uintptr_t st) {
	return CALL(ncclBroadcast, P(s), P(r), n, dt, root, P(c), P(st));
}
static int w_groupStart(void) { return p_ncclGroupStart ? p_ncclGroupStart() : MIG_MISSING; }
static int w_groupEnd(void) { return p_ncclGroupEnd ? p_ncclGroupEnd() : MIG_MISSING; }
*/
import "C"

import (
	"fmt"
	"os"
	"sync"
	"unsafe"
)

type library struct{}

var _ Interface = library{}

var (
	openOnce sync.Once
	openErr  error
)

// Open loads NCCL (once per process: EnvLibrary's path if set, else
// libnccl.so.2 from the library search path) and returns the Interface
// backed by it. It returns an error wrapping ErrLibraryNotFound, which says
// what to do, when the library cannot be loaded.
func Open() (Interface, error) {
	openOnce.Do(func() {
		path := LibraryName
		if p := os.Getenv(EnvLibrary); p != "" {
			path = p
		}
		name := C.CString(path)
		defer C.free(unsafe.Pointer(name))
		switch C.mig_nccl_open(name) {
		case 0:
		case 1:
			openErr = notFound(path, C.GoString(C.dlerror()))
		default:
			openErr = fmt.Errorf("%s does not export ncclGetVersion, ncclCommInitRank and ncclAllReduce: not an NCCL library: %w",
				path, ErrFunctionMissing)
		}
	})
	if openErr != nil {
		return nil, openErr
	}
	return library{}, nil
}

func r(code C.int) error { return resultError(int(code)) }

func (l library) last(call string, c Comm, code C.int) error {
	err := r(code)
	if err == nil {
		return nil
	}
	return detailed(call, err, l.GetLastError(c))
}

func (library) GetVersion() (int, error) {
	var v C.int
	err := r(C.w_version(&v))
	return int(v), err
}

func (library) GetUniqueID() (UniqueID, error) {
	var id UniqueID
	err := r(C.w_uniqueId(unsafe.Pointer(&id[0])))
	return id, err
}

func (l library) CommInitRank(nranks int, id UniqueID, rank int) (Comm, error) {
	var c C.uintptr_t
	err := l.last("ncclCommInitRank", 0, C.w_init(&c, C.int(nranks), unsafe.Pointer(&id[0]), C.int(rank)))
	return Comm(c), err
}

func (l library) CommDestroy(c Comm) error {
	return l.last("ncclCommDestroy", c, C.w_destroy(C.uintptr_t(c)))
}

func (l library) CommAbort(c Comm) error {
	return l.last("ncclCommAbort", c, C.w_abort(C.uintptr_t(c)))
}

func (l library) CommGetAsyncError(c Comm) error {
	var e C.int
	if err := r(C.w_asyncError(C.uintptr_t(c), &e)); err != nil {
		return fmt.Errorf("ncclCommGetAsyncError: %w", err)
	}
	return detailed("asynchronous error", resultError(int(e)), l.GetLastError(c))
}

func (library) GetErrorString(res Result) string {
	s := C.w_errorString(C.int(res))
	if s == nil {
		return res.Error()
	}
	return C.GoString(s)
}

func (library) GetLastError(c Comm) string {
	s := C.w_lastError(C.uintptr_t(c))
	if s == nil {
		return ""
	}
	return C.GoString(s)
}

func (l library) AllReduce(send, recv uintptr, count int, dt DataType, op RedOp, c Comm, s Stream) error {
	return l.last("ncclAllReduce", c, C.w_allReduce(C.uintptr_t(send), C.uintptr_t(recv), C.size_t(count), C.int(dt),
		C.int(op), C.uintptr_t(c), C.uintptr_t(s)))
}

func (l library) AllGather(send, recv uintptr, sendCount int, dt DataType, c Comm, s Stream) error {
	return l.last("ncclAllGather", c, C.w_allGather(C.uintptr_t(send), C.uintptr_t(recv), C.size_t(sendCount), C.int(dt),
		C.uintptr_t(c), C.uintptr_t(s)))
}

func (l library) ReduceScatter(send, recv uintptr, recvCount int, dt DataType, op RedOp, c Comm, s Stream) error {
	return l.last("ncclReduceScatter", c, C.w_reduceScatter(C.uintptr_t(send), C.uintptr_t(recv), C.size_t(recvCount),
		C.int(dt), C.int(op), C.uintptr_t(c), C.uintptr_t(s)))
}

func (l library) Broadcast(send, recv uintptr, count int, dt DataType, root int, c Comm, s Stream) error {
	return l.last("ncclBroadcast", c, C.w_broadcast(C.uintptr_t(send), C.uintptr_t(recv), C.size_t(count), C.int(dt),
		C.int(root), C.uintptr_t(c), C.uintptr_t(s)))
}

func (library) GroupStart() error { return r(C.w_groupStart()) }
func (library) GroupEnd() error   { return r(C.w_groupEnd()) }
