package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	ctxmgr "github.com/migctl/migctl/context"
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
  migctl swap reserve --device 0 --bytes 40GiB --priority 10
  migctl swap gate --job batch-train --policy budget=2`,
	}
	cmd.PersistentFlags().StringVar(&c.socket, "socket", ctxmgr.DefaultControlSocket(), "the daemon's control socket (env "+envControlSocket+")")
	cmd.PersistentFlags().DurationVar(&c.timeout, "timeout", 10*time.Minute, "give up waiting after this long (a swap in progress goes on in the daemon)")
	cmd.AddCommand(newSwapOutCmd(s, c), newSwapInCmd(s, c), newSwapStatusCmd(s, c), newSwapReserveCmd(s, c),
		newSwapGateCmd(s, c))
	return cmd
}

// errDaemonNotRunning: nothing listens on the control socket (the error
// says how to start the daemon).
var errDaemonNotRunning = ctxmgr.ErrDaemonNotRunning

// connect dials the daemon with a context bounded by --timeout; done closes
// the connection and releases the context.
func (c *swapConn) connect(ctx context.Context) (context.Context, *ctxmgr.Client, func(), error) {
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	cl, err := ctxmgr.Dial(ctx, c.socket)
	if err != nil {
		cancel()
		return nil, nil, nil, c.explain(err)
	}
	return ctx, cl, func() { cl.Close(); cancel() }, nil
}

// client is connect for callers that speak the gRPC API themselves.
func (c *swapConn) client(ctx context.Context) (context.Context, ctlpb.ControlClient, func(), error) {
	ctx, cl, done, err := c.connect(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	return ctx, cl.Control(), done, nil
}

// explain turns a daemon error (from the Client, or a raw gRPC status) into
// a message for people.
func (c *swapConn) explain(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ctxmgr.ErrNoSuchProcess), errors.Is(err, ctxmgr.ErrNoSuchJob):
		return fmt.Errorf("%w (see 'migctl swap status' for the shimmed processes)", err)
	case errors.Is(err, context.DeadlineExceeded), status.Code(err) == codes.DeadlineExceeded:
		return fmt.Errorf("gave up after --timeout %s; a swap in progress goes on in the daemon (see 'migctl swap status')", c.timeout)
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	switch st.Code() {
	case codes.NotFound:
		return fmt.Errorf("%s (see 'migctl swap status' for the shimmed processes)", st.Message())
	case codes.FailedPrecondition, codes.Aborted, codes.InvalidArgument, codes.ResourceExhausted:
		return errors.New(st.Message())
	case codes.PermissionDenied:
		return errors.New(st.Message())
	case codes.Unavailable:
		return fmt.Errorf("%w at %s (%s): start it with 'sudo migctl daemon' (or 'migctl daemon --sim h200x8' without a GPU)", errDaemonNotRunning, c.socket, st.Message())
	default:
		return fmt.Errorf("daemon: %s", st.Message())
	}
}
