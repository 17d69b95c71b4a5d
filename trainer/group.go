package trainer

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/migctl/migctl/allreduce"
	"github.com/migctl/migctl/allreduce/kernels"
	"github.com/migctl/migctl/comm"
	"github.com/migctl/migctl/comm/rendezvous"
	"github.com/migctl/migctl/comm/shm"
	"github.com/migctl/migctl/internal/cuda"
	"github.com/migctl/migctl/internal/mps"
)

// Sentinel errors of this package (the comm sentinels are returned too).
var (
	// ErrTimeout: a collective ran past its deadline (time held by a swap
	// not counted).
	ErrTimeout = errors.New("collective deadline exceeded")
	// ErrMultiNode: the group's ranks are on several hosts and the
	// inter-node stage cannot run (no NCCL, the host backend, ranks uneven
	// across hosts); the error says which.
	ErrMultiNode = errors.New("group spans several hosts")
	// ErrClosed: the Group was closed.
	ErrClosed = errors.New("group closed")
	// ErrUnsupported: the call cannot run on this group (say, a device
	// buffer on the host backend).
	ErrUnsupported = errors.New("not supported")
)

// setupTimeout bounds the rendezvous and the shared-memory join in Init
// when ctx has no deadline of its own.
const setupTimeout = 5 * time.Minute

// Group is this process's membership in a job's group of ranks. Its methods
// are safe for concurrent use; collectives run one at a time in the order
// they were issued.
type Group struct {
	cfg       config
	rank      int
	size      int
	localRank int
	localSize int
	peers     []rendezvous.Peer
	topo      rendezvous.Topology

	dev     comm.Device
	kv      kv
	closeKV func() error
	// faultReported: a dead or stalled peer was reported to the
	// rendezvous (reportFault).
	faultReported atomic.Bool
	job           *comm.ShmJob
	tr            *comm.ShmTransport
	exec          *allreduce.Executor
	cm            communicator   // allreduce's within a node; nodeComm across nodes
	api           cuda.Interface // the driver behind dev (gpu backend)
	node          *nodeStage     // groups across nodes (multinode.go)
	stream        comm.Stream
	transport     Transport
	alg           allreduce.Algorithm
	groups        allreduce.Grouping // ranks sharing a GPU (Hierarchical)
	h2dFixed      bool               // MIGCTL_H2D chose the small-copy mode

	queue   chan *Work
	stopped chan struct{}
	// running is held by whoever runs a collective: the worker, or a
	// synchronous caller running its call inline (work.go). pending counts
	// the collectives queued or running; inlined the inline ones, for Close.
	running sync.Mutex
	pending atomic.Int64
	inlined sync.WaitGroup

	hold    *holdState
	clock   *callClock   // the deadline of the worker's collectives
	clock2  *callClock   // a second one, for a chained collective beside another (made by the worker on first use)
	timeout atomic.Int64 // every collective's deadline, in nanoseconds (SetTimeout)
	swap    *swapMember
	daemon  *daemonLink

	// Owned by the worker goroutine.
	scratch    map[string]comm.Buffer
	ipc        *ipcState
	registered map[[2]uintptr]*comm.PeerBuffers // RegisterIPC'd (send, recv) pairs

	closeOnce sync.Once
	closeErr  error
	mu        sync.Mutex
	closed    bool
	parent    *Group              // the group NewGroup formed this one from (nil: Init's)
	link      bool                // a point-to-point link (p2p.go): a smaller arena (geometry.go)
	subs      []*Group            // groups formed from this one (NewGroup) and still open, closed with it
	subNames  map[string]bool     // their names, for good
	links     map[p2pKey]*p2pLink // point-to-point links (p2p.go), by peer and direction
}

// kv is what the group needs of a rendezvous client.
type kv interface {
	comm.KV
	Abort(ctx context.Context, reason string) error
}

// Init joins the group this process belongs to, as the environment and opts
// describe (see the package documentation), and returns once every rank has
// joined and the transport is up. ctx bounds the setup (default 5m).
func Init(ctx context.Context, opts ...Option) (_ *Group, err error) {
	var c config
	if err := fromEnv(&c, os.Getenv); err != nil {
		return nil, fmt.Errorf("trainer: reading the environment: %w", err)
	}
	for _, o := range opts {
		if err := o(&c); err != nil {
			return nil, fmt.Errorf("trainer: %w", err)
		}
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, setupTimeout)
		defer cancel()
	}
	g := &Group{cfg: c, queue: make(chan *Work, 64), stopped: make(chan struct{}), scratch: map[string]comm.Buffer{},
		hold: newHoldState()}
	g.clock = newCallClock(g.hold)
	g.timeout.Store(int64(c.timeout))
	defer func() {
		if err != nil {
			if g.kv != nil {
				actx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				_ = g.kv.Abort(actx, fmt.Sprintf("rank %d failed to join: %v", c.rank, err))
				cancel()
			}
			g.release()
			err = fmt.Errorf("trainer: rank %d: %w", c.rank, err)
		}
	}()
	if err := g.openDevice(); err != nil {
		return nil, err
	}
	self := g.self()
	var m rendezvous.Membership
	switch {
	case c.addr != "":
		client, err := rendezvous.Dial(c.addr, c.token)
		if err != nil {
			return nil, err
		}
		g.kv, g.closeKV = client, client.Close
		if m, err = client.Register(ctx, c.rank, self); err != nil {
			return nil, err
		}
	case c.size == 1:
		local := newLocalKV()
		g.kv, g.closeKV = local, func() error { return nil }
		self.Rank = 0
		m = rendezvous.Membership{Rank: 0, World: 1, Peers: []rendezvous.Peer{self},
			Topology: rendezvous.Topology{SameHost: true, SameGPU: true, AnyMIG: self.MIG}}
	default:
		return nil, fmt.Errorf("%s=%d but no rendezvous: start the program with `migctl run`, or set %s and %s: %w",
			EnvWorldSize, c.size, EnvRendezvous, EnvToken, comm.ErrInvalid)
	}
	g.rank, g.size, g.peers, g.topo = m.Rank, m.World, m.Peers, m.Topology
	g.localRank, g.localSize = c.localRank, c.localSize
	if g.localRank < 0 || g.localSize < 1 {
		g.localRank, g.localSize = g.rank, g.size // one host, else joinNodes sets them
	}
	if !m.Topology.SameHost {
		if err := g.joinNodes(); err != nil {
			return nil, err
		}
	}
	if err := g.chooseAlgorithm(); err != nil {
		return nil, err
	}
	if err := g.connect(ctx); err != nil {
		return nil, err
	}
	if g.swap, err = joinSwap(ctx, g); err != nil {
		return nil, err
	}
	g.daemon = linkDaemon(ctx, g)
	go g.work()
	return g, nil
}

func countHosts(peers []rendezvous.Peer) int {
	hosts := map[string]bool{}
	for _, p := range peers {
		hosts[p.Host] = true
	}
	return len(hosts)
}

// self is what this rank reports at the rendezvous.
func (g *Group) self() rendezvous.Peer {
	c := g.cfg
	host := c.host
	if host == "" {
		host, _ = os.Hostname()
	}
	p := rendezvous.Peer{Rank: c.rank, Host: host, PID: os.Getpid(), World: c.size, Settings: map[string]string{}}
	if td, ok := g.dev.(comm.TopologyDevice); ok {
		t := td.Topology()
		p.GPUUUID, p.MIG, p.ParentGPUUUID = t.UUID, t.MIG, t.ParentUUID
		if t.PCIBusID != "" {
			p.ParentGPUUUID = "pci:" + t.PCIBusID
		}
	} else {
		// Every host-backend rank of a host shares one virtual GPU.
		p.GPUUUID = "host:" + host
		p.ParentGPUUUID = p.GPUUUID
	}
	for k, v := range c.settings {
		p.Settings[k] = v
	}
	t := c.tuning
	p.Settings["trainer.transport"] = string(c.transport)
	p.Settings["trainer.algorithm"] = string(c.algorithm)
	p.Settings["trainer.chunk"] = strconv.Itoa(t.Chunk)
	p.Settings["trainer.slots"] = strconv.Itoa(t.Slots)
	p.Settings["trainer.small"] = strconv.Itoa(t.SmallBytes)
	p.Settings["trainer.smallon"] = map[bool]string{false: "cpu", true: "device"}[t.SmallOnDevice]
	p.Settings["trainer.piece"] = map[bool]string{false: "auto", true: "chunk"}[t.WholeChunks]
	return p
}

// openDevice opens the rank's device: injected, host memory, or CUDA.
func (g *Group) openDevice() error {
	c := &g.cfg
	if c.dev != nil {
		g.dev = c.dev
		if _, ok := c.dev.(comm.TopologyDevice); ok {
			c.backend = BackendGPU
		} else {
			c.backend = BackendHost
		}
		return nil
	}
	api := c.api
	if api == nil && c.backend != BackendHost {
		if os.Getenv(EnvCUDAFake) == "1" {
			f := cuda.NewFake()
			comm.InstallFakeCUDAKernels(f)
			api = f
		} else if real, err := cuda.Open(); err == nil {
			api = real
		} else if c.backend == BackendGPU {
			return fmt.Errorf("opening the CUDA driver for %s=gpu: %w (without a GPU, use %s=host)", EnvBackend, err, EnvBackend)
		}
	}
	if api != nil && c.backend == BackendAuto {
		if err := api.Init(0); err != nil {
			api = nil
		} else if n, err := api.DeviceGetCount(); err != nil || n == 0 {
			api = nil
		}
	}
	if api == nil {
		c.backend = BackendHost
		g.dev = comm.NewHostDevice(comm.HostOptions{ReduceWorkers: c.tuning.ReduceWorkers})
		return nil
	}
	c.backend = BackendGPU
	g.api = api
	// Unset, the mode follows the ranks sharing the device (setSmallH2D).
	g.h2dFixed = os.Getenv(EnvSmallH2D) != ""
	mode, err := comm.ParseH2DMode(os.Getenv(EnvSmallH2D))
	if err != nil {
		return fmt.Errorf("%s: %w", EnvSmallH2D, err)
	}
	stage, err := parseReduceStage(os.Getenv(EnvReduceStage))
	if err != nil {
		return err
	}
	dev, err := comm.NewCUDADevice(api, comm.CUDAConfig{Ordinal: c.device, PTX: kernels.PTX, SmallH2D: mode,
		StageReduce: stage})
	if err != nil {
		return fmt.Errorf("opening CUDA device %d: %w", c.device, err)
	}
	g.dev = dev
	return nil
}

// parseReduceStage reads EnvReduceStage: "" the schedules that ask (the
// ring's reductions), "1" every device reduction of host memory, "0" none.
func parseReduceStage(v string) (comm.StageMode, error) {
	switch v {
	case "":
		return comm.StageAsked, nil
	case "1":
		return comm.StageAll, nil
	case "0":
		return comm.StageNone, nil
	}
	return 0, fmt.Errorf("%s=%q: want 1 (stage every device reduction of host memory), 0 (none) or unset "+
		"(the ring's): %w", EnvReduceStage, v, comm.ErrInvalid)
}

// chooseAlgorithm picks the transport and the all-reduce algorithm from the
// topology the rendezvous reported: CUDA IPC between whole GPUs of one host;
// otherwise, over shared memory, whichever of host-staged, ring and
// hierarchical allreduce's cost model predicts fastest for the ranks'
// grouping by physical GPU, on the machine figures in the job's settings
// (allreduce.Setting*; hw/H200.md's without them). Every input is the same
// on every rank (the peers, the settings the rendezvous made equal, the
// world size), so every rank picks the same.
func (g *Group) chooseAlgorithm() error {
	c := g.cfg
	_, size, peers, top, _ := g.intra() // the node's ranks
	_, ipcOK := g.dev.(comm.IPCDevice)
	t := c.transport
	if t == TransportAuto {
		t = TransportShm
		if ipcOK && c.backend == BackendGPU && !top.AnyMIG && !top.SameGPU && top.SameHost && size > 1 && g.node == nil {
			t = TransportIPC
		}
	}
	g.transport = t
	groups, err := peerGroups(peers, size)
	if err != nil {
		return err
	}
	g.groups = groups
	if t == TransportIPC {
		switch {
		case !ipcOK:
			return fmt.Errorf("transport ipc: the %s backend cannot share buffers through CUDA IPC: %w", c.backend, ErrUnsupported)
		case top.AnyMIG:
			return fmt.Errorf("transport ipc: CUDA IPC does not work between MIG instances; use the shm transport: %w", ErrUnsupported)
		}
		g.alg = allreduce.RingIPC
		return nil
	}
	switch c.algorithm {
	case AlgorithmRing:
		g.alg = allreduce.Ring
	case AlgorithmHostStaged:
		g.alg = allreduce.HostStaged
	case AlgorithmHierarchical:
		g.alg = allreduce.Hierarchical
	default:
		m, err := allreduce.MachineFromSettings(allreduce.H200(), c.settings)
		if err != nil {
			return fmt.Errorf("machine figures for choosing the all-reduce algorithm: %w (fix or drop the setting)", err)
		}
		// Reduce threads per rank: the setting every rank shares, else the
		// executor's default without its per-process core cap (the tuning
		// and the cores a process sees need not be equal on every rank).
		workers := max(1, min(6, 14/size))
		if v, ok := c.settings[allreduce.SettingReduceWorkers]; ok {
			if workers, err = strconv.Atoi(v); err != nil || workers < 1 {
				return fmt.Errorf("setting %s=%q: want a thread count: %w", allreduce.SettingReduceWorkers, v, comm.ErrInvalid)
			}
		}
		choice, err := m.Choose(allreduce.Workload{Coll: allreduce.AllReduce, Groups: groups, Bytes: 256 << 20,
			ReduceThreads: size * workers, HostBackend: c.backend == BackendHost}, allreduce.ShmCandidates(groups))
		if err != nil {
			return fmt.Errorf("choosing the all-reduce algorithm: %w", err)
		}
		g.alg = choice.Algorithm
	}
	return nil
}

// peerGroups groups ranks by the physical GPU they use (MIG instances of
// one GPU share its link).
func peerGroups(peers []rendezvous.Peer, size int) (allreduce.Grouping, error) {
	keys := make([]string, size)
	for i, p := range peers {
		r := peerRank(p, i, size)
		keys[r] = p.ParentGPUUUID
		if keys[r] == "" {
			keys[r] = p.GPUUUID
		}
		keys[r] = p.Host + "/" + keys[r]
	}
	return allreduce.GroupByKey(keys)
}

// shmRootHint adds to err, a failure to register the job's shared segment
// with the GPU, the likely cause when the segments' directory is not memory:
// Linux does not let the driver pin pages of a disk file system.
func shmRootHint(root string, err error) error {
	if root == "" {
		root = shm.DefaultRoot
	}
	fs, ferr := shm.FSOf(root)
	if ferr != nil || fs.Memory {
		return err
	}
	return fmt.Errorf("%w (the shared-memory directory %s is on %s, whose pages the GPU driver cannot pin: "+
		"use a tmpfs such as /dev/shm: %s, or migctl run --shm-dir)", err, root, fs.Name, EnvShmRoot)
}

// connect maps the job's shared segment and builds the executor.
func (g *Group) connect(ctx context.Context) error {
	c := g.cfg
	t := c.tuning
	opts := allreduce.Options{Chunk: t.Chunk, Slots: t.Slots, Depth: t.Depth, ReduceWorkers: t.ReduceWorkers,
		EventSpin: t.Spin, SmallSpin: t.Spin, SmallBytes: t.SmallBytes, SmallOnDevice: t.SmallOnDevice, WholeChunks: t.WholeChunks,
		// Only where the caller is readied early (Group.CompletesEarly).
		QueueCopiesBack: t.QueueCopiesBack && t.CompleteOnDevice,
		// Not on the IPC transport, whose broadcasts are never queued (ordersStreams):
		// the flag words would be registered with the device for nothing.
		BroadcastOnDevice: !t.BroadcastOnCPU && !g.link && g.cfg.backend == BackendGPU && g.transport != TransportIPC}
	if t.SmallBytes == 0 {
		opts.SmallBytes = allreduce.DefaultSmallBytes
	}
	if c.trace != nil && (g.rank == 0 || c.traceAll) {
		opts.Trace = c.trace
	}
	rank, size, _, _, kv := g.intra() // the node's ranks share the segment
	var chunk, slots int              // chosen by rank 0 as it creates the segment (geometry.go)
	layout := func(capacity, free int64) shm.Layout {
		chunk, slots = g.arenaGeometry(size, capacity, free)
		return shm.Layout{World: size, Flags: size * allreduce.FlagsPerRank, DataBytes: allreduce.ArenaBytes(size, chunk, slots)}
	}
	job := c.job
	if job == "" {
		job = "trainer"
	}
	if g.node != nil {
		job = fmt.Sprintf("%s-node%d", job, g.node.node)
	}
	var err error
	if g.job, err = comm.JoinShmSized(ctx, kv, rank, job, c.shmRoot, g.arenaNode(), layout); err != nil {
		return err
	}
	if chunk, slots, err = g.agreeOnGeometry(ctx, rank, size, kv, chunk, slots); err != nil {
		return err
	}
	opts.Chunk, opts.Slots = chunk, slots
	if g.tr, err = comm.NewShmTransport(g.job.Control, rank, comm.ShmOptions{Spin: t.Spin}); err != nil {
		return err
	}
	if err := g.setSmallH2D(); err != nil {
		return err
	}
	if g.exec, err = allreduce.NewExecutor(g.dev, g.tr, opts); err != nil {
		if g.cfg.backend == BackendGPU {
			err = shmRootHint(c.shmRoot, err)
		}
		return err
	}
	cm := allreduce.NewCommunicator(g.exec, g.alg)
	if err := cm.SetGroups(g.groups); err != nil {
		return err
	}
	// A link's sends are broadcasts: each waits for the receiver to have
	// finished the one before, so that a refused receive fails the next send.
	cm.SetBroadcastPairs(!g.link)
	g.cm = cm
	if g.stream, err = g.dev.NewStream(); err != nil {
		return err
	}
	if err := g.setReduceOn(g.cm); err != nil { // where host-staged all-reduces reduce (reduce_on.go)
		return err
	}
	if g.node != nil {
		return g.connectNodes(ctx, cm)
	}
	return nil
}

// setSmallH2D sets the CUDA device's small-copy mode, unless MIGCTL_H2D
// chose it, from how many of the node's ranks use this rank's CUDA device
// (comm.SmallH2DFor; a MIG instance is a device of its own).
func (g *Group) setSmallH2D() error {
	d, ok := g.dev.(*comm.CUDADevice)
	if !ok || g.h2dFixed || g.cfg.dev != nil { // a device given to Init keeps its configuration
		return nil
	}
	rank, size, peers, _, _ := g.intra()
	ranks, mine := map[string]int{}, ""
	for i, p := range peers {
		key := p.Host + "/" + p.GPUUUID
		ranks[key]++
		if peerRank(p, i, size) == rank {
			mine = key
		}
	}
	return d.SetSmallH2D(comm.SmallH2DFor(ranks[mine], mpsClient()))
}

// peerRank is the rank of peers[i] among size ranks: its own, or its place
// in the list where it has none.
func peerRank(p rendezvous.Peer, i, size int) int {
	if p.Rank < 0 || p.Rank >= size {
		return i
	}
	return p.Rank
}

// mpsClient is whether this process's CUDA work goes through an MPS server:
// CUDA_MPS_PIPE_DIRECTORY is set (migctl run, migctl bench and the swap
// daemon set it for the MPS servers they start), or a node-wide MPS control
// daemon has its pipe where clients look without it.
func mpsClient() bool {
	if os.Getenv(mps.EnvPipeDir) != "" {
		return true
	}
	_, err := os.Stat(filepath.Join(mps.SystemPipeDir, mps.ControlPipe))
	return err == nil
}

// SmallH2D is how the group's device queues small host-to-device copies
// (comm.H2DMode; "" for the host backend).
func (g *Group) SmallH2D() string {
	if d, ok := g.dev.(*comm.CUDADevice); ok {
		return string(d.SmallH2D())
	}
	return ""
}

// Rank is this process's rank in [0, Size).
func (g *Group) Rank() int { return g.rank }

// Size is the number of ranks.
func (g *Group) Size() int { return g.size }

// LocalRank is the rank among the ranks of this node.
func (g *Group) LocalRank() int { return g.localRank }

// LocalSize is the number of ranks on this node.
func (g *Group) LocalSize() int { return g.localSize }

// NodeRank is this node's index among the job's nodes (GROUP_RANK; in a
// group across hosts, the index of this host in the order of its lowest
// rank, which is GROUP_RANK under `migctl run`).
func (g *Group) NodeRank() int { return g.cfg.nodeRank }

// NumNodes is the number of nodes (GROUP_WORLD_SIZE; in a group across
// hosts, the number of hosts).
func (g *Group) NumNodes() int { return g.cfg.numNodes }

// Generation is the restart generation (0 on the first run).
func (g *Group) Generation() int { return g.cfg.generation }

// Backend is where this rank's buffers live.
func (g *Group) Backend() Backend { return g.cfg.backend }

// Transport is the transport in use.
func (g *Group) Transport() Transport { return g.transport }

// Algorithm names the all-reduce algorithm ("ring", "hoststaged",
// "hierarchical", "ring-ipc").
func (g *Group) Algorithm() string { return g.alg.String() }

// Timeout is every collective's deadline.
func (g *Group) Timeout() time.Duration { return time.Duration(g.timeout.Load()) }

// SetTimeout sets every collective's deadline (WithTimeout, MIGCTL_TIMEOUT
// at Init) for the collectives issued from now on; d must be positive. Each
// rank sets its own: a collective fails on every rank once the first
// rank's deadline for it passes.
func (g *Group) SetTimeout(d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("collective timeout %v: must be positive: %w", d, comm.ErrInvalid)
	}
	g.timeout.Store(int64(d))
	return nil
}

// Peers are every rank's rendezvous records, by rank.
func (g *Group) Peers() []rendezvous.Peer { return append([]rendezvous.Peer(nil), g.peers...) }

// Close waits for queued collectives and point-to-point transfers, then
// leaves the group and releases the shared segment, the device and the
// daemon connection. It does not wait for the other ranks. A transfer whose
// peer never comes (a RecvAsync nobody sends to) keeps it until that
// transfer's deadline (Timeout): call Abort first to end such work at once,
// as a rank that gives up on the job does. Safe to call more than once.
func (g *Group) Close() error {
	g.closeOnce.Do(func() {
		g.mu.Lock()
		g.closed = true
		close(g.queue)
		g.mu.Unlock()
		g.closeLinks() // their groups leave g.subs
		g.mu.Lock()
		subs := g.subs
		g.subs = nil
		g.mu.Unlock()
		var errs []error
		for _, s := range subs { // they use this group's device and rendezvous
			errs = append(errs, s.Close())
		}
		<-g.stopped
		g.inlined.Wait() // calls running inline on their callers' goroutines
		g.clock.close()
		if g.clock2 != nil {
			g.clock2.close()
		}
		g.closeErr = errors.Join(append(errs, g.release())...)
		if p := g.parent; p != nil { // a group of some ranks leaves its parent's list
			p.mu.Lock()
			p.subs = slices.DeleteFunc(p.subs, func(s *Group) bool { return s == g })
			p.mu.Unlock()
		}
	})
	return g.closeErr
}

// release frees what Init acquired, in reverse order.
func (g *Group) release() error {
	var errs []error
	if g.daemon != nil {
		errs = append(errs, g.daemon.Close())
	}
	if g.swap != nil {
		errs = append(errs, g.swap.Close())
	}
	g.freeIPC()
	errs = append(errs, g.node.close())
	if g.stream != nil {
		errs = append(errs, g.stream.Close())
	}
	if g.exec != nil {
		errs = append(errs, g.exec.Close())
	}
	if g.tr != nil {
		errs = append(errs, g.tr.Close())
	}
	if g.job != nil {
		errs = append(errs, g.job.Close())
	}
	if g.closeKV != nil {
		errs = append(errs, g.closeKV())
	}
	if g.dev != nil && g.cfg.dev == nil {
		errs = append(errs, g.dev.Close())
	}
	return errors.Join(errs...)
}

// Abort fails the group's collectives on every rank (the running ones and
// all later ones) with reason: a rank that cannot go on releases the others
// at once instead of at their deadline. The groups formed from it
// (NewGroup) fail too, and the job's rendezvous is aborted (every group of
// the job). It does nothing after Close.
func (g *Group) Abort(reason string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return
	}
	if g.tr != nil {
		g.tr.Abort()
	}
	g.node.abort()
	if g.kv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = g.kv.Abort(ctx, fmt.Sprintf("rank %d: %s", g.rank, reason))
	}
	for _, s := range g.subs { // the groups formed from this one fail with it
		s.Abort(reason)
	}
}

// Store is a small key-value store shared by the group's ranks (the
// rendezvous'). Keys are written once; Get blocks until the key exists;
// Barrier returns once every rank has entered the barrier of that name.
type Store interface {
	Put(ctx context.Context, key string, value []byte) error
	Get(ctx context.Context, key string) ([]byte, error)
	Barrier(ctx context.Context, name string) error
}

// StorePrefix is put before every key and barrier name of Store at the
// rendezvous, so they do not collide with the ones migctl uses itself (a
// launcher that waits for a barrier of its ranks names it with the prefix).
const StorePrefix = "user/"

// Store returns the group's key-value store.
func (g *Group) Store() Store { return prefixStore{kv: g.kv, prefix: StorePrefix} }

type prefixStore struct {
	kv     comm.KV
	prefix string
}

func (s prefixStore) Put(ctx context.Context, k string, v []byte) error {
	return s.kv.Put(ctx, s.prefix+k, v)
}
func (s prefixStore) Get(ctx context.Context, k string) ([]byte, error) {
	return s.kv.Get(ctx, s.prefix+k)
}
func (s prefixStore) Barrier(ctx context.Context, name string) error {
	return s.kv.Barrier(ctx, s.prefix+name)
}
