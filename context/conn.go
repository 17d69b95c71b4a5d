package ctxmgr

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/migctl/migctl/context/swapproto"
)

// writeTimeout bounds each write to a shim; a shim that does not read is dropped.
const writeTimeout = 5 * time.Second

// shimConn is one shim's connection.
type shimConn struct {
	c    net.Conn
	w    *swapproto.Writer
	wmu  sync.Mutex // orders send and sendGate's descriptor-passing write
	once sync.Once
}

func newShimConn(c net.Conn) *shimConn {
	return &shimConn{c: c, w: swapproto.NewWriter(deadlineWriter{c})}
}

func (s *shimConn) send(m swapproto.Message) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	return s.w.Write(m)
}

func (s *shimConn) close() { s.once.Do(func() { s.c.Close() }) }

type deadlineWriter struct{ c net.Conn }

func (d deadlineWriter) Write(b []byte) (int, error) {
	_ = d.c.SetWriteDeadline(time.Now().Add(writeTimeout))
	return d.c.Write(b)
}

// maxProtocolErrors is how many bad lines (over-long, malformed, unknown or
// daemon-only types, results for unknown ids) a shim may send before it is
// disconnected: a few are answered and forgiven, a flood is not.
const maxProtocolErrors = 16

// serveConn runs one shim connection: hello, then messages until it closes.
// A message whose fields break the limits (swapproto.Message.Validate, the
// device's memory, the peer's pid) ends the connection: the shim is told why
// and the daemon logs it.
func (m *Manager) serveConn(ctx context.Context, c net.Conn) {
	sc := newShimConn(c)
	defer sc.close()
	r := swapproto.NewReader(c)

	_ = c.SetReadDeadline(time.Now().Add(m.opts.HelloTimeout))
	hello, err := r.Read()
	_ = c.SetReadDeadline(time.Time{})
	if err != nil {
		if !errors.Is(err, io.EOF) {
			peer, _ := peerOf(c)
			m.refuseShim(sc, peer.pid, 0, fmt.Sprintf("reading hello: %v", err))
		}
		return
	}
	peer, peerErr := peerOf(c)
	p, limit, reason := m.admit(ctx, peer, peerErr, hello)
	if reason != "" {
		m.refuseShim(sc, peer.pid, hello.PID, reason)
		return
	}
	pid := p.PID
	p.conn = sc
	if err := m.register(p); err != nil {
		m.refuseShim(sc, peer.pid, pid, err.Error())
		return
	}
	defer m.forget(p)
	if err := sc.send(swapproto.Message{Type: swapproto.TypeWelcome, Version: swapproto.Version}); err != nil {
		return
	}
	m.gateSync(p.Device) // after welcome: the shim reads its gate settings on its control thread
	m.log.Info("shim connected", "pid", pid, "peer_pid", p.PeerPID, "job", p.Job, "priority", p.Priority, "device", p.Device, "bytes", p.Bytes)

	var needs sync.WaitGroup
	needCtx, cancelNeeds := context.WithCancel(ctx)
	defer func() { cancelNeeds(); needs.Wait() }()
	protocolErrors := 0
	protocolError := func(reason string) bool {
		protocolErrors++
		if protocolErrors > maxProtocolErrors {
			m.dropShim(sc, p, fmt.Sprintf("%s (more than %d protocol errors)", reason, maxProtocolErrors))
			return false
		}
		_ = sc.send(swapproto.Message{Type: swapproto.TypeError, Reason: reason})
		return true
	}
	for {
		msg, err := r.Read()
		switch {
		case errors.Is(err, swapproto.ErrLineTooLong), errors.Is(err, swapproto.ErrMalformed):
			if !protocolError(err.Error()) {
				return
			}
			continue
		case err != nil:
			return
		}
		if err := msg.Validate(); err != nil {
			m.dropShim(sc, p, err.Error())
			return
		}
		if reason := overLimit(msg, limit, p.Device); reason != "" {
			m.dropShim(sc, p, reason)
			return
		}
		switch msg.Type {
		case swapproto.TypeUsage:
			m.onUsage(pid, msg.Bytes)
		case swapproto.TypeGateStats:
			m.onGateStats(pid, msg)
		case swapproto.TypeProgress:
			m.onProgress(pid, msg)
		case swapproto.TypeResult:
			if err := m.onResult(pid, msg); err != nil && !protocolError(err.Error()) {
				return
			}
		case swapproto.TypeNeed:
			if msg.Bytes > limit {
				_ = sc.send(swapproto.Message{Type: swapproto.TypeDenied, ID: msg.ID,
					Reason: fmt.Sprintf("need %s exceeds device %q's %s of memory", FormatBytes(msg.Bytes), p.Device, FormatBytes(limit))})
				continue
			}
			m.setWaiting(pid, 1)
			needs.Add(1)
			go func() {
				defer needs.Done()
				defer m.setWaiting(pid, -1)
				m.onNeed(needCtx, pid, msg)
			}()
		default:
			reason := fmt.Sprintf("unknown message type %q", msg.Type)
			if msg.Known() {
				reason = fmt.Sprintf("unexpected message type %q from a shim", msg.Type)
			}
			if !protocolError(reason) {
				return
			}
		}
	}
}

// admit checks a hello and returns the process it registers and the most
// bytes any of its messages may name (the device's memory), or the reason it
// is refused.
func (m *Manager) admit(ctx context.Context, peer peerProc, peerErr error, hello swapproto.Message) (*proc, int64, string) {
	if hello.Type != swapproto.TypeHello {
		return nil, 0, fmt.Sprintf("expected hello, got %q", hello.Type)
	}
	if err := hello.Validate(); err != nil {
		return nil, 0, err.Error()
	}
	if peerErr != nil {
		return nil, 0, fmt.Sprintf("cannot verify the shim's pid: %v", peerErr)
	}
	pid, peerPID, err := shimPID(hello.PID, peer, os.Getpid())
	if err != nil {
		return nil, 0, err.Error()
	}
	device := string(hello.Device)
	limit, err := m.deviceLimit(ctx, device)
	if err != nil {
		return nil, 0, err.Error()
	}
	if hello.Bytes > limit {
		return nil, 0, fmt.Sprintf("hello: bytes %d exceed device %q's %s of memory", hello.Bytes, device, FormatBytes(limit))
	}
	p := &proc{ops: map[swapproto.ID]*op{}, slot: -1}
	p.Process = Process{PID: pid, PeerPID: peerPID, Job: hello.Job, Priority: hello.Priority, Device: device,
		Bytes: hello.Bytes, State: Running, Started: m.opts.Now(), Gate: GateStatus{Slot: -1}}
	if p.Job == "" {
		p.Job = fmt.Sprintf("pid-%d", pid)
	}
	return p, limit, ""
}

// overLimit says which byte count of msg exceeds the device's memory limit
// ("" when none does). A need over it is answered denied, not dropped: a
// program may ask for more than the device has.
func overLimit(msg swapproto.Message, limit int64, device string) string {
	check := func(field string, v int64) string {
		if v > limit {
			return fmt.Sprintf("%s: %s %d exceeds device %q's %s of memory", msg.Type, field, v, device, FormatBytes(limit))
		}
		return ""
	}
	switch msg.Type {
	case swapproto.TypeUsage, swapproto.TypeResult:
		return check("bytes", msg.Bytes)
	case swapproto.TypeProgress:
		return check("total", msg.Total)
	}
	return ""
}

// capacityInfo is the optional ability of a MemoryInfo to report a device's
// total memory (NVML's and the declared memory have it).
type capacityInfo interface {
	Total(ctx context.Context, device string) (int64, error)
}

// deviceLimit returns the device's memory, the most bytes a shim on it may
// report, or an error when the memory source does not know the device. With
// no declared capacity the limit is swapproto.MaxBytes.
func (m *Manager) deviceLimit(ctx context.Context, device string) (int64, error) {
	var total int64
	var err error
	if ci, ok := m.mem.(capacityInfo); ok {
		total, err = ci.Total(ctx, device)
	} else {
		_, err = m.mem.Free(ctx, device)
	}
	if err != nil {
		return 0, fmt.Errorf("unknown device %q: %w", device, err)
	}
	if total <= 0 || total > swapproto.MaxBytes {
		total = swapproto.MaxBytes
	}
	return total, nil
}

// refuseShim answers a refused hello with an error and logs why.
func (m *Manager) refuseShim(sc *shimConn, peerPID, claimed int, reason string) {
	m.log.Warn("shim refused", "peer_pid", peerPID, "claimed_pid", claimed, "reason", reason)
	_ = sc.send(swapproto.Message{Type: swapproto.TypeError, Reason: reason})
}

// dropShim disconnects a registered shim that broke the protocol's limits:
// the shim is told why, the daemon logs it, and the deferred forget fails the
// shim's swaps in flight.
func (m *Manager) dropShim(sc *shimConn, p *proc, reason string) {
	m.log.Warn("shim disconnected for a protocol violation", "pid", p.PID, "peer_pid", p.PeerPID, "job", p.Job, "reason", reason)
	_ = sc.send(swapproto.Message{Type: swapproto.TypeError, Reason: reason + "; disconnecting"})
	sc.close()
}

func (m *Manager) register(p *proc) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, dup := m.procs[p.PID]; dup {
		return fmt.Errorf("pid %d is already registered on another connection", p.PID)
	}
	m.procs[p.PID] = p
	return nil
}

// forget removes a process whose connection closed, fails its swaps in
// flight, drops its reservations and lets the rebalancer use its memory.
func (m *Manager) forget(p *proc) {
	m.mu.Lock()
	if m.procs[p.PID] == p {
		delete(m.procs, p.PID)
	}
	for id, o := range p.ops {
		o.done <- Result{PID: o.pid, Job: o.job, Direction: o.dir.String(), Error: ErrDisconnected.Error(),
			Elapsed: m.opts.Now().Sub(o.started)}
		delete(p.ops, id)
	}
	for k, r := range m.reserved {
		if r.pid == p.PID {
			delete(m.reserved, k)
		}
	}
	m.epoch++
	m.mu.Unlock()
	m.gateLeave(p)
	m.log.Info("shim disconnected", "pid", p.PID, "job", p.Job)
	m.Kick()
}

func (m *Manager) onUsage(pid int, bytes int64) {
	m.mu.Lock()
	p, ok := m.procs[pid]
	if !ok {
		m.mu.Unlock()
		return
	}
	lower := bytes < p.Bytes
	p.Bytes = bytes
	released := false
	for k, r := range m.reserved {
		if r.pid == pid {
			delete(m.reserved, k)
			released = true
		}
	}
	if lower || released {
		m.epoch++
	}
	m.mu.Unlock()
	if lower || released {
		m.Kick()
	}
}

func (m *Manager) setWaiting(pid, delta int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if p, ok := m.procs[pid]; ok {
		p.waitingN += delta
		p.Waiting = p.waitingN > 0
	}
}

func (m *Manager) onProgress(pid int, msg swapproto.Message) {
	m.mu.Lock()
	p, ok := m.procs[pid]
	if !ok {
		m.mu.Unlock()
		return
	}
	p.LastProgress = m.opts.Now()
	p.Done, p.Total = msg.Done, msg.Total
	o := p.ops[msg.ID]
	m.mu.Unlock()
	if o != nil {
		select { // progress is lossy: a slow watcher never stalls the shim
		case o.progress <- Progress{PID: pid, Done: msg.Done, Total: msg.Total}:
		default:
		}
	}
}

func (m *Manager) onResult(pid int, msg swapproto.Message) error {
	m.mu.Lock()
	p, ok := m.procs[pid]
	if !ok {
		m.mu.Unlock()
		return nil
	}
	o, ok := p.ops[msg.ID]
	if !ok {
		m.mu.Unlock()
		return fmt.Errorf("result for unknown swap id %s", msg.ID)
	}
	delete(p.ops, msg.ID)
	switch {
	case o.dir == SwapOut && msg.OK:
		p.State = Out
		m.epoch++
	case o.dir == SwapOut:
		p.State = Running // refused or failed: the shim keeps the memory where it was
		p.Hold = false
	case msg.OK:
		p.State = Running
	default:
		p.State = Blocked
	}
	p.LastProgress = m.opts.Now()
	res := Result{PID: pid, Job: p.Job, Direction: o.dir.String(), OK: msg.OK, Bytes: msg.Bytes,
		Seconds: msg.Seconds, Error: msg.Error, Elapsed: m.opts.Now().Sub(o.started)}
	if !msg.OK && res.Error == "" {
		res.Error = "the shim reported failure without a reason"
	}
	m.mu.Unlock()
	o.done <- res
	m.log.Info("swap result", "dir", o.dir, "pid", pid, "ok", msg.OK, "bytes", msg.Bytes, "seconds", msg.Seconds, "error", msg.Error)
	return nil
}

// onNeed answers a shim's need: granted when the request fits (after the
// policy's victims are swapped out), denied with a reason otherwise.
func (m *Manager) onNeed(ctx context.Context, pid int, msg swapproto.Message) {
	m.mu.Lock()
	p, ok := m.procs[pid]
	if !ok {
		m.mu.Unlock()
		return
	}
	req := Request{PID: pid, Device: p.Device, Bytes: msg.Bytes, Priority: p.Priority}
	c := p.conn
	m.mu.Unlock()
	_, err := m.makeRoom(ctx, req, m.opts.ReservationTTL)
	if errors.Is(err, context.Canceled) {
		return // the shim is gone or the daemon stops
	}
	if err != nil {
		m.log.Info("need denied", "pid", pid, "bytes", msg.Bytes, "reason", err)
		_ = c.send(swapproto.Message{Type: swapproto.TypeDenied, ID: msg.ID, Reason: err.Error()})
		return
	}
	m.log.Info("need granted", "pid", pid, "bytes", msg.Bytes)
	_ = c.send(swapproto.Message{Type: swapproto.TypeGranted, ID: msg.ID})
}

// Reserve makes room for bytes on device for a job that does not run under
// the shim (req.PID 0): like a need, but the granted memory is kept from the
// policy for hold. It returns the policy's decision (victims, free memory
// before), or an error wrapping ErrDenied. It blocks until the victims are out.
func (m *Manager) Reserve(ctx context.Context, req Request, hold time.Duration) (Decision, error) {
	req.PID = 0
	return m.makeRoom(ctx, req, hold)
}

// makeRoom runs the need policy for req, swaps the victims out and, when req
// then fits, reserves its bytes (until the requester's next usage report, or
// hold) and returns the decision and nil. Otherwise it returns ErrDenied with
// the reason. It blocks until the victims' swaps end (each bounded by
// SwapTimeout).
func (m *Manager) makeRoom(ctx context.Context, req Request, hold time.Duration) (Decision, error) {
	if err := m.lockPolicy(ctx); err != nil {
		return Decision{}, err
	}
	defer m.unlockPolicy()
	s, err := m.snapshot(ctx, req.Device)
	if err != nil {
		return Decision{}, fmt.Errorf("%w: %v", ErrDenied, err)
	}
	want := req
	want.Bytes += m.opts.Headroom
	d := m.planNeed(s, want)
	if !d.Granted {
		if m.opts.Headroom > 0 {
			d.Reason += fmt.Sprintf(" (the need includes %s of headroom)", FormatBytes(m.opts.Headroom))
		}
		return d, fmt.Errorf("%w: %s", ErrDenied, d.Reason)
	}
	if len(d.Victims) > 0 {
		m.log.Info("swapping out for a need", "pid", req.PID, "bytes", req.Bytes, "victims", d.Victims)
		sctx, cancel := context.WithTimeout(ctx, m.opts.SwapTimeout)
		results := m.swapAll(sctx, SwapOut, d.Victims, false, nil)
		cancel()
		if ctx.Err() != nil {
			return d, ctx.Err()
		}
		var failed []string
		for _, r := range results {
			if !r.OK {
				failed = append(failed, fmt.Sprintf("pid %d: %s", r.PID, r.Error))
			}
		}
		if s, err = m.snapshot(ctx, req.Device); err != nil {
			return d, fmt.Errorf("%w: %v", ErrDenied, err)
		}
		if free := s.Free[req.Device]; free < want.Bytes {
			m.Kick() // what did go out may come back
			return d, fmt.Errorf("%w: need %s on device %q, only %s free after swapping out %v (failed: %v)",
				ErrDenied, FormatBytes(want.Bytes), req.Device, FormatBytes(free), d.Victims, failed)
		}
	}
	m.mu.Lock()
	m.nextRes++
	m.reserved[m.nextRes] = &reservation{pid: req.PID, device: req.Device, bytes: req.Bytes, expires: m.opts.Now().Add(hold)}
	m.mu.Unlock()
	time.AfterFunc(hold+10*time.Millisecond, m.Kick) // the expiry is a memory-freeing event (snapshot counts it)
	return d, nil
}

// peerProc is the process at the other end of a shim connection, as the
// kernel reports it.
type peerProc struct {
	pid   int // SO_PEERCRED: the pid in the daemon's namespace
	nspid int // the pid in the peer's own namespace (NSpid); = pid outside containers
}

// procRoot is where peerOf reads /proc/<pid>/status.
const procRoot = "/proc"

// peerOf reads the peer's pid (SO_PEERCRED) and its pid in its own namespace
// (the last NSpid of /proc/<pid>/status; the pid itself when the kernel does
// not say).
func peerOf(c net.Conn) (peerProc, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return peerProc{}, fmt.Errorf("%T is not a Unix socket", c)
	}
	cred, err := PeerCred(uc)
	if err != nil {
		return peerProc{}, err
	}
	p := peerProc{pid: int(cred.Pid), nspid: int(cred.Pid)}
	if b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(p.pid), "status")); err == nil {
		if ns, ok := innermostNSpid(string(b)); ok {
			p.nspid = ns
		}
	}
	return p, nil
}

// innermostNSpid returns the last pid of the "NSpid:" line of a
// /proc/<pid>/status text: the pid in the process's own namespace.
func innermostNSpid(status string) (int, bool) {
	for _, line := range strings.Split(status, "\n") {
		rest, ok := strings.CutPrefix(line, "NSpid:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			return 0, false
		}
		n, err := strconv.Atoi(f[len(f)-1])
		return n, err == nil && n > 0
	}
	return 0, false
}

// shimPID decides a shim's registry pid from the pid its hello claims and the
// kernel's view of the peer (self is the daemon's pid). The claim is only a
// label that must name the peer: its pid (0 means that too) gives (pid, 0);
// its pid in its own namespace (a shim in a container) gives (claim,
// peer.pid), the peer's pid kept as PeerPID; anything else is refused. A peer
// in the daemon's own process (tests' fakeshim, code embedding the daemon) may
// claim any pid: it could call the Manager directly anyway.
func shimPID(claim int, peer peerProc, self int) (pid, peerPID int, err error) {
	switch {
	case peer.pid <= 0: // SO_PEERCRED reports 0 for a peer outside the daemon's pid namespace
		return 0, 0, fmt.Errorf("hello claims pid %d, but the connecting process is not in the daemon's pid namespace (run the daemon on the host)", claim)
	case claim == 0 || claim == peer.pid:
		return peer.pid, 0, nil
	case claim == peer.nspid || peer.pid == self:
		return claim, peer.pid, nil
	case peer.nspid != peer.pid:
		return 0, 0, fmt.Errorf("hello claims pid %d, but the connecting process is pid %d (pid %d in its own namespace)", claim, peer.pid, peer.nspid)
	default:
		return 0, 0, fmt.Errorf("hello claims pid %d, but the connecting process is pid %d", claim, peer.pid)
	}
}
