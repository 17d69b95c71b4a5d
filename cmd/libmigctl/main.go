package main

/*
#cgo CFLAGS: -I${SRCDIR}/../../include
#include <stdint.h>
#include <stddef.h>
#include <stdlib.h>
#include "migctl.h"
#include "cabi.h"
// Go's build cache does not watch include/migctl.h (outside this package):
// naming its version here makes a version change rebuild the library.
#if MIGCTL_ABI_VERSION != 17
#error "MIGCTL_ABI_VERSION changed in include/migctl.h: update this check"
#endif
*/
import "C"

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"runtime"
	"sync"
	"time"
	"unsafe"

	"github.com/migctl/migctl/allreduce"
	"github.com/migctl/migctl/comm"
	"github.com/migctl/migctl/comm/rendezvous"
	"github.com/migctl/migctl/trainer"
)

func main() {} // a c-shared library has no main

// The process's group (group 0) and the groups formed from it by id. The
// collectives in flight live in cabi.c's ring; the dispatcher goroutine runs
// them.
var (
	mu         sync.Mutex
	group      *trainer.Group
	subs       = map[int]*trainer.Group{}
	lastSub    int // the last id given out (ids are not reused)
	closed     bool
	dispatched chan struct{} // closed when the dispatcher has returned
	initCtx    = context.Background
	served     *hosted // the rendezvous migctl_serve hosts, if any
)

// hosted is a rendezvous server this process hosts for its node's group.
type hosted struct {
	srv  *rendezvous.Server
	lis  net.Listener
	done chan struct{}
}

// Collective kinds, as cabi.c passes them.
const (
	kindAllReduce = iota
	kindReduceScatter
	kindAllGather
	kindBroadcast
	kindBarrier
	kindSend
	kindRecv
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
	case errors.Is(err, comm.ErrMismatch):
		return C.MIGCTL_ERR_INVALID
	case errors.Is(err, trainer.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		return C.MIGCTL_ERR_TIMEOUT
	case errors.Is(err, comm.ErrPeerDead):
		return C.MIGCTL_ERR_PEER_DEAD
	case errors.Is(err, comm.ErrAborted):
		return C.MIGCTL_ERR_ABORTED
	case errors.Is(err, trainer.ErrClosed), errors.Is(err, comm.ErrClosed):
		return C.MIGCTL_ERR_CLOSED
	case errors.Is(err, trainer.ErrUnsupported), errors.Is(err, trainer.ErrMultiNode), errors.Is(err, allreduce.ErrUnsupported):
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
	errAlreadyInit = errors.New("libmigctl: already initialised (migctl_new_group forms more groups)")
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

// groupOf returns group id (0: the process's group), or an error saying why
// there is none.
func groupOf(id int) (*trainer.Group, error) {
	if id == 0 {
		return current()
	}
	mu.Lock()
	defer mu.Unlock()
	if closed {
		return nil, fmt.Errorf("libmigctl: migctl_finalize was called: %w", trainer.ErrClosed)
	}
	if g := subs[id]; g != nil {
		return g, nil
	}
	if id > 0 && id <= lastSub {
		return nil, fmt.Errorf("libmigctl: group %d was freed: %w", id, trainer.ErrClosed)
	}
	return nil, fmt.Errorf("libmigctl: no group %d: %w", id, comm.ErrInvalid)
}

// migctlGoInit joins the group: rank and size (-1: from the environment),
// the rendezvous address and the job name (NULL: from the environment).
//
//export migctlGoInit
func migctlGoInit(rank, size C.int, rdzv, job *C.char) C.int {
	mu.Lock()
	defer mu.Unlock()
	if closed {
		return fail(fmt.Errorf("libmigctl: migctl_finalize was called: a process joins at most once: %w", trainer.ErrClosed))
	}
	if group != nil {
		return fail(errAlreadyInit)
	}
	var opts []trainer.Option
	if rank >= 0 || size > 0 {
		if rank < 0 || size < 1 {
			return fail(fmt.Errorf("libmigctl: migctl_init(%d, %d): give both rank and size, or -1 for both: %w", rank, size, comm.ErrInvalid))
		}
		opts = append(opts, trainer.WithRank(int(rank), int(size)))
	}
	if rdzv != nil {
		token := os.Getenv(trainer.EnvToken)
		if token == "" {
			return fail(fmt.Errorf("libmigctl: migctl_init_group: %s is not set (migctl run sets it): %w", trainer.EnvToken, comm.ErrInvalid))
		}
		opts = append(opts, trainer.WithRendezvous(C.GoString(rdzv), token))
	}
	if job != nil {
		opts = append(opts, trainer.WithJob(C.GoString(job)))
	}
	g, err := trainer.Init(initCtx(), opts...)
	if err != nil {
		return fail(err)
	}
	group = g
	dispatched = make(chan struct{})
	go dispatch(g, dispatched)
	return C.MIGCTL_OK
}

// dispatch runs the issued collectives in order, each to its end (the
// trainer's worker runs it; this goroutine, not locked to a thread, waits
// for it, so the Go scheduler hands over on one thread), and marks their
// slots done. It returns when migctl_finalize has stopped it and the ring is
// drained.
func dispatch(g *trainer.Group, done chan struct{}) {
	defer close(done)
	for {
		s := C.migctl_next()
		if s == nil {
			return
		}
		if s.kind == kindSend || s.kind == kindRecv {
			// It waits for its peer, not in the process's order: the
			// collectives issued after it go on meanwhile (once it is in
			// its link's queue, so that a later transfer on the link,
			// which may start on its caller's thread, stays behind it).
			startTransfer(g, s)
			C.migctl_hand_off(s)
			continue
		}
		mark := takeMark(uint64(s.order))
		if s.kind == kindAllReduce && chainSlot(g, s, mark) {
			// A large all-reduce the trainer lets the next collective
			// start beside (once its copies out are done): the slots
			// issued after it are taken now, its Work completes it.
			C.migctl_hand_off_chained(s)
			continue
		}
		complete(s, runSlot(g, s, mark), false)
	}
}

// chained are the chained all-reduces handed off and perhaps still running
// (chainSlot), all of one group: a collective of another group waits for
// them first (await), so that the process's collectives of different groups
// still run one at a time, as the header says; the group's own next ones are
// ordered behind them by the trainer. Its callers (runSlot, chainSlot) run
// one at a time: the dispatcher's under cabi.c's run lock, a direct run's
// under it too.
var chained chainedWorks

type chainedWorks struct {
	mu    sync.Mutex
	g     *trainer.Group
	works []*trainer.Work
}

// await waits until no chained all-reduce of a group other than g runs.
func (c *chainedWorks) await(g *trainer.Group) {
	c.mu.Lock()
	if c.g == g {
		c.mu.Unlock()
		return
	}
	works := c.works
	c.works, c.g = nil, nil
	c.mu.Unlock()
	for _, w := range works {
		<-w.Done()
	}
}

// add records w, an all-reduce of g handed off (after await(g)).
func (c *chainedWorks) add(g *trainer.Group, w *trainer.Work) {
	c.mu.Lock()
	defer c.mu.Unlock()
	live := c.works[:0]
	for _, x := range c.works {
		if !isDone(x) {
			live = append(live, x)
		}
	}
	c.g, c.works = g, append(live, w)
}

func isDone(w *trainer.Work) bool {
	select {
	case <-w.Done():
		return true
	default:
		return false
	}
}

// chainSlot issues the all-reduce of slot s asynchronously, its Work
// completing the slot, where the group chains it (trainer.Group.Chains: a
// host-staged all-reduce above the small-message size on buffers used in
// place), and reports whether it did; the dispatcher then goes on to the
// next slot, which the trainer starts once this one admits it.
func chainSlot(g *trainer.Group, s *C.migctl_slot_t, mark comm.Event) bool {
	g, buf, err := slotGroup(g, s, mark)
	if err != nil {
		return false // runSlot runs it (and reports the error)
	}
	n := int(s.count)
	send, recv := buf(s.send, n), buf(s.recv, n)
	if !g.Chains(send, recv) {
		return false
	}
	chained.await(g)
	w := g.AllReduceAsync(context.Background(), send, recv, trainer.Op(s.op))
	chained.add(g, w)
	id := uint64(s.id)
	if s.device != 0 {
		w.OnReady(func(ev comm.Event) {
			readyWorks.Store(id, readyWork{g, ev})
			C.migctl_ready(s)
		})
	}
	w.OnDone(func(err error) {
		readyWorks.Delete(id)
		complete(s, err, true)
	})
	return true
}

// readyWorks are the chained all-reduces whose result is queued on the
// device (trainer.Work.OnReady) and not yet claimed by a migctl_wait_stream:
// handle -> readyWork. The entry goes when the waiter takes it or when the
// all-reduce finishes, whichever comes first.
var readyWorks sync.Map

type readyWork struct {
	g  *trainer.Group
	ev comm.Event
}

// migctlGoOrderReady orders the caller's stream after the result of the
// all-reduce of handle id (migctl_wait_stream, after migctl_ready):
// MIGCTL_OK, or MIGCTL_PENDING when there is nothing to order after (it has
// finished meanwhile, or never readied early), or an error code when the
// stream could not be ordered; then the caller waits on the CPU.
//
//export migctlGoOrderReady
func migctlGoOrderReady(id C.uint64_t, stream C.uintptr_t) C.int {
	v, ok := readyWorks.LoadAndDelete(uint64(id))
	if !ok {
		return C.MIGCTL_PENDING
	}
	r := v.(readyWork)
	if err := r.g.OrderStream(uintptr(stream), r.ev); err != nil {
		return C.MIGCTL_ERR_INTERNAL
	}
	return C.MIGCTL_OK
}

// slotGroup is the group of slot s (the process's group is g) and a maker
// of the slot's buffers (count elements at p) ordered after mark.
func slotGroup(g *trainer.Group, s *C.migctl_slot_t, mark comm.Event) (*trainer.Group, func(p unsafe.Pointer, count int) trainer.Buffer, error) {
	if s.group != 0 {
		var err error
		if g, err = groupOf(int(s.group)); err != nil {
			return nil, nil, err
		}
	}
	dt := trainer.DType(s.dtype)
	onDev, st := s.device != 0, uintptr(s.stream)
	// On the gpu backend the issue marked the stream (cabi.c); on the host
	// backend device memory fails in the trainer, as the header says.
	ordered := onDev && g.Backend() == trainer.BackendGPU
	streamed := s.streamed != 0 // migctl_run: the caller goes on on the stream
	return g, func(p unsafe.Pointer, count int) trainer.Buffer {
		return buffer(p, count, dt, onDev, st, ordered, streamed, mark)
	}, nil
}

// complete marks slot s finished with err (handed: migctl_hand_off let it
// go on beside the dispatcher).
func complete(s *C.migctl_slot_t, err error, handed bool) {
	var (
		rc  C.int = C.MIGCTL_OK
		cs  *C.char
		n   C.size_t
		msg string
	)
	if err != nil {
		if msg = err.Error(); msg == "" {
			msg = "error"
		}
		rc, cs, n = code(err), C.CString(msg), C.size_t(len(msg))
		defer C.free(unsafe.Pointer(cs))
	}
	if handed {
		C.migctl_complete_handed(s, rc, cs, n)
	} else {
		C.migctl_complete(s, rc, cs, n)
	}
}

// startTransfer queues the transfer of slot s on its link; the goroutine
// that finishes it completes the slot (the caller lets the run lock go).
func startTransfer(g *trainer.Group, s *C.migctl_slot_t) {
	w, err := transfer(g, s, takeMark(uint64(s.order)))
	if err != nil {
		complete(s, err, true)
		return
	}
	w.OnDone(func(err error) { complete(s, err, true) })
}

// migctlGoTransfer starts the transfer of slot s from its caller's thread
// (cabi.c's issue of a transfer with nothing queued or running before it:
// it holds the run lock and took the slot itself), saving the wake of the
// dispatcher. It only queues the transfer on its link; it never waits.
//
//export migctlGoTransfer
func migctlGoTransfer(s *C.migctl_slot_t) {
	g, err := current()
	if err != nil {
		takeMark(uint64(s.order))
		complete(s, err, true)
		return
	}
	startTransfer(g, s)
}

// transfer issues the point-to-point transfer of slot s on its group (its
// arguments were checked by cabi.c; root is the peer), ordered after mark.
func transfer(g *trainer.Group, s *C.migctl_slot_t, mark comm.Event) (*trainer.Work, error) {
	if s.group != 0 {
		var err error
		if g, err = groupOf(int(s.group)); err != nil {
			return nil, err
		}
	}
	onDev := s.device != 0
	ordered := onDev && g.Backend() == trainer.BackendGPU
	dt, n, peer := trainer.DType(s.dtype), int(s.count), int(s.root)
	ctx := context.Background()
	if s.kind == kindSend {
		return g.SendAsync(ctx, buffer(s.send, n, dt, onDev, uintptr(s.stream), ordered, false, mark), peer), nil
	}
	return g.RecvAsync(ctx, buffer(s.recv, n, dt, onDev, uintptr(s.stream), ordered, false, mark), peer), nil
}

// migctlGoQueuedBack is MIGCTL_STAT_QUEUED_BACK (migctl_stats): the
// all-reduces of this process that queued their copies back behind device
// waits.
//
//export migctlGoQueuedBack
func migctlGoQueuedBack() C.uint64_t { return C.uint64_t(trainer.QueuedBackCalls()) }

//export migctlGoInfo
func migctlGoInfo(id, what C.int) C.int {
	g, err := groupOf(int(id))
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
	case 5:
		return C.int(runtime.GOMAXPROCS(0))
	case 6:
		return C.int(g.QueuedBroadcastBytes())
	case 7:
		if g.CompletesEarly() {
			return 1
		}
		return 0
	}
	return -1
}

// The marks of callers' streams taken at the issue (migctlGoOrder), until
// the dispatcher hands them to the collective.
var marks = struct {
	sync.Mutex
	next uint64
	m    map[uint64]comm.Event
}{m: map[uint64]comm.Event{}}

// migctlGoOrder marks the work queued on the caller's stream now (cabi.c
// calls it on the issuing thread, for device buffers on the gpu backend):
// 0 when the stream is idle (nothing to wait for), else the mark's id, or a
// negative MIGCTL_ERR_* code. It never blocks.
//
//export migctlGoOrder
func migctlGoOrder(stream C.uintptr_t) C.int64_t {
	g, err := current()
	if err != nil {
		return C.int64_t(fail(err))
	}
	ev, err := g.RecordStream(uintptr(stream))
	if err != nil {
		return C.int64_t(fail(fmt.Errorf("libmigctl: %w", err)))
	}
	// Idle, told by the mark itself: an Event's Done would make the device's
	// context current on the caller's thread, which the header promises to
	// leave as it was (RecordStream puts it back).
	if comm.Idle(ev) {
		return 0
	}
	marks.Lock()
	marks.next++
	id := marks.next
	marks.m[id] = ev
	marks.Unlock()
	return C.int64_t(id)
}

// takeMark returns and forgets mark id (nil for 0 or an unknown id).
func takeMark(id uint64) comm.Event {
	if id == 0 {
		return nil
	}
	marks.Lock()
	defer marks.Unlock()
	ev := marks.m[id]
	delete(marks.m, id)
	return ev
}

// migctlGoDropOrder forgets a mark whose collective was not issued after all.
//
//export migctlGoDropOrder
func migctlGoDropOrder(id C.uint64_t) { takeMark(uint64(id)) }

// buffer is count elements of dt at p: host memory, or device memory with
// the stream its contents are produced on, or (ordered) with the mark of
// that stream taken at the issue — and (streamed: migctl_run) whose result
// may be ordered on that stream rather than waited for.
func buffer(p unsafe.Pointer, count int, dt trainer.DType, device bool, stream uintptr, ordered, streamed bool, mark comm.Event) trainer.Buffer {
	if p == nil {
		return trainer.Buffer{}
	}
	if device && ordered && streamed {
		// Stream-ordered where the group allows it (a small all-reduce on
		// the devices, a broadcast of one chunk): the header's ABI 6 and 12
		// semantics for migctl_run.
		return trainer.DeviceBufferOrdered(uintptr(p), count, dt, stream, mark)
	}
	if device && ordered {
		return trainer.DeviceBufferAfter(uintptr(p), count, dt, mark)
	}
	if device {
		return trainer.DeviceBuffer(uintptr(p), count, dt, stream)
	}
	if count == 0 {
		return trainer.HostBytes([]byte{}, dt)
	}
	return trainer.HostBytes(unsafe.Slice((*byte)(p), count*dt.Size()), dt)
}

// migctlGoDirect runs a collective on the calling thread (cabi.c's direct
// migctl_run: its arguments are checked, nothing else is in flight, the
// caller's stream marked as for an issue: order) and returns its result,
// the text set on this thread. The goroutine of a cgo callback is locked to
// the C thread, so the trainer's waits poll without yielding meanwhile
// (comm.HoldYields).
//
//export migctlGoDirect
func migctlGoDirect(id, kind C.int, send, recv unsafe.Pointer, count C.size_t, dtype, op, root, device C.int, stream C.uintptr_t, order C.uint64_t) C.int {
	mark := takeMark(uint64(order))
	g, err := current()
	if err != nil {
		return fail(err)
	}
	s := C.migctl_slot_t{group: id, kind: kind, send: send, recv: recv, count: count, dtype: dtype, op: op,
		root: root, device: device, stream: stream, streamed: 1}
	release := comm.HoldYields()
	err = runSlot(g, &s, mark)
	release()
	if err != nil {
		return fail(err)
	}
	return C.MIGCTL_OK
}

// runSlot runs the collective of slot s on its group (the process's group
// is g; its arguments were checked by cabi.c), ordered after mark (the
// caller's stream's work at the issue; nil: none), and returns its error.
func runSlot(g *trainer.Group, s *C.migctl_slot_t, mark comm.Event) error {
	g, buf, err := slotGroup(g, s, mark)
	if err != nil {
		return err
	}
	chained.await(g)
	send, recv := s.send, s.recv
	n, size := int(s.count), g.Size()
	o := trainer.Op(s.op)
	inPlace := send == recv
	ctx := context.Background()
	switch s.kind {
	case kindAllReduce:
		return g.AllReduce(ctx, buf(send, n), buf(recv, n), o)
	case kindReduceScatter:
		sn, rn := n*size, n
		if inPlace {
			rn = sn
		}
		return g.ReduceScatter(ctx, buf(send, sn), buf(recv, rn), o)
	case kindAllGather:
		sn := n
		if inPlace {
			sn = n * size
		}
		return g.AllGather(ctx, buf(send, sn), buf(recv, n*size))
	case kindBroadcast:
		snd := trainer.Buffer{}
		if send != nil {
			snd = buf(send, n)
		}
		return g.Broadcast(ctx, snd, buf(recv, n), int(s.root))
	case kindBarrier:
		return g.Barrier(ctx)
	}
	return fmt.Errorf("libmigctl: collective kind %d: %w", s.kind, comm.ErrInvalid)
}

//export migctlGoSetTimeout
func migctlGoSetTimeout(id C.int, ms C.int64_t) C.int {
	g, err := groupOf(int(id))
	if err != nil {
		return fail(err)
	}
	if ms > C.int64_t(math.MaxInt64/int64(time.Millisecond)) {
		return fail(fmt.Errorf("libmigctl: collective timeout of %d ms: too long: %w", int64(ms), comm.ErrInvalid))
	}
	// SetTimeout refuses the rest (0 and negative).
	if err := g.SetTimeout(time.Duration(ms) * time.Millisecond); err != nil {
		return fail(fmt.Errorf("libmigctl: %w", err))
	}
	return C.MIGCTL_OK
}

// migctlGoNewGroup forms a group of the n ranks at ranks (their ranks in
// the process's group) named name, and returns its id (> 0) or the error's
// code.
//
//export migctlGoNewGroup
func migctlGoNewGroup(ranks *C.int, n C.int, name *C.char) C.int {
	g, err := current()
	if err != nil {
		return fail(err)
	}
	list := make([]int, int(n))
	for i, r := range unsafe.Slice(ranks, int(n)) {
		list[i] = int(r)
	}
	mu.Lock()
	full := groupsFull()
	mu.Unlock()
	if full != nil {
		return fail(full)
	}
	s, err := g.NewGroup(initCtx(), C.GoString(name), list)
	if err != nil {
		return fail(fmt.Errorf("libmigctl: migctl_new_group: %w", err))
	}
	mu.Lock()
	defer mu.Unlock()
	switch {
	case closed:
		_ = s.Close()
		return fail(fmt.Errorf("libmigctl: migctl_finalize was called: %w", trainer.ErrClosed))
	case groupsFull() != nil: // formed meanwhile on other threads
		_ = s.Close()
		return fail(groupsFull())
	}
	lastSub++
	subs[lastSub] = s
	return C.int(lastSub)
}

// groupsFull says why no more groups may be formed (nil: they may); mu held.
func groupsFull() error {
	if lastSub < C.MIGCTL_MAX_GROUPS-1 {
		return nil
	}
	return fmt.Errorf("libmigctl: migctl_new_group: this process formed %d groups, the most it may: %w", lastSub, comm.ErrInvalid)
}

// migctlGoFreeGroup closes group id (cabi.c refuses new collectives on it
// already).
//
//export migctlGoFreeGroup
func migctlGoFreeGroup(id C.int) C.int {
	mu.Lock()
	s := subs[int(id)]
	delete(subs, int(id))
	mu.Unlock()
	if s == nil {
		return fail(fmt.Errorf("libmigctl: migctl_free_group: no group %d: %w", id, comm.ErrInvalid))
	}
	if err := s.Close(); err != nil {
		return fail(fmt.Errorf("libmigctl: migctl_free_group %d: %w", id, err))
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

// migctlGoServe hosts the rendezvous of a group of size ranks on a new
// abstract Unix socket (no file to remove), guarded by the job token, and
// writes its address (with a NUL) to out.
//
//export migctlGoServe
func migctlGoServe(size C.int, out *C.char, outLen C.size_t) C.int {
	mu.Lock()
	defer mu.Unlock()
	switch {
	case served != nil:
		return fail(fmt.Errorf("libmigctl: migctl_serve: this process hosts a rendezvous already: %w", comm.ErrInvalid))
	case closed:
		return fail(fmt.Errorf("libmigctl: migctl_finalize was called: %w", trainer.ErrClosed))
	case out == nil:
		return fail(fmt.Errorf("libmigctl: migctl_serve: NULL address buffer: %w", comm.ErrInvalid))
	}
	token := os.Getenv(trainer.EnvToken)
	if token == "" {
		return fail(fmt.Errorf("libmigctl: migctl_serve: %s is not set (migctl run sets it): %w", trainer.EnvToken, comm.ErrInvalid))
	}
	b := make([]byte, 8)
	_, _ = rand.Read(b) // never fails on Linux
	name := "@migctl-node-" + hex.EncodeToString(b)
	addr := "unix://" + name
	if len(addr)+1 > int(outLen) {
		return fail(fmt.Errorf("libmigctl: migctl_serve: the address needs %d bytes, the buffer has %d: %w", len(addr)+1, outLen, comm.ErrInvalid))
	}
	srv, err := rendezvous.NewServer(token, int(size))
	if err != nil {
		return fail(fmt.Errorf("libmigctl: migctl_serve: %w", err))
	}
	lis, err := net.Listen("unix", name)
	if err != nil {
		return fail(fmt.Errorf("libmigctl: migctl_serve: listening at %s: %w", addr, err))
	}
	h := &hosted{srv: srv, lis: lis, done: make(chan struct{})}
	go func() { _ = srv.Serve(lis); close(h.done) }()
	served = h
	dst := unsafe.Slice((*byte)(unsafe.Pointer(out)), int(outLen))
	dst[copy(dst, addr)] = 0
	return C.MIGCTL_OK
}

//export migctlGoFinalize
func migctlGoFinalize() C.int {
	mu.Lock()
	g, done, h := group, dispatched, served
	group, closed, served = nil, true, nil
	clear(subs) // g's Close closes them
	mu.Unlock()
	var err error
	if g != nil {
		// cabi.c refuses new collectives now; the dispatcher runs the issued ones.
		C.migctl_stop_dispatcher()
		<-done
		err = g.Close()
	}
	if h != nil {
		h.srv.Stop()
		h.lis.Close()
		<-h.done
	}
	if err != nil {
		return fail(err)
	}
	return C.MIGCTL_OK
}
