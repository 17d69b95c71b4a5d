package main

/*
#cgo CFLAGS: -I${SRCDIR}/../../include
#include <stdint.h>
#include <stddef.h>
#include <stdlib.h>
#include "migctl.h"
void migctl_set_error(const char *msg, size_t n);
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
	"unsafe"

	"github.com/migctl/migctl/comm"
	"github.com/migctl/migctl/trainer"
)

func main() {} // a c-shared library has no main

// The process's group and the collectives in flight.
var (
	mu      sync.Mutex
	group   *trainer.Group
	closed  bool
	works   = map[uint64]*trainer.Work{}
	nextID  uint64
	initCtx = context.Background
)

// Collective kinds, as cabi.c passes them.
const (
	kindAllReduce = iota
	kindReduceScatter
	kindAllGather
	kindBroadcast
	kindBarrier
)

// fail records err as the calling thread's last error and returns its code.
func fail(err error) C.int {
	msg := err.Error()
	if msg == "" {
		msg = "error"
	}
	cs := C.CString(msg)
	C.migctl_set_error(cs, C.size_t(len(msg)))
	C.free(unsafe.Pointer(cs))
	return code(err)
}

// code maps an error to its MIGCTL_ERR_* code.
func code(err error) C.int {
	switch {
	case err == nil:
		return C.MIGCTL_OK
	case errors.Is(err, errForked):
		return C.MIGCTL_ERR_FORKED
	case errors.Is(err, errBadHandle):
		return C.MIGCTL_ERR_BAD_HANDLE
	case errors.Is(err, errNotInit):
		return C.MIGCTL_ERR_NOT_INITIALIZED
	case errors.Is(err, errAlreadyInit):
		return C.MIGCTL_ERR_ALREADY_INITIALIZED
	case errors.Is(err, trainer.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		return C.MIGCTL_ERR_TIMEOUT
	case errors.Is(err, comm.ErrPeerDead):
		return C.MIGCTL_ERR_PEER_DEAD
	case errors.Is(err, comm.ErrAborted):
		return C.MIGCTL_ERR_ABORTED
	case errors.Is(err, trainer.ErrClosed), errors.Is(err, comm.ErrClosed):
		return C.MIGCTL_ERR_CLOSED
	case errors.Is(err, trainer.ErrUnsupported), errors.Is(err, trainer.ErrMultiNode):
		return C.MIGCTL_ERR_UNSUPPORTED
	case errors.Is(err, comm.ErrInvalid):
		return C.MIGCTL_ERR_INVALID
	}
	return C.MIGCTL_ERR_INTERNAL
}

var (
	errForked      = errors.New("forked")
	errBadHandle   = errors.New("unknown work handle (already waited for, or never issued)")
	errNotInit     = errors.New("libmigctl: not initialised: call migctl_init_from_env first")
	errAlreadyInit = errors.New("libmigctl: already initialised (one group per process)")
)

// current returns the group, or an error saying why there is none.
func current() (*trainer.Group, error) {
	mu.Lock()
	defer mu.Unlock()
	switch {
	case closed:
		return nil, fmt.Errorf("libmigctl: migctl_finalize was called: %w", trainer.ErrClosed)
	case group == nil:
		return nil, errNotInit
	}
	return group, nil
}

//export migctlGoInit
func migctlGoInit(rank, size C.int) C.int {
	mu.Lock()
	defer mu.Unlock()
	if group != nil || closed {
		return fail(errAlreadyInit)
	}
	var opts []trainer.Option
	if rank >= 0 || size > 0 {
		if rank < 0 || size < 1 {
			return fail(fmt.Errorf("libmigctl: migctl_init(%d, %d): give both rank and size, or -1 for both: %w", rank, size, comm.ErrInvalid))
		}
		opts = append(opts, trainer.WithRank(int(rank), int(size)))
	}
	g, err := trainer.Init(initCtx(), opts...)
	if err != nil {
		return fail(err)
	}
	group = g
	return C.MIGCTL_OK
}

//export migctlGoInfo
func migctlGoInfo(what C.int) C.int {
	g, err := current()
	if err != nil {
		fail(err)
		return -1
	}
	switch what {
	case 0:
		return C.int(g.Rank())
	case 1:
		return C.int(g.Size())
	case 2:
		return C.int(g.LocalRank())
	case 3:
		return C.int(g.LocalSize())
	case 4:
		if g.Backend() == trainer.BackendGPU {
			return 1
		}
		return 0
	}
	return -1
}

// buffer is count elements of dt at p: host memory, or device memory with
// the stream its contents are produced on.
func buffer(p unsafe.Pointer, count int, dt trainer.DType, device bool, stream uintptr) trainer.Buffer {
	if p == nil {
		return trainer.Buffer{}
	}
	if device {
		return trainer.DeviceBuffer(uintptr(p), count, dt, stream)
	}
	if count == 0 {
		return trainer.HostBytes([]byte{}, dt)
	}
	return trainer.HostBytes(unsafe.Slice((*byte)(p), count*dt.Size()), dt)
}

//export migctlGoCollective
func migctlGoCollective(kind C.int, send, recv unsafe.Pointer, count C.size_t, dtype, op, root, device C.int,
	stream C.uintptr_t, work *C.migctl_work_t) C.int {
	if work == nil {
		return fail(fmt.Errorf("libmigctl: the work argument is NULL: %w", comm.ErrInvalid))
	}
	*work = 0
	g, err := current()
	if err != nil {
		return fail(err)
	}
	dt := trainer.DType(dtype)
	if dt < trainer.Float32 || dt > trainer.Uint8 {
		return fail(fmt.Errorf("libmigctl: dtype %d: want MIGCTL_FLOAT32..MIGCTL_UINT8: %w", dtype, comm.ErrInvalid))
	}
	o := trainer.Op(op)
	if (kind == kindAllReduce || kind == kindReduceScatter) && (o < trainer.Sum || o > trainer.Max) {
		return fail(fmt.Errorf("libmigctl: op %d: want MIGCTL_SUM, AVG, MIN or MAX: %w", op, comm.ErrInvalid))
	}
	if kind != kindBarrier && count > 0 && (recv == nil || send == nil && kind != kindBroadcast) {
		return fail(fmt.Errorf("libmigctl: NULL buffer for %d elements: %w", count, comm.ErrInvalid))
	}
	n, size := int(count), g.Size()
	onDev, st := device != 0, uintptr(stream)
	inPlace := send == recv
	ctx := context.Background()
	var w *trainer.Work
	switch kind {
	case kindAllReduce:
		w = g.AllReduceAsync(ctx, buffer(send, n, dt, onDev, st), buffer(recv, n, dt, onDev, st), o)
	case kindReduceScatter:
		sn := n * size
		rn := n
		if inPlace {
			rn = sn
		}
		w = g.ReduceScatterAsync(ctx, buffer(send, sn, dt, onDev, st), buffer(recv, rn, dt, onDev, st), o)
	case kindAllGather:
		sn := n
		if inPlace {
			sn = n * size
		}
		w = g.AllGatherAsync(ctx, buffer(send, sn, dt, onDev, st), buffer(recv, n*size, dt, onDev, st))
	case kindBroadcast:
		if root < 0 || int(root) >= size {
			return fail(fmt.Errorf("libmigctl: broadcast root %d of %d ranks: %w", root, size, comm.ErrInvalid))
		}
		s := trainer.Buffer{}
		if send != nil {
			s = buffer(send, n, dt, onDev, st)
		}
		w = g.BroadcastAsync(ctx, s, buffer(recv, n, dt, onDev, st), int(root))
	case kindBarrier:
		w = g.BarrierAsync(ctx)
	default:
		return fail(fmt.Errorf("libmigctl: collective kind %d: %w", kind, comm.ErrInvalid))
	}
	mu.Lock()
	nextID++
	id := nextID
	works[id] = w
	mu.Unlock()
	*work = C.migctl_work_t(id)
	return C.MIGCTL_OK
}

//export migctlGoWait
func migctlGoWait(h C.migctl_work_t, timeoutMS C.int64_t, free C.int) C.int {
	mu.Lock()
	w := works[uint64(h)]
	mu.Unlock()
	if w == nil {
		return fail(fmt.Errorf("libmigctl: work %d: %w", uint64(h), errBadHandle))
	}
	switch {
	case timeoutMS < 0:
		<-w.Done()
	case timeoutMS == 0:
		select {
		case <-w.Done():
		default:
			return C.MIGCTL_PENDING
		}
	default:
		t := time.NewTimer(time.Duration(timeoutMS) * time.Millisecond)
		defer t.Stop()
		select {
		case <-w.Done():
		case <-t.C:
			return C.MIGCTL_PENDING
		}
	}
	if free != 0 {
		mu.Lock()
		delete(works, uint64(h))
		mu.Unlock()
	}
	if err := w.Err(); err != nil {
		return fail(err)
	}
	return C.MIGCTL_OK
}

//export migctlGoAbort
func migctlGoAbort(reason *C.char) C.int {
	g, err := current()
	if err != nil {
		return fail(err)
	}
	r := "aborted through libmigctl"
	if reason != nil {
		r = C.GoString(reason)
	}
	g.Abort(r)
	return C.MIGCTL_OK
}

//export migctlGoFinalize
func migctlGoFinalize() C.int {
	mu.Lock()
	g := group
	group, closed = nil, true
	mu.Unlock()
	if g == nil {
		return C.MIGCTL_OK
	}
	if err := g.Close(); err != nil {
		return fail(err)
	}
	return C.MIGCTL_OK
}
