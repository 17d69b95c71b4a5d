package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/migctl/migctl/comm/rendezvouspb"
)

// ErrInvalid reports a bad argument (world size, token, address).
var ErrInvalid = errors.New("invalid rendezvous argument")

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
}

// Topology summarises the peers.
type Topology struct {
	SameHost bool
	SameGPU  bool
	AnyMIG   bool
}

// Membership is what Register answers.
type Membership struct {
	Rank     int
	World    int
	Peers    []Peer
	Topology Topology
}

// Client talks to a job's rendezvous server.
type Client struct {
	conn  *grpc.ClientConn
	rpc   pb.RendezvousClient
	token string
	rank  int
}

// Dial connects to addr: "unix:///path/to.sock" or "host:port" (loopback).
// It does not block; the first call does.
func Dial(addr, token string) (*Client, error) {
	if addr == "" || token == "" {
		return nil, fmt.Errorf("address %q, token set %v: %w", addr, token != "", ErrInvalid)
	}
	target := addr
	if !strings.Contains(addr, "://") && !strings.HasPrefix(addr, "unix:") {
		target = "passthrough:///" + addr
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("connecting to rendezvous %s: %w", addr, err)
	}
	return &Client{conn: conn, rpc: pb.NewRendezvousClient(conn), token: token, rank: -1}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Register announces self (rank -1: take the next free rank) and blocks
// until every rank has registered.
func (c *Client) Register(ctx context.Context, rank int, self Peer) (Membership, error) {
	resp, err := c.rpc.Register(ctx, &pb.RegisterRequest{Token: c.token, Rank: int32(rank), Self: &pb.Peer{
		Host: self.Host, Pid: int32(self.PID), GpuUuid: self.GPUUUID, ParentGpuUuid: self.ParentGPUUUID, Mig: self.MIG}},
		grpc.WaitForReady(true))
	if err != nil {
		return Membership{}, fmt.Errorf("registering with the rendezvous: %w", err)
	}
	m := Membership{Rank: int(resp.GetRank()), World: int(resp.GetWorld()), Topology: Topology{
		SameHost: resp.GetTopology().GetSameHost(), SameGPU: resp.GetTopology().GetSameGpu(), AnyMIG: resp.GetTopology().GetAnyMig()}}
	for _, p := range resp.GetPeers() {
		m.Peers = append(m.Peers, Peer{Rank: int(p.GetRank()), Host: p.GetHost(), PID: int(p.GetPid()),
			GPUUUID: p.GetGpuUuid(), ParentGPUUUID: p.GetParentGpuUuid(), MIG: p.GetMig()})
	}
	c.rank = m.Rank
	return m, nil
}

// Put stores value under key; a key can be set once.
func (c *Client) Put(ctx context.Context, key string, value []byte) error {
	if _, err := c.rpc.Put(ctx, &pb.PutRequest{Token: c.token, Key: key, Value: value}); err != nil {
		return fmt.Errorf("putting %q: %w", key, err)
	}
	return nil
}

// Get blocks until key has a value and returns it.
func (c *Client) Get(ctx context.Context, key string) ([]byte, error) {
	resp, err := c.rpc.Get(ctx, &pb.GetRequest{Token: c.token, Key: key})
	if err != nil {
		return nil, fmt.Errorf("getting %q: %w", key, err)
	}
	return resp.GetValue(), nil
}

// Barrier blocks until every rank entered the barrier called name. Call it
// after Register.
func (c *Client) Barrier(ctx context.Context, name string) error {
	if c.rank < 0 {
		return fmt.Errorf("barrier %q before register: %w", name, ErrInvalid)
	}
	if _, err := c.rpc.Barrier(ctx, &pb.BarrierRequest{Token: c.token, Name: name, Rank: int32(c.rank)}); err != nil {
		return fmt.Errorf("barrier %q: %w", name, err)
	}
	return nil
}

// Abort tells the rendezvous that this rank cannot go on: every rank's
// blocked and future calls fail with codes.Aborted.
func (c *Client) Abort(ctx context.Context, reason string) error {
	if _, err := c.rpc.Abort(ctx, &pb.AbortRequest{Token: c.token, Rank: int32(c.rank), Reason: reason}); err != nil {
		return fmt.Errorf("aborting the job: %w", err)
	}
	return nil
}
