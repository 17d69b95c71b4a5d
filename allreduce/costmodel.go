package allreduce

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"
)

// Machine is what bounds a collective on one host: the host↔device link of
// every GPU, the CPU threads that reduce in host memory, NVLink between
// GPUs, and the latency of a small copy out and back. Zero fields are not
// limits (a host-backend run has no link).
type Machine struct {
	// LinkGiBs is one GPU's pinned host↔device copy bandwidth, each way.
	LinkGiBs float64 `json:"linkGiBs" yaml:"linkGiBs"`
	// DuplexGiBs is the same link with copies both ways at once, the two
	// directions together (0: 2·LinkGiBs).
	DuplexGiBs float64 `json:"duplexGiBs" yaml:"duplexGiBs"`
	// ReduceThreadGiBs is one CPU thread's reduction rate, in GiB/s of
	// input read; ReduceHostGiBs what all threads together reach (0: no
	// cap beyond threads × ReduceThreadGiBs).
	ReduceThreadGiBs float64 `json:"reduceThreadGiBs" yaml:"reduceThreadGiBs"`
	ReduceHostGiBs   float64 `json:"reduceHostGiBs" yaml:"reduceHostGiBs"`
	// P2PGiBs is a GPU-to-GPU copy (NVLink) for the IPC ring (0: none).
	P2PGiBs float64 `json:"p2pGiBs" yaml:"p2pGiBs"`
	// DeviceReadGiBs is what one GPU's kernels read together from mapped
	// host memory over its link (the device part of a split host-staged
	// all-reduce: ReduceIn over the peers' staged copies); a byte read so
	// costs the link LinkGiBs/DeviceReadGiBs bytes of copy (0: as a copy).
	DeviceReadGiBs float64 `json:"deviceReadGiBs" yaml:"deviceReadGiBs"`
	// RoundTrip is a small copy out and back in on a pinned buffer: the
	// floor of any collective through host memory.
	RoundTrip time.Duration `json:"roundTripNs" yaml:"roundTripNs"`
	// HostMemGiBs is what host memory moves in all, bytes read plus bytes
	// written, while copy engines and CPU threads use it at once: the
	// ranks' DMA into and out of the staging arena and the CPU
	// reductions' reads and writes (limits.GPU.HostMemUnderDMAGiBs). It
	// bounds the algorithms that stage through host memory on a device
	// backend (Estimate.HostMem; 0: unknown, no cap).
	HostMemGiBs float64 `json:"hostMemGiBs,omitempty" yaml:"hostMemGiBs,omitempty"`
}

// GiB is 2^30 bytes.
const GiB = 1 << 30

// H200 is the machine of /work/shared/hw/H200.md (measured 2026-11-29):
// pinned H2D/D2H 51.5 GiB/s each way, ~97 GB/s both at once, NVLink P2P
// 364 GiB/s, a 8-KiB round trip of 23 µs with 7 processes on the GPU. The
// per-thread reduction rate is what the migctl rows of issue 9 imply where
// the host binds (8 ranks × 1 reduce worker: ~33 GiB/s of input; 4 × 3:
// ~52 GiB/s): about 4.1 GiB/s per thread; no cap was measured.
//
// DeviceReadGiBs is from the --reduce-on gpu rows of 2026-12-01 14:48 UTC
// (docs/results/collectives-h200.md): 7 ranks on one H200, 256 MiB,
// 102.94 ms; at the host-staged Efficiency (0.9) its floor is 92.6 ms, of
// which the 6·S of copies into the GPU take 29.1 ms at 51.5 GiB/s, leaving
// 63.5 ms for the 6·S = 1.5 GiB the 7 kernels read: about 24 GiB/s, half
// the copy engines' rate. (The 2-rank row, 24.72 ms, then sits at 62% of
// its floor: two kernels read slower than seven; the figure is the best
// the link gave, so the floor stays a floor.)
//
// HostMemGiBs is 0 (no cap): host memory under concurrent DMA was not
// measured on the H200 machine yet (`migctl bench limits` measures it).
func H200() Machine {
	return Machine{LinkGiBs: 51.5, DuplexGiBs: 97e9 / GiB, ReduceThreadGiBs: 4.1, P2PGiBs: 364,
		DeviceReadGiBs: 24, RoundTrip: 23 * time.Microsecond}
}

// DefaultReduceWorkers is Options.ReduceWorkers' default for a world on a
// host of cpus cores: about 14/world, at most 6 and at most half the cores.
func DefaultReduceWorkers(world, cpus int) int { return max(1, min(6, cpus/2, 14/max(world, 1))) }

// HostReduceGiBs is the rate of threads reducing at once.
func (m Machine) HostReduceGiBs(threads int) float64 {
	r := float64(max(threads, 1)) * m.ReduceThreadGiBs
	if m.ReduceHostGiBs > 0 {
		r = math.Min(r, m.ReduceHostGiBs)
	}
	return r
}

// Settings keys under which a Machine travels between ranks (every rank of
// a job must choose the same algorithm: the rendezvous makes every rank's
// settings equal).
const (
	SettingLinkGiBs       = "allreduce.link_gibs"
	SettingDuplexGiBs     = "allreduce.duplex_gibs"
	SettingThreadGiBs     = "allreduce.reduce_thread_gibs"
	SettingHostGiBs       = "allreduce.reduce_host_gibs"
	SettingP2PGiBs        = "allreduce.p2p_gibs"
	SettingDeviceReadGiBs = "allreduce.device_read_gibs"
	SettingRoundTripUS    = "allreduce.roundtrip_us"
	SettingHostMemGiBs    = "allreduce.host_mem_gibs"
	// SettingReduceWorkers is the reduce threads per rank the choice
	// assumes (Options.ReduceWorkers; not part of Machine).
	SettingReduceWorkers = "allreduce.reduce_workers"
	// SettingReduceOn is where host-staged all-reduces reduce (ReduceOn,
	// ParseReduceOn: auto, cpu, gpu, split, split:F).
	SettingReduceOn     = "allreduce.reduce_on"
	settingsFloatFormat = 'g'
)

// Settings encodes m for rendezvous settings.
func (m Machine) Settings() map[string]string {
	f := func(x float64) string { return strconv.FormatFloat(x, settingsFloatFormat, 6, 64) }
	return map[string]string{
		SettingLinkGiBs: f(m.LinkGiBs), SettingDuplexGiBs: f(m.DuplexGiBs), SettingThreadGiBs: f(m.ReduceThreadGiBs),
		SettingHostGiBs: f(m.ReduceHostGiBs), SettingP2PGiBs: f(m.P2PGiBs), SettingDeviceReadGiBs: f(m.DeviceReadGiBs),
		SettingRoundTripUS: f(float64(m.RoundTrip) / float64(time.Microsecond)), SettingHostMemGiBs: f(m.HostMemGiBs),
	}
}

// MachineFromSettings overrides base with the figures present in settings.
func MachineFromSettings(base Machine, settings map[string]string) (Machine, error) {
	m := base
	for key, dst := range map[string]*float64{SettingLinkGiBs: &m.LinkGiBs, SettingDuplexGiBs: &m.DuplexGiBs,
		SettingThreadGiBs: &m.ReduceThreadGiBs, SettingHostGiBs: &m.ReduceHostGiBs, SettingP2PGiBs: &m.P2PGiBs,
		SettingDeviceReadGiBs: &m.DeviceReadGiBs, SettingHostMemGiBs: &m.HostMemGiBs} {
		if v, ok := settings[key]; ok {
			x, err := strconv.ParseFloat(v, 64)
			if err != nil || x < 0 || math.IsInf(x, 0) || math.IsNaN(x) {
				return base, fmt.Errorf("setting %s=%q: want a bandwidth in GiB/s: %w", key, v, ErrUnsupported)
			}
			*dst = x
		}
	}
	if v, ok := settings[SettingRoundTripUS]; ok {
		x, err := strconv.ParseFloat(v, 64)
		if err != nil || x < 0 || math.IsInf(x, 0) || math.IsNaN(x) {
			return base, fmt.Errorf("setting %s=%q: want microseconds: %w", SettingRoundTripUS, v, ErrUnsupported)
		}
		m.RoundTrip = time.Duration(x * float64(time.Microsecond))
	}
	return m, nil
}

// Workload is one collective call as the cost model sees it.
type Workload struct {
	Coll      Coll
	Algorithm Algorithm
	// Groups maps ranks to the GPUs whose links they share (its length is
	// the world size).
	Groups Grouping
	// Bytes as in Params: per rank for all-reduce and broadcast, one
	// rank's block for reduce-scatter and all-gather.
	Bytes int
	// ReduceThreads is how many CPU threads reduce at once, over all ranks
	// (ranks × Options.ReduceWorkers).
	ReduceThreads int
	// HostBackend: buffers in host memory, no link; reductions the
	// device would do run on the CPU too.
	HostBackend bool
	// GPUShare is a HostStaged all-reduce's Params.GPUShare: the
	// thousandths of every chunk the devices reduce.
	GPUShare int
}

// Estimate is the floor of a workload on a machine.
type Estimate struct {
	// Limit is the time the busiest resource needs (plus RoundTrip for
	// the algorithms through host memory): no run can be faster.
	Limit time.Duration
	// Binding names that resource: "link" (one GPU's busiest direction),
	// "duplex" (one GPU's link both ways), "host" (CPU reduction),
	// "hostmem" (host memory, DMA and CPU together: HostMem at
	// Machine.HostMemGiBs), "p2p", "latency" or "" (nothing to move).
	Binding string
	// Predicted is Limit over the fraction of it the algorithm reached in
	// measurements (Efficiency): what Choose compares.
	Predicted time.Duration
	// Per-GPU bytes over the busiest link each way, bytes the CPU reads,
	// bytes over NVLink per rank: what Limit is made of.
	LinkOut, LinkIn, HostRead, P2P float64
	// DeviceRead is the part of LinkIn that the busiest GPU's kernels read
	// from mapped host memory (a split host-staged all-reduce's device
	// part): it costs the link at Machine.DeviceReadGiBs.
	DeviceRead float64
	// HostMem is every byte the schedule moves through host memory, all
	// ranks and GPUs together: copies into the arena (DMA writes), copies
	// and device kernels' reads out of it, and the CPU reductions' reads
	// and writes (each byte counted once; a write-allocate cache may read
	// written lines too). With n ranks of S bytes: host-staged (3n+1)·S
	// (n·S in, n·S read and S written by the CPU, n·S out), with a GPU
	// share f (3n+1−3f)·S; the small one-round schedule (n²+3n)·S (every
	// rank reduces every input into its own area); the shm ring 4(n−1)·S;
	// hierarchical (3n+1)·S with several groups, (3n−2)·S with one;
	// reduce-scatter of S blocks 2n(n+1)·S; all-gather n²·S; broadcast
	// n·S; the IPC ring 0. Charged at
	// Machine.HostMemGiBs on a device backend only (the host backend's
	// copies are CPU copies, not counted).
	HostMem float64
}

// Efficiency is the fraction of its Limit an algorithm reached on the
// H200s (issue 9's table, 256 MiB): host-staged 0.85–0.95 (7 on 1 GPU,
// 4 and 8 on 2), the shm ring 0.5–0.6 (its 2(n−1) dependent steps each
// reduce from mapped host memory), the IPC ring ~0.7. Hierarchical: the
// lower of its two one-GPU rows of 2026-12-01 14:48 UTC (256 MiB, with its
// kernels' reads of host memory at DeviceReadGiBs: 7 ranks 91.7 ms of floor
// in 111.56 ms, 0.82; 2 ranks 15.3 in 26.32, 0.58); not measured on two GPUs.
var Efficiency = map[Algorithm]float64{HostStaged: 0.9, HostStagedSmall: 0.9, Ring: 0.55, RingIPC: 0.7, Hierarchical: 0.58}

// RingOneGPUEfficiency replaces Efficiency[Ring] for ranks that all share
// one GPU (on a device backend), whose ring reductions stage their blocks in
// device memory through the copy engines (Step.Stage): the fraction of its
// duplex floor the shm ring reached on one H200 (2026-12-02, 256 MiB, MPS,
// docs/results/collectives-h200.md): 2 ranks 11.69–11.97 ms of 10.61 (0.89–
// 0.91), 3 ranks 23.37 of 21.21 (0.91), 7 ranks 72.59 of 63.59 (0.88); the
// lowest. Across GPUs the ring keeps Efficiency's 0.55, measured before its
// reductions staged (a staged ring on two GPUs has not been measured).
var RingOneGPUEfficiency = 0.88

// DeviceShareEfficiency replaces Efficiency[HostStaged] for a host-staged
// all-reduce with a GPU share (on a device backend): the fraction of their
// floors the --reduce-on rows of 2026-12-01 reached on one H200 (7 ranks:
// split 0.125 55%, 0.25 61%, 0.5 72%, gpu 90%; 2 ranks: split 0.5 56%,
// gpu 62%), the lowest of them. Any share pays: the fetch of a chunk waits
// for every rank's device part, which waits for every rank's staging, and
// 7 ranks with 1/8 of the reduction on the devices took 74.65 ms where the
// CPU alone took 45.42, far more than the share's bytes explain.
var DeviceShareEfficiency = 0.55

// Estimate computes w's floor on m.
func (m Machine) Estimate(w Workload) (Estimate, error) {
	n := len(w.Groups)
	if n == 0 {
		return Estimate{}, fmt.Errorf("cost of a collective with no ranks: %w", ErrUnsupported)
	}
	sizes := w.Groups.Sizes()
	G := len(sizes)
	S := float64(w.Bytes)
	N := float64(n)
	var e Estimate
	// perRank gives a rank's bytes out and in for a group of k ranks;
	// the busiest GPU is the one with most of them.
	link := func(perRank func(k int) (out, in float64)) {
		for _, k := range sizes {
			o, i := perRank(k)
			e.LinkOut = math.Max(e.LinkOut, float64(k)*o)
			e.LinkIn = math.Max(e.LinkIn, float64(k)*i)
		}
	}
	memory := true // through host memory: RoundTrip is a floor
	switch {
	case w.Coll == Barrier:
	case w.Coll == AllReduce && n == 1:
		link(func(int) (float64, float64) { return S, S })
		switch w.Algorithm {
		case Ring:
			e.HostMem = 2 * S // through one slot, when not in place
		case RingIPC:
		default:
			e.HostMem = 4 * S // the host-staged schedule with one input
		}
	case w.Coll == AllReduce && w.Algorithm == HostStaged && w.GPUShare > 0:
		// The devices' part f: each rank's kernel reads the n−1 peers'
		// copies of its 1/n of it, and the fetch skips that 1/n.
		f := float64(min(w.GPUShare, GPUShareOne)) / GPUShareOne
		link(func(int) (float64, float64) { return S, S + f*S*(N-2)/N })
		e.HostRead = N * (1 - f) * S
		if w.HostBackend {
			e.HostRead = N * S // the device part runs on the CPU too
		} else {
			e.DeviceRead = float64(slices.Max(sizes)) * (N - 1) / N * f * S
		}
		// Staged (n−f)·S, the kernels read (n−1)·f·S and write f·S, the
		// CPU reads n(1−f)·S and writes (1−f)·S, fetched (n−f)·S.
		e.HostMem = (3*N + 1 - 3*f) * S
	case w.Coll == AllReduce && (w.Algorithm == HostStaged || w.Algorithm == HostStagedSmall):
		link(func(int) (float64, float64) { return S, S })
		e.HostRead = N * S
		e.HostMem = (3*N + 1) * S
		if w.Algorithm == HostStagedSmall {
			e.HostRead = N * N * S // every rank reduces every input
			e.HostMem = (N*N + 3*N) * S
		}
	case w.Coll == AllReduce && w.Algorithm == Ring:
		x := 2 * (N - 1) / N * S
		link(func(int) (float64, float64) { return x, x })
		e.HostMem = 2 * N * x // every rank's steps: x into a slot, x out of one
		if w.HostBackend {
			e.HostRead = N * x // each step reduces two inputs of a block
		}
	case w.Coll == AllReduce && w.Algorithm == RingIPC:
		memory = false
		e.P2P = 2 * (N - 1) / N * S
		if w.HostBackend {
			e.HostRead = N * e.P2P
			e.P2P = 0
		}
	case w.Coll == AllReduce && w.Algorithm == Hierarchical:
		// A group of k stages (k−1)·S, its kernels read (k−1)·S and
		// write S of group partials; with one group the ranks fetch
		// (n−1)·S of them, with G the CPU reads G·S, writes S and the
		// ranks fetch n·S.
		e.HostMem = (3*N + 1) * S
		if G == 1 {
			e.HostMem = (3*N - 2) * S
			link(func(k int) (float64, float64) { return S, 2 * float64(k-1) / float64(k) * S })
		} else {
			link(func(k int) (float64, float64) {
				if k == 1 {
					return S, S
				}
				return S, (2 - 1/float64(k)) * S
			})
			e.HostRead = float64(G) * S
		}
		if w.HostBackend {
			e.HostRead += N * S // the group reductions run on the CPU too
		} else if k := slices.Max(sizes); k > 1 {
			// Rank j of a group of k reduces part j on its device from
			// the k−1 peers' staged copies: the GPU's kernels read
			// (k−1)·S of mapped host memory (part of LinkIn).
			e.DeviceRead = float64(k-1) * S
		}
	case w.Coll == ReduceScatter:
		link(func(int) (float64, float64) { return N * S, S })
		e.HostRead = N * N * S
		e.HostMem = 2 * N * (N + 1) * S // n²·S staged and read, n·S written and fetched
	case w.Coll == AllGather:
		// Each rank's own block is copied on its device, not fetched.
		link(func(int) (float64, float64) { return S, (N - 1) * S })
		e.HostMem = N * N * S // n·S staged, n(n−1)·S fetched
	case w.Coll == Broadcast:
		// The root stages S and fetches nothing (its own copy is on its
		// device); every other rank fetches S. So the busiest GPU takes in
		// k·S of its k ranks, less S where the root is one of them: at
		// least max(k₁−1, k₂)·S over the two largest groups, wherever
		// the root is.
		e.LinkOut = S
		k1, k2 := 0, 0
		for _, k := range sizes {
			if k > k1 {
				k1, k2 = k, k1
			} else if k > k2 {
				k2 = k
			}
		}
		e.LinkIn = float64(max(k1-1, k2)) * S
		e.HostMem = N * S // S staged, (n−1)·S fetched
	default:
		return Estimate{}, fmt.Errorf("cost of %s with the %s algorithm: %w", w.Coll, w.Algorithm, ErrUnsupported)
	}
	secs := func(bytes, gibs float64) float64 {
		if gibs <= 0 || bytes <= 0 {
			return 0
		}
		return bytes / (gibs * GiB)
	}
	var best float64
	bind := func(t float64, name string) {
		if t > best {
			best, e.Binding = t, name
		}
	}
	if !w.HostBackend {
		// The kernels' reads in copy bytes of the same link time.
		in := e.LinkIn
		if m.DeviceReadGiBs > 0 && m.LinkGiBs > 0 {
			in += e.DeviceRead * (m.LinkGiBs/m.DeviceReadGiBs - 1)
		}
		bind(secs(math.Max(e.LinkOut, in), m.LinkGiBs), "link")
		duplex := m.DuplexGiBs
		if duplex <= 0 {
			duplex = 2 * m.LinkGiBs
		}
		// The busiest GPU both ways (the same GPU carries the most of each).
		bind(secs(e.LinkOut+in, duplex), "duplex")
		bind(secs(e.P2P, m.P2PGiBs), "p2p")
	}
	bind(secs(e.HostRead, m.HostReduceGiBs(w.ReduceThreads)), "host")
	if !w.HostBackend {
		bind(secs(e.HostMem, m.HostMemGiBs), "hostmem")
	}
	lim := time.Duration(best * float64(time.Second))
	if memory && !w.HostBackend && w.Coll != Barrier && w.Bytes > 0 {
		lim += m.RoundTrip
		if e.Binding == "" || best*float64(time.Second) < float64(m.RoundTrip) {
			e.Binding = "latency"
		}
	}
	e.Limit = lim
	eff := Efficiency[w.Algorithm]
	switch {
	case w.Algorithm == HostStaged && w.GPUShare > 0 && !w.HostBackend:
		eff = DeviceShareEfficiency
	case w.Algorithm == Ring && !w.HostBackend && n > 1 && G == 1:
		eff = RingOneGPUEfficiency
	}
	if eff <= 0 {
		eff = 1
	}
	e.Predicted = time.Duration(float64(lim) / eff)
	return e, nil
}

// Choice is what Choose decided and why.
type Choice struct {
	Algorithm Algorithm
	// Estimates of every candidate, in the candidates' order.
	Estimates []Estimate
}

// Choose picks, among candidates, the all-reduce algorithm the cost model
// predicts fastest for w (w.Algorithm is ignored). A later candidate must
// be predicted at least 2% faster to win, so near ties keep the earlier,
// simpler one. Every rank computes the same answer from the same inputs.
func (m Machine) Choose(w Workload, candidates []Algorithm) (Choice, error) {
	if len(candidates) == 0 {
		return Choice{}, fmt.Errorf("no candidate algorithm: %w", ErrUnsupported)
	}
	c := Choice{Algorithm: candidates[0]}
	var best time.Duration
	for i, a := range candidates {
		w.Algorithm = a
		e, err := m.Estimate(w)
		if err != nil {
			return Choice{}, err
		}
		c.Estimates = append(c.Estimates, e)
		if i == 0 || float64(e.Predicted) < 0.98*float64(best) {
			c.Algorithm, best = a, e.Predicted
		}
	}
	return c, nil
}

// ShmCandidates are the all-reduce algorithms of the shm transport worth
// comparing for a grouping: host-staged and the ring always, hierarchical
// when some GPU carries several ranks (with one rank per GPU it is the
// host-staged schedule).
func ShmCandidates(g Grouping) []Algorithm {
	c := []Algorithm{HostStaged, Ring}
	if slices.Max(append(g.Sizes(), 0)) > 1 {
		c = append(c, Hierarchical)
	}
	return c
}

// shareStep is the resolution, in thousandths, of the shares GPUShare
// compares (1/32).
const shareStep = GPUShareOne / 32

// GPUShare is the share of a host-staged all-reduce's reduction (in
// thousandths, within [lo, hi]) that the cost model predicts fastest for
// w (w.Algorithm and w.GPUShare are ignored), comparing Predicted: the
// floor over Efficiency[HostStaged] for share 0, over
// DeviceShareEfficiency for any other. The devices' part f adds to every
// GPU's link traffic in f·S·(n−2)/n bytes of copy, and makes the kernels
// read (n−1)·f·S of host memory at DeviceReadGiBs; the CPU's reads shrink
// with it. When lo is predicted as fast as the best (within 0.1%), lo;
// otherwise the largest share predicted as fast as the best. On the H200
// figures that is 0 for 2 to 8 ranks on one GPU with the default reduce
// workers, as measured (the CPU won every row of 2026-12-01); a share
// pays only on a host that reduces far slower (15 GiB/s in all: about
// half of it for 7 ranks). On the host backend, or for one rank, lo.
func (m Machine) GPUShare(w Workload, lo, hi int) (int, error) {
	lo, hi = max(lo, 0), min(hi, GPUShareOne)
	if lo > hi {
		return 0, fmt.Errorf("GPU share range [%d, %d]: %w", lo, hi, ErrUnsupported)
	}
	if w.HostBackend || len(w.Groups) < 2 || w.Coll != AllReduce {
		return lo, nil
	}
	w.Algorithm = HostStaged
	var shares []int
	var limits []time.Duration
	best := time.Duration(math.MaxInt64)
	for f := lo; ; f = min(f+shareStep, hi) {
		w.GPUShare = f
		e, err := m.Estimate(w)
		if err != nil {
			return 0, err
		}
		shares, limits = append(shares, f), append(limits, e.Predicted)
		best = min(best, e.Predicted)
		if f == hi {
			break
		}
	}
	near := func(d time.Duration) bool { return float64(d) <= 1.001*float64(best) }
	if near(limits[0]) {
		return lo, nil
	}
	for i := len(shares) - 1; ; i-- {
		if near(limits[i]) {
			return shares[i], nil
		}
	}
}
