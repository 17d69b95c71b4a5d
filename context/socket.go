package ctxmgr

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/migctl/migctl/context/swapproto"
)

// PeerPolicy decides whether a peer with uid may talk to the daemon.
type PeerPolicy func(uid uint32) bool

// SameUIDOrRoot allows the daemon's own uid and root.
func SameUIDOrRoot(self uint32) PeerPolicy {
	return func(uid uint32) bool { return uid == self || uid == 0 }
}

// refusalSlots bounds the refused peers being answered at once; more are
// closed without an answer.
const refusalSlots = 16

// refusalDeadline bounds how long a refused peer may take to show which
// protocol it speaks, and how long an answered one stays connected.
const refusalDeadline = 2 * time.Second

// ListenOption configures ListenUnix.
type ListenOption func(*peerListener)

// WithLogger sends the log of refused peers to l (default slog.Default()).
func WithLogger(l *slog.Logger) ListenOption {
	return func(pl *peerListener) {
		if l != nil {
			pl.log = l
		}
	}
}

// ListenUnix listens on a Unix stream socket at path, owner-only: a missing
// directory is created 0700 (an existing one is left as it is), a stale socket
// left by a dead daemon is removed (a live one is an error), the socket is
// made 0600, and every accepted connection whose peer allow refuses (checked
// with SO_PEERCRED) is logged and answered in the protocol it speaks, never
// returned by Accept: a gRPC client (the CLI) gets codes.PermissionDenied
// "permission denied by the daemon (uid X is not allowed; run as uid Y or
// root)", a shim an error message with the same reason; then it is closed.
// allow nil means SameUIDOrRoot(the daemon's uid). Accepted connections are
// *net.UnixConn.
func ListenUnix(path string, allow PeerPolicy, opts ...ListenOption) (net.Listener, error) {
	if allow == nil {
		allow = SameUIDOrRoot(uint32(os.Getuid()))
	}
	dir := filepath.Dir(path)
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("creating socket directory: %w", err)
		}
		if err := os.Chmod(dir, 0o700); err != nil { // MkdirAll is subject to umask
			return nil, fmt.Errorf("making socket directory owner-only: %w", err)
		}
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("%s exists and is not a socket", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("another daemon is listening on %s", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("removing stale socket: %w", err)
		}
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("making socket owner-only: %w", err)
	}
	pl := &peerListener{UnixListener: ln, path: path, allow: allow, self: uint32(os.Getuid()),
		log: slog.Default(), slots: make(chan struct{}, refusalSlots), closed: make(chan struct{})}
	for _, o := range opts {
		o(pl)
	}
	return pl, nil
}

// peerListener checks each peer's credentials before handing a connection on.
type peerListener struct {
	*net.UnixListener
	path  string
	allow PeerPolicy
	self  uint32
	log   *slog.Logger
	slots chan struct{} // refused peers being answered

	closeOnce sync.Once
	closed    chan struct{}

	mu sync.Mutex
	// logWindow, logged, suppressed rate-limit the refusal log.
	logWindow          time.Time
	logged, suppressed int
	// refusal answers refused gRPC peers over refused; started for the first.
	refusal *grpc.Server
	refused *queueListener
}

func (l *peerListener) Accept() (net.Conn, error) {
	for {
		c, err := l.AcceptUnix()
		if err != nil {
			return nil, err
		}
		cred, err := PeerCred(c)
		if err != nil {
			l.log.Warn("peer refused: no credentials", "socket", l.path, "err", err)
			c.Close()
			continue
		}
		if l.allow(cred.Uid) {
			return c, nil
		}
		l.logRefusal(cred)
		select {
		case l.slots <- struct{}{}:
			go l.answer(c, cred.Uid)
		default:
			c.Close() // too many at once: no answer
		}
	}
}

// refusalLogRate is how many refusals a listener logs per second; more are
// counted and the count logged with the next one logged (a refused user
// looping on the socket must not fill the daemon's log).
const refusalLogRate = 10

func (l *peerListener) logRefusal(cred *unix.Ucred) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if now.Sub(l.logWindow) >= time.Second {
		l.logWindow, l.logged = now, 0
	}
	if l.logged >= refusalLogRate {
		l.suppressed++
		return
	}
	l.logged++
	args := []any{"socket", l.path, "uid", cred.Uid, "pid", cred.Pid, "reason", refusalReason(cred.Uid, l.self)}
	if l.suppressed > 0 {
		args = append(args, "not_logged_before", l.suppressed)
		l.suppressed = 0
	}
	l.log.Warn("peer refused", args...)
}

// Close stops listening and ends the answers to refused peers.
func (l *peerListener) Close() error {
	err := l.UnixListener.Close()
	l.closeOnce.Do(func() {
		close(l.closed)
		l.mu.Lock()
		srv := l.refusal
		l.mu.Unlock()
		if srv != nil {
			srv.Stop()
		}
	})
	return err
}

// refusalReason is what a refused peer is told.
func refusalReason(uid, self uint32) string {
	run := fmt.Sprintf("run as uid %d or root", self)
	if self == 0 {
		run = "run as root"
	}
	return fmt.Sprintf("permission denied by the daemon (uid %d is not allowed; %s)", uid, run)
}

// answer tells a refused peer why, in its protocol: a gRPC client (which
// starts with the HTTP/2 preface "PRI ") is handed to the refusal server; a
// shim (which starts with a JSON hello) gets a swapproto error; anything else
// is closed. It holds a slot until the connection is closed.
func (l *peerListener) answer(c *net.UnixConn, uid uint32) {
	rc := &refusedConn{UnixConn: c, r: bufio.NewReader(c), uid: uid, release: func() { <-l.slots }}
	_ = c.SetDeadline(time.Now().Add(refusalDeadline))
	first, err := rc.r.Peek(1)
	switch {
	case err == nil && first[0] == 'P':
		if srv, q := l.refusalServer(); srv != nil {
			select {
			case q.conns <- rc:
				return // the refusal server closes it (deadline, or after its answer)
			case <-l.closed:
			}
		}
	case err == nil && first[0] == '{':
		if b, err := swapproto.Encode(swapproto.Message{Type: swapproto.TypeError, Reason: refusalReason(uid, l.self)}); err == nil {
			_, _ = c.Write(b)
		}
	}
	rc.Close()
}

// refusalServer returns the gRPC server that answers refused peers with
// PermissionDenied, started at the first call; nil after Close.
func (l *peerListener) refusalServer() (*grpc.Server, *queueListener) {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.closed:
		return nil, nil
	default:
	}
	if l.refusal == nil {
		l.refused = &queueListener{addr: l.Addr(), conns: make(chan net.Conn), closed: make(chan struct{})}
		l.refusal = grpc.NewServer(
			grpc.UnknownServiceHandler(func(_ any, stream grpc.ServerStream) error {
				uid := uint32(0)
				if p, ok := peer.FromContext(stream.Context()); ok {
					if a, ok := p.Addr.(refusedAddr); ok {
						uid = a.uid
					}
				}
				return status.Error(codes.PermissionDenied, refusalReason(uid, l.self))
			}),
			grpc.ConnectionTimeout(refusalDeadline),
			grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionAge: refusalDeadline, MaxConnectionAgeGrace: refusalDeadline}),
		)
		srv, q := l.refusal, l.refused
		go func() { _ = srv.Serve(q) }()
	}
	return l.refusal, l.refused
}

// refusedConn is a refused peer's connection: what answer peeked is read
// again, its address carries the uid, and Close frees its slot.
type refusedConn struct {
	*net.UnixConn
	r       *bufio.Reader
	uid     uint32
	once    sync.Once
	release func()
}

func (c *refusedConn) Read(b []byte) (int, error) { return c.r.Read(b) }
func (c *refusedConn) RemoteAddr() net.Addr       { return refusedAddr{uid: c.uid} }
func (c *refusedConn) Close() error {
	err := c.UnixConn.Close()
	c.once.Do(c.release)
	return err
}

// refusedAddr is a refused peer's address: its uid.
type refusedAddr struct{ uid uint32 }

func (a refusedAddr) Network() string { return "unix" }
func (a refusedAddr) String() string  { return fmt.Sprintf("uid %d", a.uid) }

// queueListener hands the refusal server the connections answer queues.
type queueListener struct {
	addr   net.Addr
	conns  chan net.Conn
	once   sync.Once
	closed chan struct{}
}

func (q *queueListener) Accept() (net.Conn, error) {
	select {
	case c := <-q.conns:
		_ = c.SetDeadline(time.Time{}) // the server's ConnectionTimeout and MaxConnectionAge bound it now
		return c, nil
	case <-q.closed:
		return nil, net.ErrClosed
	}
}

func (q *queueListener) Close() error   { q.once.Do(func() { close(q.closed) }); return nil }
func (q *queueListener) Addr() net.Addr { return q.addr }

// PeerCred returns the credentials of a Unix socket's peer (SO_PEERCRED).
func PeerCred(c *net.UnixConn) (*unix.Ucred, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("reading peer credentials: %w", err)
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return nil, fmt.Errorf("reading peer credentials: %w", err)
	}
	if cerr != nil {
		return nil, fmt.Errorf("reading peer credentials: %w", cerr)
	}
	return cred, nil
}
