package ctxmgr

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"

	"github.com/migctl/migctl/context/ctlpb"
	"github.com/migctl/migctl/mig"
)

// errNoMIG says what to do about a daemon without MIG devices.
var errNoMIG = fmt.Errorf("%w: it runs without a MIG source (no NVML); restart it on a GPU node, or with --sim h200x8 for a simulated one", ErrNoMIG)

// Acquire leases MIG devices, creating them when too few are free.
func (c *ControlServer) Acquire(ctx context.Context, req *ctlpb.AcquireRequest) (*ctlpb.AcquireReply, error) {
	if c.leases == nil {
		return nil, toStatus(errNoMIG)
	}
	r := AcquireRequest{Job: req.GetJob(), Profile: req.GetProfile(), Count: int(req.GetCount()), GPU: int(req.GetGpu()), PID: int(req.GetPid())}
	if req.GetBindToConnection() {
		id, ok := ctx.Value(connKey{}).(uint64)
		if !ok || id == 0 {
			return nil, status.Error(codes.Internal, "bind_to_connection: the daemon's server does not track connections (created without ServerOptions)")
		}
		r.conn = id
	}
	ls, err := c.leases.Acquire(ctx, r)
	if err != nil {
		return nil, toStatus(err)
	}
	return &ctlpb.AcquireReply{Leases: leasesToPB(ls)}, nil
}

// Release ends a job's leases, or one device's.
func (c *ControlServer) Release(_ context.Context, req *ctlpb.ReleaseRequest) (*ctlpb.ReleaseReply, error) {
	if c.leases == nil {
		return nil, toStatus(errNoMIG)
	}
	if (req.GetJob() == "") == (req.GetUuid() == "") {
		return nil, status.Error(codes.InvalidArgument, "give exactly one of job and uuid")
	}
	var ls []Lease
	if req.GetJob() != "" {
		ls = c.leases.Release(req.GetJob())
		if len(ls) == 0 {
			return nil, toStatus(fmt.Errorf("job %q holds no lease: %w", req.GetJob(), ErrNoLease))
		}
	} else {
		le, err := c.leases.ReleaseUUID(req.GetUuid())
		if err != nil {
			return nil, toStatus(err)
		}
		ls = []Lease{le}
	}
	return &ctlpb.ReleaseReply{Leases: leasesToPB(ls)}, nil
}

// List returns the leases.
func (c *ControlServer) List(context.Context, *ctlpb.ListRequest) (*ctlpb.ListReply, error) {
	if c.leases == nil {
		return &ctlpb.ListReply{}, nil
	}
	return &ctlpb.ListReply{Leases: leasesToPB(c.leases.List())}, nil
}

// Watch streams events until the client goes away.
func (c *ControlServer) Watch(req *ctlpb.WatchRequest, stream grpc.ServerStreamingServer[ctlpb.Event]) error {
	if c.hub == nil {
		return status.Error(codes.FailedPrecondition, "this daemon publishes no events")
	}
	w := c.hub.Subscribe(req.GetJob())
	defer c.hub.Unsubscribe(w)
	// An empty header tells the client the watch is in place before any
	// event, so that it can act knowing it will not miss what follows.
	if err := stream.SendHeader(nil); err != nil {
		return err
	}
	for {
		select {
		case <-stream.Context().Done():
			return nil
		case <-c.stopping:
			return status.Error(codes.Unavailable, "the daemon is stopping")
		case e, ok := <-w.Events():
			if !ok {
				return status.Error(codes.ResourceExhausted, "the watch fell too far behind and was dropped; watch again")
			}
			if err := stream.Send(eventToPB(e)); err != nil {
				return err
			}
		}
	}
}

// ReportCollectives counts collective calls in the metrics.
func (c *ControlServer) ReportCollectives(_ context.Context, req *ctlpb.CollectiveReport) (*ctlpb.CollectiveReply, error) {
	if c.metrics == nil {
		return &ctlpb.CollectiveReply{}, nil
	}
	if err := c.metrics.ReportCollectives(req.GetJob(), req.GetOp(), req.GetCalls(), req.GetBytes(), req.GetSeconds()); err != nil {
		return nil, toStatus(err)
	}
	return &ctlpb.CollectiveReply{}, nil
}

// Drain marks the server as stopping: watches end (so a graceful stop does
// not wait for them), and from now on a closing connection does not end the
// leases bound to it (call it before grpc.Server.GracefulStop, so a daemon
// restart keeps them; a restart drops those without a pid).
func (c *ControlServer) Drain() {
	c.draining.Store(true)
	c.stopOnce.Do(func() { close(c.stopping) })
}

// connKey keys a connection's id in its context.
type connKey struct{}

// connTracker is the grpc stats.Handler that numbers connections and ends
// the leases bound to one when it closes.
type connTracker struct{ c *ControlServer }

func (t connTracker) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	id := t.c.nextConn.Add(1)
	if t.c.leases != nil {
		t.c.leases.connOpened(id)
	}
	return context.WithValue(ctx, connKey{}, id)
}

func (t connTracker) HandleConn(ctx context.Context, s stats.ConnStats) {
	if _, ok := s.(*stats.ConnEnd); !ok || t.c.leases == nil {
		return
	}
	if t.c.draining.Load() {
		// the daemon is stopping: the client lives on, and so do its
		// leases that have a pid (Restore)
		return
	}
	if id, ok := ctx.Value(connKey{}).(uint64); ok {
		t.c.leases.ReleaseConn(id)
	}
}

func (connTracker) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (connTracker) HandleRPC(context.Context, stats.RPCStats)                       {}

func leasesToPB(ls []Lease) []*ctlpb.Lease {
	out := make([]*ctlpb.Lease, len(ls))
	for i, le := range ls {
		out[i] = &ctlpb.Lease{Job: le.Job, Pid: int32(le.PID), Gpu: int32(le.GPU), GpuUuid: le.GPUUUID, Uuid: le.UUID,
			Profile: le.Profile, GpuInstanceId: int32(le.GIID), ComputeInstanceId: int32(le.CIID),
			Start: int32(le.Placement.Start), Size: int32(le.Placement.Size), SinceUnixNano: le.Since.UnixNano(),
			Created: le.Created, BoundToConnection: le.BoundToConnection}
	}
	return out
}

func leasesFromPB(ps []*ctlpb.Lease) []Lease {
	out := make([]Lease, len(ps))
	for i, p := range ps {
		out[i] = Lease{Job: p.GetJob(), PID: int(p.GetPid()), GPU: int(p.GetGpu()), GPUUUID: p.GetGpuUuid(), UUID: p.GetUuid(),
			Profile: p.GetProfile(), GIID: int(p.GetGpuInstanceId()), CIID: int(p.GetComputeInstanceId()),
			Placement: mig.Placement{Start: int(p.GetStart()), Size: int(p.GetSize())}, Since: time.Unix(0, p.GetSinceUnixNano()).UTC(),
			Created: p.GetCreated(), BoundToConnection: p.GetBoundToConnection()}
	}
	return out
}

func eventToPB(e Event) *ctlpb.Event {
	out := &ctlpb.Event{Type: string(e.Type), Job: e.Job, UnixNano: e.Time.UnixNano(), Leases: leasesToPB(e.Leases), Reason: e.Reason}
	if r := e.Swap; r != nil {
		out.Swap = &ctlpb.SwapResult{Pid: int32(r.PID), Job: r.Job, Direction: directionToPB(r.Direction), Ok: r.OK,
			Bytes: r.Bytes, Seconds: r.Seconds, Error: r.Error}
	}
	return out
}

func eventFromPB(p *ctlpb.Event) Event {
	e := Event{Type: EventType(p.GetType()), Job: p.GetJob(), Time: time.Unix(0, p.GetUnixNano()).UTC(), Reason: p.GetReason()}
	if len(p.GetLeases()) > 0 {
		e.Leases = leasesFromPB(p.GetLeases())
	}
	if r := p.GetSwap(); r != nil {
		e.Swap = resultFromPB(r)
	}
	return e
}

func directionToPB(d string) ctlpb.Direction {
	if d == SwapIn.String() {
		return ctlpb.Direction_DIRECTION_IN
	}
	return ctlpb.Direction_DIRECTION_OUT
}

func resultFromPB(r *ctlpb.SwapResult) *Result {
	dir := SwapOut.String()
	if r.GetDirection() == ctlpb.Direction_DIRECTION_IN {
		dir = SwapIn.String()
	}
	return &Result{PID: int(r.GetPid()), Job: r.GetJob(), Direction: dir, OK: r.GetOk(), Bytes: r.GetBytes(),
		Seconds: r.GetSeconds(), Error: r.GetError()}
}
