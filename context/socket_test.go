package ctxmgr_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	ctxmgr "github.com/migctl/migctl/context"
	"github.com/migctl/migctl/context/ctlpb"
	"github.com/migctl/migctl/context/fakeshim"
)

// serveControl runs the control API on ln and returns a client of socket.
func serveControl(t *testing.T, ln interface{ Close() error }, socket string, serve func(*grpc.Server) error) ctlpb.ControlClient {
	t.Helper()
	srv := grpc.NewServer()
	ctxmgr.NewControlServer(ctxmgr.NewManager(ctxmgr.Options{RebalanceEvery: -1})).Register(srv)
	done := make(chan struct{})
	go func() { defer close(done); _ = serve(srv) }()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return ctlpb.NewControlClient(conn)
}

// TestRefusedUIDGetsPermissionDenied: a peer the policy refuses gets
// PermissionDenied with its uid and what to do, not a closed connection that
// reads as "the daemon is not running" (issue 8 item 12). The policy injects
// the refusal, since the test runs as a uid the default policy allows.
func TestRefusedUIDGetsPermissionDenied(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "run", "control.sock")
	log := &syncLog{}
	ln, err := ctxmgr.ListenUnix(socket, func(uint32) bool { return false }, ctxmgr.WithLogger(slog.New(slog.NewTextHandler(log, nil))))
	require.NoError(t, err)
	cl := serveControl(t, ln, socket, func(s *grpc.Server) error { return s.Serve(ln) })

	for range 3 { // the answer does not wear out
		_, err = cl.Status(ctx5s(t), &ctlpb.StatusRequest{})
		require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
		require.Contains(t, status.Convert(err).Message(), "permission denied by the daemon (uid ")
		require.Contains(t, status.Convert(err).Message(), " is not allowed; run as ")
	}
	stream, err := cl.Swap(ctx5s(t), &ctlpb.SwapRequest{Direction: ctlpb.Direction_DIRECTION_OUT, Job: "x"})
	require.NoError(t, err)
	_, err = stream.Recv()
	require.Equal(t, codes.PermissionDenied, status.Code(err), "streams too: %v", err)
	require.Contains(t, log.String(), "peer refused")
	require.Contains(t, log.String(), "uid=")

	// A shim on a refusing socket is told the same in its protocol.
	shimSocket := filepath.Join(t.TempDir(), "run", "swap.sock")
	sln, err := ctxmgr.ListenUnix(shimSocket, func(uint32) bool { return false }, ctxmgr.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	require.NoError(t, err)
	m := ctxmgr.NewManager(ctxmgr.Options{RebalanceEvery: -1})
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- m.Serve(ctx, sln) }()
	t.Cleanup(func() { cancel(); <-served })
	_, err = fakeshim.Dial(ctx5s(t), shimSocket, fakeshim.Hello{PID: 1}, fakeshim.Behavior{})
	require.ErrorContains(t, err, "expected welcome, got error: permission denied by the daemon (uid ")
}

// TestRefusedUIDProcessGetsPermissionDenied: a client process running as
// nobody, with the socket's file permissions opened so that only the
// daemon's own check stands, gets PermissionDenied naming its uid. Needs root
// (to setuid the child).
func TestRefusedUIDProcessGetsPermissionDenied(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("running a child as another uid needs root")
	}
	const nobody = 65534
	dir, err := os.MkdirTemp("", "ctxsec") // t.TempDir's parents are 0700: nobody could not reach the socket
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	bin := filepath.Join(dir, "ctxmgr.test")
	b, err := os.ReadFile(os.Args[0])
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(bin, b, 0o755))

	socket := filepath.Join(dir, "run", "control.sock")
	log := &syncLog{}
	ln, err := ctxmgr.ListenUnix(socket, nil, ctxmgr.WithLogger(slog.New(slog.NewTextHandler(log, nil))))
	require.NoError(t, err)
	require.NoError(t, os.Chmod(filepath.Dir(socket), 0o755))
	require.NoError(t, os.Chmod(socket, 0o666))
	cl := serveControl(t, ln, socket, func(s *grpc.Server) error { return s.Serve(ln) })
	_, err = cl.Status(ctx5s(t), &ctlpb.StatusRequest{})
	require.NoError(t, err, "root is allowed")

	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	cmd := execHelper(ctx, bin, "ctl", socket)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "uid=65534 code=PermissionDenied msg=permission denied by the daemon (uid 65534 is not allowed; run as root)")
	require.Contains(t, log.String(), "peer refused")
	require.Contains(t, log.String(), "uid=65534")
}

// TestRefusalLogIsRateLimited: a refused user looping on the socket gets an
// answer every time but cannot fill the daemon's log.
func TestRefusalLogIsRateLimited(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "run", "s.sock")
	log := &syncLog{}
	ln, err := ctxmgr.ListenUnix(socket, func(uint32) bool { return false }, ctxmgr.WithLogger(slog.New(slog.NewTextHandler(log, nil))))
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() { _, _ = ln.Accept() }() // Accept only returns allowed peers: none
	for range 50 {
		c, err := net.Dial("unix", socket)
		require.NoError(t, err)
		_, _ = c.Write([]byte("{\"type\":\"hello\",\"version\":1}\n"))
		b, err := io.ReadAll(c) // the answer, then the close
		c.Close()
		require.NoError(t, err)
		require.Contains(t, string(b), "permission denied by the daemon")
	}
	n := strings.Count(log.String(), "peer refused")
	require.GreaterOrEqual(t, n, 10)
	require.Less(t, n, 50, "logged at most 10 a second")
}
