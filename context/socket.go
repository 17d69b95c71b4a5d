package ctxmgr

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// PeerPolicy decides whether a peer with uid may talk to the daemon.
type PeerPolicy func(uid uint32) bool

// SameUIDOrRoot allows the daemon's own uid and root.
func SameUIDOrRoot(self uint32) PeerPolicy {
	return func(uid uint32) bool { return uid == self || uid == 0 }
}

// ListenUnix listens on a Unix stream socket at path, owner-only: a missing
// directory is created 0700 (an existing one is left as it is), a stale socket
// left by a dead daemon is removed (a live one is an error), the socket is
// made 0600, and every accepted connection whose peer allow refuses (checked
// with SO_PEERCRED) is closed before Accept returns it. allow nil means
// SameUIDOrRoot(the daemon's uid). Accepted connections are *net.UnixConn.
func ListenUnix(path string, allow PeerPolicy) (net.Listener, error) {
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
	return &peerListener{UnixListener: ln, allow: allow}, nil
}

// peerListener checks each peer's credentials before handing a connection on.
type peerListener struct {
	*net.UnixListener
	allow PeerPolicy
}

func (l *peerListener) Accept() (net.Conn, error) {
	for {
		c, err := l.AcceptUnix()
		if err != nil {
			return nil, err
		}
		cred, err := PeerCred(c)
		if err != nil || !l.allow(cred.Uid) {
			c.Close()
			continue
		}
		return c, nil
	}
}

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
