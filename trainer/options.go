package trainer

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/migctl/migctl/allreduce"
	"github.com/migctl/migctl/comm"
	"github.com/migctl/migctl/internal/cuda"
)

// The environment a launcher gives every worker (torchrun's names where
// torchrun has one).
const (
	EnvRank           = "RANK"
	EnvWorldSize      = "WORLD_SIZE"
	EnvLocalRank      = "LOCAL_RANK"
	EnvLocalWorldSize = "LOCAL_WORLD_SIZE"
	EnvGroupRank      = "GROUP_RANK"
	EnvGroupWorldSize = "GROUP_WORLD_SIZE"
	EnvRestartCount   = "TORCHELASTIC_RESTART_COUNT"

	// EnvRendezvous is the rendezvous address: "unix:///abs/path.sock" or
	// "host:port".
	EnvRendezvous = "MIGCTL_RDZV_ADDR"
	// EnvToken is the job token (environment only, never a command line).
	EnvToken = "MIGCTL_JOB_TOKEN"
	// EnvJob is the job's name.
	EnvJob = "MIGCTL_JOB"
	// EnvGeneration is the restart generation (as TORCHELASTIC_RESTART_COUNT).
	EnvGeneration = "MIGCTL_GENERATION"
	// EnvBackend is "gpu" or "host".
	EnvBackend = "MIGCTL_BACKEND"
	// EnvDevice is the CUDA ordinal the rank uses (default 0; under MIG
	// every rank sees its instance as device 0).
	EnvDevice = "MIGCTL_DEVICE"
	// EnvTimeout is the collective deadline (a Go duration, default 5m).
	EnvTimeout = "MIGCTL_TIMEOUT"
	// EnvSocket is the node daemon's control socket.
	EnvSocket = "MIGCTL_SOCKET"
	// EnvShmRoot is where shared-memory segments live (default /dev/shm).
	EnvShmRoot = "MIGCTL_SHM_ROOT"
	// EnvCUDAFake, set to 1, runs the gpu backend on the fake driver
	// (internal/cuda.Fake: host memory, CPU kernels with the GPU kernels'
	// ABI): the whole GPU code path without a GPU.
	EnvCUDAFake = "MIGCTL_CUDA_FAKE"
	// EnvSmallH2D picks how small host-to-device copies are queued
	// (comm.H2DMode: plain, 2d, 2drows, dtod, pad).
	EnvSmallH2D = "MIGCTL_H2D"
	// EnvReduceStage is which of the device's reductions of host memory
	// copy their sources (256 KiB and more) into device memory first with
	// the copy engines instead of reading them over the link from the
	// kernel (comm.CUDAConfig.StageReduce): unset, the ring's (the
	// schedules that ask); "1" all of them; "0" none.
	EnvReduceStage = "MIGCTL_REDUCE_STAGE"
	// EnvTrace: "1" makes rank 0 print per-step timings at Close, "all"
	// every rank.
	EnvTrace = "MIGCTL_TRACE"
	// EnvReduceOn is where host-staged all-reduces reduce: cpu, gpu,
	// split[:F] or auto (WithReduceOn; a job setting every rank must share).
	EnvReduceOn = "MIGCTL_REDUCE_ON"
	// EnvMachine carries the figures of this node that the launcher read
	// from `migctl bench limits`' cache (allreduce.Machine: link, host
	// memory, CPU reduction, ...), as MachineEnv writes them: the choice of
	// the all-reduce algorithm uses them over hw/H200.md's. Every rank
	// must see the same (the rendezvous compares them).
	EnvMachine = "MIGCTL_MACHINE"

	// The swap shim's variables, read for gang preemption of host-backend
	// ranks.
	EnvSwapSocket   = "MIGSWAP_SOCKET"
	EnvSwapJob      = "MIGSWAP_JOB"
	EnvSwapPriority = "MIGSWAP_PRIORITY"
)

// DefaultTimeout is the collective deadline unless WithTimeout or
// MIGCTL_TIMEOUT says otherwise.
const DefaultTimeout = 5 * time.Minute

// Backend is where a rank's buffers live.
type Backend string

// Backends.
const (
	// BackendAuto: gpu when the CUDA driver loads and shows a device, else
	// host.
	BackendAuto Backend = ""
	// BackendGPU: CUDA device memory, copies by the copy engines,
	// reductions by kernels.
	BackendGPU Backend = "gpu"
	// BackendHost: plain host memory and CPU reductions (no GPU needed).
	BackendHost Backend = "host"
)

// Transport is how ranks exchange data.
type Transport string

// Transports.
const (
	TransportAuto Transport = "auto"
	// TransportShm: shared host memory (what MIG instances need).
	TransportShm Transport = "shm"
	// TransportIPC: CUDA IPC between non-MIG GPUs of one host (all-reduce;
	// the other collectives go through shared memory).
	TransportIPC Transport = "ipc"
)

// Algorithm is the all-reduce schedule over the shm transport.
type Algorithm string

// Algorithms.
const (
	AlgorithmAuto       Algorithm = "auto"
	AlgorithmRing       Algorithm = "ring"
	AlgorithmHostStaged Algorithm = "hoststaged"
	// AlgorithmHierarchical: several ranks on each of several GPUs (MIG
	// instances of several GPUs) reduce per GPU on the device, then across
	// GPUs on the CPU (package allreduce, Hierarchical).
	AlgorithmHierarchical Algorithm = "hierarchical"
)

// Tuning are the executor's knobs; zero fields take the defaults of package
// allreduce. Chunk, Slots and SmallBytes must be equal on every rank.
type Tuning struct {
	// Chunk is the arena slot size in bytes (default 2 MiB).
	Chunk int
	// Slots per rank: the pipeline depth (default 4).
	Slots int
	// Depth bounds the asynchronous copies a lane keeps in flight (default 2).
	Depth int
	// ReduceWorkers bounds the goroutines one host reduction uses.
	ReduceWorkers int
	// Spin is how long waits poll before they sleep.
	Spin time.Duration
	// SmallBytes is the largest all-reduce that takes the small-message
	// schedule (0: the default, 64 KiB; negative: never).
	SmallBytes int
	// SmallOnDevice reduces small-message all-reduces on the devices: each
	// rank's stream waits for the peers' staged inputs and reduces them
	// from mapped host memory, with no CPU step between (allreduce.Options).
	// Off by default. Every rank must set the same (the rendezvous compares
	// it): the device adds the inputs in another association than the CPU,
	// so floating-point results may differ in the last bit between the two.
	SmallOnDevice bool
	// RecvDirect makes a Recv into device memory whose stream was busy at
	// the call wait for that work before it receives anything, straight
	// into the buffer. By default the message is received into scratch
	// device memory meanwhile and copied in once that work has finished,
	// so the transfer overlaps the receiver's kernels (a pipeline stage
	// receives the next micro-batch while it computes this one). A local
	// choice: ranks may differ.
	RecvDirect bool
	// BroadcastOnCPU keeps every broadcast's flags on the CPU. By default a
	// synchronous broadcast of at most one chunk on device memory of one
	// stream (the C ABI's migctl_run: torch's broadcasts, DDP's buffers)
	// is queued whole on the device — the root's stream raises the staged
	// flag, the peers' streams wait for it — and returns once queued, the
	// caller's stream ordered after it, where the device can wait for
	// flags (allreduce.Options.BroadcastOnDevice). A local choice: ranks
	// may differ.
	BroadcastOnCPU bool
	// NoChain runs every asynchronous collective to its end before the next
	// one starts. By default a host-staged all-reduce issued asynchronously
	// on buffers of the device (DDP's gradient buckets) lets the next
	// all-reduce start once its copies out are done, so that the next one's
	// copies out (device to host) run while its copies back (host to
	// device) do (allreduce.WithAdmit). A local choice: ranks may differ.
	NoChain bool
	// WholeChunks makes every host-staged all-reduce move whole chunks. By
	// default one of at most slots/4 chunks (4 MiB at 7 ranks) moves
	// quarter chunks, so that its copies out, reductions and copies back
	// overlap (allreduce.PieceFor). Like Chunk, the same on every rank.
	WholeChunks bool
	// CompleteOnDevice lets a chained all-reduce (see NoChain) on a group
	// that orders streams hand its caller an event once its result is
	// determined and its last copies back are queued (Work.OnReady,
	// allreduce.WithReady), so that the caller's stream can wait for those
	// copies on the device while its CPU goes on (the C ABI's
	// migctl_wait_stream: DDP's last bucket), as NCCL's callers do. Off by
	// default until measured on a GPU (docs/collectives.md, "Completion of
	// collectives on device buffers"): a caller learns that an all-reduce is
	// done once its copies back have completed. A local choice: ranks may
	// differ.
	CompleteOnDevice bool
	// QueueCopiesBack, with CompleteOnDevice, readies a chained all-reduce
	// earlier still: once this rank's copies out are all queued, its copies
	// back are queued too, each behind device-side waits for its chunk's
	// reduced flags (allreduce.Options.QueueCopiesBack), so that a call
	// whose chunks fit the slots (DDP's last bucket) readies at its issue.
	// Off by default until measured on a GPU. A local choice.
	QueueCopiesBack bool
}

// Option configures Init.
type Option func(*config) error

type config struct {
	rank, size           int
	localRank, localSize int
	nodeRank, numNodes   int
	addr, token, job     string
	generation           int
	backend              Backend
	device               int
	timeout              time.Duration
	transport            Transport
	algorithm            Algorithm
	tuning               Tuning
	trace                io.Writer
	traceAll             bool
	shmRoot              string
	settings             map[string]string
	socket               string
	swapSocket, swapJob  string
	swapPriority         int

	api  cuda.Interface // tests: a fake driver
	dev  comm.Device    // tests: an injected device
	host string         // tests: the host name reported at the rendezvous
	nccl ncclConfig     // tests: the fake NCCL, or a failing Open (multinode_nccl.go)
}

// WithRendezvous sets the rendezvous address and job token (instead of
// MIGCTL_RDZV_ADDR and MIGCTL_JOB_TOKEN).
func WithRendezvous(addr, token string) Option {
	return func(c *config) error {
		if addr == "" {
			return errors.New("WithRendezvous: empty address")
		}
		c.addr, c.token = addr, token
		return nil
	}
}

// WithRank sets this process's rank and the world size (instead of RANK and
// WORLD_SIZE). rank -1 takes the next free rank at the rendezvous.
func WithRank(rank, size int) Option {
	return func(c *config) error {
		if size < 1 || rank < -1 || rank >= size {
			return fmt.Errorf("WithRank(%d, %d): need -1 <= rank < size and size >= 1: %w", rank, size, comm.ErrInvalid)
		}
		c.rank, c.size = rank, size
		return nil
	}
}

// WithJob names the job (shared-memory names, gang preemption).
func WithJob(name string) Option {
	return func(c *config) error { c.job = name; return nil }
}

// WithBackend picks where buffers live.
func WithBackend(b Backend) Option {
	return func(c *config) error {
		switch b {
		case BackendAuto, BackendGPU, BackendHost:
			c.backend = b
			return nil
		}
		return fmt.Errorf("backend %q: want gpu or host: %w", b, comm.ErrInvalid)
	}
}

// WithDevice picks the CUDA ordinal (gpu backend).
func WithDevice(ordinal int) Option {
	return func(c *config) error {
		if ordinal < 0 {
			return fmt.Errorf("device %d: %w", ordinal, comm.ErrInvalid)
		}
		c.device = ordinal
		return nil
	}
}

// WithTimeout sets the deadline of every collective (time held by a swap
// does not count).
func WithTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("timeout %v: must be positive: %w", d, comm.ErrInvalid)
		}
		c.timeout = d
		return nil
	}
}

// WithTransport forces a transport.
func WithTransport(t Transport) Option {
	return func(c *config) error {
		switch t {
		case TransportAuto, TransportShm, TransportIPC:
			c.transport = t
			return nil
		}
		return fmt.Errorf("transport %q: want auto, shm or ipc: %w", t, comm.ErrInvalid)
	}
}

// WithAlgorithm forces the all-reduce algorithm of the shm transport.
func WithAlgorithm(a Algorithm) Option {
	return func(c *config) error {
		switch a {
		case AlgorithmAuto, AlgorithmRing, AlgorithmHostStaged, AlgorithmHierarchical:
			c.algorithm = a
			return nil
		}
		return fmt.Errorf("algorithm %q: want auto, ring, hoststaged or hierarchical: %w", a, comm.ErrInvalid)
	}
}

// WithTuning sets the executor's knobs.
func WithTuning(t Tuning) Option {
	return func(c *config) error {
		if t.Chunk < 0 || t.Slots < 0 || t.Depth < 0 || t.ReduceWorkers < 0 || t.Spin < 0 {
			return fmt.Errorf("tuning %+v: negative value: %w", t, comm.ErrInvalid)
		}
		if t.Chunk%64 != 0 { // the executor refuses every all-reduce otherwise
			return fmt.Errorf("tuning chunk of %d bytes: want a multiple of 64: %w", t.Chunk, comm.ErrInvalid)
		}
		c.tuning = t
		return nil
	}
}

// WithTrace makes the executor write per-step timings to w at Close (rank 0
// only unless allRanks).
func WithTrace(w io.Writer, allRanks bool) Option {
	return func(c *config) error { c.trace, c.traceAll = w, allRanks; return nil }
}

// WithShmRoot puts the shared-memory segment in dir instead of /dev/shm.
func WithShmRoot(dir string) Option {
	return func(c *config) error { c.shmRoot = dir; return nil }
}

// WithSettings adds values every rank must agree on (compared at the
// rendezvous; a difference fails every rank, naming it).
func WithSettings(kv map[string]string) Option {
	return func(c *config) error {
		for k, v := range kv {
			c.settings["user."+k] = v
		}
		return nil
	}
}

// WithMachine makes the choice of the all-reduce algorithm use m's figures
// (what `migctl bench limits` measured on this node) instead of
// hw/H200.md's. Every rank must pass the same (the rendezvous compares
// them).
func WithMachine(m allreduce.Machine) Option {
	return func(c *config) error {
		for k, v := range m.Settings() {
			c.settings[k] = v
		}
		return nil
	}
}

// MachineEnv is the EnvMachine entry of the environment for m, for a
// launcher to hand its ranks ("MIGCTL_MACHINE=key=value,...", sorted).
func MachineEnv(m allreduce.Machine) string {
	kv := m.Settings()
	keys := slices.Sorted(maps.Keys(kv))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + kv[k]
	}
	return EnvMachine + "=" + strings.Join(parts, ",")
}

// parseMachine reads an EnvMachine value: the allreduce.Setting* keys of
// machine figures with their values, each checked.
func parseMachine(v string) (map[string]string, error) {
	known := allreduce.Machine{}.Settings()
	kv := map[string]string{}
	for _, part := range strings.Split(v, ",") {
		k, val, ok := strings.Cut(strings.TrimSpace(part), "=")
		if _, isKey := known[k]; !ok || !isKey {
			return nil, fmt.Errorf("%q: want key=value pairs of %s: %w", part,
				strings.Join(slices.Sorted(maps.Keys(known)), ", "), comm.ErrInvalid)
		}
		kv[k] = val
	}
	if _, err := allreduce.MachineFromSettings(allreduce.Machine{}, kv); err != nil {
		return nil, fmt.Errorf("%w: %w", err, comm.ErrInvalid)
	}
	return kv, nil
}

// withCUDA runs the gpu backend on api (tests: a fake driver).
func withCUDA(api cuda.Interface) Option {
	return func(c *config) error { c.api = api; return nil }
}

// withHost reports host as this rank's host name (tests of multi-host groups).
func withHost(host string) Option {
	return func(c *config) error { c.host = host; return nil }
}

// withDevice injects the rank's device (tests).
func withDevice(d comm.Device) Option {
	return func(c *config) error { c.dev = d; return nil }
}

// fromEnv fills c from the environment; options applied later override it.
func fromEnv(c *config, getenv func(string) string) error {
	c.rank, c.size = 0, 1
	c.device = 0
	c.timeout = DefaultTimeout
	c.transport, c.algorithm = TransportAuto, AlgorithmAuto
	c.settings = map[string]string{}
	c.nodeRank, c.numNodes = 0, 1
	c.localRank, c.localSize = -1, -1
	ints := []struct {
		key string
		dst *int
		min int
	}{
		{EnvRank, &c.rank, 0}, {EnvWorldSize, &c.size, 1}, {EnvLocalRank, &c.localRank, 0},
		{EnvLocalWorldSize, &c.localSize, 1}, {EnvGroupRank, &c.nodeRank, 0}, {EnvGroupWorldSize, &c.numNodes, 1},
		{EnvGeneration, &c.generation, 0}, {EnvDevice, &c.device, 0},
	}
	for _, e := range ints {
		v := getenv(e.key)
		if v == "" {
			continue
		}
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < e.min {
			return fmt.Errorf("%s=%q: want an integer >= %d: %w", e.key, v, e.min, comm.ErrInvalid)
		}
		*e.dst = n
	}
	if getenv(EnvGeneration) == "" {
		if v := getenv(EnvRestartCount); v != "" {
			if n, err := strconv.Atoi(v); err == nil && n >= 0 {
				c.generation = n
			}
		}
	}
	if c.rank >= c.size {
		return fmt.Errorf("%s=%d is not below %s=%d: %w", EnvRank, c.rank, EnvWorldSize, c.size, comm.ErrInvalid)
	}
	c.addr, c.token, c.job = getenv(EnvRendezvous), getenv(EnvToken), getenv(EnvJob)
	switch b := Backend(getenv(EnvBackend)); b {
	case BackendAuto, BackendGPU, BackendHost:
		c.backend = b
	default:
		return fmt.Errorf("%s=%q: want gpu or host: %w", EnvBackend, b, comm.ErrInvalid)
	}
	if v := getenv(EnvTimeout); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return fmt.Errorf("%s=%q: want a positive Go duration such as 5m: %w", EnvTimeout, v, comm.ErrInvalid)
		}
		c.timeout = d
	}
	if v := getenv(EnvTrace); v != "" && v != "0" {
		c.trace, c.traceAll = os.Stderr, v == "all"
	}
	if v := getenv(EnvMachine); v != "" {
		kv, err := parseMachine(v)
		if err != nil {
			return fmt.Errorf("%s: %w", EnvMachine, err)
		}
		for k, x := range kv {
			c.settings[k] = x
		}
	}
	if v := getenv(EnvReduceOn); v != "" {
		if err := WithReduceOn(v)(c); err != nil {
			return fmt.Errorf("%s=%q: %w", EnvReduceOn, v, err)
		}
	}
	if v := getenv(EnvTuning); v != "" {
		t, err := ParseTuning(v)
		if err != nil {
			return fmt.Errorf("%s: %w", EnvTuning, err)
		}
		c.tuning = t
	}
	c.shmRoot = getenv(EnvShmRoot)
	c.socket = getenv(EnvSocket)
	c.swapSocket, c.swapJob = getenv(EnvSwapSocket), getenv(EnvSwapJob)
	if v := getenv(EnvSwapPriority); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return fmt.Errorf("%s=%q: want an integer: %w", EnvSwapPriority, v, comm.ErrInvalid)
		}
		c.swapPriority = n
	}
	return nil
}
