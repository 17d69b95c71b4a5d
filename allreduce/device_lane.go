package allreduce

import (
	"context"
	"fmt"

	"github.com/migctl/migctl/comm"
)

// The small all-reduce on the devices (Options.SmallOnDevice) runs its one
// lane with the flags on the device: the CPU queues every step at once
// (copy out, write of this rank's flag, waits for the peers' flags, copy
// in, reduction) and then only waits for the end, so no CPU round trip sits
// between a peer's staged input and this rank's reduction of it.

// wordTransport is a Transport whose flags are words of memory a device
// can register (comm.ShmTransport).
type wordTransport interface {
	FlagMemory() []byte
	FlagWord(i int) []byte
}

// checker is a Transport that makes a wait's checks (abort, deadline, dead
// peers) for a caller that polls something else (comm.ShmTransport).
type checker interface {
	Check(ctx context.Context, what string) error
}

var (
	_ wordTransport = (*comm.ShmTransport)(nil)
	_ checker       = (*comm.ShmTransport)(nil)
)

// streamWords returns tr as a wordTransport when dev's streams can wait for
// and write its flags (dev passes its probe, every stream is a
// comm.WordStream, tr checks and exposes its flags, and its flag memory
// registers with dev); else nil, and the CPU handles the flags.
func streamWords(dev comm.Device, tr Transport, streams [NumLanes]comm.Stream) wordTransport {
	wd, ok := dev.(comm.WordDevice)
	if !ok || wd.StreamWords() != nil {
		return nil
	}
	wt, ok := tr.(wordTransport)
	if _, chk := tr.(checker); !ok || !chk {
		return nil
	}
	for _, s := range streams {
		if _, ok := s.(comm.WordStream); !ok {
			return nil
		}
	}
	if err := dev.Register(wt.FlagMemory()); err != nil {
		return nil
	}
	return wt
}

// deviceFlags reports whether a lane has steps whose flags the device
// handles.
func deviceFlags(steps []*Step) bool {
	for _, st := range steps {
		if st.DeviceFlags {
			return true
		}
	}
	return false
}

// runDeviceLane queues every step of the lane on its stream (queueDeviceLane)
// and waits for the end, making the transport's checks as it polls.
func (e *Executor) runDeviceLane(ctx context.Context, lane Lane, steps []*Step, call Call, epoch uint64, world int) error {
	ev, err := e.queueDeviceLane(lane, steps, call, epoch, world, true)
	if err != nil {
		return err
	}
	if err := e.waitDevice(ctx, ev); err != nil {
		return fmt.Errorf("lane %d: waiting for the device's flags and reduction: %w", lane, err)
	}
	e.consumed(lane, ev)
	if e.trace != nil {
		end := e.trace.since()
		tr := e.trace.cur.lanes[lane]
		for i := range tr {
			tr[i].done = end
		}
	}
	return nil
}

// queueDeviceLane queues every step of the lane on its stream, the
// DeviceFlags steps as stream waits and writes of the flag words, and
// returns an event recorded after the last (a consumed one again when
// reuse: the caller gives it back once it completed).
func (e *Executor) queueDeviceLane(lane Lane, steps []*Step, call Call, epoch uint64, world int, reuse bool) (comm.Event, error) {
	s := e.streams[lane]
	ws := s.(comm.WordStream)
	var tr []stepTrace
	if e.trace != nil {
		tr = e.trace.cur.lanes[lane]
	}
	for i, st := range steps {
		if tr != nil {
			tr[i].reach = e.trace.since()
			tr[i].ready = tr[i].reach
		}
		var err error
		if st.Kind == Nop && st.DeviceFlags {
			for _, c := range st.Wait {
				if err = ws.WaitWord(e.words.FlagWord(c.Flag), epoch|c.Value); err != nil {
					break
				}
			}
			for _, c := range st.Set {
				if err == nil {
					err = ws.WriteWord(e.words.FlagWord(c.Flag), epoch|c.Value)
				}
			}
		} else if len(st.Wait) > 0 || len(st.Set) > 0 {
			err = fmt.Errorf("a %s step with CPU flags in a lane of device flags: %w", st.Kind, ErrUnsupported)
		} else {
			_, err = e.enqueue(lane, st, call, world)
		}
		if err != nil {
			return nil, fmt.Errorf("lane %d: %s step: %w", lane, st.Kind, err)
		}
		if tr != nil {
			tr[i].issued = e.trace.since()
		}
	}
	var ev comm.Event
	var err error
	if reuse {
		ev, err = e.record(lane)
	} else {
		ev, err = s.Record()
	}
	if err != nil {
		return nil, fmt.Errorf("lane %d: %w", lane, err)
	}
	return ev, nil
}

// waitDevice polls ev: back to back for the small spin, then napping, with
// the transport's checks every 64 polls (the device, not the CPU, waits for
// the peers, so this is where a dead peer or the deadline is noticed).
func (e *Executor) waitDevice(ctx context.Context, ev comm.Event) error {
	chk := e.tr.(checker)
	return pollEvent(ev, max(e.opts.SmallSpin, e.opts.EventSpin), func() error {
		return chk.Check(ctx, "waiting for the device, whose stream waits for the peers' flags")
	})
}

// releaseWaits, after a failed call, stores a release value in every flag
// that this rank's streams may be waiting for on the device, so that they
// (and every peer's) drain instead of hanging forever. The abort flag is
// already up: Run fails the call; a stream-ordered call's result, though,
// is undefined (the caller's stream goes on), and the next call reports the
// failure. A peer's stream may still write its own flag afterwards,
// lowering it again: drain and the watchdog release again until the work
// has finished.
//
// The release value is the latest epoch plus 2^62: it passes the CPU's
// wait (flag >= value) and the device's, whose >= wraps ((int64)(flag -
// value) >= 0, cuStreamWaitValue64), for every call so far.
func (e *Executor) releaseWaits(sched Schedule) {
	back := e.queuesCopiesBack(sched.Params)
	if e.words == nil || !sched.Params.SmallOnDevice && !back {
		return
	}
	for _, st := range sched.Steps[e.tr.Rank()] {
		if st.DeviceFlags || back && st.Lane == LaneIn && st.Kind == CopyIn {
			for _, c := range st.Wait {
				e.tr.Set(c.Flag, e.maxEpoch.Load()+1<<62)
			}
		}
	}
}
