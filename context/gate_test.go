package ctxmgr_test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	ctxmgr "github.com/migctl/migctl/context"
	"github.com/migctl/migctl/context/swapproto"
)

func TestParseGatePolicy(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want ctxmgr.GatePolicy
		err  string
	}{
		{in: "", want: ctxmgr.GatePolicy{Mode: ctxmgr.GateOff}},
		{in: "off", want: ctxmgr.GatePolicy{Mode: ctxmgr.GateOff}},
		{in: "gate", want: ctxmgr.GatePolicy{Mode: ctxmgr.GateHold}},
		{in: "budget=4", want: ctxmgr.GatePolicy{Mode: ctxmgr.GateBudget, Budget: 4}},
		{in: "budget:1", want: ctxmgr.GatePolicy{Mode: ctxmgr.GateBudget, Budget: 1}},
		{in: "gate,depth=8", want: ctxmgr.GatePolicy{Mode: ctxmgr.GateHold, Depth: 8}},
		{in: "budget=2,depth=16", want: ctxmgr.GatePolicy{Mode: ctxmgr.GateBudget, Budget: 2, Depth: 16}},
		{in: "budget=0", err: "budget 0 is out of range"},
		{in: "budget=65", err: "budget 65 is out of range"},
		{in: "budget=x", err: "not an integer"},
		{in: "gate,depth=65", err: "depth 65 is out of range"},
		{in: "gate,deep=2", err: "is not depth=M"},
		{in: "always", err: "want off, gate or budget=N"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ctxmgr.ParseGatePolicy(tc.in)
			if tc.err != "" {
				require.ErrorIs(t, err, ctxmgr.ErrBadRequest)
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
			again, err := ctxmgr.ParseGatePolicy(got.String())
			require.NoError(t, err)
			require.Equal(t, got, again, "String %q does not parse back", got.String())
		})
	}
}

// rawShim speaks the protocol over a bare Unix socket and keeps the
// descriptors the daemon passes (SCM_RIGHTS).
type rawShim struct {
	t     *testing.T
	c     *net.UnixConn
	buf   []byte
	fds   []int
	lines chan swapproto.Message
}

func dialRaw(t *testing.T, socket string, pid, prio int, job string) *rawShim {
	t.Helper()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: socket, Net: "unix"})
	require.NoError(t, err)
	r := &rawShim{t: t, c: c, lines: make(chan swapproto.Message, 64)}
	t.Cleanup(func() { c.Close() })
	hello, _ := json.Marshal(map[string]any{"type": "hello", "version": 1, "pid": pid, "job": job, "priority": prio, "device": "GPU-0"})
	_, err = c.Write(append(hello, '\n'))
	require.NoError(t, err)
	go r.read()
	require.Equal(t, swapproto.TypeWelcome, r.next(t).Type)
	return r
}

func (r *rawShim) read() {
	defer close(r.lines)
	b, oob := make([]byte, 8192), make([]byte, unix.CmsgSpace(4*4))
	for {
		n, oobn, _, _, err := r.c.ReadMsgUnix(b, oob)
		if err != nil {
			return
		}
		if oobn > 0 {
			msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
			for _, m := range msgs {
				fds, _ := unix.ParseUnixRights(&m)
				r.fds = append(r.fds, fds...)
			}
		}
		r.buf = append(r.buf, b[:n]...)
		for {
			i := bytes.IndexByte(r.buf, '\n')
			if i < 0 {
				break
			}
			m, err := swapproto.Decode(r.buf[:i])
			r.buf = r.buf[i+1:]
			if err == nil {
				r.lines <- m
			}
		}
	}
}

func (r *rawShim) next(t *testing.T) swapproto.Message {
	t.Helper()
	select {
	case m, ok := <-r.lines:
		require.True(t, ok, "connection closed")
		return m
	case <-time.After(5 * time.Second):
		require.FailNow(t, "no message from the daemon")
		return swapproto.Message{}
	}
}

// gate returns the next gate message, skipping others.
func (r *rawShim) gate(t *testing.T) swapproto.Message {
	t.Helper()
	for {
		if m := r.next(t); m.Type == swapproto.TypeGate {
			return m
		}
	}
}

func (r *rawShim) send(t *testing.T, m map[string]any) {
	t.Helper()
	b, _ := json.Marshal(m)
	_, err := r.c.Write(append(b, '\n'))
	require.NoError(t, err)
}

// The daemon gives each shim of a device a slot on one shared page (passed
// with the first gate message), a mask of the higher-priority slots and a
// class; it re-plans when a process comes or goes, and clears the busy bit of
// one that goes away. gate_stats reach Status.
func TestGateSlotsMasksAndPage(t *testing.T) {
	d := startDaemon(t, ctxmgr.Options{GPUMemory: gib, Gate: ctxmgr.GatePolicy{Mode: ctxmgr.GateBudget, Budget: 2, Stale: 250 * time.Millisecond}})
	low := dialRaw(t, d.socket, 1001, 0, "train")
	g := low.gate(t)
	require.True(t, g.Page)
	require.Len(t, low.fds, 1, "the page's descriptor came with the first gate message")
	require.NotNil(t, g.Slot)
	require.Equal(t, "alone", g.Class)
	require.Equal(t, "budget", g.Policy)
	require.Equal(t, 2, g.Budget)
	require.Equal(t, 250, g.StaleMS)
	require.Zero(t, g.Mask)
	require.False(t, g.Signal)
	lowSlot := *g.Slot

	page, err := unix.Mmap(low.fds[0], 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	require.NoError(t, err)
	t.Cleanup(func() { _ = unix.Munmap(page) })
	require.Equal(t, uint32(0x5047534d), binary.LittleEndian.Uint32(page[0:]))
	require.Equal(t, uint32(1), binary.LittleEndian.Uint32(page[4:]))
	busy := (*atomic.Uint64)(unsafe.Pointer(&page[8]))

	high := dialRaw(t, d.socket, 1002, 10, "infer")
	hg := high.gate(t)
	require.True(t, hg.Page)
	require.Equal(t, "high", hg.Class)
	require.True(t, hg.Signal)
	require.NotEqual(t, lowSlot, *hg.Slot)
	lg := low.gate(t) // re-planned: now held by the high one
	require.False(t, lg.Page, "the page is passed once")
	require.Equal(t, "low", lg.Class)
	require.Equal(t, uint64(1)<<*hg.Slot, lg.Mask)
	require.Len(t, low.fds, 1)

	mid := dialRaw(t, d.socket, 1003, 5, "eval")
	mg := mid.gate(t)
	require.Equal(t, "mid", mg.Class)
	require.True(t, mg.Signal)
	require.Equal(t, uint64(1)<<*hg.Slot, mg.Mask)
	lg = low.gate(t)
	require.Equal(t, uint64(1)<<*hg.Slot|uint64(1)<<*mg.Slot, lg.Mask)

	// the shims report their counters; Status shows them with the class
	low.send(t, map[string]any{"type": "gate_stats", "holds": 7, "held_seconds": 1.5})
	high.send(t, map[string]any{"type": "gate_stats", "busy_periods": 3, "busy_seconds": 0.25})
	require.Eventually(t, func() bool {
		p, _ := d.proc(t, 1001)
		q, _ := d.proc(t, 1002)
		return p.Gate.Holds == 7 && q.Gate.BusyPeriods == 3
	}, 5*time.Second, 10*time.Millisecond)
	p, _ := d.proc(t, 1001)
	require.Equal(t, ctxmgr.GateStatus{Class: "low", Policy: "budget=2", Slot: lowSlot, Holds: 7, HeldSeconds: 1.5}, p.Gate)
	q, _ := d.proc(t, 1002)
	require.Equal(t, "high", q.Gate.Class)
	require.InDelta(t, 0.25, q.Gate.BusySeconds, 1e-9)

	// the high process is busy and dies: its bit is cleared, the others re-planned
	busy.Or(1 << *hg.Slot)
	high.c.Close()
	require.Eventually(t, func() bool { return busy.Load()&(1<<*hg.Slot) == 0 }, 5*time.Second, 5*time.Millisecond,
		"the departed process's busy bit stayed set")
	lg = low.gate(t)
	require.Equal(t, uint64(1)<<*mg.Slot, lg.Mask)
	require.Equal(t, "low", lg.Class)
	mg = mid.gate(t)
	require.Equal(t, "high", mg.Class)
	require.Zero(t, mg.Mask)
}

// Policy off: the shims are told nothing (they behave as before), and Status
// has no class; SetGatePolicy on one process turns gating on for its device.
func TestGateOffSaysNothingUntilSet(t *testing.T) {
	d := startDaemon(t, ctxmgr.Options{GPUMemory: gib})
	low := dialRaw(t, d.socket, 2001, 0, "train")
	high := dialRaw(t, d.socket, 2002, 9, "infer")
	low.send(t, map[string]any{"type": "usage", "bytes": 1024})
	require.Eventually(t, func() bool { p, _ := d.proc(t, 2001); return p.Bytes == 1024 }, 5*time.Second, 10*time.Millisecond)
	select {
	case m := <-low.lines:
		require.Failf(t, "unexpected message", "%+v", m)
	case <-time.After(100 * time.Millisecond):
	}
	p, _ := d.proc(t, 2001)
	require.Equal(t, ctxmgr.GateStatus{Slot: -1}, p.Gate)

	require.ErrorIs(t, d.m.SetGatePolicy(2001, &ctxmgr.GatePolicy{Mode: ctxmgr.GateBudget}), ctxmgr.ErrBadRequest)
	require.ErrorIs(t, d.m.SetGatePolicy(4242, nil), ctxmgr.ErrNoSuchProcess)
	require.NoError(t, d.m.SetGatePolicy(2001, &ctxmgr.GatePolicy{Mode: ctxmgr.GateHold}))
	lg := low.gate(t)
	require.True(t, lg.Page)
	require.Equal(t, "gate", lg.Policy)
	require.Equal(t, "low", lg.Class)
	hg := high.gate(t)
	require.Equal(t, "off", hg.Policy, "the high process keeps the daemon's policy for itself")
	require.True(t, hg.Signal, "it signals: a process below it is gated")
	require.Equal(t, uint64(1)<<*hg.Slot, lg.Mask)

	// by job, as 'migctl swap gate --job' does
	pids, err := d.m.SetGate(ctxmgr.Target{Job: "train"}, "budget=3")
	require.NoError(t, err)
	require.Equal(t, []int{2001}, pids)
	lg = low.gate(t)
	require.Equal(t, "budget", lg.Policy)
	require.Equal(t, 3, lg.Budget)
	_, err = d.m.SetGate(ctxmgr.Target{Job: "nosuch"}, "gate")
	require.ErrorIs(t, err, ctxmgr.ErrNoSuchJob)
	_, err = d.m.SetGate(ctxmgr.Target{PID: 2001}, "sometimes")
	require.ErrorIs(t, err, ctxmgr.ErrBadRequest)

	// back to the daemon's policy (off): the low process is told so, the high stops signalling
	_, err = d.m.SetGate(ctxmgr.Target{PID: 2001}, "default")
	require.NoError(t, err)
	lg = low.gate(t)
	require.Equal(t, -1, *lg.Slot)
	require.Equal(t, "off", lg.Policy)
	hg = high.gate(t)
	require.False(t, hg.Signal)
}

// A shim's gate_stats are checked like every other message.
func TestGateStatsValidated(t *testing.T) {
	for _, tc := range []struct {
		m   swapproto.Message
		err string
	}{
		{swapproto.Message{Type: swapproto.TypeGateStats, Holds: 3, HeldSeconds: 1}, ""},
		{swapproto.Message{Type: swapproto.TypeGateStats, Holds: -1}, "must not be negative"},
		{swapproto.Message{Type: swapproto.TypeGateStats, HeldSeconds: -1}, "held_seconds"},
		{swapproto.Message{Type: swapproto.TypeGateStats, BusySeconds: 1e12}, "busy_seconds"},
	} {
		err := tc.m.Validate()
		if tc.err == "" {
			require.NoError(t, err)
			continue
		}
		require.ErrorIs(t, err, swapproto.ErrInvalid)
		require.True(t, strings.Contains(err.Error(), tc.err), "%v", err)
	}
}
