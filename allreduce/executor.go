package allreduce

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/migctl/migctl/comm"
)

// Transport is what the executor needs from the shared-memory layer: the
// arena, single-writer sequence flags, and failure propagation.
// comm.ShmTransport implements it.
type Transport interface {
	Rank() int
	World() int
	Arena() []byte
	Flag(i int) uint64
	Set(i int, v uint64)
	// Wait blocks until flag i ≥ v; it fails (having raised the abort flag)
	// when ctx ends, the job is aborted or a peer is dead.
	Wait(ctx context.Context, i int, v uint64) error
	Abort()
	Aborted() error
}

var _ Transport = (*comm.ShmTransport)(nil)

// Options tune an Executor; zero values pick defaults.
type Options struct {
	// Chunk is the arena slot size in bytes (default 2 MiB).
	Chunk int
	// Slots is the number of slots per rank: the pipeline depth (default 4).
	Slots int
	// Depth bounds the asynchronous copies a lane keeps in flight (default 2).
	Depth int
	// ReduceWorkers bounds the goroutines one host reduction uses (default:
	// about 14/world, at most 6 and at most half the cores).
	ReduceWorkers int
	// SmallSpin is how long the waits of a collective that runs on one
	// lane (the small-message all-reduce, barriers) poll flags and events
	// before they sleep. Default: 300 µs when the ranks of the node are at
	// most half its cores (each such call polls on one core per rank while
	// it lasts), else EventSpin and the transport's own spin; negative: the
	// same as that. Measured on one H200, 7 ranks, 8 KiB (-c 1, same call):
	// 90.9-95.6 µs with the 20/30-µs spins, 75.4 µs at 300 µs, 79.4 at 1 ms.
	SmallSpin time.Duration
	// EventSpin is how long a lane polls a device event back to back before
	// it naps between polls (default 30µs).
	EventSpin time.Duration
	// SmallBytes is the largest host-staged all-reduce that takes the
	// small-message schedule (HostStagedSmall), capped by what the arena
	// holds (SmallCapacity); default DefaultSmallBytes, negative: never.
	// Like Chunk and Slots, it must be the same on every rank.
	SmallBytes int
	// WholeChunks makes every host-staged all-reduce move whole chunks
	// (Params.Piece 0). By default one of at most Slots/4 chunks moves
	// quarter chunks (PieceFor). Like Chunk, the same on every rank.
	WholeChunks bool
	// Trace, when set, receives a summary of per-step timings of every call
	// at Close (see trace.go). Nil costs nothing.
	Trace io.Writer
	// GPUShare is the part of every chunk of a host-staged all-reduce, in
	// thousandths, that the devices reduce from mapped host memory instead
	// of the CPU threads (Params.GPUShare; Machine.ResolveGPUShare turns a
	// reduce-on setting into it). Like Chunk, the same on every rank.
	GPUShare int
	// SmallOnDevice makes the small-message all-reduce reduce on the
	// devices (Params.SmallOnDevice): each rank's stream waits for the
	// peers' staged inputs and reduces them itself, where the device can
	// wait for flags (comm.WordDevice; elsewhere the CPU waits and the
	// device still reduces). Like Chunk, the same on every rank: the device
	// folds the inputs one by one where the CPU adds them in pairs, so float
	// results may differ in the last bit between the two ways.
	SmallOnDevice bool
	// BroadcastOnDevice lets Communicator.BroadcastOrdered put the flags of
	// a broadcast of at most one chunk on the devices (where their streams
	// can wait for and write them: comm.WordDevice) and return once it is
	// queued. Unlike SmallOnDevice it may differ between ranks: the flags
	// and slot are the CPU schedule's.
	BroadcastOnDevice bool
	// QueueCopiesBack lets a chained all-reduce run under WithReady whose
	// chunks all fit the slots queue every copy out at once and then every
	// copy back, each behind device-side waits for its chunk's reduced
	// flags, and call ready then (at the issue), not once the last chunk is
	// reduced (queue_back.go). Needs streams that wait for flag words
	// (comm.WordStream); without them it does nothing. A local choice:
	// ranks may differ.
	QueueCopiesBack bool
}

// Staged is the arena geometry the host-staged collectives of ranks that
// stage device buffers through host memory (the gpu backend) use by
// default for a node of ranks local ranks: 8 slots of
// pow2floor(16 MiB / ranks), within 1..8 MiB. Measured on H200s (256 MiB
// fp32 all-reduce, one GPU, docs/results/collectives-h200.md): 2 ranks
// 14.5-14.9 ms at 4 MiB -> 12.8 ms at 8 MiB (16 MiB: 16.2); 7 ranks 44.1 ms
// at 4 MiB -> 43.7 at 2 MiB, and the best of every earlier grid was 2 MiB
// with 7 ranks. shmBytes, when positive, is the size of the shared-memory
// filesystem: the chunk halves (down to 256 KiB) until the arena,
// (ranks+1)·slots·chunk, takes at most half of it, so that a small /dev/shm
// (a container's 64 MiB) is not overrun.
func Staged(ranks int, shmBytes int64) (chunk, slots int) {
	slots = 8
	chunk = 8 << 20
	for chunk > 1<<20 && chunk*max(ranks, 1) > 16<<20 {
		chunk /= 2
	}
	return FitShm(ranks, chunk, slots, shmBytes), slots
}

// FitShm is chunk halved, down to 256 KiB, until the arena of ranks ranks
// with slots slots, (ranks+1)·slots·chunk, takes at most half of shmBytes,
// the size of the shared-memory file system (0 or less: unknown, chunk as
// it is), so that a small one (a container's 64 MiB /dev/shm) is not overrun.
func FitShm(ranks, chunk, slots int, shmBytes int64) int {
	for shmBytes > 0 && chunk > 256<<10 && int64(ArenaBytes(ranks, chunk, slots)) > shmBytes/2 {
		chunk /= 2
	}
	return chunk
}

// FitArena shrinks an arena geometry until (ranks+1)·slots·chunk is at
// most budget bytes (budget 0 or less: no limit): first the chunk, halved
// down to 256 KiB, then the slots, halved down to 2, then the chunk again,
// down to the smallest a schedule of ranks ranks accepts (64·ranks·8
// bytes, and 64 KiB). What cannot shrink further is returned as it is; the
// caller's allocation then fails with the file system's own error. Groups
// formed after others on a small shared-memory file system (a container's
// 64-MiB /dev/shm: point-to-point links, groups of some ranks) shrink this
// way rather than fail.
func FitArena(ranks, chunk, slots int, budget int64) (int, int) {
	over := func() bool { return budget > 0 && int64(ArenaBytes(ranks, chunk, slots)) > budget }
	for over() && chunk > 256<<10 {
		chunk /= 2
	}
	for over() && slots > 2 {
		slots /= 2
	}
	least := max(64<<10, 64*8*max(ranks, 1))
	for over() && chunk/2 >= least && chunk%128 == 0 {
		chunk /= 2
	}
	return chunk, slots
}

// DefaultSmallBytes is the default Options.SmallBytes.
const DefaultSmallBytes = 64 << 10

// DefaultOptions fills in zero fields for a world size.
func (o Options) withDefaults(world int) Options {
	if o.Chunk <= 0 {
		o.Chunk = 2 << 20
	}
	if o.Slots <= 0 {
		o.Slots = 4
	}
	if o.Depth <= 0 {
		o.Depth = 2
	}
	if o.ReduceWorkers <= 0 {
		// What measured best for 256 MiB on H200 hosts of 16 and 32
		// cores (2 workers for 7 ranks, 6 for 2 ranks): about 14/world,
		// at most 6 and at most half the cores.
		o.ReduceWorkers = max(1, min(6, numCPU()/2, 14/world))
	}
	if o.EventSpin <= 0 {
		o.EventSpin = defaultEventSpin
	}
	switch {
	case o.SmallSpin < 0:
		o.SmallSpin = 0
	case o.SmallSpin == 0 && 2*world <= numCPU():
		o.SmallSpin = defaultSmallSpin
	}
	if o.SmallBytes == 0 {
		o.SmallBytes = DefaultSmallBytes
	}
	o.SmallBytes = min(o.SmallBytes, SmallCapacity(world, o.Chunk, o.Slots))
	o.GPUShare = min(max(o.GPUShare, 0), GPUShareOne)
	return o
}

// Executor runs schedules for one rank. It is not safe for concurrent use:
// collectives on one communicator are called in the same order on every rank,
// one at a time.
type Executor struct {
	dev     comm.Device
	tr      Transport
	sw      spinWaiter // tr, when its waits take a spin (nil: not)
	opts    Options
	streams [NumLanes]comm.Stream
	words   wordTransport // tr, when the streams wait for and write its flags themselves (nil: the CPU does)
	calls   uint64
	broken  error   // (mu) set by the first failure: every later call fails at once
	prev    Params  // the previous call's schedule parameters
	fenced  bool    // whether the previous call began once every rank had finished the one before it
	trace   *tracer // nil unless Options.Trace

	// Reused from call to call, so that a call allocates nothing here:
	// each schedule's steps split by lane (keyed by the rank's first
	// step: the Communicator caches schedules), each lane's queue of steps
	// in flight and its list of host sources.
	split   map[*Step]laneSplit
	flights [NumLanes][]inflight
	srcs    [NumLanes][][]byte
	// free are each lane's events that completed and were consumed,
	// recorded again rather than new ones (streams that can:
	// comm.EventStream; a new event costs a few allocations and a
	// finalizer).
	free [NumLanes][]comm.Event

	// red is how host reductions run: ReduceWorkers goroutines, results
	// stored non-temporally where copy engines read them next
	// (comm.NonTemporalFor).
	red comm.ReduceOptions

	ord      orderedState  // stream-ordered calls outstanding (ordered.go)
	maxEpoch atomic.Uint64 // the latest call's epoch (what a release must exceed)

	// sigs[g] is the signature of this rank's latest call of generation g
	// (calls of even and odd number: two may be in progress, see chain.go);
	// sigSeen[g][q] the epoch whose signature of rank q matched it
	// (signature.go).
	sigs    [2]signature
	sigSeen [2][]atomic.Uint64

	// mu guards broken and chain: a chained call ends on its own goroutine
	// while the next one starts (chain.go).
	mu    sync.Mutex
	chain *chainCall // the latest host-staged all-reduce, until it has ended
	// overlaps counts the calls that started before the previous one ended.
	overlaps atomic.Uint64
}

// laneSplit is one rank's steps of a schedule by lane.
type laneSplit struct {
	n     int // the rank's step count (a different slice of steps splits anew)
	lanes [NumLanes][]*Step
}

// lanesOf splits steps by lane, once per schedule.
func (e *Executor) lanesOf(steps []Step) [NumLanes][]*Step {
	if len(steps) == 0 {
		return [NumLanes][]*Step{}
	}
	if s, ok := e.split[&steps[0]]; ok && s.n == len(steps) {
		return s.lanes
	}
	var lanes [NumLanes][]*Step
	for i := range steps {
		lanes[steps[i].Lane] = append(lanes[steps[i].Lane], &steps[i])
	}
	if e.split == nil || len(e.split) >= 1024 {
		e.split = map[*Step]laneSplit{}
	}
	e.split[&steps[0]] = laneSplit{len(steps), lanes}
	return lanes
}

// NewExecutor registers the transport's arena with dev and opens one stream
// per lane. Close undoes both.
func NewExecutor(dev comm.Device, tr Transport, opts Options) (*Executor, error) {
	opts = opts.withDefaults(tr.World())
	if need := ArenaBytes(tr.World(), opts.Chunk, opts.Slots); len(tr.Arena()) < need {
		return nil, fmt.Errorf("arena of %d bytes, schedules need %d: %w", len(tr.Arena()), need, comm.ErrInvalid)
	}
	if err := dev.Register(tr.Arena()); err != nil {
		return nil, fmt.Errorf("registering the shared arena with the device: %w", err)
	}
	e := &Executor{dev: dev, tr: tr, opts: opts, sigSeen: [2][]atomic.Uint64{make([]atomic.Uint64, tr.World()), make([]atomic.Uint64, tr.World())},
		red: comm.ReduceOptions{Workers: opts.ReduceWorkers, NonTemporal: comm.NonTemporalFor(comm.ReadsByDMA(dev))}}
	e.sw, _ = tr.(spinWaiter)
	if opts.Trace != nil {
		e.trace = newTracer(opts.Trace, tr.Rank())
	}
	for l := range e.streams {
		s, err := dev.NewStream()
		if err != nil {
			_ = e.Close()
			return nil, fmt.Errorf("creating stream for lane %d: %w", l, err)
		}
		e.streams[l] = s
	}
	if opts.SmallOnDevice || opts.BroadcastOnDevice || opts.QueueCopiesBack {
		e.words = streamWords(dev, tr, e.streams)
	}
	return e, nil
}

// Options are the executor's effective options.
func (e *Executor) Options() Options { return e.opts }

// Close closes the streams and unregisters the arena (and writes the trace
// summary when tracing).
func (e *Executor) Close() error {
	errs := []error{e.closeOrdered()}
	if e.trace != nil {
		e.trace.summary()
	}
	undrained := false
	for _, s := range e.streams {
		if s != nil {
			err := s.Close()
			undrained = undrained || errors.Is(err, comm.ErrNotDrained)
			errs = append(errs, err)
		}
	}
	if undrained {
		// Work that may still run keeps the memory it was given.
		return errors.Join(append(errs, fmt.Errorf("the arena and flags stay registered: %w", comm.ErrNotDrained))...)
	}
	if e.words != nil {
		errs = append(errs, e.dev.Unregister(e.words.FlagMemory()))
	}
	errs = append(errs, e.dev.Unregister(e.tr.Arena()))
	return errors.Join(errs...)
}

// Flag values are epoch | value: the epoch counts the executor's calls in
// the bits from EpochShift up, the value counts within one call (a step's
// Cond.Value, below MaxCondValue: Build refuses a schedule that needs
// more). Flags only grow, and waits compare with >=, so a group's flags are
// good for 2^(64-EpochShift) calls: 2^36, 40 days of calls back to back
// at 20k a second (with 32 bits, as before, 2^32: 2.5 days).
const (
	EpochShift   = 28
	MaxCondValue = 1<<EpochShift - 1
)

// epochOf is the epoch of call number calls (from 1).
func epochOf(calls uint64) uint64 { return calls << EpochShift }

// Call is one collective call's user buffers.
type Call struct {
	Send, Recv comm.Buffer
	// SendBase and RecvBase are added to every offset into Send and Recv
	// (in-place reduce-scatter and all-gather: rank·block).
	SendBase, RecvBase int
	DType              comm.DType
	Op                 comm.Op
	// PeerSend and PeerRecv are the previous rank's buffers, opened through
	// IPC (RingIPC schedules only; with one rank, this rank's own).
	PeerSend, PeerRecv comm.Buffer
	// After are events of the work that produces Send (the caller's
	// stream; WithAfter adds to them): a stream-ordered call's stream
	// waits for them on the device (RunOrdered), and a chainable
	// all-reduce's out lane; any other call waits on the CPU before it
	// starts.
	After []comm.Event
}

// Run executes rank's part of sched. It blocks until this rank's part is
// done (its receive buffer holds the result) or fails. After a failure the
// executor is broken: every later Run fails at once.
//
// Calls run one at a time, except that a host-staged all-reduce run with an
// admit function in ctx (WithAdmit) calls it once its copies out are done,
// and the caller may then start the next call from another goroutine while
// this one goes on (chain.go).
func (e *Executor) Run(ctx context.Context, sched Schedule, call Call) error {
	prev := e.awaitChain(sched, call) // nil: no call in progress any more
	if err := e.precheck(ctx, sched, prev == nil); err != nil {
		return err
	}
	// A chainable call reads its input only through its copies out (the in
	// lane writes the receive buffer after every rank's copies out are
	// done): the out lane's stream waits for the input's producer on the
	// device. Any other call waits on the CPU (no stream), first.
	chain := chainable(sched.Params)
	after := afterOf(ctx, call)
	call.After = nil
	if !chain {
		if err := e.orderAfter(ctx, nil, after); err != nil {
			return err
		}
	}
	// Stream-ordered calls still outstanding finish first (ordered.go).
	if err := e.settle(ctx, -1); err != nil {
		return err
	}
	var cur *chainCall
	if chain {
		// The previous call's copies out are done (awaitChain): only this
		// call's wait behind the device wait.
		if err := e.orderAfter(ctx, e.streams[LaneOut], after); err != nil {
			return err
		}
		cur = newChainCall(sched.Params, call.Recv)
		if prev != nil {
			cur.prevDone = prev.done
		}
		if err := e.startChain(cur); err != nil {
			return err
		}
	}
	e.calls++
	epoch := epochOf(e.calls)
	e.maxEpoch.Store(epoch)
	r := e.tr.Rank()
	fence := e.calls > 1 && needsFenceAfter(e.prev, e.fenced, sched.Params)
	links := lanesLinks{cur: cur, prev: prev}
	if e.calls > 1 {
		links.cross, links.prevEpoch = crossWaits(e.prev, sched.Params), epochOf(e.calls-1)
	}
	if cur != nil && e.trace == nil {
		links.admit = admitOf(ctx)
		links.ready = readyOf(ctx)
	}
	e.prev, e.fenced = sched.Params, fence || e.calls == 1
	if e.trace != nil {
		e.trace.begin(sched.Params, sched.Steps[r], e.tr)
	}
	direct := sched.Params.Algorithm == RingIPC && sched.Params.World > 1
	err := e.enterDirect(ctx, direct, epoch)
	if err == nil {
		err = e.run(ctx, sched, call, epoch, fence, links)
	}
	if e.trace != nil && err == nil {
		e.trace.end(e.tr)
	}
	if err == nil && sched.Params.SmallOnDevice {
		// A rank that failed releases the device waits on its flags
		// (releaseWaits): work that got past them read no real input.
		err = e.tr.Aborted()
	}
	if prev != nil {
		// End-of-call flags go up in call order, and failures are handled
		// one call after the other.
		<-prev.done
	}
	if err == nil {
		e.tr.Set(FlagOf(r, RoleFin), epoch|1)
		err = e.leaveDirect(ctx, direct, epoch)
	}
	if err != nil {
		err = e.failCall(cur, sched, err)
	}
	e.endChain(cur)
	return err
}

// enterDirect and leaveDirect bracket a schedule whose steps read the
// previous rank's user buffers directly (RingIPC). A rank's send buffer is
// its input only from the moment it enters the call, so a rank announces
// its entry (its end-of-call flag at epoch|0, which is more than any earlier
// call's epoch|1) and waits for the previous rank's before it reads; and
// the next rank reads this rank's buffers until its own last step, so a
// rank returns only once the next rank has finished — after that the caller
// may reuse its buffers, as after any collective.
func (e *Executor) enterDirect(ctx context.Context, direct bool, epoch uint64) error {
	if !direct {
		return nil
	}
	r, n := e.tr.Rank(), e.tr.World()
	e.tr.Set(FlagOf(r, RoleFin), epoch)
	prev := (r + n - 1) % n
	if err := e.tr.Wait(ctx, FlagOf(prev, RoleFin), epoch); err != nil {
		return fmt.Errorf("rank %d waiting for rank %d to enter the collective: %w", r, prev, err)
	}
	return nil
}

func (e *Executor) leaveDirect(ctx context.Context, direct bool, epoch uint64) error {
	if !direct {
		return nil
	}
	r, n := e.tr.Rank(), e.tr.World()
	next := (r + 1) % n
	if err := e.tr.Wait(ctx, FlagOf(next, RoleFin), epoch|1); err != nil {
		return fmt.Errorf("rank %d waiting for rank %d to finish reading its buffers: %w", r, next, err)
	}
	return nil
}

// drain waits briefly for queued device work so that buffers are not
// written after Run returned an error.
//
// With the device waiting for flags (small all-reduces on the devices), it
// releases the waits of scheds again on every round: a peer's stream may
// lower a released flag when it writes its own afterwards.
func (e *Executor) drain(scheds ...Schedule) {
	var evs []comm.Event
	for _, s := range e.streams {
		if s == nil {
			continue
		}
		if ev, err := s.Record(); err == nil { // an error: the stream runs nothing more
			evs = append(evs, ev)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		for _, s := range scheds {
			e.releaseWaits(s)
		}
		e.rerelease()
		idle := true
		for _, ev := range evs {
			done, err := ev.Done()
			idle = idle && (done || err != nil)
		}
		if idle || time.Now().After(deadline) {
			return
		}
		nap(eventNap)
	}
}

// needsFence reports whether a call must wait until every rank finished the
// previous one. Not needed for a barrier (it touches no arena memory), nor
// for a host-staged all-reduce after a barrier, or after a host-staged
// all-reduce: its first chunks wait for the previous call's flags of the
// slots they reuse (crossWaits), and the slots the previous call did not
// use are clear (see chain.go).
//
// A small-message all-reduce (HostStagedSmall) needs none after a barrier,
// a host-staged all-reduce or another small one: it stages into the
// parity's input area, which no rank reads any more once this rank finished
// the previous call (that needed every rank to have entered it, so to have
// finished the one before), and it writes its result area only after every
// rank staged. A host-staged all-reduce after a small one does need it:
// slower ranks may still be reducing from the input areas it stages into.
// A hierarchical all-reduce needs none after a barrier, or after another
// with the same grouping (with one group: and the same size).
func needsFence(prev, next Params) bool {
	if next.Coll == Barrier {
		return false
	}
	ar := func(p Params, a Algorithm) bool { return p.Coll == AllReduce && p.Algorithm == a }
	switch {
	case ar(next, HostStaged):
		return !(ar(prev, HostStaged) || prev.Coll == Barrier)
	case ar(next, HostStagedSmall):
		return !(ar(prev, HostStaged) || ar(prev, HostStagedSmall) || prev.Coll == Barrier)
	case ar(next, Hierarchical):
		// Its CPU reductions wait until every rank entered the call, and a
		// rank that finished the previous one (same grouping) has seen every
		// partial and every reduction of it done: see buildHierarchicalAllReduce.
		// With one group, slower ranks may still fetch the previous call's
		// parts from this rank's area, which only the same size keeps clear
		// of what this call stages there.
		same := ar(prev, Hierarchical) && prev.Groups == next.Groups &&
			(next.Groups.Count() > 1 || prev.Bytes == next.Bytes && prev.ElemSize == next.ElemSize)
		return !(same || prev.Coll == Barrier)
	}
	return true
}

// needsFenceAfter is needsFence knowing whether the previous call was
// fenced itself (or the first): a one-chunk broadcast right after a fenced
// one-chunk broadcast of the other parity needs no fence. It stages into
// another slot than that one (Params.Parity), which slower ranks may still
// read, and the slot it stages into was last used before that fence; its
// readers wait for the root's flag of this call, and a later call fences
// (the previous one then was not). Every rank is thus at most one call
// ahead of a rank still in a call, as the signatures need. DDP's two
// buffer broadcasts per forward pass (one per element type) then wait for
// the root only, not also for the slowest rank to have received the first.
func needsFenceAfter(prev Params, prevFenced bool, next Params) bool {
	oneChunk := func(p Params) bool {
		return p.Coll == Broadcast && p.Algorithm == HostStaged && p.Bytes <= p.Chunk && p.Slots >= 2
	}
	if prevFenced && oneChunk(prev) && oneChunk(next) && prev.Parity != next.Parity {
		return false
	}
	return needsFence(prev, next)
}

// fence waits until every rank has finished the call before the one of
// epoch, so that no arena slot or flag of it is still in use anywhere.
func (e *Executor) fence(ctx context.Context, epoch uint64) error {
	prev := epoch - epochOf(1)
	if prev == 0 {
		return nil
	}
	for q := range e.tr.World() {
		if err := e.tr.Wait(ctx, FlagOf(q, RoleFin), prev|1); err != nil {
			return fmt.Errorf("rank %d waiting for rank %d to finish the previous collective: %w", e.tr.Rank(), q, err)
		}
	}
	if e.trace != nil {
		e.trace.cur.fence = e.trace.since()
	}
	return nil
}

// lanesLinks tie a call's lanes to the calls around it (chain.go).
type lanesLinks struct {
	cross     [NumLanes][][]Cond // per lane and step: flags of the previous call to wait for first
	prevEpoch uint64             // the previous call's epoch
	prev      *chainCall         // the call this one overlaps: each lane starts after prev's (nil: none)
	cur       *chainCall         // this call, when chainable: its lanes' ends are announced
	admit     func()             // called once the copies out are done (nil: not)
	ready     func(comm.Event)   // called once the copies back are queued (nil: not; WithReady)
}

// laneHooks connect a chained all-reduce's lanes to its caller and to each
// other (zero: none).
type laneHooks struct {
	// ready (the in lane) is called once every step is queued (WithReady).
	ready func(comm.Event)
	// queued (the out lane) is called once every step is queued; a lane
	// with it queues its steps regardless of Options.Depth.
	queued func()
	// outQueued (the in lane): the lane waits until it is closed (the out
	// lane has queued every step) and then queues every copy back at once
	// behind device-side waits for its flags (Options.QueueCopiesBack).
	outQueued <-chan struct{}
}

func (e *Executor) run(ctx context.Context, sched Schedule, call Call, epoch uint64, fence bool, links lanesLinks) error {
	r := e.tr.Rank()
	if fence {
		if err := e.fence(ctx, epoch); err != nil {
			return err
		}
	}
	// After the fence: see signature.go.
	if err := e.publishSignature(epoch, signatureOf(sched.Params, call)); err != nil {
		return err
	}
	lanes := e.lanesOf(sched.Steps[r])
	busy := 0
	for l := range lanes {
		if len(lanes[l]) > 0 {
			busy++
		}
	}
	if cur := links.cur; cur != nil {
		for l := range lanes {
			if len(lanes[l]) == 0 {
				close(cur.laneDone[l])
			}
		}
	}
	if busy == 1 && links.cur == nil {
		// One lane (the small-message all-reduce, barriers): run it here,
		// its waits polling for SmallSpin.
		for l := range lanes {
			if len(lanes[l]) == 0 {
				continue
			}
			if e.words != nil && deviceFlags(lanes[l]) {
				return withCause(ctx, e.runDeviceLane(ctx, Lane(l), lanes[l], call, epoch, sched.Params.World))
			}
			return withCause(ctx, e.runLane(ctx, Lane(l), lanes[l], call, epoch, sched.Params.World, e.opts.SmallSpin, nil, 0, laneHooks{}))
		}
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	errs := make([]error, NumLanes)
	order := make([]uint64, NumLanes)
	var failed atomic.Uint64
	var hooks [NumLanes]laneHooks
	hooks[LaneIn].ready = links.ready
	if links.ready != nil && e.queueBackCall(sched.Params, lanes, links.cross) {
		outQueued := make(chan struct{})
		hooks[LaneOut].queued = sync.OnceFunc(func() { close(outQueued) })
		hooks[LaneIn].outQueued = outQueued
	}
	for l := range lanes {
		if len(lanes[l]) == 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := e.afterLane(ctx, links.prev, Lane(l))
			if err == nil {
				err = e.runLane(ctx, Lane(l), lanes[l], call, epoch, sched.Params.World, 0, links.cross[l], links.prevEpoch, hooks[l])
			}
			if links.cur != nil {
				close(links.cur.laneDone[l])
			}
			if err != nil {
				errs[l], order[l] = err, failed.Add(1)
				e.tr.Abort()
				cancel(err)
				return
			}
			if Lane(l) == LaneOut && links.admit != nil {
				links.admit()
			}
		}()
	}
	wg.Wait()
	// Report the root cause: the error of a lane that waited for another
	// rank (it names the rank at fault), else of the lane that failed first
	// (the others fail after it, through the abort flag or the cancellation
	// it caused, and say less).
	// A wait for another rank's flag names the rank at fault: it goes first.
	// A call that differs from a peer's goes before all (the others fail
	// after it, through the abort flag it raised).
	var first error
	var at uint64
	peerWait := func(err error) bool {
		var we *waitError
		return errors.As(err, &we) && we.peer != e.tr.Rank()
	}
	rank := func(err error) int {
		var me *MismatchError
		switch {
		case errors.As(err, &me):
			return 2
		case peerWait(err):
			return 1
		}
		return 0
	}
	for l, err := range errs {
		if err == nil {
			continue
		}
		if first == nil || rank(err) > rank(first) || rank(err) == rank(first) && order[l] < at {
			first, at = err, order[l]
		}
	}
	return withCause(ctx, first)
}

// waitError is a lane's failure while it waited for a flag of rank peer.
type waitError struct {
	peer int
	err  error
}

func (w *waitError) Error() string { return w.err.Error() }
func (w *waitError) Unwrap() error { return w.err }

// withCause adds ctx's cause to err when err only says the context was
// cancelled (a caller that cancels with a cause, as the trainer's
// collective deadline does, gets it back matchable with errors.Is) and does
// not carry it already.
func withCause(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if c := context.Cause(ctx); c != nil && errors.Is(err, context.Canceled) && !errors.Is(c, context.Canceled) &&
		!errors.Is(err, c) {
		return fmt.Errorf("%w: %w", c, err)
	}
	return err
}

type inflight struct {
	st  *Step
	idx int // position in the lane (trace)
	ev  comm.Event
	// dev: the step was queued behind device-side waits for its flags,
	// which the CPU waits for (with the transport's checks) before ev.
	dev bool
}

func (e *Executor) ready(conds []Cond, epoch uint64) bool {
	for _, c := range conds {
		if e.tr.Flag(c.Flag) < epoch|c.Value {
			return false
		}
	}
	return true
}

// spinWaiter is a Transport whose waits can poll for a given time before
// they sleep (comm.ShmTransport).
type spinWaiter interface {
	WaitSpin(ctx context.Context, i int, v uint64, spin time.Duration) error
}

// wait waits for every condition; spin > 0 overrides the transport's spin.
func (e *Executor) wait(ctx context.Context, conds []Cond, epoch uint64, st *stepTrace, spin time.Duration) error {
	var prev, longest time.Duration
	if st != nil {
		prev = st.reach
	}
	for _, c := range conds {
		var err error
		if spin > 0 && e.sw != nil {
			err = e.sw.WaitSpin(ctx, c.Flag, epoch|c.Value, spin)
		} else {
			err = e.tr.Wait(ctx, c.Flag, epoch|c.Value)
		}
		if err != nil {
			return &waitError{peer: c.Flag / FlagsPerRank, err: fmt.Errorf("rank %d waiting for flag %d (rank %d) to reach %d: %w",
				e.tr.Rank(), c.Flag, c.Flag/FlagsPerRank, c.Value, err)}
		}
		if st != nil {
			// Waits run in flag order: the longest one marks the rank
			// that arrived last.
			now := e.trace.since()
			if d := now - prev; d > longest {
				st.slowRank, longest = c.Flag/FlagsPerRank, d
			}
			if now-prev >= 900*time.Microsecond {
				st.longWaits++
			}
			prev = now
		}
	}
	if st != nil {
		st.ready = prev
	}
	return nil
}

func (e *Executor) publish(sets []Cond, epoch uint64) {
	for _, c := range sets {
		e.tr.Set(c.Flag, epoch|c.Value)
	}
}

// afterLane waits until lane of the call this one overlaps (prev, nil:
// none) has run.
func (e *Executor) afterLane(ctx context.Context, prev *chainCall, lane Lane) error {
	if prev == nil {
		return nil
	}
	select {
	case <-prev.laneDone[lane]:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("lane %d waiting for the previous call's: %w", lane, context.Cause(ctx))
	}
}

// runLane runs one lane's steps; spin > 0 is how long its waits poll. Step
// i first waits for cross[i] at prevEpoch (the previous call's flags, see
// crossWaits), when cross has it. hooks.ready, when not nil, is called once
// every step is queued, before the lane waits for the last ones, with an
// event recorded after them on the lane's stream (WithReady); hooks.queued
// then too. With hooks.outQueued, the lane waits for it to close and then
// queues its steps at once behind device-side waits (queueBehindWaits).
func (e *Executor) runLane(ctx context.Context, lane Lane, steps []*Step, call Call, epoch uint64, world int, spin time.Duration,
	cross [][]Cond, prevEpoch uint64, hooks laneHooks) error {
	evSpin := e.opts.EventSpin
	if spin > 0 {
		evSpin = spin
	}
	// q[head:] are the steps in flight, oldest first (the lane's reused
	// array: a call allocates nothing for it).
	q, head := e.flights[lane][:0], 0
	defer func() { e.flights[lane] = q[:0] }()
	var tr []stepTrace // this lane's trace records (nil unless tracing)
	if e.trace != nil {
		tr = e.trace.cur.lanes[lane]
	}
	complete := func() error {
		f := q[head]
		q[head] = inflight{}
		if head++; head == len(q) {
			q, head = q[:0], 0
		}
		if f.dev {
			// Queued behind device waits: the flags first, on the CPU,
			// where the transport's wait notices a dead peer, the abort
			// flag and the deadline, which the event cannot.
			if err := e.wait(ctx, f.st.Wait, epoch, nil, spin); err != nil {
				return err
			}
			if err := e.checkPeers(f.st.Wait, epoch); err != nil {
				return err
			}
		}
		if err := waitEvent(ctx, f.ev, e.tr, evSpin); err != nil {
			return fmt.Errorf("lane %d: %s step: %w", lane, f.st.Kind, err)
		}
		e.consumed(lane, f.ev)
		if tr != nil {
			tr[f.idx].done = e.trace.since()
		}
		e.publish(f.st.Set, epoch)
		return nil
	}
	queueBack := hooks.outQueued != nil
	if queueBack {
		// The out lane queues every copy out without waiting for this
		// lane (the call's chunks fit the slots: queueBackCall).
		select {
		case <-hooks.outQueued:
		case <-ctx.Done():
			return fmt.Errorf("lane %d waiting for the copies out to be queued: %w", lane, context.Cause(ctx))
		}
	}
	reached := -1
	for i := 0; i < len(steps); {
		st := steps[i]
		if tr != nil && reached < i {
			reached = i
			tr[i].reach = e.trace.since()
			tr[i].ready = tr[i].reach
		}
		if queueBack {
			ev, err := e.queueBehindWaits(lane, st, call, epoch, world)
			if err != nil {
				return fmt.Errorf("lane %d: %s step queued behind its flags: %w", lane, st.Kind, err)
			}
			if tr != nil {
				tr[i].issued = e.trace.since()
				tr[i].done = tr[i].issued
			}
			if len(q) == cap(q) && head > 0 {
				q, head = q[:copy(q, q[head:])], 0
			}
			q = append(q, inflight{st, i, ev, true})
			i++
			continue
		}
		if len(q)-head >= e.opts.Depth && hooks.queued == nil {
			if err := complete(); err != nil {
				return err
			}
			continue
		}
		if i < len(cross) && !e.ready(cross[i], prevEpoch) {
			if len(q) > head {
				if err := complete(); err != nil {
					return err
				}
				continue
			}
			if err := e.wait(ctx, cross[i], prevEpoch, nil, spin); err != nil {
				return err
			}
		}
		if !e.ready(st.Wait, epoch) {
			if len(q) > head {
				if err := complete(); err != nil {
					return err
				}
				continue
			}
			var sttr *stepTrace
			if tr != nil {
				sttr = &tr[i]
				sttr.reach = e.trace.since() // the wait starts now
			}
			if err := e.wait(ctx, st.Wait, epoch, sttr, spin); err != nil {
				return err
			}
		} else if tr != nil {
			tr[i].ready = e.trace.since()
		}
		if err := e.checkPeers(st.Wait, epoch); err != nil {
			return err
		}
		async := st.Len > 0 && (st.Kind == CopyOut || st.Kind == CopyIn || st.Kind == ReduceIn ||
			st.Kind == ReducePeer || st.Kind == CopyPeer)
		if !async {
			// Flags are ordered per lane: finish what is in flight first.
			for len(q) > head {
				if err := complete(); err != nil {
					return err
				}
			}
		}
		ev, err := e.issue(lane, st, call, world)
		if err != nil {
			return fmt.Errorf("lane %d: %s step: %w", lane, st.Kind, err)
		}
		if tr != nil {
			tr[i].issued = e.trace.since()
			tr[i].done = tr[i].issued
		}
		i++
		if ev == nil {
			e.publish(st.Set, epoch)
			continue
		}
		if len(q) == cap(q) && head > 0 { // slide the live entries down rather than grow
			q, head = q[:copy(q, q[head:])], 0
		}
		q = append(q, inflight{st, i - 1, ev, false})
	}
	if hooks.queued != nil {
		hooks.queued()
	}
	if queueBack {
		queuedBack.Add(1)
	}
	if ready := hooks.ready; ready != nil {
		// A fresh event, not one of the lane's reused ones: the caller may
		// order a stream after it later, when the lane may have recorded
		// those again behind work that waits for other ranks.
		ev, err := e.streams[lane].Record()
		if err != nil {
			return fmt.Errorf("lane %d: recording the end of the copies back: %w", lane, err)
		}
		ready(ev)
	}
	for len(q) > head {
		if err := complete(); err != nil {
			return err
		}
	}
	return nil
}

func (e *Executor) buf(id BufID, call Call) (comm.Buffer, int) {
	if id == Send {
		return call.Send, call.SendBase
	}
	return call.Recv, call.RecvBase
}

func (e *Executor) host(s Span) []byte { return e.tr.Arena()[s.Off : s.Off+s.Len] }

// issue queues an asynchronous step and returns its event, or runs a
// synchronous one (host reduction, nop, empty span) and returns nil.
func (e *Executor) issue(lane Lane, st *Step, call Call, world int) (comm.Event, error) {
	if queued, err := e.enqueue(lane, st, call, world); !queued || err != nil {
		return nil, err
	}
	return e.record(lane)
}

// record records an event at the end of lane's stream: a consumed one again
// where the stream can, else a new one.
func (e *Executor) record(lane Lane) (comm.Event, error) {
	s := e.streams[lane]
	if f := e.free[lane]; len(f) > 0 {
		ev := f[len(f)-1]
		e.free[lane] = f[:len(f)-1]
		if err := s.(comm.EventStream).RecordEvent(ev); err != nil {
			return nil, err
		}
		return ev, nil
	}
	return s.Record()
}

// consumed gives back an event of lane that completed and that nothing
// refers to any more, for record.
func (e *Executor) consumed(lane Lane, ev comm.Event) {
	if _, ok := e.streams[lane].(comm.EventStream); ok && len(e.free[lane]) < 64 {
		e.free[lane] = append(e.free[lane], ev)
	}
}

// enqueue queues an asynchronous step on its lane's stream (true) or runs a
// synchronous one (false).
func (e *Executor) enqueue(lane Lane, st *Step, call Call, world int) (bool, error) {
	if st.Len == 0 && st.Kind != HostReduce || st.Kind == Nop {
		return false, nil
	}
	s := e.streams[lane]
	switch st.Kind {
	case CopyOut:
		b, base := e.buf(st.Buf, call)
		if err := s.CopyToHost(e.host(st.Host), b, base+st.Off); err != nil {
			return false, err
		}
	case CopyIn:
		b, base := e.buf(st.Buf, call)
		if err := s.CopyFromHost(b, base+st.Off, e.host(st.Host)); err != nil {
			return false, err
		}
	case ReduceIn:
		dst, dbase := e.buf(st.Buf, call)
		src, sbase := e.buf(st.Src, call)
		if dst != src || dbase+st.Off != sbase+st.SrcOff {
			if err := s.CopyBuffer(dst, dbase+st.Off, src, sbase+st.SrcOff, st.Len); err != nil {
				return false, err
			}
		}
		hosts := e.srcs[lane][:0] // reused: the streams keep no reference to the list
		for _, h := range st.Hosts {
			hosts = append(hosts, e.host(h))
		}
		e.srcs[lane] = hosts
		op := call.Op
		if op == comm.Avg {
			op = comm.Sum
		}
		reduce := s.ReduceFromHost
		if sr, ok := s.(comm.StagingReducer); ok && st.Stage {
			reduce = sr.ReduceFromHostStaged
		}
		if len(hosts) > 0 {
			if err := reduce(dst, dbase+st.Off, hosts, call.DType, op); err != nil {
				return false, err
			}
		}
		if st.Final && call.Op == comm.Avg {
			if err := s.Scale(dst, dbase+st.Off, st.Len, call.DType, world); err != nil {
				return false, err
			}
		}
	case ReducePeer, CopyPeer:
		dst, dbase := e.buf(st.Buf, call)
		peer := call.PeerSend
		if st.Peer == Recv {
			peer = call.PeerRecv
		}
		if peer == nil {
			return false, fmt.Errorf("%s step without the previous rank's buffer: %w", st.Kind, comm.ErrInvalid)
		}
		if st.Kind == CopyPeer {
			if err := s.CopyBuffer(dst, dbase+st.Off, peer, st.Off, st.Len); err != nil {
				return false, err
			}
			break
		}
		red, ok := s.(comm.BufferReducer)
		if !ok {
			return false, fmt.Errorf("stream %T cannot reduce device buffers: %w", s, ErrUnsupported)
		}
		src, sbase := e.buf(st.Src, call)
		if dst != src || dbase+st.Off != sbase+st.SrcOff {
			if err := s.CopyBuffer(dst, dbase+st.Off, src, sbase+st.SrcOff, st.Len); err != nil {
				return false, err
			}
		}
		op := call.Op
		if op == comm.Avg {
			op = comm.Sum
		}
		if err := red.ReduceBuffers(dst, dbase+st.Off, []comm.BufferSpan{{Buf: peer, Off: st.Off}}, st.Len, call.DType, op); err != nil {
			return false, err
		}
		if st.Final && call.Op == comm.Avg {
			if err := s.Scale(dst, dbase+st.Off, st.Len, call.DType, world); err != nil {
				return false, err
			}
		}
	case HostReduce:
		if st.Host.Len == 0 {
			return false, nil
		}
		hosts := e.srcs[lane][:0] // reused: the streams keep no reference to the list
		for _, h := range st.Hosts {
			hosts = append(hosts, e.host(h))
		}
		e.srcs[lane] = hosts
		op := call.Op
		if op == comm.Avg && !st.Final {
			op = comm.Sum
		}
		if op == comm.Avg && st.Div > 0 && st.Div != len(hosts) {
			// A sum of partial sums: divide by the world, not the inputs.
			if err := comm.ReduceHostWith(e.host(st.Host), hosts, call.DType, comm.Sum, e.red); err != nil {
				return false, err
			}
			return false, comm.ScaleHost(e.host(st.Host), call.DType, st.Div)
		}
		return false, comm.ReduceHostWith(e.host(st.Host), hosts, call.DType, op, e.red)
	default:
		return false, fmt.Errorf("step kind %d: %w", st.Kind, ErrUnsupported)
	}
	return true, nil
}
