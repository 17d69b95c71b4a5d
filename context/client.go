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
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/migctl/migctl/context/ctlpb"
	"github.com/migctl/migctl/mig"
)

// Where the daemon listens unless told otherwise.
const (
	// SystemControlSocket and SystemSwapSocket are root's defaults (and the
	// shim's default MIGSWAP_SOCKET).
	SystemControlSocket = "/run/migctl/control.sock"
	SystemSwapSocket    = "/run/migctl/migswap.sock"
	// EnvControlSocket names the control socket for clients and the daemon.
	EnvControlSocket = "MIGCTL_SOCKET"
	// EnvSwapSocket names the shim socket (read by libmigswap.so too).
	EnvSwapSocket = "MIGSWAP_SOCKET"
)

// Client-side sentinels (the daemon's own, like ErrNoFreeInstance, come back
// as themselves: match them with errors.Is).
var (
	// ErrDaemonNotRunning: nothing listens on the control socket.
	ErrDaemonNotRunning = errors.New("the migctl daemon is not running")
	// ErrPermissionDenied: the daemon refused this user.
	ErrPermissionDenied = errors.New("permission denied by the daemon")
)

// UserSocketDir is where a daemon run by a user other than root puts its
// sockets: $XDG_RUNTIME_DIR/migctl, else /tmp/migctl-<uid>.
func UserSocketDir() string {
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "migctl")
	}
	return filepath.Join(os.TempDir(), "migctl-"+strconv.Itoa(os.Getuid()))
}

// DaemonSockets are the sockets `migctl daemon` listens on by default:
// $MIGCTL_SOCKET / $MIGSWAP_SOCKET when set, else root's /run/migctl/...,
// else the user's UserSocketDir.
func DaemonSockets() (control, swap string) {
	control, swap = SystemControlSocket, SystemSwapSocket
	if os.Geteuid() != 0 {
		control, swap = filepath.Join(UserSocketDir(), "control.sock"), filepath.Join(UserSocketDir(), "migswap.sock")
	}
	if v := os.Getenv(EnvControlSocket); v != "" {
		control = v
	}
	if v := os.Getenv(EnvSwapSocket); v != "" {
		swap = v
	}
	return control, swap
}

// DefaultControlSocket is where clients look for the daemon: $MIGCTL_SOCKET,
// else the user's own daemon's socket if there is one, else root's.
func DefaultControlSocket() string {
	if v := os.Getenv(EnvControlSocket); v != "" {
		return v
	}
	if os.Geteuid() != 0 {
		user := filepath.Join(UserSocketDir(), "control.sock")
		if fi, err := os.Stat(user); err == nil && fi.Mode()&os.ModeSocket != 0 {
			return user
		}
	}
	return SystemControlSocket
}

// Client talks to the daemon's control API. Safe for concurrent use; Close
// it when done.
type Client struct {
	socket string
	conn   *grpc.ClientConn
	ctl    ctlpb.ControlClient
}

// notRunning says how to start the daemon.
func notRunning(socket, why string) error {
	return fmt.Errorf("%w at %s (%s): start it with 'sudo migctl daemon' (or 'migctl daemon --sim h200x8' on a machine without a GPU), "+
		"or point --socket / %s at the socket it listens on", ErrDaemonNotRunning, socket, why, EnvControlSocket)
}

// Dial connects to the daemon at socket and checks that it answers. A dead
// daemon is ErrDaemonNotRunning with how to start it; a daemon that refuses
// this user is ErrPermissionDenied with its reason. Blocks up to ctx (and at
// most 5 s for the check).
func Dial(ctx context.Context, socket string) (*Client, error) {
	if socket == "" {
		socket = DefaultControlSocket()
	}
	d := net.Dialer{Timeout: 2 * time.Second}
	probe, err := d.DialContext(ctx, "unix", socket)
	switch {
	case errors.Is(err, os.ErrNotExist), errors.Is(err, syscall.ENOENT):
		return nil, notRunning(socket, "no socket there")
	case errors.Is(err, syscall.ECONNREFUSED):
		return nil, notRunning(socket, "a stale socket: the daemon that made it is gone")
	case errors.Is(err, os.ErrPermission), errors.Is(err, syscall.EACCES):
		return nil, fmt.Errorf("%w: %s is owner-only (uid %d may not open it); run as the daemon's user or root", ErrPermissionDenied, socket, os.Getuid())
	case err != nil:
		return nil, fmt.Errorf("connecting to the daemon at %s: %w", socket, err)
	}
	probe.Close()
	conn, err := grpc.NewClient("passthrough:///migctl-daemon",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return d.DialContext(ctx, "unix", socket)
		}))
	if err != nil {
		return nil, fmt.Errorf("connecting to the daemon at %s: %w", socket, err)
	}
	c := &Client{socket: socket, conn: conn, ctl: ctlpb.NewControlClient(conn)}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	// Unimplemented: a daemon from before leases, alive all the same.
	if _, err := c.ctl.List(cctx, &ctlpb.ListRequest{}); err != nil && status.Code(err) != codes.Unimplemented {
		conn.Close()
		return nil, c.wrap(err)
	}
	return c, nil
}

// Close closes the connection; leases bound to it end.
func (c *Client) Close() error { return c.conn.Close() }

// Socket is the control socket the client is connected to.
func (c *Client) Socket() string { return c.socket }

// Control is the raw gRPC client, for callers that need the protocol itself.
func (c *Client) Control() ctlpb.ControlClient { return c.ctl }

// sentinels the daemon's messages carry, recognised by their text.
var remoteSentinels = []error{ErrNoSuchProcess, ErrNoSuchJob, ErrAlreadyOut, ErrAlreadyIn, ErrBusy, ErrDisconnected, ErrDenied,
	ErrNoFreeInstance, ErrLeased, ErrNoLease, mig.ErrUnknownProfile, ErrBadRequest, ErrNoMIG}

// RemoteError is an error the daemon returned: Error is its message, Code
// its gRPC code, and errors.Is matches the sentinel the message carries.
type RemoteError struct {
	Code     codes.Code
	Msg      string
	sentinel error
}

func (e *RemoteError) Error() string { return e.Msg }
func (e *RemoteError) Unwrap() error { return e.sentinel }

// wrap turns a gRPC error into one callers can match: the daemon's
// sentinels, ErrDaemonNotRunning, ErrPermissionDenied, context errors.
func (c *Client) wrap(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	switch st.Code() {
	case codes.Unavailable:
		return notRunning(c.socket, st.Message())
	case codes.PermissionDenied:
		msg := st.Message()
		if !strings.HasPrefix(msg, ErrPermissionDenied.Error()) {
			msg = ErrPermissionDenied.Error() + ": " + msg
		}
		return &RemoteError{Code: st.Code(), Msg: msg, sentinel: ErrPermissionDenied}
	case codes.DeadlineExceeded:
		return fmt.Errorf("waiting for the daemon at %s: %w", c.socket, context.DeadlineExceeded)
	case codes.Canceled:
		return fmt.Errorf("waiting for the daemon at %s: %w", c.socket, context.Canceled)
	}
	e := &RemoteError{Code: st.Code(), Msg: st.Message()}
	for _, s := range remoteSentinels {
		if strings.Contains(e.Msg, s.Error()) {
			e.sentinel = s
			break
		}
	}
	if e.sentinel == nil && st.Code() == codes.InvalidArgument {
		e.sentinel = ErrBadRequest
	}
	return e
}

// Acquire leases req.Count MIG devices of req.Profile to req.Job (GPU -1:
// any), creating instances when too few are free, all or nothing. With
// req.PID the leases end when that process exits; with
// req.BindToConnection, when this client closes. A request that does not
// fit fails with ErrNoFreeInstance and the daemon's explanation.
func (c *Client) Acquire(ctx context.Context, req AcquireRequest) ([]Lease, error) {
	r, err := c.ctl.Acquire(ctx, &ctlpb.AcquireRequest{Job: req.Job, Profile: req.Profile, Count: int32(req.Count),
		Gpu: int32(req.GPU), Pid: int32(req.PID), BindToConnection: req.BindToConnection})
	if err != nil {
		return nil, c.wrap(err)
	}
	return leasesFromPB(r.GetLeases()), nil
}

// Release ends every lease of job and returns them (ErrNoLease: none).
func (c *Client) Release(ctx context.Context, job string) ([]Lease, error) {
	r, err := c.ctl.Release(ctx, &ctlpb.ReleaseRequest{Job: job})
	if err != nil {
		return nil, c.wrap(err)
	}
	return leasesFromPB(r.GetLeases()), nil
}

// ReleaseUUID ends the lease of one MIG device (ErrNoLease: none).
func (c *Client) ReleaseUUID(ctx context.Context, uuid string) (Lease, error) {
	r, err := c.ctl.Release(ctx, &ctlpb.ReleaseRequest{Uuid: uuid})
	if err != nil {
		return Lease{}, c.wrap(err)
	}
	ls := leasesFromPB(r.GetLeases())
	if len(ls) == 0 {
		return Lease{}, fmt.Errorf("%s: %w", uuid, ErrNoLease)
	}
	return ls[0], nil
}

// Leases lists every lease, by GPU and placement.
func (c *Client) Leases(ctx context.Context) ([]Lease, error) {
	r, err := c.ctl.List(ctx, &ctlpb.ListRequest{})
	if err != nil {
		return nil, c.wrap(err)
	}
	return leasesFromPB(r.GetLeases()), nil
}

// EventWatchEnded is the last event of a Watch channel that ended for
// another reason than ctx (the daemon stopped, the watcher fell behind);
// Reason says why.
const EventWatchEnded EventType = "watch-ended"

// Watch streams lease and swap events of job ("" for all) until ctx ends.
// It returns once the daemon has the watch in place, so nothing that
// happens after it returns is missed. The channel is closed at the end; if
// the stream broke (not ctx), an EventWatchEnded event comes first.
func (c *Client) Watch(ctx context.Context, job string) (<-chan Event, error) {
	stream, err := c.ctl.Watch(ctx, &ctlpb.WatchRequest{Job: job})
	if err != nil {
		return nil, c.wrap(err)
	}
	if _, err := stream.Header(); err != nil {
		return nil, c.wrap(err)
	}
	ch := make(chan Event, 64)
	go func() {
		defer close(ch)
		for {
			ev, err := stream.Recv()
			if err != nil {
				if ctx.Err() == nil {
					reason := "the daemon ended the stream"
					if !errors.Is(err, io.EOF) {
						reason = c.wrap(err).Error()
					}
					select {
					case ch <- Event{Type: EventWatchEnded, Job: job, Time: time.Now(), Reason: reason}:
					case <-ctx.Done():
					}
				}
				return
			}
			select {
			case ch <- eventFromPB(ev):
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch, nil
}

// Swap swaps a pid's or a job's shimmed processes out or in and returns a
// result per process; progress (may be nil) sees the copies advance. It
// blocks until every process is done or ctx ends (the swap then goes on in
// the daemon).
func (c *Client) Swap(ctx context.Context, dir Direction, t Target, progress func(Progress)) ([]Result, error) {
	d := ctlpb.Direction_DIRECTION_OUT
	if dir == SwapIn {
		d = ctlpb.Direction_DIRECTION_IN
	}
	stream, err := c.ctl.Swap(ctx, &ctlpb.SwapRequest{Direction: d, Pid: int32(t.PID), Job: t.Job})
	if err != nil {
		return nil, c.wrap(err)
	}
	var out []Result
	for {
		ev, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, c.wrap(err)
		}
		if p := ev.GetProgress(); p != nil && progress != nil {
			progress(Progress{PID: int(p.GetPid()), Done: p.GetDone(), Total: p.GetTotal()})
		}
		if r := ev.GetResult(); r != nil {
			out = append(out, *resultFromPB(r))
		}
	}
}

// Status lists the shimmed processes and the free memory of their devices.
func (c *Client) Status(ctx context.Context) ([]Process, map[string]int64, error) {
	st, err := c.ctl.Status(ctx, &ctlpb.StatusRequest{})
	if err != nil {
		return nil, nil, c.wrap(err)
	}
	procs := make([]Process, 0, len(st.GetProcesses()))
	for _, p := range st.GetProcesses() {
		procs = append(procs, Process{PID: int(p.GetPid()), PeerPID: int(p.GetPeerPid()), Job: p.GetJob(),
			Priority: int(p.GetPriority()), Device: p.GetDevice(), Bytes: p.GetBytes(), State: State(p.GetState()),
			Hold: p.GetHold(), Started: unixTime(p.GetStartedUnixNano()), LastProgress: unixTime(p.GetLastProgressUnixNano()),
			Done: p.GetDone(), Total: p.GetTotal(), Waiting: p.GetWaiting(), Gate: gateStatusOf(p)})
	}
	free := map[string]int64{}
	for _, d := range st.GetDevices() {
		free[d.GetDevice()] = d.GetFree()
	}
	return procs, free, nil
}

// gateStatusOf reads a process's gating fields (slot -1 when it has none).
func gateStatusOf(p *ctlpb.Process) GateStatus {
	g := GateStatus{Class: p.GetGateClass(), Policy: p.GetGatePolicy(), Slot: int(p.GetGateSlot()),
		Holds: p.GetGateHolds(), HeldSeconds: p.GetGateHeldSeconds(), BusyPeriods: p.GetGateBusyPeriods(),
		BusySeconds: p.GetGateBusySeconds()}
	if g.Class == "" {
		g.Slot = -1
	}
	return g
}

func unixTime(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

// Reservation is what Reserve did: the processes it swapped out and the
// free memory it started from.
type Reservation struct {
	Victims []int `json:"victims" yaml:"victims"`
	Free    int64 `json:"free" yaml:"free"`
}

// Reserve asks the policy to make room for req.Bytes on req.Device for a job
// of req.Priority that is not shimmed, and to keep it for hold.
func (c *Client) Reserve(ctx context.Context, req Request, hold time.Duration) (Reservation, error) {
	r, err := c.ctl.Reserve(ctx, &ctlpb.ReserveRequest{Device: req.Device, Bytes: req.Bytes, Priority: int32(req.Priority),
		HoldSeconds: hold.Seconds()})
	if err != nil {
		return Reservation{}, c.wrap(err)
	}
	out := Reservation{Free: r.GetFree(), Victims: []int{}}
	for _, v := range r.GetVictims() {
		out.Victims = append(out.Victims, int(v))
	}
	return out, nil
}

// SetGate sets the priority-gating policy of t's processes ("gate",
// "budget=N[,depth=M]", "off", or "default" for the daemon's) and returns
// their pids.
func (c *Client) SetGate(ctx context.Context, t Target, policy string) ([]int, error) {
	r, err := c.ctl.SetGate(ctx, &ctlpb.SetGateRequest{Pid: int32(t.PID), Job: t.Job, Policy: policy})
	if err != nil {
		return nil, c.wrap(err)
	}
	out := make([]int, 0, len(r.GetPids()))
	for _, p := range r.GetPids() {
		out = append(out, int(p))
	}
	return out, nil
}

// CollectiveReport is what a process reports of its collective calls since
// its last report (op: one of CollectiveOps).
type CollectiveReport struct {
	Job     string
	Op      string
	Calls   int64
	Bytes   int64
	Seconds float64
}

// ReportCollectives adds r to the daemon's collective metrics.
func (c *Client) ReportCollectives(ctx context.Context, r CollectiveReport) error {
	_, err := c.ctl.ReportCollectives(ctx, &ctlpb.CollectiveReport{Job: r.Job, Op: r.Op, Calls: r.Calls, Bytes: r.Bytes, Seconds: r.Seconds})
	return c.wrap(err)
}
