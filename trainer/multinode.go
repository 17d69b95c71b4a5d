package trainer

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"

	"github.com/migctl/migctl/allreduce"
	"github.com/migctl/migctl/comm"
	"github.com/migctl/migctl/comm/rendezvous"
	"github.com/migctl/migctl/internal/nccl"
)

// EnvNCCLFake, set to 1, runs the inter-node stage of a group that spans
// hosts on internal/nccl's fake (loopback TCP, host memory) instead of
// NCCL: what tests use to run "nodes" of the host backend on one machine.
const EnvNCCLFake = "MIGCTL_NCCL_FAKE"

// communicator is what the collectives run on: allreduce's Communicator
// within a node, nodeComm across nodes.
type communicator interface {
	AllReduce(ctx context.Context, send, recv comm.Buffer, count int, dt comm.DType, op comm.Op) error
	ReduceScatter(ctx context.Context, send, recv comm.Buffer, count int, dt comm.DType, op comm.Op) error
	AllGather(ctx context.Context, send, recv comm.Buffer, count int, dt comm.DType) error
	Broadcast(ctx context.Context, send, recv comm.Buffer, count int, dt comm.DType, root int) error
	Barrier(ctx context.Context) error
	AllReduceIPC(ctx context.Context, send, recv, prevSend, prevRecv comm.Buffer, count int, dt comm.DType, op comm.Op) error
}

var (
	_ communicator = (*allreduce.Communicator)(nil)
	_ communicator = (*nodeComm)(nil)
)

// nodeStage is what a group whose ranks span hosts adds to a one-node
// group: the layout, this rank's node-local view of the rendezvous (its
// node's ranks, their topology, a key-value store and barriers scoped to
// the node, for the node's shared-memory segment) and its shard's NCCL
// communicator.
type nodeStage struct {
	plan        nodePlan
	node, local int
	peers       []rendezvous.Peer // the node's ranks, Rank = local rank
	topo        rendezvous.Topology
	kv          comm.KV
	lib         nccl.Interface
	mem         *nccl.HostMemory // host backend (the fake): buffers by address
	inter       *interComm       // nil with one node
}

// joinNodes sets up the node stage of a group whose ranks are on several
// hosts, or says why it cannot run here.
func (g *Group) joinNodes() error {
	c := g.cfg
	hosts := make([]string, g.size)
	for i, p := range g.peers {
		r := p.Rank
		if r < 0 || r >= g.size {
			r = i
		}
		hosts[r] = p.Host
	}
	what := fmt.Sprintf("the group's %d ranks are on %d hosts", g.size, countHosts(g.peers))
	plan, err := planNodes(hosts)
	if err != nil {
		return fmt.Errorf("%s: %w: %w", what, err, ErrMultiNode)
	}
	if c.transport == TransportIPC {
		return fmt.Errorf("%s: transport ipc within the nodes of a group across nodes is not supported; use shm or auto: %w", what, ErrUnsupported)
	}
	s := &nodeStage{plan: plan, node: plan.node[g.rank], local: plan.local[g.rank]}
	fake := c.nccl.fake || os.Getenv(EnvNCCLFake) == "1"
	switch {
	case fake && c.backend != BackendHost:
		return fmt.Errorf("%s: %s=1 (the fake NCCL) runs on the host backend only: %w", what, EnvNCCLFake, ErrMultiNode)
	case fake:
		s.mem = nccl.NewHostMemory()
		s.lib = nccl.NewFake(s.mem)
	case c.backend == BackendHost:
		return fmt.Errorf("%s, and the host backend cannot cross nodes: the inter-node stage runs on NCCL, which needs GPU memory; "+
			"run on GPUs (%s=gpu) with NCCL installed (libnccl.so.2), or run one group per node: %w", what, EnvBackend, ErrMultiNode)
	default:
		open := c.nccl.open
		if open == nil {
			open = nccl.Open
		}
		if s.lib, err = open(); err != nil {
			return fmt.Errorf("%s, and the inter-node stage needs NCCL: %w: %w", what, err, ErrMultiNode)
		}
		if g.api == nil {
			return fmt.Errorf("%s: the device was injected without a CUDA driver, so NCCL cannot be used: %w", what, ErrMultiNode)
		}
	}
	members := plan.members(s.node)
	s.peers = make([]rendezvous.Peer, len(members))
	gpus := map[string]bool{}
	s.topo = rendezvous.Topology{SameHost: true}
	for j, r := range members {
		p := g.peers[r]
		p.Rank = j
		s.peers[j] = p
		gpu := p.ParentGPUUUID
		if gpu == "" {
			gpu = p.GPUUUID
		}
		gpus[gpu] = true
		s.topo.AnyMIG = s.topo.AnyMIG || p.MIG
	}
	s.topo.SameGPU = len(gpus) == 1
	s.kv = &memberKV{kv: g.kv, prefix: "trainer/node/" + strconv.Itoa(s.node) + "/", local: s.local, size: plan.localSize}
	g.node = s
	g.localRank, g.localSize = s.local, plan.localSize
	g.cfg.nodeRank, g.cfg.numNodes = s.node, plan.nodes()
	return nil
}

// intra is the group as the node-local stage sees it: this rank's index,
// the number of ranks, their records and topology, and the store the
// shared-memory segment is set up through (the whole group on one node).
func (g *Group) intra() (rank, size int, peers []rendezvous.Peer, topo rendezvous.Topology, kv comm.KV) {
	if g.node == nil {
		return g.rank, g.size, g.peers, g.topo, g.kv
	}
	s := g.node
	return s.local, s.plan.localSize, s.peers, s.topo, s.kv
}

// connectNodes builds this rank's shard communicator across nodes (local
// rank j of every node; the id made by node 0's and passed through the
// rendezvous store) and puts the node stage in front of the node-local
// communicator.
func (g *Group) connectNodes(ctx context.Context, intra *allreduce.Communicator) error {
	s := g.node
	if s.plan.nodes() > 1 {
		// Every rank of every node has got this far (NCCL loaded, the node's
		// segment mapped): a node that failed aborts the job here, rather
		// than leaving the others inside ncclCommInitRank, which cannot be
		// cancelled.
		if err := g.kv.Barrier(ctx, "trainer/nodes/joined"); err != nil {
			return fmt.Errorf("waiting for the ranks of the other nodes: %w", err)
		}
		ic, err := newInterComm(ctx, g, s)
		if err != nil {
			return fmt.Errorf("joining the NCCL communicator of shard %d (local rank %d of each of %d nodes): %w",
				s.local, s.local, s.plan.nodes(), err)
		}
		s.inter = ic
	}
	g.cm = &nodeComm{g: g, s: s, intra: intra}
	return nil
}

// abort stops the inter-node communicator at once (a collective waiting
// on it fails).
func (s *nodeStage) abort() {
	if s != nil && s.inter != nil {
		s.inter.abort(errors.New("the group was aborted"))
	}
}

// close frees the inter-node communicator.
func (s *nodeStage) close() error {
	if s == nil || s.inter == nil {
		return nil
	}
	return s.inter.close()
}

// nodeComm runs the collectives of a group across nodes: each call becomes
// this rank's schedule (nodePlan), whose intra-node stages run on the
// node's shared-memory communicator and inter-node stages on NCCL. It
// takes the group's semantics (global ranks, roots and sizes).
type nodeComm struct {
	g     *Group
	s     *nodeStage
	intra *allreduce.Communicator
}

func (n *nodeComm) AllReduce(ctx context.Context, send, recv comm.Buffer, count int, dt comm.DType, op comm.Op) error {
	return n.run(ctx, n.s.plan.allReduce(n.g.rank, count, op, send == recv), send, recv, dt)
}

func (n *nodeComm) ReduceScatter(ctx context.Context, send, recv comm.Buffer, count int, dt comm.DType, op comm.Op) error {
	return n.run(ctx, n.s.plan.reduceScatter(n.g.rank, count, op, send == recv), send, recv, dt)
}

func (n *nodeComm) AllGather(ctx context.Context, send, recv comm.Buffer, count int, dt comm.DType) error {
	return n.run(ctx, n.s.plan.allGather(n.g.rank, count, send == recv), send, recv, dt)
}

func (n *nodeComm) Broadcast(ctx context.Context, send, recv comm.Buffer, count int, dt comm.DType, root int) error {
	return n.run(ctx, n.s.plan.broadcast(n.g.rank, count, root, send == recv), send, recv, dt)
}

func (n *nodeComm) Barrier(ctx context.Context) error {
	return n.run(ctx, n.s.plan.barrier(n.g.rank), nil, nil, comm.Int32)
}

func (n *nodeComm) AllReduceIPC(context.Context, comm.Buffer, comm.Buffer, comm.Buffer, comm.Buffer, int, comm.DType, comm.Op) error {
	return fmt.Errorf("the IPC ring within the nodes of a group across nodes: %w", ErrUnsupported)
}

// run executes one rank's schedule. Worker goroutine only.
func (n *nodeComm) run(ctx context.Context, sched schedule, send, recv comm.Buffer, dt comm.DType) error {
	g := n.g
	es := dt.Size()
	bufs := [3]comm.Buffer{bufSend: send, bufRecv: recv}
	if sched.Work > 0 {
		w, err := g.scratchBuf("nodes", sched.Work*es)
		if err != nil {
			return err
		}
		bufs[bufWork] = w
	}
	queued := false // copies queued on g.stream, not yet waited for
	flush := func() error {
		if !queued {
			return nil
		}
		queued = false
		return g.stream.Synchronize(ctx)
	}
	for _, st := range sched.Stages {
		dst := bufs[st.Dst]
		var err error
		switch {
		case st.Kind == stCopy:
			err = g.stream.CopyBuffer(dst, st.Off*es, bufs[st.Src], st.SrcOff*es, st.Count*es)
			queued = true
		case st.Kind == stScale:
			err = g.stream.Scale(dst, st.Off*es, st.Count*es, dt, st.Div)
			queued = true
		case st.Kind.intra():
			if err = flush(); err == nil {
				err = n.runIntra(ctx, st, bufs, es, dt)
			}
		default:
			if err = flush(); err == nil {
				err = n.s.inter.run(ctx, st, dst, dt)
			}
		}
		if err != nil {
			return fmt.Errorf("%v: %w", st, err)
		}
	}
	return flush()
}

func (n *nodeComm) runIntra(ctx context.Context, st stage, bufs [3]comm.Buffer, es int, dt comm.DType) error {
	if st.Kind == stIntraBarrier {
		return n.intra.Barrier(ctx)
	}
	srcN, dstN := st.Count, st.Count
	switch st.Kind {
	case stIntraReduceScatter:
		srcN *= n.s.plan.localSize
	case stIntraAllGather:
		dstN *= n.s.plan.localSize
	}
	dst, err := n.g.view(bufs[st.Dst], st.Off*es, dstN*es)
	if err != nil {
		return err
	}
	src := dst // in place: one buffer, as the communicator wants it
	if bufs[st.Src] != bufs[st.Dst] || st.SrcOff != st.Off {
		if src, err = n.g.view(bufs[st.Src], st.SrcOff*es, srcN*es); err != nil {
			return err
		}
	}
	switch st.Kind {
	case stIntraAllReduce:
		return n.intra.AllReduce(ctx, src, dst, st.Count, dt, st.Op)
	case stIntraReduceScatter:
		return n.intra.ReduceScatter(ctx, src, dst, st.Count, dt, st.Op)
	case stIntraAllGather:
		return n.intra.AllGather(ctx, src, dst, st.Count, dt)
	default:
		return n.intra.Broadcast(ctx, src, dst, st.Count, dt, st.Root)
	}
}

// view is n bytes of buf from off, as a buffer of the group's device.
func (g *Group) view(buf comm.Buffer, off, n int) (comm.Buffer, error) {
	if off == 0 && n == buf.Len() {
		return buf, nil
	}
	if off < 0 || n < 0 || off+n > buf.Len() {
		return nil, fmt.Errorf("view [%d:+%d] of a %d-byte buffer: %w", off, n, buf.Len(), comm.ErrInvalid)
	}
	switch b := buf.(type) {
	case *comm.HostBuffer:
		return comm.WrapHostBytes(b.Bytes()[off : off+n]), nil
	case *comm.CUDABuffer:
		ext, ok := g.dev.(comm.ExternalDevice)
		if !ok {
			return nil, fmt.Errorf("a view of a device buffer: %w", ErrUnsupported)
		}
		return ext.WrapPointer(uintptr(b.Ptr())+uintptr(off), n)
	}
	return nil, fmt.Errorf("a view of a %T: %w", buf, ErrUnsupported)
}
