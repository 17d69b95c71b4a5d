package ctxmgr

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/migctl/migctl/context/ctlpb"
	"github.com/migctl/migctl/mig"
)

// ControlServer serves the gRPC control API (context/ctlpb) over a Manager
// (swaps), a Leases registry (leases), an EventHub (Watch) and Metrics
// (ReportCollectives). Create the grpc.Server with ServerOptions, so that
// leases bound to a connection end with it, then Register; serve it on
// ListenUnix's socket.
type ControlServer struct {
	ctlpb.UnimplementedControlServer
	m        *Manager
	leases   *Leases
	hub      *EventHub
	metrics  *Metrics
	nextConn atomic.Uint64
	// draining: the server is stopping; connections that end now do not
	// end their leases (the clients live on, and the pids keep the leases
	// across the restart).
	draining atomic.Bool
	stopping chan struct{} // closed by Drain: watches end
	stopOnce sync.Once
}

var _ ctlpb.ControlServer = (*ControlServer)(nil)

// NewControlServer returns the control API of m, with leases, events and
// metrics when given (without leases, Acquire and Release answer
// FAILED_PRECONDITION; without events, Watch does).
func NewControlServer(m *Manager, opts ...ControlOption) *ControlServer {
	c := &ControlServer{m: m, stopping: make(chan struct{})}
	for _, o := range opts {
		o(c)
	}
	return c
}

// ControlOption adds a part to a ControlServer.
type ControlOption func(*ControlServer)

// WithLeases serves Acquire, Release and List over l.
func WithLeases(l *Leases) ControlOption { return func(c *ControlServer) { c.leases = l } }

// WithEvents serves Watch from h.
func WithEvents(h *EventHub) ControlOption { return func(c *ControlServer) { c.hub = h } }

// WithMetrics counts ReportCollectives in m.
func WithMetrics(m *Metrics) ControlOption { return func(c *ControlServer) { c.metrics = m } }

// ServerOptions are the options the grpc.Server must be created with: a
// stats handler that tags each connection, so that leases bound to it end
// when it closes.
func (c *ControlServer) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.StatsHandler(connTracker{c})}
}

// Register adds the control API to s.
func (c *ControlServer) Register(s *grpc.Server) { ctlpb.RegisterControlServer(s, c) }

// Swap runs a manual swap and streams its progress and results.
func (c *ControlServer) Swap(req *ctlpb.SwapRequest, stream grpc.ServerStreamingServer[ctlpb.SwapEvent]) error {
	var dir Direction
	switch req.GetDirection() {
	case ctlpb.Direction_DIRECTION_OUT:
		dir = SwapOut
	case ctlpb.Direction_DIRECTION_IN:
		dir = SwapIn
	default:
		return status.Error(codes.InvalidArgument, "direction must be out or in")
	}
	if (req.GetPid() == 0) == (req.GetJob() == "") {
		return status.Error(codes.InvalidArgument, "exactly one of pid and job must be given")
	}
	ctx := stream.Context()
	var sendErr error
	results, err := c.m.Swap(ctx, dir, Target{PID: int(req.GetPid()), Job: req.GetJob()}, func(p Progress) {
		if sendErr == nil {
			sendErr = stream.Send(&ctlpb.SwapEvent{Event: &ctlpb.SwapEvent_Progress{Progress: &ctlpb.SwapProgress{
				Pid: int32(p.PID), Done: p.Done, Total: p.Total}}})
		}
	})
	if err != nil {
		return toStatus(err)
	}
	for _, r := range results {
		d := ctlpb.Direction_DIRECTION_OUT
		if r.Direction == SwapIn.String() {
			d = ctlpb.Direction_DIRECTION_IN
		}
		if err := stream.Send(&ctlpb.SwapEvent{Event: &ctlpb.SwapEvent_Result{Result: &ctlpb.SwapResult{
			Pid: int32(r.PID), Job: r.Job, Direction: d, Ok: r.OK, Bytes: r.Bytes, Seconds: r.Seconds, Error: r.Error}}}); err != nil {
			return err
		}
	}
	return nil
}

// Status returns the registry and free memory.
func (c *ControlServer) Status(ctx context.Context, _ *ctlpb.StatusRequest) (*ctlpb.StatusReply, error) {
	procs, free, err := c.m.Status(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	out := &ctlpb.StatusReply{}
	for _, p := range procs {
		q := &ctlpb.Process{Pid: int32(p.PID), PeerPid: int32(p.PeerPID), Job: p.Job, Priority: int32(p.Priority),
			Device: p.Device, Bytes: p.Bytes, GpuBytes: p.GPUBytes(), State: string(p.State), Hold: p.Hold,
			StartedUnixNano: p.Started.UnixNano(), Done: p.Done, Total: p.Total, Waiting: p.Waiting,
			GateClass: p.Gate.Class, GatePolicy: p.Gate.Policy, GateSlot: int32(p.Gate.Slot), GateHolds: p.Gate.Holds,
			GateHeldSeconds: p.Gate.HeldSeconds, GateBusyPeriods: p.Gate.BusyPeriods, GateBusySeconds: p.Gate.BusySeconds}
		if !p.LastProgress.IsZero() {
			q.LastProgressUnixNano = p.LastProgress.UnixNano()
		}
		out.Processes = append(out.Processes, q)
	}
	for _, d := range sortedKeys(free) {
		out.Devices = append(out.Devices, &ctlpb.DeviceMemory{Device: d, Free: free[d]})
	}
	return out, nil
}

// Reserve makes room for a non-shimmed job.
func (c *ControlServer) Reserve(ctx context.Context, req *ctlpb.ReserveRequest) (*ctlpb.ReserveReply, error) {
	if req.GetBytes() <= 0 {
		return nil, status.Error(codes.InvalidArgument, "bytes must be positive")
	}
	hold := time.Duration(req.GetHoldSeconds() * float64(time.Second))
	if hold <= 0 {
		hold = time.Minute
	}
	d, err := c.m.Reserve(ctx, Request{Device: req.GetDevice(), Bytes: req.GetBytes(), Priority: int(req.GetPriority())}, hold)
	if err != nil {
		return nil, toStatus(err)
	}
	out := &ctlpb.ReserveReply{Free: d.Free}
	for _, v := range d.Victims {
		out.Victims = append(out.Victims, int32(v))
	}
	return out, nil
}

// SetGate sets the priority-gating policy of a pid's or a job's processes.
func (c *ControlServer) SetGate(_ context.Context, req *ctlpb.SetGateRequest) (*ctlpb.SetGateReply, error) {
	if (req.GetPid() == 0) == (req.GetJob() == "") {
		return nil, status.Error(codes.InvalidArgument, "exactly one of pid and job must be given")
	}
	pids, err := c.m.SetGate(Target{PID: int(req.GetPid()), Job: req.GetJob()}, req.GetPolicy())
	if err != nil {
		return nil, toStatus(err)
	}
	out := &ctlpb.SetGateReply{}
	for _, p := range pids {
		out.Pids = append(out.Pids, int32(p))
	}
	return out, nil
}

// toStatus maps the sentinel errors to gRPC codes (the CLI maps them back).
func toStatus(err error) error {
	code := codes.Internal
	switch {
	case errors.Is(err, ErrNoSuchProcess), errors.Is(err, ErrNoSuchJob), errors.Is(err, ErrNoLease):
		code = codes.NotFound
	case errors.Is(err, ErrBadRequest), errors.Is(err, mig.ErrUnknownProfile), errors.Is(err, mig.ErrBadConfig):
		code = codes.InvalidArgument
	case errors.Is(err, ErrNoFreeInstance):
		code = codes.ResourceExhausted
	case errors.Is(err, ErrLeased), errors.Is(err, ErrNoMIG):
		code = codes.FailedPrecondition
	case errors.Is(err, ErrAlreadyOut), errors.Is(err, ErrAlreadyIn), errors.Is(err, ErrDenied):
		code = codes.FailedPrecondition
	case errors.Is(err, ErrBusy):
		code = codes.Aborted
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	}
	return status.Error(code, err.Error())
}
