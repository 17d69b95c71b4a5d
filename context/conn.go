package ctxmgr

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
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
	once sync.Once
}

func newShimConn(c net.Conn) *shimConn {
	return &shimConn{c: c, w: swapproto.NewWriter(deadlineWriter{c})}
}

func (s *shimConn) send(m swapproto.Message) error { return s.w.Write(m) }
func (s *shimConn) close()                         { s.once.Do(func() { s.c.Close() }) }

type deadlineWriter struct{ c net.Conn }

func (d deadlineWriter) Write(b []byte) (int, error) {
	_ = d.c.SetWriteDeadline(time.Now().Add(writeTimeout))
	return d.c.Write(b)
}

// serveConn runs one shim connection: hello, then messages until it closes.
func (m *Manager) serveConn(ctx context.Context, c net.Conn) {
	sc := newShimConn(c)
	defer sc.close()
	r := swapproto.NewReader(c)

	_ = c.SetReadDeadline(time.Now().Add(m.opts.HelloTimeout))
	hello, err := r.Read()
	_ = c.SetReadDeadline(time.Time{})
	if err != nil {
		if !errors.Is(err, io.EOF) {
			_ = sc.send(swapproto.Message{Type: swapproto.TypeError, Reason: fmt.Sprintf("reading hello: %v", err)})
		}
		return
	}
	if hello.Type != swapproto.TypeHello {
		_ = sc.send(swapproto.Message{Type: swapproto.TypeError, Reason: fmt.Sprintf("expected hello, got %q", hello.Type)})
		return
	}
	if hello.Version != swapproto.Version {
		_ = sc.send(swapproto.Message{Type: swapproto.TypeError,
			Reason: fmt.Sprintf("unsupported protocol version %d (this daemon speaks %d)", hello.Version, swapproto.Version)})
		return
	}
	pid, peer := hello.PID, 0
	if uc, ok := c.(*net.UnixConn); ok {
		if cred, err := PeerCred(uc); err == nil {
			peer = int(cred.Pid)
		}
	}
	if pid <= 0 {
		pid = peer
	}
	if pid <= 0 {
		_ = sc.send(swapproto.Message{Type: swapproto.TypeError, Reason: "hello without a pid"})
		return
	}
	p := &proc{conn: sc, ops: map[swapproto.ID]*op{}}
	p.Process = Process{PID: pid, Job: hello.Job, Priority: hello.Priority, Device: string(hello.Device),
		Bytes: hello.Bytes, State: Running, Started: m.opts.Now()}
	if peer != pid {
		p.PeerPID = peer
	}
	if p.Job == "" {
		p.Job = fmt.Sprintf("pid-%d", pid)
	}
	if err := m.register(p); err != nil {
		_ = sc.send(swapproto.Message{Type: swapproto.TypeError, Reason: err.Error()})
		return
	}
	defer m.forget(p)
	if err := sc.send(swapproto.Message{Type: swapproto.TypeWelcome, Version: swapproto.Version}); err != nil {
		return
	}
	m.log.Info("shim connected", "pid", pid, "job", p.Job, "priority", p.Priority, "device", p.Device, "bytes", p.Bytes)

	var needs sync.WaitGroup
	needCtx, cancelNeeds := context.WithCancel(ctx)
	defer func() { cancelNeeds(); needs.Wait() }()
	for {
		msg, err := r.Read()
		switch {
		case errors.Is(err, swapproto.ErrLineTooLong), errors.Is(err, swapproto.ErrMalformed):
			_ = sc.send(swapproto.Message{Type: swapproto.TypeError, Reason: err.Error()})
			continue
		case err != nil:
			return
		}
		switch msg.Type {
		case swapproto.TypeUsage:
			m.onUsage(pid, msg.Bytes)
		case swapproto.TypeProgress:
			m.onProgress(pid, msg)
		case swapproto.TypeResult:
			if err := m.onResult(pid, msg); err != nil {
				_ = sc.send(swapproto.Message{Type: swapproto.TypeError, Reason: err.Error()})
			}
		case swapproto.TypeNeed:
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
			_ = sc.send(swapproto.Message{Type: swapproto.TypeError, Reason: reason})
		}
	}
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
	d := PlanNeed(s, want)
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
