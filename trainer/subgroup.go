package trainer

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/migctl/migctl/comm"
	"github.com/migctl/migctl/comm/rendezvous"
)

// subgroupName is what a subgroup's name may hold: it becomes part of
// rendezvous keys.
var subgroupName = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// NewGroup forms a group of some of g's ranks, for collectives among them
// only (PyTorch's dist.new_group(ranks=...): FSDP's hybrid sharding, tensor
// and pipeline parallel groups). ranks lists its members by their rank in
// g; member ranks[i] is rank i of the new group. name tells the group apart
// from the job's other groups. Every member calls NewGroup with the same
// name and ranks, the other ranks of g do not, and it returns once every
// member has joined (ctx bounds that; without a deadline of its own, g's
// collective timeout does). A rank not listed, a repeated or unknown rank,
// a name used before in this group or taken by another group of the job,
// or members that disagree on the ranks fail with comm.ErrInvalid; members on several hosts with ErrUnsupported
// (a group shares one node's memory).
//
// The new group shares g's device and rendezvous and takes its transport
// and all-reduce algorithm from the topology of its members, as Init does
// for a job; it has a shared-memory segment and a stream of its own, the
// timeout g has now, and g's swap state (while the job is swapped out, its
// collectives wait too). Its collectives run in its own order, independent
// of g's: a program must issue the collectives of its groups so that no two
// ranks wait on each other across groups (every member in the same order,
// as with NCCL). Close it before g; g's Close closes the groups formed from
// it that are still open.
//
// Names that begin with "p2p-" are the point-to-point links' (Send, Recv).
func (g *Group) NewGroup(ctx context.Context, name string, ranks []int) (*Group, error) {
	if !subgroupName.MatchString(name) {
		return nil, fmt.Errorf("trainer: NewGroup: name %q: want 1 to 64 letters, digits, '.', '_' or '-': %w", name, comm.ErrInvalid)
	}
	if strings.HasPrefix(name, p2pPrefix) {
		return nil, fmt.Errorf("trainer: NewGroup: name %q: names beginning with %q are the point-to-point links': pick another: %w",
			name, p2pPrefix, comm.ErrInvalid)
	}
	return g.newGroup(ctx, name, ranks, false)
}

// newGroup is NewGroup for a valid name, reserved ones included; link: a
// point-to-point link's (p2p.go), whose arena is smaller (arenaGeometry).
func (g *Group) newGroup(ctx context.Context, name string, ranks []int, link bool) (_ *Group, err error) {
	me := -1
	seen := map[int]bool{}
	for i, r := range ranks {
		switch {
		case r < 0 || r >= g.size:
			return nil, fmt.Errorf("trainer: NewGroup %q: rank %d is not in this group of %d ranks: %w", name, r, g.size, comm.ErrInvalid)
		case seen[r]:
			return nil, fmt.Errorf("trainer: NewGroup %q: rank %d listed twice: %w", name, r, comm.ErrInvalid)
		}
		seen[r] = true
		if r == g.rank {
			me = i
		}
	}
	if me < 0 {
		return nil, fmt.Errorf("trainer: NewGroup %q of ranks %v: rank %d is not one of them (only its members call NewGroup): %w",
			name, ranks, g.rank, comm.ErrInvalid)
	}
	peers := make([]rendezvous.Peer, len(ranks))
	for i, r := range ranks {
		p := g.peers[r]
		if p.Host != g.peers[g.rank].Host {
			return nil, fmt.Errorf("trainer: NewGroup %q: rank %d is on host %s, rank %d on %s: a group of ranks on several hosts is not supported (its ranks share one node's memory): %w",
				name, r, p.Host, g.rank, g.peers[g.rank].Host, ErrUnsupported)
		}
		p.Rank, p.World = i, len(ranks)
		peers[i] = p
	}
	g.mu.Lock()
	switch {
	case g.closed:
		g.mu.Unlock()
		return nil, fmt.Errorf("trainer: NewGroup %q: %w", name, ErrClosed)
	case g.subNames[name]:
		g.mu.Unlock()
		return nil, fmt.Errorf("trainer: NewGroup: this group formed a group named %q before: pick another name: %w", name, comm.ErrInvalid)
	}
	if g.subNames == nil {
		g.subNames = map[string]bool{}
	}
	g.subNames[name] = true
	g.mu.Unlock()

	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, g.Timeout())
		defer cancel()
	}
	kv := &memberKV{kv: g.kv, prefix: "trainer/sub/" + name + "/", local: me, size: len(ranks)}
	if err := agreeOnRanks(ctx, kv, g.rank, ranks); err != nil {
		return nil, fmt.Errorf("trainer: NewGroup %q: %w", name, err)
	}
	s := &Group{cfg: g.cfg, queue: make(chan *Work, 64), stopped: make(chan struct{}), scratch: map[string]comm.Buffer{},
		hold: g.hold, rank: me, size: len(ranks), localRank: me, localSize: len(ranks), peers: peers,
		topo: rendezvous.TopologyOf(peers), dev: g.dev, api: g.api, kv: kv, parent: g, link: link}
	s.cfg.dev = g.dev // g's: the subgroup neither configures nor closes it
	s.cfg.rank, s.cfg.size = me, len(ranks)
	s.cfg.localRank, s.cfg.localSize = me, len(ranks)
	s.cfg.nodeRank, s.cfg.numNodes = 0, 1
	s.cfg.job = g.cfg.job + "." + name
	s.clock = newCallClock(g.hold)
	s.timeout.Store(g.timeout.Load())
	defer func() {
		if err != nil {
			s.clock.close()
			_ = s.release()
			err = fmt.Errorf("trainer: NewGroup %q: rank %d: %w", name, g.rank, err)
		}
	}()
	if err := s.chooseAlgorithm(); err != nil {
		return nil, err
	}
	if err := s.connect(ctx); err != nil {
		return nil, err
	}
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil, ErrClosed
	}
	g.subs = append(g.subs, s)
	g.mu.Unlock()
	go s.work()
	return s, nil
}

// agreeOnRanks fails unless every member lists the same ranks and no other
// group of the job has the name: each member publishes its list under its
// rank in the parent (two members that disagree on the order may think
// themselves the same member), the first member listed records it under
// the name (a second group of that name finds the first's there), and each
// compares both with its own.
func agreeOnRanks(ctx context.Context, kv *memberKV, self int, ranks []int) error {
	list := make([]string, len(ranks))
	for i, r := range ranks {
		list[i] = strconv.Itoa(r)
	}
	mine := strings.Join(list, ",")
	// first, so that a member that fails below is seen to differ at once
	if err := kv.Put(ctx, "ranks/"+strconv.Itoa(self), []byte(mine)); err != nil {
		return fmt.Errorf("publishing the group's ranks: %w", err)
	}
	var perr error
	if ranks[0] == self {
		perr = kv.Put(ctx, "owner", []byte(mine))
	}
	owner, err := kv.Get(ctx, "owner")
	switch {
	case err != nil && perr != nil:
		return fmt.Errorf("recording the group's ranks: %w", perr)
	case err != nil:
		return fmt.Errorf("waiting for member 0 (rank %d) to form the group: %w", ranks[0], err)
	case string(owner) != mine:
		return fmt.Errorf("a group of this name has ranks [%s] in this job, this rank lists [%s]: every group needs a name of its own, and its members the same list: %w",
			owner, mine, comm.ErrInvalid)
	}
	for q, r := range ranks {
		if r == self {
			continue
		}
		v, err := kv.Get(ctx, "ranks/"+strconv.Itoa(r))
		if err != nil {
			return fmt.Errorf("waiting for member %d (rank %d) to form the group: %w", q, r, err)
		}
		if string(v) != mine {
			return fmt.Errorf("rank %d formed it of ranks [%s], rank %d of [%s]: %w", r, v, self, mine, comm.ErrInvalid)
		}
	}
	return nil
}

// memberKV scopes a rendezvous store to some of its ranks (a node's, a
// subgroup's): keys get a prefix, and a barrier waits for those ranks only.
// Abort is the whole job's.
type memberKV struct {
	kv          kv
	prefix      string
	local, size int // this rank's place among them, and their number
}

func (k *memberKV) Put(ctx context.Context, key string, v []byte) error {
	return k.kv.Put(ctx, k.prefix+key, v)
}

func (k *memberKV) Get(ctx context.Context, key string) ([]byte, error) {
	return k.kv.Get(ctx, k.prefix+key)
}

// Barrier returns once every member has entered it (each puts a key; each
// waits for all of them). A name is used once.
func (k *memberKV) Barrier(ctx context.Context, name string) error {
	base := k.prefix + "barrier/" + name + "/"
	if err := k.kv.Put(ctx, base+strconv.Itoa(k.local), []byte{1}); err != nil {
		return fmt.Errorf("barrier %q: %w", name, err)
	}
	for q := range k.size {
		if _, err := k.kv.Get(ctx, base+strconv.Itoa(q)); err != nil {
			return fmt.Errorf("barrier %q: waiting for member %d: %w", name, q, err)
		}
	}
	return nil
}

func (k *memberKV) Abort(ctx context.Context, reason string) error { return k.kv.Abort(ctx, reason) }
