package trainer

import (
	"fmt"
	"slices"
	"strings"

	"github.com/migctl/migctl/comm"
)

// nodePlan is the layout of a group whose ranks span nodes: which node each
// rank is on and its index among that node's ranks. Nodes are numbered in
// the order of their lowest rank, a node's ranks by rank. Every node has
// localSize ranks. Local rank j of every node forms shard j: the ranks that
// talk across nodes (through NCCL) for the j-th share of the data.
type nodePlan struct {
	hosts     []string // node i's host
	node      []int    // rank → node
	local     []int    // rank → index among its node's ranks
	localSize int
}

// planNodes lays out ranks whose hosts are hosts[rank].
func planNodes(hosts []string) (nodePlan, error) {
	if len(hosts) == 0 {
		return nodePlan{}, fmt.Errorf("no ranks: %w", comm.ErrInvalid)
	}
	p := nodePlan{node: make([]int, len(hosts)), local: make([]int, len(hosts))}
	index := map[string]int{}
	var count []int
	for r, h := range hosts {
		i, ok := index[h]
		if !ok {
			i = len(p.hosts)
			index[h] = i
			p.hosts = append(p.hosts, h)
			count = append(count, 0)
		}
		p.node[r], p.local[r] = i, count[i]
		count[i]++
	}
	p.localSize = count[0]
	for i, c := range count {
		if c != p.localSize {
			return nodePlan{}, fmt.Errorf("host %s has %d ranks and host %s %d: a group across nodes needs the same number of ranks on every node (run the same --np on each): %w",
				p.hosts[0], p.localSize, p.hosts[i], c, comm.ErrInvalid)
		}
	}
	return p, nil
}

// nodes is the number of nodes.
func (p nodePlan) nodes() int { return len(p.hosts) }

// rankOf is the rank of local rank j of node i.
func (p nodePlan) rankOf(i, j int) int {
	for r := range p.node {
		if p.node[r] == i && p.local[r] == j {
			return r
		}
	}
	panic(fmt.Sprintf("trainer: no local rank %d on node %d", j, i))
}

// members are the ranks of node i, by local rank.
func (p nodePlan) members(i int) []int {
	out := make([]int, p.localSize)
	for r := range p.node {
		if p.node[r] == i {
			out[p.local[r]] = r
		}
	}
	return out
}

// shard are the ranks of shard j, by node.
func (p nodePlan) shard(j int) []int {
	out := make([]int, p.nodes())
	for r := range p.node {
		if p.local[r] == j {
			out[p.node[r]] = r
		}
	}
	return out
}

// stageKind is one step of a collective across nodes.
type stageKind int

const (
	// stCopy: Dst[Off:Off+Count] = Src[SrcOff:SrcOff+Count].
	stCopy stageKind = iota
	// stScale: Dst[Off:Off+Count] /= Div (finishes an Avg).
	stScale
	// Intra-node collectives among the node's ranks (shared memory), from
	// Src[SrcOff:] to Dst[Off:] (in place when they are the same).
	stIntraAllReduce     // Count elements
	stIntraReduceScatter // reads Count·L elements; local rank k gets block k (Count)
	stIntraAllGather     // each reads Count; Dst gets Count·L, local rank k's at k·Count
	stIntraBroadcast     // Count elements of local rank Root
	stIntraBarrier
	// Inter-node collectives among the ranks of this rank's shard (one per
	// node, NCCL), in place on Dst; the index of a rank is its node.
	stInterAllReduce     // Dst[Off:Off+Count]
	stInterReduceScatter // Dst[Off:Off+Count·N]; node k's block at Off+k·Count
	stInterAllGather     // Dst[Off:Off+Count·N]; node k's block at Off+k·Count
	stInterBroadcast     // Dst[Off:Off+Count] from node Root
)

var stageNames = [...]string{"copy", "scale", "intra-allreduce", "intra-reducescatter", "intra-allgather",
	"intra-broadcast", "intra-barrier", "inter-allreduce", "inter-reducescatter", "inter-allgather", "inter-broadcast"}

func (k stageKind) String() string { return stageNames[k] }

func (k stageKind) intra() bool { return k >= stIntraAllReduce && k <= stIntraBarrier }
func (k stageKind) inter() bool { return k >= stInterAllReduce }

// bufID names a buffer of a stage: the caller's send and receive buffers
// (one buffer when the collective is in place) and a scratch buffer.
type bufID int

const (
	bufSend bufID = iota
	bufRecv
	bufWork
)

func (b bufID) String() string { return [...]string{"send", "recv", "work"}[b] }

// stage is one step; offsets and counts are in elements.
type stage struct {
	Kind        stageKind
	Dst, Src    bufID
	Off, SrcOff int
	Count       int
	Root        int
	Op          comm.Op
	Div         int
}

func (s stage) String() string {
	switch s.Kind {
	case stCopy:
		return fmt.Sprintf("copy %v[%d:+%d] <- %v[%d]", s.Dst, s.Off, s.Count, s.Src, s.SrcOff)
	case stScale:
		return fmt.Sprintf("scale %v[%d:+%d] /%d", s.Dst, s.Off, s.Count, s.Div)
	case stIntraBarrier:
		return s.Kind.String()
	case stIntraAllReduce, stIntraReduceScatter, stIntraAllGather:
		return fmt.Sprintf("%v %v[%d] <- %v[%d] count %d op %d", s.Kind, s.Dst, s.Off, s.Src, s.SrcOff, s.Count, s.Op)
	case stIntraBroadcast, stInterBroadcast:
		return fmt.Sprintf("%v %v[%d] count %d root %d", s.Kind, s.Dst, s.Off, s.Count, s.Root)
	}
	return fmt.Sprintf("%v %v[%d] count %d op %d", s.Kind, s.Dst, s.Off, s.Count, s.Op)
}

// schedule is one rank's steps of one collective and the scratch it needs.
type schedule struct {
	Work   int // elements of scratch (bufWork)
	Stages []stage
}

func (s schedule) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "work %d", s.Work)
	for _, st := range s.Stages {
		b.WriteString("; ")
		b.WriteString(st.String())
	}
	return b.String()
}

// reduceOp is the op of the stages of a reduction: Avg sums, and the last
// stage divides.
func reduceOp(op comm.Op) comm.Op {
	if op == comm.Avg {
		return comm.Sum
	}
	return op
}

// allReduce is rank's schedule of an all-reduce of count elements
// (Horovod's hierarchical all-reduce, sharded): the node's ranks
// reduce-scatter the largest part that splits evenly among them (block j
// to local rank j, in scratch), local rank j all-reduces block j with local
// rank j of every other node, and the node's ranks all-gather the blocks
// into recv. The few elements left over are all-reduced within the node,
// across nodes by local rank 0 only, and broadcast from it, so every rank
// ends with bit-identical results. Within a node nothing runs in place
// but the leftover's broadcast.
func (p nodePlan) allReduce(rank, count int, op comm.Op, inPlace bool) schedule {
	var s schedule
	L, N, j := p.localSize, p.nodes(), p.local[rank]
	if count == 0 {
		return s
	}
	red := reduceOp(op)
	b := count / L
	switch {
	case L == 1:
		if !inPlace {
			s.add(stage{Kind: stCopy, Dst: bufRecv, Src: bufSend, Count: count})
		}
		if N > 1 {
			s.add(stage{Kind: stInterAllReduce, Dst: bufRecv, Count: count, Op: red})
		}
	case b > 0:
		s.Work = b
		s.add(stage{Kind: stIntraReduceScatter, Dst: bufWork, Src: bufSend, Count: b, Op: red})
		if N > 1 {
			s.add(stage{Kind: stInterAllReduce, Dst: bufWork, Count: b, Op: red})
		}
		s.add(stage{Kind: stIntraAllGather, Dst: bufRecv, Src: bufWork, Count: b})
	}
	if m, t := b*L, count-b*L; t > 0 {
		s.add(stage{Kind: stIntraAllReduce, Dst: bufRecv, Off: m, Src: bufSend, SrcOff: m, Count: t, Op: red})
		if N > 1 {
			if j == 0 {
				s.add(stage{Kind: stInterAllReduce, Dst: bufRecv, Off: m, Count: t, Op: red})
			}
			s.add(stage{Kind: stIntraBroadcast, Dst: bufRecv, Off: m, Src: bufRecv, SrcOff: m, Count: t, Root: 0})
		}
	}
	if op == comm.Avg {
		s.add(stage{Kind: stScale, Dst: bufRecv, Count: count, Div: N * L})
	}
	return s
}

// reduceScatter is rank's schedule of a reduce-scatter of N·L blocks of
// block elements: the blocks are put in shard order in scratch (the blocks
// of local rank j of every node next to each other), the node's ranks
// reduce-scatter them (local rank j gets the node's sum of its shard's
// blocks, after them in scratch), local rank j of every node
// reduce-scatters those across nodes, and the rank's block is copied out
// (to recv[0:block], or to its place in the buffer when in place).
func (p nodePlan) reduceScatter(rank, block int, op comm.Op, inPlace bool) schedule {
	L, N, i := p.localSize, p.nodes(), p.node[rank]
	if block == 0 {
		return schedule{}
	}
	W := N * L
	s := schedule{Work: W * block}
	for jj := range L {
		for ii := range N {
			s.add(stage{Kind: stCopy, Dst: bufWork, Off: (jj*N + ii) * block, Src: bufSend,
				SrcOff: p.rankOf(ii, jj) * block, Count: block})
		}
	}
	red := reduceOp(op)
	base := 0 // the node's sum of this rank's shard: N blocks
	if L > 1 {
		base = W * block
		s.Work += N * block
		s.add(stage{Kind: stIntraReduceScatter, Dst: bufWork, Off: base, Src: bufWork, Count: N * block, Op: red})
	}
	if N > 1 {
		s.add(stage{Kind: stInterReduceScatter, Dst: bufWork, Off: base, Count: block, Op: red})
	}
	out := 0
	if inPlace {
		out = rank * block
	}
	s.add(stage{Kind: stCopy, Dst: bufRecv, Off: out, Src: bufWork, SrcOff: base + i*block, Count: block})
	if op == comm.Avg {
		s.add(stage{Kind: stScale, Dst: bufRecv, Off: out, Count: block, Div: W})
	}
	return s
}

// allGather is rank's schedule of an all-gather of block elements per
// rank, sharded like the all-reduce: local rank j of every node gathers
// the nodes' blocks j across nodes (each rank sends its own block once),
// the node's ranks gather those per-shard parts, and the blocks are copied
// to their places in recv in rank order. Work: the shard's N blocks, then
// the node's L·N.
func (p nodePlan) allGather(rank, block int, inPlace bool) schedule {
	L, N, i := p.localSize, p.nodes(), p.node[rank]
	var s schedule
	if block == 0 {
		return s
	}
	srcOff := 0
	if inPlace {
		srcOff = rank * block
	}
	if L == 1 {
		// One rank per node: gather across nodes into recv itself (rank =
		// node with one rank per node).
		if !inPlace {
			s.add(stage{Kind: stCopy, Dst: bufRecv, Off: rank * block, Src: bufSend, Count: block})
		}
		if N > 1 {
			s.add(stage{Kind: stInterAllGather, Dst: bufRecv, Count: block})
		}
		return s
	}
	shard := N * block // work[0:shard]: blocks (0..N-1, j)
	s.Work = shard + L*shard
	s.add(stage{Kind: stCopy, Dst: bufWork, Off: i * block, Src: bufSend, SrcOff: srcOff, Count: block})
	if N > 1 {
		s.add(stage{Kind: stInterAllGather, Dst: bufWork, Count: block})
	}
	// work[shard:]: local rank jj's shard part at shard + jj·shard, block
	// (ii, jj) at shard + (jj·N + ii)·block.
	s.add(stage{Kind: stIntraAllGather, Dst: bufWork, Off: shard, Src: bufWork, Count: shard})
	for jj := range L {
		for ii := range N {
			s.add(stage{Kind: stCopy, Dst: bufRecv, Off: p.rankOf(ii, jj) * block, Src: bufWork,
				SrcOff: shard + (jj*N+ii)*block, Count: block})
		}
	}
	return s
}

// broadcast is rank's schedule of a broadcast of count elements from
// root, sharded: root's node gets everything within the node, local rank
// j of every node receives piece j (⌊count/L⌋ elements) from root's node
// across nodes, and every other node's ranks gather the pieces. The
// leftover elements cross on shard 0 and are broadcast from local rank 0
// within each other node.
func (p nodePlan) broadcast(rank, count, root int, inPlace bool) schedule {
	var s schedule
	if count == 0 {
		return s
	}
	L, N, i, j := p.localSize, p.nodes(), p.node[rank], p.local[rank]
	ri, rj := p.node[root], p.local[root]
	if rank == root && !inPlace {
		s.add(stage{Kind: stCopy, Dst: bufRecv, Src: bufSend, Count: count})
	}
	if L == 1 {
		if N > 1 {
			s.add(stage{Kind: stInterBroadcast, Dst: bufRecv, Count: count, Root: ri})
		}
		return s
	}
	if N == 1 {
		s.add(stage{Kind: stIntraBroadcast, Dst: bufRecv, Src: bufRecv, Count: count, Root: rj})
		return s
	}
	b := count / L
	m, t := b*L, count-b*L
	if i == ri {
		s.add(stage{Kind: stIntraBroadcast, Dst: bufRecv, Src: bufRecv, Count: count, Root: rj})
		if b > 0 {
			s.add(stage{Kind: stInterBroadcast, Dst: bufRecv, Off: j * b, Count: b, Root: ri})
		}
		if t > 0 && j == 0 {
			s.add(stage{Kind: stInterBroadcast, Dst: bufRecv, Off: m, Count: t, Root: ri})
		}
		return s
	}
	if b > 0 {
		s.Work = b
		s.add(stage{Kind: stInterBroadcast, Dst: bufWork, Count: b, Root: ri})
		s.add(stage{Kind: stIntraAllGather, Dst: bufRecv, Src: bufWork, Count: b})
	}
	if t > 0 {
		if j == 0 {
			s.add(stage{Kind: stInterBroadcast, Dst: bufRecv, Off: m, Count: t, Root: ri})
		}
		s.add(stage{Kind: stIntraBroadcast, Dst: bufRecv, Off: m, Src: bufRecv, SrcOff: m, Count: t, Root: 0})
	}
	return s
}

// barrier is rank's schedule of a barrier: every shard all-reduces one
// element across nodes (rank passes once every node's rank of its shard
// has entered), then the node's ranks meet (once all of them have passed,
// every rank of every node has entered).
func (p nodePlan) barrier(int) schedule {
	var s schedule
	if p.nodes() > 1 {
		s.Work = 1
		s.add(stage{Kind: stInterAllReduce, Dst: bufWork, Count: 1, Op: comm.Sum})
	}
	if p.localSize > 1 {
		s.add(stage{Kind: stIntraBarrier})
	}
	return s
}

// add appends st, merging a copy into the previous one when both are
// contiguous continuations of each other.
func (s *schedule) add(st stage) {
	if n := len(s.Stages); n > 0 && st.Kind == stCopy {
		prev := &s.Stages[n-1]
		if prev.Kind == stCopy && prev.Dst == st.Dst && prev.Src == st.Src &&
			prev.Off+prev.Count == st.Off && prev.SrcOff+prev.Count == st.SrcOff {
			prev.Count += st.Count
			return
		}
	}
	if st.Kind == stCopy && st.Dst == st.Src && st.Off == st.SrcOff {
		return
	}
	s.Stages = append(s.Stages, st)
}

// kinds lists the kinds of the stages, in order (tests).
func (s schedule) kinds() []stageKind {
	out := make([]stageKind, 0, len(s.Stages))
	for _, st := range s.Stages {
		out = append(out, st.Kind)
	}
	return slices.Clip(out)
}
