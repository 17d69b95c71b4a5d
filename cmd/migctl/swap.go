package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/migctl/migctl/context/ctlpb"
)

// swapConn are the flags every swap subcommand shares: where the daemon is
// and how long to wait for it.
type swapConn struct {
	socket  string
	timeout time.Duration
}

func newSwapCmd(s streams) *cobra.Command {
	c := &swapConn{}
	cmd := &cobra.Command{
		Use:   "swap",
		Short: "Ask the daemon to swap a job's GPU memory out to host memory or back in",
		Long: `Talk to 'migctl daemon' on its control socket: swap the GPU memory of processes that run
under the shim (libmigswap.so) out to host memory and back in, at the same virtual
addresses; list them; reserve memory for a job that does not run under the shim.

A process swapped out by hand stays out until 'migctl swap in' (the daemon's policy only
brings back what it swapped out itself).`,
		Example: `  migctl swap status
  migctl swap out --job batch-train
  migctl swap in --pid 12345 --timeout 2m
  migctl swap reserve --device 0 --bytes 40GiB --priority 10`,
	}
	cmd.PersistentFlags().StringVar(&c.socket, "socket", envOr(envControlSocket, defaultControlSocket), "the daemon's control socket (env "+envControlSocket+")")
	cmd.PersistentFlags().DurationVar(&c.timeout, "timeout", 10*time.Minute, "give up waiting after this long (a swap in progress goes on in the daemon)")
	cmd.AddCommand(newSwapOutCmd(s, c), newSwapInCmd(s, c), newSwapStatusCmd(s, c), newSwapReserveCmd(s, c))
	return cmd
}

// errDaemonNotRunning says how to start the daemon.
var errDaemonNotRunning = errors.New("the migctl daemon is not running")

// dial checks that the daemon listens on the socket and returns a client.
func (c *swapConn) dial(ctx context.Context) (ctlpb.ControlClient, func(), error) {
	hint := fmt.Sprintf("start it with 'sudo migctl daemon' (or 'migctl daemon --socket %s --swap-socket ... --gpu-memory SIZE' without a GPU), or point --socket at the socket it uses", c.socket)
	d := net.Dialer{Timeout: 2 * time.Second}
	probe, err := d.DialContext(ctx, "unix", c.socket)
	switch {
	case errors.Is(err, os.ErrNotExist), errors.Is(err, syscall.ENOENT):
		return nil, nil, fmt.Errorf("%w (no socket at %s): %s", errDaemonNotRunning, c.socket, hint)
	case errors.Is(err, syscall.ECONNREFUSED):
		return nil, nil, fmt.Errorf("%w (%s is a stale socket): %s", errDaemonNotRunning, c.socket, hint)
	case errors.Is(err, os.ErrPermission), errors.Is(err, syscall.EACCES):
		return nil, nil, fmt.Errorf("permission denied on %s: the daemon's sockets are owner-only; run as the daemon's user or root", c.socket)
	case err != nil:
		return nil, nil, fmt.Errorf("connecting to the daemon at %s: %w", c.socket, err)
	}
	probe.Close()
	conn, err := grpc.NewClient("passthrough:///migctl-daemon",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return d.DialContext(ctx, "unix", c.socket)
		}))
	if err != nil {
		return nil, nil, fmt.Errorf("connecting to the daemon at %s: %w", c.socket, err)
	}
	return ctlpb.NewControlClient(conn), func() { conn.Close() }, nil
}

// client dials the daemon with a context bounded by --timeout; done closes
// the connection and releases the context.
func (c *swapConn) client(ctx context.Context) (context.Context, ctlpb.ControlClient, func(), error) {
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	cl, closeConn, err := c.dial(ctx)
	if err != nil {
		cancel()
		return nil, nil, nil, err
	}
	return ctx, cl, func() { closeConn(); cancel() }, nil
}

// explain turns a control API error into a message for people.
func (c *swapConn) explain(err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	switch st.Code() {
	case codes.NotFound:
		return fmt.Errorf("%s (see 'migctl swap status' for the shimmed processes)", st.Message())
	case codes.FailedPrecondition, codes.Aborted, codes.InvalidArgument:
		return errors.New(st.Message())
	case codes.DeadlineExceeded:
		return fmt.Errorf("gave up after --timeout %s; a swap in progress goes on in the daemon (see 'migctl swap status')", c.timeout)
	case codes.Unavailable:
		return fmt.Errorf("%w (%s): start it with 'sudo migctl daemon'", errDaemonNotRunning, st.Message())
	default:
		return fmt.Errorf("daemon: %s", st.Message())
	}
}
