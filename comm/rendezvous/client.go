package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	pb "github.com/migctl/migctl/comm/rendezvouspb"
)

// Peer is what a rank reports about itself, and learns about the others.
type Peer struct {
	Rank int
	Host string
	PID  int
	// GPUUUID is the device the rank uses ("MIG-..." for an instance; a
	// virtual name for the host backend); ParentGPUUUID the physical GPU.
	GPUUUID       string
	ParentGPUUUID string
	MIG           bool
	// World is the world size this rank expects (Register only; 0 takes the
	// server's). A rank expecting another size aborts the job.
	World int
	// Settings is what every rank of the job must share (collective plan,
	// chunk, slots, dtype, op, sizes, ...; Register only). The server
	// compares each registrant's with the first registrant's; any difference
	// aborts the job with a message naming the rank and the keys.
	Settings map[string]string
}

// Topology summarises the peers.
type Topology struct {
	SameHost bool
	SameGPU  bool
	AnyMIG   bool
}

// TopologyOf summarises peers as Register does for a job's: on one host,
// on one physical GPU (ParentGPUUUID, else GPUUUID), any of them a MIG
// instance. A group formed of some of a job's ranks (trainer's NewGroup)
// computes its own from their records.
func TopologyOf(peers []Peer) Topology {
	t := Topology{SameHost: true, SameGPU: true}
	for _, p := range peers {
		if p.Host != peers[0].Host {
			t.SameHost = false
		}
		if p.physical() != peers[0].physical() || p.physical() == "" {
			t.SameGPU = false
		}
		if p.MIG {
			t.AnyMIG = true
		}
	}
	t.SameGPU = t.SameGPU && t.SameHost
	return t
}

// physical is the physical GPU of the peer's device.
func (p Peer) physical() string {
	if p.ParentGPUUUID != "" {
		return p.ParentGPUUUID
	}
	return p.GPUUUID
}

// Membership is what Register answers.
type Membership struct {
	Rank  int
	World int
	// Generation is the job's restart count this rank joined.
	Generation int
	Peers      []Peer
	Topology   Topology
}

// DefaultConnectTimeout bounds how long a call waits for an absent
// rendezvous server (retrying with backoff) before it fails with an
// *UnreachableError; the call's ctx deadline bounds it too. Launchers start
// the server before their ranks, so only a rank joined by hand can be early.
const DefaultConnectTimeout = 5 * time.Second

// DialOption configures a Client.
type DialOption func(*Client)

// WithConnectTimeout sets how long calls wait for an unreachable server
// (default DefaultConnectTimeout; the ctx deadline still applies).
func WithConnectTimeout(d time.Duration) DialOption {
	return func(c *Client) { c.connectTimeout = d }
}

// Client talks to a job's rendezvous server. Its methods are safe for
// concurrent use once Register returned.
type Client struct {
	addr           string
	conn           *grpc.ClientConn
	rpc            pb.RendezvousClient
	token          string
	connectTimeout time.Duration

	mu      sync.Mutex
	rank    int    // -1 until Register
	gen     *int32 // the generation joined; nil until Register
	refused bool   // Register was refused (rank taken, ...): this client has no part in the job
	dialErr error  // the last failed dial
	ready   bool   // the connection was up once
}

// Dial prepares a connection to addr: "unix:///path/to.sock" or "host:port".
// It does not block: every call waits for the server (an absent one is
// retried with backoff for up to the connect timeout, bounded by the call's
// ctx) and then fails with an *UnreachableError ("no rendezvous at <addr>:
// connection refused (is the launcher running?)").
func Dial(addr, token string, opts ...DialOption) (*Client, error) {
	if addr == "" || token == "" {
		return nil, fmt.Errorf("address %q, token set %v: %w", addr, token != "", ErrInvalid)
	}
	network, address := "tcp", addr
	if p, ok := strings.CutPrefix(addr, "unix://"); ok {
		network, address = "unix", p
	} else if p, ok := strings.CutPrefix(addr, "unix:"); ok {
		network, address = "unix", p
	}
	c := &Client{addr: addr, token: token, rank: -1, connectTimeout: DefaultConnectTimeout}
	for _, o := range opts {
		o(c)
	}
	dialer := func(ctx context.Context, _ string) (net.Conn, error) {
		var d net.Dialer
		conn, err := d.DialContext(ctx, network, address)
		c.mu.Lock()
		if err != nil {
			c.dialErr = err
		}
		c.mu.Unlock()
		return conn, err
	}
	conn, err := grpc.NewClient("passthrough:///rendezvous",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(dialer),
		// Never idle the connection: the server takes a registered rank's
		// connection closing as the rank leaving (gRPC's default closes it
		// after 30 idle minutes, which would abort any long job).
		grpc.WithIdleTimeout(0),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 500 * time.Millisecond},
			MinConnectTimeout: 5 * time.Second,
		}))
	if err != nil {
		return nil, fmt.Errorf("connecting to rendezvous %s: %w", addr, err)
	}
	c.conn, c.rpc = conn, pb.NewRendezvousClient(conn)
	return c, nil
}

// Close leaves the job cleanly (after the world formed, the server then
// does not count this rank's going away as a failure; before, its rank is
// free again) and closes the connection. A rank that exits without Close,
// once the world formed, aborts the job.
func (c *Client) Close() error {
	c.mu.Lock()
	rank, gen := c.rank, c.gen
	c.mu.Unlock()
	if rank >= 0 && c.conn.GetState() == connectivity.Ready {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, _ = c.rpc.Leave(ctx, &pb.LeaveRequest{Token: c.token, Generation: gen, Rank: int32(rank), Done: true})
		cancel()
	}
	return c.conn.Close()
}

// waitReady waits until the connection is up, retrying an absent server
// for up to the connect timeout within ctx.
func (c *Client) waitReady(ctx context.Context) error {
	st := c.conn.GetState()
	if st == connectivity.Ready {
		return nil
	}
	bctx, cancel := context.WithTimeout(ctx, c.connectTimeout)
	defer cancel()
	for {
		switch st {
		case connectivity.Ready:
			c.mu.Lock()
			c.ready = true
			c.mu.Unlock()
			return nil
		case connectivity.Shutdown:
			return fmt.Errorf("rendezvous client for %s is closed: %w", c.addr, ErrInvalid)
		case connectivity.Idle:
			c.conn.Connect()
		}
		if !c.conn.WaitForStateChange(bctx, st) {
			c.mu.Lock()
			failed := c.dialErr != nil
			c.mu.Unlock()
			if !failed && ctx.Err() != nil {
				return fmt.Errorf("connecting to the rendezvous at %s: %w", c.addr, ctx.Err())
			}
			return c.unreachable(false)
		}
		st = c.conn.GetState()
	}
}

// unreachable is the error for a server that does not answer; lost: a call
// failed because the connection went away.
func (c *Client) unreachable(lost bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return &UnreachableError{Addr: c.addr, Err: c.dialErr, Lost: lost && c.ready}
}

// call runs one RPC once the connection is up and converts its error.
func (c *Client) call(ctx context.Context, exists error, f func() error) error {
	if err := c.waitReady(ctx); err != nil {
		return err
	}
	if err := f(); err != nil {
		return c.fromStatus(err, exists)
	}
	return nil
}

func (c *Client) generation() *int32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gen
}

// Register announces self (rank -1: take the next free rank) and blocks
// until every rank has registered. A rank that is taken fails with
// ErrRankTaken and leaves the job alone; settings or a world size that
// differ from the first registrant's abort the whole job (ErrMismatch).
// If ctx ends (or the process dies) first, the rank is free again.
func (c *Client) Register(ctx context.Context, rank int, self Peer) (Membership, error) {
	var resp *pb.RegisterResponse
	err := c.call(ctx, ErrRankTaken, func() (err error) {
		resp, err = c.rpc.Register(ctx, &pb.RegisterRequest{Token: c.token, Rank: int32(rank), World: int32(self.World),
			Settings: self.Settings, Self: &pb.Peer{Host: self.Host, Pid: int32(self.PID), GpuUuid: self.GPUUUID,
				ParentGpuUuid: self.ParentGPUUUID, Mig: self.MIG}})
		return err
	})
	if err != nil {
		if errors.Is(err, ErrRankTaken) || errors.Is(err, ErrInvalid) || errors.Is(err, ErrMismatch) {
			c.mu.Lock()
			c.refused = true
			c.mu.Unlock()
		}
		return Membership{}, fmt.Errorf("registering with the rendezvous: %w", err)
	}
	m := Membership{Rank: int(resp.GetRank()), World: int(resp.GetWorld()), Generation: int(resp.GetGeneration()),
		Topology: Topology{SameHost: resp.GetTopology().GetSameHost(), SameGPU: resp.GetTopology().GetSameGpu(),
			AnyMIG: resp.GetTopology().GetAnyMig()}}
	for _, p := range resp.GetPeers() {
		m.Peers = append(m.Peers, Peer{Rank: int(p.GetRank()), Host: p.GetHost(), PID: int(p.GetPid()),
			GPUUUID: p.GetGpuUuid(), ParentGPUUUID: p.GetParentGpuUuid(), MIG: p.GetMig()})
	}
	c.mu.Lock()
	c.rank, c.gen, c.refused = m.Rank, proto.Int32(int32(m.Generation)), false
	c.mu.Unlock()
	return m, nil
}

// Put stores value under key; a key can be set once per generation.
func (c *Client) Put(ctx context.Context, key string, value []byte) error {
	err := c.call(ctx, nil, func() error {
		_, err := c.rpc.Put(ctx, &pb.PutRequest{Token: c.token, Key: key, Value: value, Generation: c.generation()})
		return err
	})
	if err != nil {
		return fmt.Errorf("putting %q: %w", key, err)
	}
	return nil
}

// Get blocks until key has a value and returns it.
func (c *Client) Get(ctx context.Context, key string) ([]byte, error) {
	var resp *pb.GetResponse
	err := c.call(ctx, nil, func() (err error) {
		resp, err = c.rpc.Get(ctx, &pb.GetRequest{Token: c.token, Key: key, Generation: c.generation()})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("getting %q: %w", key, err)
	}
	return resp.GetValue(), nil
}

// Barrier blocks until every rank entered the barrier called name. Call it
// after Register.
func (c *Client) Barrier(ctx context.Context, name string) error {
	c.mu.Lock()
	rank := c.rank
	c.mu.Unlock()
	if rank < 0 {
		return fmt.Errorf("barrier %q before register: %w", name, ErrInvalid)
	}
	err := c.call(ctx, nil, func() error {
		_, err := c.rpc.Barrier(ctx, &pb.BarrierRequest{Token: c.token, Name: name, Rank: int32(rank), Generation: c.generation()})
		return err
	})
	if err != nil {
		return fmt.Errorf("barrier %q: %w", name, err)
	}
	return nil
}

// Abort tells the rendezvous that this rank cannot go on: every rank's
// blocked and future calls fail with an *AbortError naming this rank. A
// client whose Register was refused (its rank taken, say) has no part in
// the job: its Abort does nothing.
func (c *Client) Abort(ctx context.Context, reason string) error {
	return c.abort(ctx, nil, reason)
}

// FaultRanker is an error that names the rank at fault (comm.AbortError and
// comm.PeerError do: a peer that exited or stalled).
type FaultRanker interface {
	FaultRank() int
}

// AbortWith is Abort for err: when err names another rank at fault (a
// FaultRanker in its chain), the job's AbortError names that rank.
func (c *Client) AbortWith(ctx context.Context, err error) error {
	var fr FaultRanker
	if errors.As(err, &fr) {
		f := int32(fr.FaultRank())
		return c.abort(ctx, &f, err.Error())
	}
	return c.abort(ctx, nil, err.Error())
}

func (c *Client) abort(ctx context.Context, fault *int32, reason string) error {
	c.mu.Lock()
	rank, gen, refused := c.rank, c.gen, c.refused
	c.mu.Unlock()
	if refused {
		return nil
	}
	err := c.call(ctx, nil, func() error {
		_, err := c.rpc.Abort(ctx, &pb.AbortRequest{Token: c.token, Rank: int32(rank), Reason: reason, Generation: gen, FaultRank: fault})
		return err
	})
	if err != nil {
		return fmt.Errorf("aborting the job: %w", err)
	}
	return nil
}

// Leave takes this rank out of the job for reason: before the world formed
// its rank is free again; after, the job is aborted naming this rank.
func (c *Client) Leave(ctx context.Context, reason string) error {
	c.mu.Lock()
	rank, gen := c.rank, c.gen
	c.mu.Unlock()
	if rank < 0 {
		return fmt.Errorf("leaving before register: %w", ErrInvalid)
	}
	err := c.call(ctx, nil, func() error {
		_, err := c.rpc.Leave(ctx, &pb.LeaveRequest{Token: c.token, Rank: int32(rank), Reason: reason, Generation: gen})
		return err
	})
	if err != nil {
		return fmt.Errorf("leaving the job: %w", err)
	}
	return nil
}
