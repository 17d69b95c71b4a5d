package trainer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"github.com/migctl/migctl/context/swapproto"
)

// swapMember is a host-backend rank's connection to the node daemon's shim
// socket: it registers the process as holding no GPU memory, so the daemon
// can swap the whole job out and in as a gang, and turns the daemon's
// swap_out and swap_in into a hold of the group's collectives.
type swapMember struct {
	conn net.Conn
	w    *swapproto.Writer
	hold *holdState
	mu   sync.Mutex // serialises writes
	done chan struct{}
}

// joinSwap connects a host-backend rank to the daemon named by
// MIGSWAP_SOCKET. No socket, no daemon, or a daemon that refuses: the rank
// runs without gang preemption, as a process under the shim would.
func joinSwap(ctx context.Context, g *Group) (*swapMember, error) {
	c := g.cfg
	if c.swapSocket == "" || c.backend != BackendHost {
		return nil, nil
	}
	job := c.swapJob
	if job == "" {
		job = c.job
	}
	if job == "" {
		job = fmt.Sprintf("pid-%d", os.Getpid())
	}
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(dctx, "unix", c.swapSocket)
	if err != nil {
		return nil, nil // no daemon: no preemption, like the shim's passthrough
	}
	m := &swapMember{conn: conn, w: swapproto.NewWriter(conn), hold: g.hold, done: make(chan struct{})}
	hello := swapproto.Message{Type: swapproto.TypeHello, Version: swapproto.Version, PID: os.Getpid(), Job: job,
		Priority: c.swapPriority, Device: swapproto.Device("host"), Bytes: 0}
	if err := m.w.Write(hello); err != nil {
		conn.Close()
		return nil, nil
	}
	r := swapproto.NewReader(conn)
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	welcome, err := r.Read()
	_ = conn.SetReadDeadline(time.Time{})
	if err != nil || welcome.Type != swapproto.TypeWelcome {
		conn.Close()
		return nil, nil
	}
	go m.loop(r)
	return m, nil
}

// loop answers the daemon's swaps until the connection ends; then any hold
// is released (nobody is left to swap the job back in).
func (m *swapMember) loop(r *swapproto.Reader) {
	defer close(m.done)
	defer m.hold.releaseAll()
	for {
		msg, err := r.Read()
		if err != nil {
			if errors.Is(err, swapproto.ErrLineTooLong) || errors.Is(err, swapproto.ErrMalformed) {
				continue
			}
			return
		}
		start := time.Now()
		switch msg.Type {
		case swapproto.TypeSwapOut:
			m.hold.out()
		case swapproto.TypeSwapIn:
			m.hold.in()
		default:
			continue
		}
		m.mu.Lock()
		_ = m.w.Write(swapproto.Message{Type: swapproto.TypeResult, ID: msg.ID, OK: true, Bytes: 0,
			Seconds: time.Since(start).Seconds()})
		m.mu.Unlock()
	}
}

// Close ends the connection (the daemon forgets the process).
func (m *swapMember) Close() error {
	err := m.conn.Close()
	<-m.done
	return err
}
