package ctxmgr

import (
	"encoding/binary"
	"fmt"
	"math"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/migctl/migctl/context/swapproto"
)

// Priority launch gating (shim/PROTOCOL.md "Priority launch gating"): the
// daemon gives every shimmed process of a device a slot in one shared page
// (a memfd passed over the shim's connection); a process with lower-priority
// neighbours sets its slot's busy bit while its launches are in flight, and a
// process with higher-priority neighbours holds its launches (or keeps at
// most Budget in flight) while a bit of its mask is set. The daemon decides
// the slots, masks and policies, clears the bit of a process that goes away,
// and keeps the counters the shims report.

// GateMode is how a lower-priority process's launches are gated while a
// higher-priority process on its device has work in flight.
type GateMode string

// The gate modes.
const (
	// GateOff: no gating (the shim behaves as without it).
	GateOff GateMode = "off"
	// GateHold: launches wait until the higher-priority work completes.
	GateHold GateMode = "gate"
	// GateBudget: at most Budget launches in flight while held.
	GateBudget GateMode = "budget"
)

// MaxGateBudget is the largest budget (the shim tracks 64 launches in flight).
const MaxGateBudget = 64

// gateSlots is how many processes per device take part in gating; further
// ones are neither held nor signal.
const gateSlots = 64

// DefaultGateStale is how long a busy signal may go without a heartbeat
// before held processes ignore it (a stopped or hung process).
const DefaultGateStale = time.Second

// GatePolicy is the priority-gating policy of the daemon (Options.Gate) or
// of one process (SetGatePolicy). The zero value is off.
type GatePolicy struct {
	Mode GateMode `json:"mode" yaml:"mode"`
	// Budget is the number of launches a held process may have in flight
	// (GateBudget only), 1..MaxGateBudget.
	Budget int `json:"budget,omitempty" yaml:"budget,omitempty"`
	// Depth, when > 0, keeps a lower-priority process's launches in flight
	// at most Depth while it is not held (0..MaxGateBudget; an event after
	// each launch): the backlog a higher-priority launch finds queued ahead
	// of it stays short. 0: no limit (an ungated launch costs nothing more).
	Depth int `json:"depth,omitempty" yaml:"depth,omitempty"`
	// Stale: a busy bit whose heartbeat is older is ignored (default
	// DefaultGateStale; the shim's watcher beats at least every 200 µs while
	// the work lasts).
	Stale time.Duration `json:"stale,omitempty" yaml:"stale,omitempty"`
}

// ParseGatePolicy parses "off", "gate" or "budget=N" (also "budget:N"),
// optionally followed by ",depth=M" (e.g. "gate,depth=8").
func ParseGatePolicy(s string) (GatePolicy, error) {
	all := strings.TrimSpace(s)
	mode, opt, _ := strings.Cut(all, ",")
	var p GatePolicy
	switch {
	case mode == "" || mode == string(GateOff):
		p = GatePolicy{Mode: GateOff}
	case mode == string(GateHold):
		p = GatePolicy{Mode: GateHold}
	case strings.HasPrefix(mode, "budget=") || strings.HasPrefix(mode, "budget:"):
		n, err := strconv.Atoi(mode[len("budget="):])
		if err != nil {
			return GatePolicy{}, fmt.Errorf("%w: gate policy %q: budget is not an integer", ErrBadRequest, all)
		}
		p = GatePolicy{Mode: GateBudget, Budget: n}
	default:
		return GatePolicy{}, fmt.Errorf("%w: gate policy %q (want off, gate or budget=N, optionally ,depth=M)", ErrBadRequest, all)
	}
	if opt != "" {
		v, ok := strings.CutPrefix(opt, "depth=")
		n, err := strconv.Atoi(v)
		if !ok || err != nil {
			return GatePolicy{}, fmt.Errorf("%w: gate policy %q: %q is not depth=M", ErrBadRequest, all, opt)
		}
		p.Depth = n
	}
	return p, p.Validate()
}

// Validate checks the mode and the budget.
func (p GatePolicy) Validate() error {
	switch p.Mode {
	case "", GateOff, GateHold:
	case GateBudget:
		if p.Budget < 1 || p.Budget > MaxGateBudget {
			return fmt.Errorf("%w: gate budget %d is out of range [1, %d]", ErrBadRequest, p.Budget, MaxGateBudget)
		}
	default:
		return fmt.Errorf("%w: gate mode %q (want off, gate or budget)", ErrBadRequest, p.Mode)
	}
	if p.Depth < 0 || p.Depth > MaxGateBudget {
		return fmt.Errorf("%w: gate depth %d is out of range [0, %d]", ErrBadRequest, p.Depth, MaxGateBudget)
	}
	if p.Stale < 0 {
		return fmt.Errorf("%w: gate stale %v is negative", ErrBadRequest, p.Stale)
	}
	return nil
}

// String is the form ParseGatePolicy reads.
func (p GatePolicy) String() string {
	s := string(GateOff)
	switch p.Mode {
	case GateHold:
		s = string(GateHold)
	case GateBudget:
		s = fmt.Sprintf("budget=%d", p.Budget)
	}
	if p.Depth > 0 && p.on() {
		s += fmt.Sprintf(",depth=%d", p.Depth)
	}
	return s
}

func (p GatePolicy) on() bool { return p.Mode == GateHold || p.Mode == GateBudget }

// GateStatus is one process's part in priority gating, as `migctl swap
// status` shows it.
type GateStatus struct {
	// Class is the process's place among the processes of its device by
	// priority: "high" (others below, none above: its work holds theirs),
	// "low" (held by a higher one), "mid" (both), "alone" (no other priority
	// there). Empty when gating is off.
	Class string `json:"class,omitempty" yaml:"class,omitempty"`
	// Policy is how its own launches are gated when held ("gate", "budget=N", "off").
	Policy string `json:"policy,omitempty" yaml:"policy,omitempty"`
	// Slot is its bit on the device's page (-1 none).
	Slot int `json:"slot" yaml:"slot"`
	// Holds counts the launches/copies that waited; HeldSeconds is the total wait.
	Holds       int64   `json:"holds" yaml:"holds"`
	HeldSeconds float64 `json:"heldSeconds" yaml:"heldSeconds"`
	// BusyPeriods and BusySeconds: how often and how long it had work in
	// flight while it signalled (high and mid processes).
	BusyPeriods int64   `json:"busyPeriods,omitempty" yaml:"busyPeriods,omitempty"`
	BusySeconds float64 `json:"busySeconds,omitempty" yaml:"busySeconds,omitempty"`
}

// ------------------------------------------------------------ shared page

// The page layout (shim/internal.h struct ms_pg_page).
const (
	gatePageSize    = 4096
	gatePageMagic   = 0x5047534d
	gatePageVersion = 1
	gateOffBusy     = 8
	gateOffEpoch    = 16
)

// gatePage is one device's shared page: a memfd mapped here and, through the
// descriptor the daemon passes, in every shim of the device.
type gatePage struct {
	fd   int
	mem  []byte
	used uint64 // slots in use
}

func newGatePage(device string) (*gatePage, error) {
	fd, err := unix.MemfdCreate("migctl-gate", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("creating the gate page of device %q: %w", device, err)
	}
	if err := unix.Ftruncate(fd, gatePageSize); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("sizing the gate page of device %q: %w", device, err)
	}
	mem, err := unix.Mmap(fd, 0, gatePageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("mapping the gate page of device %q: %w", device, err)
	}
	binary.LittleEndian.PutUint32(mem[4:], gatePageVersion)
	(*atomic.Uint32)(unsafe.Pointer(&mem[0])).Store(gatePageMagic)
	return &gatePage{fd: fd, mem: mem}, nil
}

func (g *gatePage) busy() *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&g.mem[gateOffBusy]))
}
func (g *gatePage) epoch() *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&g.mem[gateOffEpoch]))
}

// take returns a free slot, or -1.
func (g *gatePage) take() int {
	for i := 0; i < gateSlots; i++ {
		if g.used&(1<<i) == 0 {
			g.used |= 1 << i
			return i
		}
	}
	return -1
}

// release frees a slot and clears its busy bit, waking held processes: a
// process that went away never leaves others held.
func (g *gatePage) release(slot int) {
	if slot < 0 {
		return
	}
	g.used &^= 1 << slot
	if g.busy().And(^(uint64(1)<<slot))&(1<<slot) != 0 {
		g.epoch().Add(1)
		// FUTEX_WAKE (1), shared: held shims sleep on the epoch word
		_, _, _ = unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(&g.mem[gateOffEpoch])), 1, math.MaxInt32, 0, 0, 0)
	}
}

func (g *gatePage) close() {
	_ = unix.Munmap(g.mem)
	_ = unix.Close(g.fd)
}

// -------------------------------------------------------------- the policy

// gateMsg is what one process is told.
type gateMsg struct {
	policy GatePolicy
	slot   int
	mask   uint64
	signal bool
	class  string
}

func (g gateMsg) message(page bool) swapproto.Message {
	slot := g.slot
	stale := g.policy.Stale
	if stale <= 0 {
		stale = DefaultGateStale
	}
	mode := g.policy.Mode
	if mode == "" {
		mode = GateOff
	}
	return swapproto.Message{Type: swapproto.TypeGate, Policy: string(mode), Budget: g.policy.Budget, Depth: g.policy.Depth, Slot: &slot,
		Mask: g.mask, Signal: g.signal, StaleMS: int(stale / time.Millisecond), Page: page, Class: g.class}
}

// gateEnabledLocked: some policy (the daemon's or a process's) gates.
func (m *Manager) gateEnabledLocked() bool {
	if m.opts.Gate.on() {
		return true
	}
	for _, p := range m.procs {
		if p.gatePolicy != nil && p.gatePolicy.on() {
			return true
		}
	}
	return false
}

func (m *Manager) policyOfLocked(p *proc) GatePolicy {
	pol := m.opts.Gate
	if p.gatePolicy != nil {
		pol = *p.gatePolicy
	}
	if pol.Stale <= 0 {
		pol.Stale = m.opts.Gate.Stale
	}
	return pol
}

type gateSend struct {
	p    *proc
	msg  gateMsg
	page *gatePage // non-nil: pass the page with this message
}

// gateSync brings device dev's gating up to date: slots for its processes
// (when gating is on), each one's mask, signal and class, and sends what
// changed. It serialises with other syncs so that messages arrive in the
// order the decisions were made.
func (m *Manager) gateSync(dev string) {
	m.gateMu.Lock()
	defer m.gateMu.Unlock()
	m.mu.Lock()
	sends, err := m.gatePlanLocked(dev)
	m.mu.Unlock()
	if err != nil {
		m.log.Warn("priority gating", "device", dev, "err", err)
	}
	for _, s := range sends {
		if err := s.p.conn.sendGate(s.msg.message(s.page != nil), s.page); err != nil {
			m.log.Warn("sending gate settings", "pid", s.p.PID, "err", err)
			continue
		}
		m.mu.Lock()
		s.p.gateSent = s.msg
		s.p.gateSentOK = true
		if s.page != nil {
			s.p.pageSent = true
		}
		m.mu.Unlock()
	}
}

// gatePlanLocked decides the settings of dev's processes and returns the
// messages to send (those that changed).
func (m *Manager) gatePlanLocked(dev string) ([]gateSend, error) {
	var procs []*proc
	for _, p := range m.procs {
		if p.Device == dev && p.conn != nil && !p.gone {
			procs = append(procs, p)
		}
	}
	sort.Slice(procs, func(i, j int) bool { return procs[i].PID < procs[j].PID })
	enabled := m.gateEnabledLocked()
	page := m.gates[dev]
	if enabled && page == nil && len(procs) > 0 {
		var err error
		if page, err = newGatePage(dev); err != nil {
			return nil, err
		}
		m.gates[dev] = page
	}
	if page != nil {
		for _, p := range procs {
			if enabled && p.slot < 0 {
				p.slot = page.take()
			}
		}
	}
	var out []gateSend
	for _, p := range procs {
		want := gateMsg{slot: -1, class: ""}
		if enabled && p.slot >= 0 {
			pol := m.policyOfLocked(p)
			want = gateMsg{policy: pol, slot: p.slot, class: "alone"}
			above, below := false, false
			for _, q := range procs {
				if q == p || q.slot < 0 {
					continue
				}
				qp := m.policyOfLocked(q)
				switch {
				case q.Priority > p.Priority:
					above = true
					if pol.on() {
						want.mask |= 1 << q.slot
					}
				case q.Priority < p.Priority:
					below = true
					if qp.on() {
						want.signal = true
					}
				}
			}
			switch {
			case above && below:
				want.class = "mid"
			case above:
				want.class = "low"
			case below:
				want.class = "high"
			}
		}
		p.Gate.Class = want.class
		p.Gate.Slot = want.slot
		p.Gate.Policy = ""
		if want.slot >= 0 {
			p.Gate.Policy = want.policy.String()
		}
		if want.slot < 0 && !p.gateSentOK {
			continue // never gated: nothing to say
		}
		if p.gateSentOK && p.gateSent == want {
			continue
		}
		s := gateSend{p: p, msg: want}
		if !p.pageSent && want.slot >= 0 {
			s.page = page
		}
		out = append(out, s)
	}
	return out, nil
}

// gateLeave releases a departing process's slot (clearing its busy bit) and
// re-plans its device.
func (m *Manager) gateLeave(p *proc) {
	m.gateMu.Lock()
	m.mu.Lock()
	p.gone = true
	if g := m.gates[p.Device]; g != nil && p.slot >= 0 {
		g.release(p.slot)
		p.slot = -1
	}
	m.mu.Unlock()
	m.gateMu.Unlock()
	m.gateSync(p.Device)
}

// onGateStats keeps the counters a shim reported.
func (m *Manager) onGateStats(pid int, msg swapproto.Message) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if p, ok := m.procs[pid]; ok {
		p.Gate.Holds, p.Gate.HeldSeconds = msg.Holds, msg.HeldSeconds
		p.Gate.BusyPeriods, p.Gate.BusySeconds = msg.BusyPeriods, msg.BusySeconds
	}
}

// SetGatePolicy sets how process pid's launches are gated when a
// higher-priority process on its device is busy; nil returns it to the
// daemon's policy (Options.Gate). It sends the new settings before returning.
func (m *Manager) SetGatePolicy(pid int, pol *GatePolicy) error {
	if pol != nil {
		if err := pol.Validate(); err != nil {
			return err
		}
		c := *pol
		pol = &c
	}
	m.mu.Lock()
	p, ok := m.procs[pid]
	if !ok {
		m.mu.Unlock()
		return fmt.Errorf("pid %d: %w", pid, ErrNoSuchProcess)
	}
	p.gatePolicy = pol
	var devs []string
	seen := map[string]bool{}
	for _, q := range m.procs { // enabling gating anywhere may give every device slots
		if !seen[q.Device] {
			seen[q.Device] = true
			devs = append(devs, q.Device)
		}
	}
	m.mu.Unlock()
	sort.Strings(devs)
	for _, d := range devs {
		m.gateSync(d)
	}
	return nil
}

// SetGate sets the gating policy of target's processes (a pid, or every
// process of a job): "default" (or "") returns them to the daemon's policy,
// anything else is parsed by ParseGatePolicy. It returns the pids it set.
func (m *Manager) SetGate(t Target, policy string) ([]int, error) {
	var pol *GatePolicy
	if policy != "" && policy != "default" {
		p, err := ParseGatePolicy(policy)
		if err != nil {
			return nil, err
		}
		pol = &p
	}
	m.mu.Lock()
	var pids []int
	for pid, p := range m.procs {
		if (t.PID != 0 && (pid == t.PID || p.PeerPID == t.PID)) || (t.PID == 0 && t.Job != "" && p.Job == t.Job) {
			pids = append(pids, pid)
		}
	}
	m.mu.Unlock()
	if len(pids) == 0 {
		if t.PID != 0 {
			return nil, fmt.Errorf("%s: %w", t, ErrNoSuchProcess)
		}
		return nil, fmt.Errorf("%s: %w", t, ErrNoSuchJob)
	}
	sort.Ints(pids)
	for _, pid := range pids {
		if err := m.SetGatePolicy(pid, pol); err != nil {
			return nil, err
		}
	}
	return pids, nil
}

// closeGates unmaps the pages (the shims keep their own mappings).
func (m *Manager) closeGates() {
	m.gateMu.Lock()
	defer m.gateMu.Unlock()
	m.mu.Lock()
	defer m.mu.Unlock()
	for d, g := range m.gates {
		g.close()
		delete(m.gates, d)
	}
}

// sendGate writes a gate message, with the page's descriptor when page is
// not nil (SCM_RIGHTS on the message's bytes).
func (s *shimConn) sendGate(msg swapproto.Message, page *gatePage) error {
	if page == nil {
		return s.send(msg)
	}
	b, err := swapproto.Encode(msg)
	if err != nil {
		return err
	}
	uc, ok := s.c.(*net.UnixConn)
	if !ok {
		return fmt.Errorf("passing the gate page: %T is not a Unix socket", s.c)
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	_ = uc.SetWriteDeadline(time.Now().Add(writeTimeout))
	n, _, err := uc.WriteMsgUnix(b, unix.UnixRights(page.fd), nil)
	if err == nil && n < len(b) {
		_, err = uc.Write(b[n:]) // the descriptor went with the first byte
	}
	if err != nil {
		return fmt.Errorf("writing gate message: %w", err)
	}
	return nil
}
