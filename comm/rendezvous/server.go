package rendezvous

import (
	"context"
	"crypto/subtle"
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"

	pb "github.com/migctl/migctl/comm/rendezvouspb"
)

// Server is the rendezvous of one job of World ranks. A job that restarts
// (the launcher starts every rank again) gets a fresh generation from
// NewGeneration; everything a generation holds (registrations, keys,
// barriers, the abort state) goes with it, so nothing grows across restarts.
type Server struct {
	pb.UnimplementedRendezvousServer

	token string
	world int

	mu  sync.Mutex
	cur *generation // s.mu guards it and everything in it

	conns    atomic.Uint64 // last connection id handed out
	grpc     *grpc.Server
	stopping bool // Stop was called: closing connections is no rank leaving
}

// generation is one run of the job.
type generation struct {
	n        int
	peers    []*pb.Peer // by rank; nil until registered
	owner    []uint64   // by rank: the connection that registered it
	settings []map[string]string
	done     []bool // by rank: left cleanly (Client.Close) after the world formed
	nreg     int
	formed   bool
	full     chan struct{}  // closed when every rank registered
	ended    map[int]string // rank -> why: ended without joining (RankEnded)
	kv       map[string][]byte
	kvWait   map[string]*waiter
	barriers map[string]*barrier
	aborted  chan struct{} // closed with abort set
	abort    *AbortError
}

type waiter struct {
	ch chan struct{}
	n  int // Gets blocked on it
}

type barrier struct {
	in   map[int32]bool
	done chan struct{}
}

var _ pb.RendezvousServer = (*Server)(nil)

// NewServer returns a server for a job of world ranks guarded by token,
// at generation 0.
func NewServer(token string, world int) (*Server, error) {
	if world < 1 {
		return nil, fmt.Errorf("world of %d ranks: %w", world, ErrInvalid)
	}
	if token == "" {
		return nil, fmt.Errorf("empty job token: %w", ErrInvalid)
	}
	return &Server{token: token, world: world, cur: newGeneration(0, world)}, nil
}

func newGeneration(n, world int) *generation {
	return &generation{n: n, peers: make([]*pb.Peer, world), owner: make([]uint64, world),
		settings: make([]map[string]string, world), done: make([]bool, world), full: make(chan struct{}),
		kv: map[string][]byte{}, kvWait: map[string]*waiter{}, barriers: map[string]*barrier{},
		aborted: make(chan struct{})}
}

// NewGeneration starts the next generation of the job (the launcher calls
// it between restarts) and returns its number: registrations, keys,
// barriers and the abort state are cleared. Calls of the previous generation
// still blocked fail (codes.Aborted), and later calls from its ranks fail
// with ErrStaleGeneration. Safe for concurrent use.
func (s *Server) NewGeneration() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.cur
	s.cur = newGeneration(old.n+1, s.world)
	old.abortLocked(-1, fmt.Sprintf("generation %d ended: the job restarted as generation %d", old.n, s.cur.n), false)
	return s.cur.n
}

// Generation is the current generation (0 until NewGeneration).
func (s *Server) Generation() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur.n
}

// Formed is closed when every rank of the current generation has
// registered (the world formed). Call it again after NewGeneration.
func (s *Server) Formed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur.full
}

// Failed is closed when the current generation is aborted (by a rank, a
// rank that left, mismatched settings, or AbortJob); Err then says why.
// NewGeneration closes the old generation's channel and starts a new one:
// call Failed again after it.
func (s *Server) Failed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur.aborted
}

// Err is nil while the current generation is healthy, else its
// *AbortError (errors.Is(err, ErrAborted)).
func (s *Server) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur.abort == nil {
		return nil
	}
	return s.cur.abort
}

// Serve serves on lis until Stop; it blocks.
func (s *Server) Serve(lis net.Listener) error {
	s.mu.Lock()
	s.grpc = grpc.NewServer(grpc.StatsHandler(connTracker{s}))
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
	s.stopping = true
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

// connTracker gives every connection an id, so that the server knows which
// rank a connection registered and what to do when it goes away.
type connTracker struct{ s *Server }

type connKey struct{}

func (c connTracker) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return context.WithValue(ctx, connKey{}, c.s.conns.Add(1))
}

func (c connTracker) HandleConn(ctx context.Context, st stats.ConnStats) {
	if _, ok := st.(*stats.ConnEnd); ok {
		c.s.connGone(connID(ctx))
	}
}

func (connTracker) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (connTracker) HandleRPC(context.Context, stats.RPCStats)                       {}

func connID(ctx context.Context) uint64 {
	id, _ := ctx.Value(connKey{}).(uint64)
	return id
}

// connGone handles a closed connection: a rank it registered is free again
// while the world is still forming; once the world formed, a rank that did
// not leave cleanly has left the job, and the job is aborted naming it.
func (s *Server) connGone(id uint64) {
	if id == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping {
		return
	}
	g := s.cur
	for r, o := range g.owner {
		if o != id {
			continue
		}
		switch {
		case !g.formed:
			g.unregisterLocked(r)
		case !g.done[r]:
			g.abortLocked(r, fmt.Sprintf("rank %d left the job: its connection to the rendezvous closed (did the process exit?)", r), false)
		}
	}
}

// enter checks the token and the generation of a request and returns the
// generation it belongs to; a generation that was aborted answers its abort.
func (s *Server) enter(token string, gen *int32) (*generation, error) {
	if err := s.checkToken(token); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.cur
	if gen != nil && int(*gen) != g.n {
		return nil, status.Errorf(codes.FailedPrecondition,
			"this rank joined generation %d of the job, which is over (the job restarted; now generation %d)", *gen, g.n)
	}
	return g, g.abortErrLocked()
}

func (s *Server) checkToken(token string) error {
	if subtle.ConstantTimeCompare([]byte(token), []byte(s.token)) != 1 {
		return status.Error(codes.PermissionDenied, "wrong job token")
	}
	return nil
}

// abortErrLocked is the generation's abort as a status, or nil.
func (g *generation) abortErrLocked() error {
	if g.abort == nil {
		return nil
	}
	st := status.New(codes.Aborted, g.abort.Error())
	if d, err := st.WithDetails(&pb.AbortInfo{Rank: int32(g.abort.Rank), Reason: g.abort.Reason,
		Generation: int32(g.abort.Generation), Mismatch: g.abort.Mismatch}); err == nil {
		st = d
	}
	return st.Err()
}

// abortLocked aborts the generation naming rank (-1: none); the first
// abort sticks.
func (g *generation) abortLocked(rank int, reason string, mismatch bool) {
	if g.abort != nil {
		return
	}
	g.abort = &AbortError{Rank: rank, Reason: reason, Generation: g.n, Mismatch: mismatch}
	close(g.aborted)
}

// AbortJob fails every blocked and future call of the current generation
// with codes.Aborted, naming no rank. The first abort sticks. Safe to call
// more than once.
func (s *Server) AbortJob(reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cur.abortLocked(-1, reason, false)
}

// AbortRank is AbortJob naming the rank at fault (the launcher saw it exit,
// say): every rank's error carries it (AbortError.Rank), and the reason is
// prefixed with "rank N: " unless it names the rank already.
func (s *Server) AbortRank(rank int, reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rank >= 0 {
		reason = withRank(rank, reason)
	}
	s.cur.abortLocked(rank, reason, false)
}

// RankEnded tells the server that rank's process ended without failing
// (the launcher saw it exit 0) for reason. Before the current generation's
// world has formed that rank will never join, and the ranks joining would
// wait for it until their start-up limit: the generation is aborted naming
// it, at once when some rank has registered, else at the first
// registration (a job whose ranks never use the rendezvous, a gloo job,
// sees nothing). It reports whether it aborted now; nothing happens once
// the world has formed.
func (s *Server) RankEnded(rank int, reason string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.cur
	if g.formed || g.abort != nil {
		return false
	}
	if g.ended == nil {
		g.ended = map[int]string{}
	}
	g.ended[rank] = withRank(rank, reason)
	if g.nreg == 0 {
		return false
	}
	g.abortLocked(rank, g.ended[rank], false)
	return true
}

// withRank prefixes reason with "rank N: " unless it already names the rank.
func withRank(rank int, reason string) string {
	if rank < 0 {
		return "a process that had not registered: " + reason
	}
	if p := fmt.Sprintf("rank %d", rank); strings.HasPrefix(reason, p+":") || strings.HasPrefix(reason, p+" ") || strings.HasPrefix(reason, p+",") {
		return reason
	}
	return fmt.Sprintf("rank %d: %s", rank, reason)
}

func (s *Server) wait(ctx context.Context, g *generation, ch <-chan struct{}) error {
	select {
	case <-ch:
		return nil
	case <-g.aborted:
		s.mu.Lock()
		defer s.mu.Unlock()
		return g.abortErrLocked()
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
}

// Abort implements the service.
func (s *Server) Abort(_ context.Context, req *pb.AbortRequest) (*pb.AbortResponse, error) {
	if err := s.checkToken(req.GetToken()); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.cur
	if req.Generation != nil && int(req.GetGeneration()) != g.n {
		return &pb.AbortResponse{}, nil // an earlier generation's rank cannot abort this one
	}
	fault := int(req.GetRank())
	if req.FaultRank != nil && req.GetFaultRank() >= 0 && int(req.GetFaultRank()) < s.world {
		fault = int(req.GetFaultRank())
	}
	g.abortLocked(fault, withRank(int(req.GetRank()), req.GetReason()), false)
	return &pb.AbortResponse{}, nil
}

// Leave implements the service.
func (s *Server) Leave(ctx context.Context, req *pb.LeaveRequest) (*pb.LeaveResponse, error) {
	if err := s.checkToken(req.GetToken()); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.cur
	r := int(req.GetRank())
	if req.Generation != nil && int(req.GetGeneration()) != g.n {
		return &pb.LeaveResponse{}, nil // nothing of it is left
	}
	if r < 0 || r >= len(g.peers) || g.peers[r] == nil {
		return nil, status.Errorf(codes.InvalidArgument, "rank %d is not registered", r)
	}
	if g.owner[r] != connID(ctx) {
		return nil, status.Errorf(codes.PermissionDenied, "rank %d was registered by another connection", r)
	}
	switch {
	case !g.formed:
		g.unregisterLocked(r)
	case req.GetDone():
		g.done[r] = true
	default:
		reason := req.GetReason()
		if reason == "" {
			reason = "no reason given"
		}
		g.abortLocked(r, fmt.Sprintf("rank %d left the job: %s", r, reason), false)
	}
	return &pb.LeaveResponse{}, nil
}

// unregisterLocked frees rank r of a world that has not formed yet.
func (g *generation) unregisterLocked(r int) {
	if g.formed || g.peers[r] == nil {
		return
	}
	g.peers[r], g.owner[r], g.settings[r] = nil, 0, nil
	g.nreg--
}

// refLocked returns the rank every registrant is compared with (-1: none).
// Every registered rank agrees with the first registrant's settings, so the
// lowest registered rank stands for them: messages name it.
func (g *generation) refLocked() int {
	return slices.IndexFunc(g.peers, func(p *pb.Peer) bool { return p != nil })
}

// Register implements the service.
func (s *Server) Register(ctx context.Context, req *pb.RegisterRequest) (*pb.RegisterResponse, error) {
	g, err := s.enter(req.GetToken(), nil)
	if err != nil {
		return nil, err
	}
	self := req.GetSelf()
	if self == nil {
		return nil, status.Error(codes.InvalidArgument, "register without peer info")
	}
	s.mu.Lock()
	r := int(req.GetRank())
	if g.formed {
		// The job runs: a late joiner is refused, whatever it expects,
		// and the job goes on.
		s.mu.Unlock()
		if r >= 0 && r < s.world {
			p := g.peers[r]
			return nil, status.Errorf(codes.AlreadyExists, "rank %d is already taken (by pid %d on %s): the job's %d ranks have all joined",
				r, p.GetPid(), p.GetHost(), s.world)
		}
		return nil, status.Errorf(codes.ResourceExhausted, "all %d ranks of the job are taken: it has already started", s.world)
	}
	if w := int(req.GetWorld()); w != 0 && w != s.world {
		who := fmt.Sprintf("rank %d", r)
		if r < 0 {
			who = fmt.Sprintf("a rank (pid %d on %s)", self.GetPid(), self.GetHost())
		}
		g.abortLocked(r, fmt.Sprintf("%s expects a %d-rank job, but the job has %d ranks", who, w, s.world), true)
		err := g.abortErrLocked()
		s.mu.Unlock()
		return nil, err
	}
	if len(g.ended) > 0 {
		first := slices.Min(slices.Collect(maps.Keys(g.ended)))
		g.abortLocked(first, g.ended[first], false)
		err := g.abortErrLocked()
		s.mu.Unlock()
		return nil, err
	}
	switch {
	case r < 0:
		r = slices.Index(g.peers, nil)
		if r < 0 {
			s.mu.Unlock()
			return nil, status.Errorf(codes.ResourceExhausted, "all %d ranks of the job are taken", s.world)
		}
	case r >= s.world:
		s.mu.Unlock()
		return nil, status.Errorf(codes.InvalidArgument, "rank %d of a %d-rank job: ranks are 0..%d", r, s.world, s.world-1)
	case g.peers[r] != nil:
		p := g.peers[r]
		s.mu.Unlock()
		return nil, status.Errorf(codes.AlreadyExists, "rank %d is already taken (by pid %d on %s): give each process its own rank, or -1 for any free one",
			r, p.GetPid(), p.GetHost())
	}
	if ref := g.refLocked(); ref >= 0 {
		if d := diffSettings(r, req.GetSettings(), ref, g.settings[ref]); d != "" {
			g.abortLocked(r, d, true)
			err := g.abortErrLocked()
			s.mu.Unlock()
			return nil, err
		}
	}
	p := &pb.Peer{Rank: int32(r), Host: self.GetHost(), Pid: self.GetPid(), GpuUuid: self.GetGpuUuid(),
		ParentGpuUuid: self.GetParentGpuUuid(), Mig: self.GetMig()}
	g.peers[r], g.owner[r], g.settings[r] = p, connID(ctx), maps.Clone(req.GetSettings())
	if g.settings[r] == nil {
		g.settings[r] = map[string]string{}
	}
	g.nreg++
	if g.nreg == s.world {
		g.formed = true
		close(g.full)
	}
	s.mu.Unlock()
	if err := s.wait(ctx, g, g.full); err != nil {
		s.mu.Lock()
		if g.peers[r] == p {
			g.unregisterLocked(r) // a joiner that gave up (or died) frees its rank
		}
		s.mu.Unlock()
		return nil, err
	}
	s.mu.Lock()
	peers := slices.Clone(g.peers)
	s.mu.Unlock()
	return &pb.RegisterResponse{Rank: int32(r), World: int32(s.world), Peers: peers, Topology: topology(peers),
		Generation: int32(g.n)}, nil
}

// diffSettings describes how rank r's settings differ from rank ref's ("" if
// they do not), key by key in sorted order.
func diffSettings(r int, got map[string]string, ref int, want map[string]string) string {
	keys := slices.Sorted(maps.Keys(got))
	for k := range want {
		if _, ok := got[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	var mine, theirs []string
	missing := true
	for _, k := range keys {
		g, gok := got[k]
		w, wok := want[k]
		if gok == wok && g == w {
			continue
		}
		if gok {
			mine, missing = append(mine, k+"="+g), false
		} else {
			mine = append(mine, k)
		}
		if wok {
			theirs = append(theirs, k+"="+w)
		} else {
			theirs = append(theirs, "no "+k)
		}
	}
	if len(mine) == 0 {
		return ""
	}
	if missing {
		return fmt.Sprintf("rank %d joined without %s, but rank %d has %s", r, strings.Join(mine, ", "), ref, strings.Join(theirs, ", "))
	}
	for i, m := range mine {
		if !strings.Contains(m, "=") {
			mine[i] = "no " + m
		}
	}
	return fmt.Sprintf("rank %d joined with %s, but rank %d has %s", r, strings.Join(mine, ", "), ref, strings.Join(theirs, ", "))
}

func topology(peers []*pb.Peer) *pb.Topology {
	ps := make([]Peer, len(peers))
	for i, p := range peers {
		ps[i] = Peer{Host: p.GetHost(), GPUUUID: p.GetGpuUuid(), ParentGPUUUID: p.GetParentGpuUuid(), MIG: p.GetMig()}
	}
	t := TopologyOf(ps)
	return &pb.Topology{SameHost: t.SameHost, SameGpu: t.SameGPU, AnyMig: t.AnyMIG}
}

// Put implements the service.
func (s *Server) Put(_ context.Context, req *pb.PutRequest) (*pb.PutResponse, error) {
	g, err := s.enter(req.GetToken(), req.Generation)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := g.kv[req.GetKey()]; ok {
		return nil, status.Errorf(codes.AlreadyExists, "key %q already has a value", req.GetKey())
	}
	g.kv[req.GetKey()] = slices.Clone(req.GetValue())
	if w, ok := g.kvWait[req.GetKey()]; ok {
		close(w.ch)
		delete(g.kvWait, req.GetKey())
	}
	return &pb.PutResponse{}, nil
}

// Get implements the service.
func (s *Server) Get(ctx context.Context, req *pb.GetRequest) (*pb.GetResponse, error) {
	g, err := s.enter(req.GetToken(), req.Generation)
	if err != nil {
		return nil, err
	}
	k := req.GetKey()
	s.mu.Lock()
	if v, ok := g.kv[k]; ok {
		s.mu.Unlock()
		return &pb.GetResponse{Value: v}, nil
	}
	w, ok := g.kvWait[k]
	if !ok {
		w = &waiter{ch: make(chan struct{})}
		g.kvWait[k] = w
	}
	w.n++
	s.mu.Unlock()
	err = s.wait(ctx, g, w.ch)
	s.mu.Lock()
	defer s.mu.Unlock()
	if w.n--; w.n == 0 && g.kvWait[k] == w {
		delete(g.kvWait, k) // nobody waits for it any more
	}
	if err != nil {
		return nil, err
	}
	return &pb.GetResponse{Value: g.kv[k]}, nil
}

// Barrier implements the service.
func (s *Server) Barrier(ctx context.Context, req *pb.BarrierRequest) (*pb.BarrierResponse, error) {
	g, err := s.enter(req.GetToken(), req.Generation)
	if err != nil {
		return nil, err
	}
	if req.GetRank() < 0 || int(req.GetRank()) >= s.world {
		return nil, status.Errorf(codes.InvalidArgument, "rank %d of a %d-rank job", req.GetRank(), s.world)
	}
	s.mu.Lock()
	b := g.barrierLocked(req.GetName())
	if !b.in[req.GetRank()] {
		b.in[req.GetRank()] = true
		if len(b.in) == s.world {
			close(b.done)
		}
	}
	s.mu.Unlock()
	if err := s.wait(ctx, g, b.done); err != nil {
		return nil, err
	}
	return &pb.BarrierResponse{}, nil
}

// WaitBarrier blocks until every rank of the current generation has entered
// the barrier called name (the host's way to learn that joined ranks are
// done), the generation is aborted, or ctx ends.
func (s *Server) WaitBarrier(ctx context.Context, name string) error {
	s.mu.Lock()
	g := s.cur
	b := g.barrierLocked(name)
	s.mu.Unlock()
	return s.wait(ctx, g, b.done)
}

// barrierLocked returns the barrier called name, creating it.
func (g *generation) barrierLocked(name string) *barrier {
	b, ok := g.barriers[name]
	if !ok {
		b = &barrier{in: map[int32]bool{}, done: make(chan struct{})}
		g.barriers[name] = b
	}
	return b
}
