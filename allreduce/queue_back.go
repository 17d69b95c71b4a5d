package allreduce

import (
	"fmt"
	"sync/atomic"

	"github.com/migctl/migctl/comm"
)

// Copies back queued on the device (Options.QueueCopiesBack).
//
// A chained all-reduce readies its caller (WithReady) once its in lane has
// queued its last copy back. On the CPU path the in lane queues a chunk's
// copy back only once it has seen every rank's reduced flag of the chunk,
// so the caller learns of the result once the last chunk is reduced. With
// QueueCopiesBack, a call whose chunks all fit the slots (DDP's last
// bucket, 8 chunks of 2 MiB) queues every copy out at once, and its in
// lane, as soon as they are queued, queues every copy back behind
// device-side waits for that chunk's reduced flags (cuStreamWaitValue64 on
// the flag words) and readies the caller: at the issue, as NCCL's callers
// are, or, behind a chained call still running, once that call's in lane
// has finished (a rank's lanes run its calls in order). A larger call runs as before (its copies out wait for slots that
// its own copies back free, so the in lane cannot wait for them first). The CPU still follows every step (its flags first, through the
// transport's wait, which notices a dead peer; then its event) and raises
// this rank's fetched flags as before.
//
// Why no rank can deadlock, with FIFO hardware queues shared by streams:
// every device wait is queued after every copy out of its call on this rank
// (the out lane has queued them all), and a reduced flag of the call needs
// only every rank's copies out of the call — queued, on every rank, before
// that rank's waits of the call, and behind nothing but earlier calls'
// waits, which need earlier calls' copies out only (by induction over the
// calls). What a wait can still cost is time: work queued behind it on a
// hardware queue it shares (the next call's copies out, the training's
// kernels: CUDA_DEVICE_MAX_CONNECTIONS) starts only once the chunk is
// reduced. A failed call releases the waits (releaseWaits).

// queuedBack counts the calls of this process that queued their copies
// back behind device waits.
var queuedBack atomic.Uint64

// QueuedBackCalls is how many all-reduces of this process, on every
// executor, have queued their copies back behind device waits
// (Options.QueueCopiesBack), for diagnosis (libmigctl's
// MIGCTL_STAT_QUEUED_BACK).
func QueuedBackCalls() uint64 { return queuedBack.Load() }

// queuesCopiesBack reports whether calls of p may queue their copies back
// behind device waits (queueBackCall says which do).
func (e *Executor) queuesCopiesBack(p Params) bool {
	return e.opts.QueueCopiesBack && e.words != nil && chainable(p)
}

// queueBackCall reports whether this rank's call of p, split into lanes,
// queues its copies back behind device waits (when run under WithReady):
// every step of the in lane is a copy back with bytes to copy and no wait
// on the previous call's flags (cross), and no copy out waits for a flag of
// the call (its chunks fit the slots), so the out lane queues them all
// without waiting for the in lane, which waits for that before it queues.
func (e *Executor) queueBackCall(p Params, lanes [NumLanes][]*Step, cross [NumLanes][][]Cond) bool {
	if !e.queuesCopiesBack(p) || len(cross[LaneIn]) > 0 || len(lanes[LaneIn]) == 0 || len(lanes[LaneOut]) == 0 {
		return false
	}
	for _, st := range lanes[LaneIn] {
		if st.Kind != CopyIn || st.Len == 0 || st.DeviceFlags {
			return false
		}
	}
	for _, st := range lanes[LaneOut] {
		if len(st.Wait) > 0 || st.DeviceFlags {
			return false
		}
	}
	return true
}

// queueBehindWaits queues st on lane's stream behind a device-side wait
// for each of its flags and returns the event recorded after it.
func (e *Executor) queueBehindWaits(lane Lane, st *Step, call Call, epoch uint64, world int) (comm.Event, error) {
	ws, ok := e.streams[lane].(comm.WordStream)
	if !ok {
		return nil, fmt.Errorf("lane %d's stream cannot wait for flag words: %w", lane, ErrUnsupported)
	}
	for _, c := range st.Wait {
		if e.tr.Flag(c.Flag) >= epoch|c.Value {
			continue // reached: nothing to wait for
		}
		if err := ws.WaitWord(e.words.FlagWord(c.Flag), epoch|c.Value); err != nil {
			return nil, err
		}
	}
	ev, err := e.issue(lane, st, call, world)
	if err == nil && ev == nil {
		err = fmt.Errorf("a %s step of %d bytes queued nothing: %w", st.Kind, st.Len, ErrUnsupported)
	}
	return ev, err
}
