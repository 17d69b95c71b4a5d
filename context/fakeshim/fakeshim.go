package fakeshim

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/migctl/migctl/context/swapproto"
)

// Hello is what the shim says about itself.
type Hello struct {
	PID      int
	Job      string
	Priority int
	Device   string
	Bytes    int64
}

// Behavior is how the shim answers swaps. The zero value succeeds at once.
type Behavior struct {
	// Chunks is the number of progress reports per swap (default 4), each
	// after ChunkDelay.
	Chunks     int
	ChunkDelay time.Duration
	// RefuseOut / FailIn, when not empty, make swap-out (refused) or swap-in
	// (no memory) fail with that reason.
	RefuseOut string
	FailIn    string
	// DisconnectMidSwap closes the connection after the first progress report.
	DisconnectMidSwap bool
}

// Shim is one fake shimmed process connected to a daemon.
type Shim struct {
	conn  net.Conn
	w     *swapproto.Writer
	hello Hello

	mu       sync.Mutex
	behavior Behavior
	bytes    int64
	out      bool
	swaps    []string // "swap_out"/"swap_in" as received
	errors   []string
	nextNeed int
	needs    map[swapproto.ID]chan swapproto.Message
	closed   chan struct{}
	readErr  error
}

// Dial connects to the daemon's shim socket, says hello and waits for welcome.
func Dial(ctx context.Context, socket string, h Hello, b Behavior) (*Shim, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, fmt.Errorf("dialing %s: %w", socket, err)
	}
	s := &Shim{conn: c, w: swapproto.NewWriter(c), hello: h, behavior: b, bytes: h.Bytes,
		needs: map[swapproto.ID]chan swapproto.Message{}, closed: make(chan struct{})}
	if err := s.w.Write(swapproto.Message{Type: swapproto.TypeHello, Version: swapproto.Version, PID: h.PID,
		Job: h.Job, Priority: h.Priority, Device: swapproto.Device(h.Device), Bytes: h.Bytes}); err != nil {
		c.Close()
		return nil, err
	}
	r := swapproto.NewReader(c)
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetReadDeadline(dl)
	}
	m, err := r.Read()
	_ = c.SetReadDeadline(time.Time{})
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("reading welcome: %w", err)
	}
	if m.Type != swapproto.TypeWelcome {
		c.Close()
		return nil, fmt.Errorf("expected welcome, got %s: %s", m.Type, m.Reason)
	}
	go s.readLoop(r)
	return s, nil
}

// PID is the pid the shim announced.
func (s *Shim) PID() int { return s.hello.PID }

// SetBehavior changes how later swaps are answered.
func (s *Shim) SetBehavior(b Behavior) {
	s.mu.Lock()
	s.behavior = b
	s.mu.Unlock()
}

// Out reports whether the shim's memory is swapped out.
func (s *Shim) Out() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.out
}

// Swaps returns the swap requests received so far ("swap_out", "swap_in").
func (s *Shim) Swaps() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.swaps...)
}

// Errors returns the reasons of the error messages received so far.
func (s *Shim) Errors() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.errors...)
}

// Done is closed when the connection has ended.
func (s *Shim) Done() <-chan struct{} { return s.closed }

// Usage reports the bytes the process's allocations hold.
func (s *Shim) Usage(bytes int64) error {
	s.mu.Lock()
	s.bytes = bytes
	s.mu.Unlock()
	return s.w.Write(swapproto.Message{Type: swapproto.TypeUsage, Bytes: bytes})
}

// Send writes a raw message (for protocol-error tests).
func (s *Shim) Send(m swapproto.Message) error { return s.w.Write(m) }

// SendLine writes raw bytes (for framing tests).
func (s *Shim) SendLine(b []byte) error {
	_, err := s.conn.Write(b)
	return err
}

// Need asks for bytes and blocks until granted (true) or denied (false, reason).
func (s *Shim) Need(ctx context.Context, bytes int64) (bool, string, error) {
	s.mu.Lock()
	s.nextNeed++
	id := swapproto.ID(strconv.Itoa(s.nextNeed))
	ch := make(chan swapproto.Message, 1)
	s.needs[id] = ch
	s.mu.Unlock()
	if err := s.w.Write(swapproto.Message{Type: swapproto.TypeNeed, ID: id, Bytes: bytes}); err != nil {
		return false, "", err
	}
	select {
	case m := <-ch:
		return m.Type == swapproto.TypeGranted, m.Reason, nil
	case <-s.closed:
		return false, "", errors.New("connection closed while waiting for an answer to need")
	case <-ctx.Done():
		return false, "", ctx.Err()
	}
}

// Close ends the connection, like the process exiting.
func (s *Shim) Close() error { return s.conn.Close() }

func (s *Shim) readLoop(r *swapproto.Reader) {
	defer close(s.closed)
	for {
		m, err := r.Read()
		if err != nil {
			s.mu.Lock()
			s.readErr = err
			s.mu.Unlock()
			return
		}
		switch m.Type {
		case swapproto.TypeSwapOut, swapproto.TypeSwapIn:
			s.mu.Lock()
			s.swaps = append(s.swaps, m.Type)
			b := s.behavior
			s.mu.Unlock()
			go s.swap(m, b)
		case swapproto.TypeGranted, swapproto.TypeDenied:
			s.mu.Lock()
			ch := s.needs[m.ID]
			delete(s.needs, m.ID)
			s.mu.Unlock()
			if ch != nil {
				ch <- m
			}
		case swapproto.TypeError:
			s.mu.Lock()
			s.errors = append(s.errors, m.Reason)
			s.mu.Unlock()
		}
	}
}

func (s *Shim) swap(m swapproto.Message, b Behavior) {
	start := time.Now()
	s.mu.Lock()
	total := s.bytes
	s.mu.Unlock()
	chunks := b.Chunks
	if chunks <= 0 {
		chunks = 4
	}
	out := m.Type == swapproto.TypeSwapOut
	if out && b.RefuseOut != "" {
		_ = s.w.Write(swapproto.Message{Type: swapproto.TypeResult, ID: m.ID, Error: b.RefuseOut})
		return
	}
	for i := 1; i <= chunks; i++ {
		time.Sleep(b.ChunkDelay)
		_ = s.w.Write(swapproto.Message{Type: swapproto.TypeProgress, ID: m.ID, Done: total * int64(i) / int64(chunks), Total: total})
		if b.DisconnectMidSwap {
			s.conn.Close()
			return
		}
	}
	if !out && b.FailIn != "" {
		_ = s.w.Write(swapproto.Message{Type: swapproto.TypeResult, ID: m.ID, Error: b.FailIn})
		return
	}
	s.mu.Lock()
	s.out = out
	s.mu.Unlock()
	_ = s.w.Write(swapproto.Message{Type: swapproto.TypeResult, ID: m.ID, OK: true, Bytes: total,
		Seconds: time.Since(start).Seconds()})
}
