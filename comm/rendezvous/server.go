package rendezvous

import (
	"context"
	"crypto/subtle"
	"fmt"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/migctl/migctl/comm/rendezvouspb"
)

// Server is the rendezvous of one job of World ranks.
type Server struct {
	pb.UnimplementedRendezvousServer

	token string
	world int

	mu       sync.Mutex
	peers    []*pb.Peer // by rank; nil until registered
	nreg     int
	full     chan struct{} // closed when every rank registered
	kv       map[string][]byte
	kvWait   map[string]chan struct{}
	barriers map[string]*barrier
	aborted  chan struct{} // closed by Abort
	reason   string

	grpc *grpc.Server
}

type barrier struct {
	in   map[int32]bool
	done chan struct{}
}

var _ pb.RendezvousServer = (*Server)(nil)

// NewServer returns a server for a job of world ranks guarded by token.
func NewServer(token string, world int) (*Server, error) {
	if world < 1 {
		return nil, fmt.Errorf("world of %d ranks: %w", world, ErrInvalid)
	}
	if token == "" {
		return nil, fmt.Errorf("empty job token: %w", ErrInvalid)
	}
	return &Server{token: token, world: world, peers: make([]*pb.Peer, world), full: make(chan struct{}),
		kv: map[string][]byte{}, kvWait: map[string]chan struct{}{}, barriers: map[string]*barrier{},
		aborted: make(chan struct{})}, nil
}

// Serve serves on lis until Stop; it blocks.
func (s *Server) Serve(lis net.Listener) error {
	s.mu.Lock()
	s.grpc = grpc.NewServer()
	g := s.grpc
	s.mu.Unlock()
	pb.RegisterRendezvousServer(g, s)
	return g.Serve(lis)
}

// Stop closes the listener, lets calls in progress that are about to answer
// (a completed barrier) finish for up to a second, then closes every
// connection; calls still blocked fail.
func (s *Server) Stop() {
	s.mu.Lock()
	g := s.grpc
	s.mu.Unlock()
	if g == nil {
		return
	}
	done := make(chan struct{})
	go func() { g.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Second):
		g.Stop()
		<-done
	}
}

// auth checks the token and that the job is not aborted.
func (s *Server) auth(token string) error {
	if err := s.checkToken(token); err != nil {
		return err
	}
	return s.abortErr()
}

func (s *Server) checkToken(token string) error {
	if subtle.ConstantTimeCompare([]byte(token), []byte(s.token)) != 1 {
		return status.Error(codes.PermissionDenied, "wrong job token")
	}
	return nil
}

func (s *Server) abortErr() error {
	select {
	case <-s.aborted:
		s.mu.Lock()
		defer s.mu.Unlock()
		return status.Errorf(codes.Aborted, "job aborted: %s", s.reason)
	default:
		return nil
	}
}

// AbortJob fails every blocked and future call with codes.Aborted. The
// first reason sticks. Safe to call more than once.
func (s *Server) AbortJob(reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.aborted:
	default:
		s.reason = reason
		close(s.aborted)
	}
}

func (s *Server) wait(ctx context.Context, ch <-chan struct{}) error {
	select {
	case <-ch:
		return nil
	case <-s.aborted:
		return s.abortErr()
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
}

// Abort implements the service.
func (s *Server) Abort(_ context.Context, req *pb.AbortRequest) (*pb.AbortResponse, error) {
	if err := s.checkToken(req.GetToken()); err != nil {
		return nil, err
	}
	s.AbortJob(fmt.Sprintf("rank %d: %s", req.GetRank(), req.GetReason()))
	return &pb.AbortResponse{}, nil
}

// Register implements the service.
func (s *Server) Register(ctx context.Context, req *pb.RegisterRequest) (*pb.RegisterResponse, error) {
	if err := s.auth(req.GetToken()); err != nil {
		return nil, err
	}
	self := req.GetSelf()
	if self == nil {
		return nil, status.Error(codes.InvalidArgument, "register without peer info")
	}
	s.mu.Lock()
	r := int(req.GetRank())
	if r < 0 {
		r = -1
		for i, p := range s.peers {
			if p == nil {
				r = i
				break
			}
		}
		if r < 0 {
			s.mu.Unlock()
			return nil, status.Errorf(codes.ResourceExhausted, "all %d ranks are taken", s.world)
		}
	} else if r >= s.world {
		s.mu.Unlock()
		return nil, status.Errorf(codes.InvalidArgument, "rank %d of a %d-rank job", r, s.world)
	} else if s.peers[r] != nil {
		s.mu.Unlock()
		return nil, status.Errorf(codes.AlreadyExists, "rank %d is already registered", r)
	}
	p := &pb.Peer{Rank: int32(r), Host: self.GetHost(), Pid: self.GetPid(), GpuUuid: self.GetGpuUuid(),
		ParentGpuUuid: self.GetParentGpuUuid(), Mig: self.GetMig()}
	s.peers[r] = p
	s.nreg++
	if s.nreg == s.world {
		close(s.full)
	}
	s.mu.Unlock()
	if err := s.wait(ctx, s.full); err != nil {
		return nil, err
	}
	s.mu.Lock()
	peers := append([]*pb.Peer(nil), s.peers...)
	s.mu.Unlock()
	return &pb.RegisterResponse{Rank: int32(r), World: int32(s.world), Peers: peers, Topology: topology(peers)}, nil
}

func topology(peers []*pb.Peer) *pb.Topology {
	t := &pb.Topology{SameHost: true, SameGpu: true}
	for _, p := range peers {
		if p.GetHost() != peers[0].GetHost() {
			t.SameHost = false
		}
		if parent(p) != parent(peers[0]) || parent(p) == "" {
			t.SameGpu = false
		}
		if p.GetMig() {
			t.AnyMig = true
		}
	}
	t.SameGpu = t.SameGpu && t.SameHost
	return t
}

func parent(p *pb.Peer) string {
	if u := p.GetParentGpuUuid(); u != "" {
		return u
	}
	return p.GetGpuUuid()
}

// Put implements the service.
func (s *Server) Put(_ context.Context, req *pb.PutRequest) (*pb.PutResponse, error) {
	if err := s.auth(req.GetToken()); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.kv[req.GetKey()]; ok {
		return nil, status.Errorf(codes.AlreadyExists, "key %q already has a value", req.GetKey())
	}
	s.kv[req.GetKey()] = append([]byte(nil), req.GetValue()...)
	if ch, ok := s.kvWait[req.GetKey()]; ok {
		close(ch)
		delete(s.kvWait, req.GetKey())
	}
	return &pb.PutResponse{}, nil
}

// Get implements the service.
func (s *Server) Get(ctx context.Context, req *pb.GetRequest) (*pb.GetResponse, error) {
	if err := s.auth(req.GetToken()); err != nil {
		return nil, err
	}
	for {
		s.mu.Lock()
		v, ok := s.kv[req.GetKey()]
		if ok {
			s.mu.Unlock()
			return &pb.GetResponse{Value: v}, nil
		}
		ch, ok := s.kvWait[req.GetKey()]
		if !ok {
			ch = make(chan struct{})
			s.kvWait[req.GetKey()] = ch
		}
		s.mu.Unlock()
		if err := s.wait(ctx, ch); err != nil {
			return nil, err
		}
	}
}

// Barrier implements the service.
func (s *Server) Barrier(ctx context.Context, req *pb.BarrierRequest) (*pb.BarrierResponse, error) {
	if err := s.auth(req.GetToken()); err != nil {
		return nil, err
	}
	if req.GetRank() < 0 || int(req.GetRank()) >= s.world {
		return nil, status.Errorf(codes.InvalidArgument, "rank %d of a %d-rank job", req.GetRank(), s.world)
	}
	s.mu.Lock()
	b := s.barrierLocked(req.GetName())
	if !b.in[req.GetRank()] {
		b.in[req.GetRank()] = true
		if len(b.in) == s.world {
			close(b.done)
		}
	}
	s.mu.Unlock()
	if err := s.wait(ctx, b.done); err != nil {
		return nil, err
	}
	return &pb.BarrierResponse{}, nil
}

// WaitBarrier blocks until every rank has entered the barrier called name
// (the host's way to learn that joined ranks are done) or ctx ends.
func (s *Server) WaitBarrier(ctx context.Context, name string) error {
	s.mu.Lock()
	b := s.barrierLocked(name)
	s.mu.Unlock()
	return s.wait(ctx, b.done)
}

// barrierLocked returns the barrier called name, creating it; s.mu is held.
func (s *Server) barrierLocked(name string) *barrier {
	b, ok := s.barriers[name]
	if !ok {
		b = &barrier{in: map[int32]bool{}, done: make(chan struct{})}
		s.barriers[name] = b
	}
	return b
}
