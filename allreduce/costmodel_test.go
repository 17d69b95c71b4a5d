package allreduce

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// workers is the executor's default reduce workers per rank on a host with
// plenty of cores (withDefaults without the core cap).
func workers(world int) int { return max(1, min(6, 14/world)) }

func TestChooseOnH200(t *testing.T) {
	// The rows of issue 9 (256 MiB fp32): what the model picks, and the
	// floor it states (the "link limit" column is per-way link
	// time; the duplex and host figures of hw/H200.md bind first in some).
	const S = 256 << 20
	tests := []struct {
		desc   string
		world  int
		perGPU int
		want   Algorithm
		limit  time.Duration // ±0.3 ms
		bind   string
	}{
		{"7 on 1 GPU", 7, 7, HostStaged, 38_780 * time.Microsecond, "duplex"},
		{"2 on 1 GPU", 2, 2, HostStaged, 11_100 * time.Microsecond, "duplex"},
		{"2 on 2 GPUs", 2, 1, Ring, 5_560 * time.Microsecond, "duplex"},
		// Host-staged measured 19.0 and 62.0 ms here (issue 9's table);
		// hierarchical, whose kernels read host memory at DeviceReadGiBs,
		// ran at 0.58–0.82 of its floor on one GPU, which puts it behind.
		{"4 on 2 GPUs", 4, 2, HostStaged, 20_350 * time.Microsecond, "host"},
		{"8 on 2 GPUs", 8, 4, HostStaged, 61_000 * time.Microsecond, "host"},
	}
	m := H200()
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			g := ContiguousGroups(tc.world, tc.perGPU)
			w := Workload{Coll: AllReduce, Groups: g, Bytes: S, ReduceThreads: tc.world * workers(tc.world)}
			c, err := m.Choose(w, ShmCandidates(g))
			require.NoError(t, err)
			require.Equal(t, tc.want, c.Algorithm, "estimates %+v", c.Estimates)
			w.Algorithm = c.Algorithm
			e, err := m.Estimate(w)
			require.NoError(t, err)
			require.InDelta(t, float64(tc.limit), float64(e.Limit), float64(300*time.Microsecond), "%+v", e)
			require.Equal(t, tc.bind, e.Binding)
		})
	}
}

// On the figures `migctl bench limits` measured on the H200 host of
// 2026-12-02 (link 51.3 GiB/s each way, 94.4 both ways, host memory under
// DMA 147 GiB/s, 8.9 GiB/s per reduce thread, 73 in all), the model picks
// what that host ran fastest in the same call (256 MiB, one GPU): the ring
// for 2 ranks (11.69–11.97 ms against host-staged 12.51), host-staged for
// 3 (21.08 against 23.37) and 7 (43.72 against 72.59), where host memory
// binds host-staged at (3n+1)·S and the ring moves 4(n−1)·S of it.
func TestChooseOnMeasuredH200Host(t *testing.T) {
	const S = 256 << 20
	m := H200()
	m.LinkGiBs, m.DuplexGiBs, m.HostMemGiBs = 51.3, 94.4, 147
	m.ReduceThreadGiBs, m.ReduceHostGiBs = 8.9, 73
	m.RoundTrip = 12 * time.Microsecond
	tests := []struct {
		world, perGPU int
		want          Algorithm
		measured      time.Duration // the winner's run on that host
	}{
		{2, 2, Ring, 11_720 * time.Microsecond},
		{3, 3, HostStaged, 21_080 * time.Microsecond},
		{7, 7, HostStaged, 43_720 * time.Microsecond},
		// Across GPUs the ring keeps its unstaged efficiency: host-staged, as
		// measured on two H200s (19.0 and 62.0 ms), and the ring for one rank
		// on each (8.4 ms).
		{4, 2, HostStaged, 0},
		{8, 4, HostStaged, 0},
		{2, 1, Ring, 0},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%d ranks, %d per GPU", tc.world, tc.perGPU), func(t *testing.T) {
			g := ContiguousGroups(tc.world, tc.perGPU)
			w := Workload{Coll: AllReduce, Groups: g, Bytes: S, ReduceThreads: tc.world * workers(tc.world)}
			c, err := m.Choose(w, ShmCandidates(g))
			require.NoError(t, err)
			require.Equal(t, tc.want, c.Algorithm, "estimates %+v", c.Estimates)
			if tc.measured > 0 {
				w.Algorithm = c.Algorithm
				e, err := m.Estimate(w)
				require.NoError(t, err)
				require.LessOrEqual(t, e.Limit, tc.measured, "a floor: no run is faster (%+v)", e)
				require.GreaterOrEqual(t, e.Predicted, tc.measured*85/100, "the prediction within 15%% of the run (%+v)", e)
				require.LessOrEqual(t, e.Predicted, tc.measured*115/100, "the prediction within 15%% of the run (%+v)", e)
			}
		})
	}
}

func TestEstimateFormulas(t *testing.T) {
	// One GiB per rank, 1 GiB/s links each way, 2 GiB/s both ways, 1 GiB/s
	// per reducing thread: every floor in seconds is a byte count in GiB.
	const S = GiB
	m := Machine{LinkGiBs: 1, DuplexGiBs: 2, ReduceThreadGiBs: 1}
	tests := []struct {
		alg      Algorithm
		coll     Coll
		labels   []int
		threads  int
		host     bool
		wantSecs float64
		wantBind string
		out, in  float64 // busiest GPU, GiB
		hostRead float64 // GiB
	}{
		// 4 ranks on one GPU: n·S each way, the CPU reads n·S.
		{HostStaged, AllReduce, []int{0, 0, 0, 0}, 8, false, 4, "link", 4, 4, 4},
		{HostStaged, AllReduce, []int{0, 0, 0, 0, 1, 1, 1, 1}, 1, false, 8, "host", 4, 4, 8},
		// The ring moves 2(n−1)/n·S per rank each way.
		{Ring, AllReduce, []int{0, 0, 1, 1}, 1, false, 3, "link", 3, 3, 0},
		// Hierarchical, 2 groups of 2: per GPU 2·S out, 2·1.5·S in, CPU 2·S.
		{Hierarchical, AllReduce, []int{0, 0, 1, 1}, 4, false, 3, "link", 2, 3, 2},
		{Hierarchical, AllReduce, []int{0, 0, 1, 1}, 1, false, 3, "link", 2, 3, 2},
		// 3 groups of 3 on one thread: the CPU reads G·S.
		{Hierarchical, AllReduce, []int{0, 0, 0, 1, 1, 1, 2, 2, 2}, 1, false, 3 * (2 - 1/3.0), "link", 3, 3 * (2 - 1/3.0), 3},
		{Hierarchical, AllReduce, []int{0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6, 7, 4, 5, 6, 7}, 1, false, 8, "host", 2, 3, 8},
		// One group of 3: 3·S out, 3·(2·2/3)·S in, no CPU.
		{Hierarchical, AllReduce, []int{0, 0, 0}, 1, false, 4, "link", 3, 4, 0},
		// Host backend: only the CPU counts.
		{HostStaged, AllReduce, []int{0, 0, 0}, 3, true, 1, "host", 3, 3, 3},
		{Ring, AllReduce, []int{0, 0, 0}, 2, true, 2, "host", 4, 4, 4},
		// Reduce-scatter of S blocks: n·S out, S in per rank, CPU n²·S.
		{HostStaged, ReduceScatter, []int{0, 1}, 8, false, 2, "link", 2, 1, 4},
		// All-gather: S out, (n−1)·S in per rank (its own block is copied
		// on the device).
		{HostStaged, AllGather, []int{0, 0}, 1, false, 2, "link", 2, 2, 0},
		{HostStaged, AllGather, []int{0, 0, 0}, 1, false, 6, "link", 3, 6, 0},
		// Broadcast: the root's S out; S in for every other rank, so the
		// busiest GPU takes in at least max(k₁−1, k₂)·S wherever the root is.
		{HostStaged, Broadcast, []int{0, 0, 0, 0}, 1, false, 3, "link", 1, 3, 0},
		{HostStaged, Broadcast, []int{0, 0, 0, 1}, 1, false, 2, "link", 1, 2, 0},
		{HostStaged, Broadcast, []int{0, 0, 1, 1}, 1, false, 2, "link", 1, 2, 0},
		{HostStaged, Broadcast, []int{0, 1}, 1, false, 1, "link", 1, 1, 0},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%s/%s/%v/threads%d/host=%v", tc.coll, tc.alg, tc.labels, tc.threads, tc.host), func(t *testing.T) {
			g, err := NewGrouping(tc.labels)
			require.NoError(t, err)
			e, err := m.Estimate(Workload{Coll: tc.coll, Algorithm: tc.alg, Groups: g, Bytes: S, ReduceThreads: tc.threads, HostBackend: tc.host})
			require.NoError(t, err)
			require.InDelta(t, tc.wantSecs, e.Limit.Seconds(), 1e-6, "%+v", e)
			require.Equal(t, tc.wantBind, e.Binding)
			require.InDelta(t, tc.out, e.LinkOut/GiB, 1e-9)
			require.InDelta(t, tc.in, e.LinkIn/GiB, 1e-9)
			require.InDelta(t, tc.hostRead, e.HostRead/GiB, 1e-9)
		})
	}
}

func TestEstimateEdges(t *testing.T) {
	m := H200()
	_, err := m.Estimate(Workload{Coll: AllReduce, Algorithm: HostStaged})
	require.ErrorIs(t, err, ErrUnsupported)
	_, err = m.Estimate(Workload{Coll: Broadcast, Algorithm: Ring, Groups: ContiguousGroups(2, 1), Bytes: 64})
	require.NoError(t, err) // broadcast is host-staged whatever the all-reduce algorithm
	// A small message is bound by the round trip.
	e, err := m.Estimate(Workload{Coll: AllReduce, Algorithm: HostStagedSmall, Groups: ContiguousGroups(7, 7), Bytes: 8 << 10, ReduceThreads: 14})
	require.NoError(t, err)
	require.Equal(t, "latency", e.Binding)
	// 23 µs round trip + 7·7·8 KiB read by 14 threads at 4.1 GiB/s.
	require.InDelta(t, float64(29500*time.Nanosecond), float64(e.Limit), float64(500*time.Nanosecond))
	// Nothing moved: no floor.
	e, err = m.Estimate(Workload{Coll: AllReduce, Algorithm: HostStaged, Groups: ContiguousGroups(3, 3)})
	require.NoError(t, err)
	require.Zero(t, e.Limit)
	// One rank per GPU: hierarchical is not a candidate (it is host-staged).
	require.Equal(t, []Algorithm{HostStaged, Ring}, ShmCandidates(ContiguousGroups(4, 1)))
	require.Equal(t, []Algorithm{HostStaged, Ring, Hierarchical}, ShmCandidates(ContiguousGroups(4, 2)))
	// A tie keeps the first candidate.
	c, err := (Machine{ReduceThreadGiBs: 1}).Choose(Workload{Coll: AllReduce, Groups: ContiguousGroups(2, 2), Bytes: GiB, HostBackend: true, ReduceThreads: 1},
		[]Algorithm{HostStaged, Ring})
	require.NoError(t, err)
	require.Equal(t, HostStaged, c.Algorithm)
}

func TestMachineSettings(t *testing.T) {
	m := Machine{LinkGiBs: 40.5, DuplexGiBs: 70, ReduceThreadGiBs: 3.25, ReduceHostGiBs: 60, P2PGiBs: 300, DeviceReadGiBs: 20,
		RoundTrip: 31 * time.Microsecond, HostMemGiBs: 125.5}
	got, err := MachineFromSettings(H200(), m.Settings())
	require.NoError(t, err)
	require.Equal(t, m, got)
	got, err = MachineFromSettings(H200(), map[string]string{"other": "x"})
	require.NoError(t, err)
	require.Equal(t, H200(), got)
	_, err = MachineFromSettings(H200(), map[string]string{SettingLinkGiBs: "fast"})
	require.ErrorIs(t, err, ErrUnsupported)
	_, err = MachineFromSettings(H200(), map[string]string{SettingRoundTripUS: "-3"})
	require.ErrorIs(t, err, ErrUnsupported)
}

func TestEstimateDeviceRead(t *testing.T) {
	// 4 ranks on one GPU, all of the reduction on the devices, 1 GiB each:
	// per GPU 4 GiB out, 4·(1 + 2/4) = 6 GiB in, of which the kernels read
	// 4·3/4 = 3 GiB from host memory. At half the copy rate those 3 GiB
	// take the link as long as 6 GiB of copies: 9 GiB-equivalents in.
	const S = GiB
	w := Workload{Coll: AllReduce, Algorithm: HostStaged, Groups: ContiguousGroups(4, 4), Bytes: S, ReduceThreads: 1,
		GPUShare: GPUShareOne}
	for _, tc := range []struct {
		read     float64
		host     bool
		wantSecs float64
		wantBind string
		wantRead float64 // GiB
	}{
		{0, false, 6, "link", 3},   // 0: a read costs what a copy does
		{1, false, 6, "link", 3},   // as fast as a copy
		{0.5, false, 9, "link", 3}, // half: 6 + 3 GiB-equivalents in
		{0.25, false, 15, "link", 3},
		{0.5, true, 4, "host", 0}, // host backend: the CPU reduces all of it
	} {
		t.Run(fmt.Sprintf("read%v/host=%v", tc.read, tc.host), func(t *testing.T) {
			m := Machine{LinkGiBs: 1, DuplexGiBs: 2, ReduceThreadGiBs: 1, DeviceReadGiBs: tc.read}
			x := w
			x.HostBackend = tc.host
			e, err := m.Estimate(x)
			require.NoError(t, err)
			require.InDelta(t, tc.wantSecs, e.Limit.Seconds(), 1e-6, "%+v", e)
			require.Equal(t, tc.wantBind, e.Binding)
			require.InDelta(t, tc.wantRead, e.DeviceRead/GiB, 1e-9)
			eff := DeviceShareEfficiency
			if tc.host {
				eff = Efficiency[HostStaged]
			}
			require.InDelta(t, tc.wantSecs/eff, e.Predicted.Seconds(), 1e-6)
		})
	}
}

// measuredH200 is the machine `migctl bench limits` measured on the H200 of
// 2026-12-01 14:48 UTC (the LIMIT column of the --reduce-on rows).
func measuredH200() Machine {
	m := H200()
	m.LinkGiBs, m.DuplexGiBs, m.ReduceThreadGiBs, m.ReduceHostGiBs = 51.45, 94.47, 7.98, 70.38
	m.RoundTrip = 9588 * time.Nanosecond
	return m
}

func TestReduceOnMeasuredH200(t *testing.T) {
	// The --reduce-on rows of 2026-12-01 (256 MiB fp32, one H200, default
	// reduce workers): every floor lies under its measurement, and the
	// predictions order the placements as measured, the CPU first.
	const S = 256 << 20
	rows := []struct {
		n, share int
		ms       float64
	}{
		{7, 0, 45.42}, {7, 125, 74.65}, {7, 250, 79.45}, {7, 500, 88.20}, {7, GPUShareOne, 102.94},
		{2, 0, 14.16}, {2, 500, 22.41}, {2, GPUShareOne, 24.72},
	}
	for _, m := range []Machine{H200(), measuredH200()} {
		last := map[int]time.Duration{}
		for _, r := range rows {
			e, err := m.Estimate(Workload{Coll: AllReduce, Algorithm: HostStaged, Groups: ContiguousGroups(r.n, r.n), Bytes: S,
				ReduceThreads: r.n * workers(r.n), GPUShare: r.share})
			require.NoError(t, err)
			measured := time.Duration(r.ms * float64(time.Millisecond))
			require.Less(t, e.Limit, measured, "%d ranks, share %d: the floor %v over the measured %v", r.n, r.share, e.Limit, measured)
			require.Greater(t, e.Predicted, last[r.n], "%d ranks, share %d: measured slower than the smaller share", r.n, r.share)
			last[r.n] = e.Predicted
		}
	}
}

func TestAutoReducesOnCPUOnH200(t *testing.T) {
	// Measured 2026-12-01: on one H200 the CPU reduction beat every share
	// on the devices (2 and 7 ranks). auto must keep it for 2..8 ranks on
	// one GPU (the MIG path), with the trainer's default reduce workers and
	// with a 16-core host's (DefaultReduceWorkers), on the H200 figures and
	// on the measured machine. (Across GPUs auto runs the ring or the
	// hierarchical schedule, and a forced host-staged one where the host
	// binds may still get a share: not measured.)
	for _, m := range []Machine{H200(), measuredH200()} {
		for n := 2; n <= 8; n++ {
			for _, wk := range []int{workers(n), DefaultReduceWorkers(n, 16)} {
				w := Workload{Coll: AllReduce, Groups: ContiguousGroups(n, n), Bytes: 256 << 20, ReduceThreads: n * wk}
				got, err := m.ResolveGPUShare("auto", w)
				require.NoError(t, err)
				require.Zero(t, got, "%d ranks, %d workers each, machine %+v", n, wk, m)
			}
		}
	}
}

func TestHierarchicalMeasuredH200(t *testing.T) {
	// The --algo hierarchical rows of 2026-12-01 14:48 UTC (256 MiB fp32, one
	// H200): each floor, with the kernels' reads of host memory at
	// DeviceReadGiBs, lies under its measurement, and the prediction is no
	// faster than the measurement (Efficiency is the lower of the two
	// rows), so the model never prefers it to host-staged on one GPU, where
	// host-staged measured 45.42 and 14.16 ms.
	const S = 256 << 20
	m := H200()
	for _, r := range []struct {
		n          int
		ms, hostMS float64
	}{{7, 111.56, 45.42}, {2, 26.32, 14.16}} {
		w := Workload{Coll: AllReduce, Algorithm: Hierarchical, Groups: ContiguousGroups(r.n, r.n), Bytes: S,
			ReduceThreads: r.n * workers(r.n)}
		e, err := m.Estimate(w)
		require.NoError(t, err)
		require.InDelta(t, float64(r.n-1)*S, e.DeviceRead, 1, "%d ranks", r.n)
		measured := time.Duration(r.ms * float64(time.Millisecond))
		require.Less(t, e.Limit, measured, "%d ranks", r.n)
		require.GreaterOrEqual(t, e.Predicted, measured-time.Millisecond, "%d ranks: predicted %v", r.n, e.Predicted)
		w.Algorithm = HostStaged
		h, err := m.Estimate(w)
		require.NoError(t, err)
		require.Less(t, h.Predicted, e.Predicted, "%d ranks", r.n)
	}
}

// scheduleHostMem counts the bytes a schedule moves through host memory:
// copies into and out of the arena, device kernels' reads of it, and the
// CPU reductions' reads and writes.
func scheduleHostMem(s Schedule) float64 {
	var b int
	for _, steps := range s.Steps {
		for _, st := range steps {
			switch st.Kind {
			case CopyOut, CopyIn:
				b += st.Len
			case ReduceIn:
				for _, h := range st.Hosts {
					b += h.Len
				}
			case HostReduce:
				b += st.Host.Len
				for _, h := range st.Hosts {
					b += h.Len
				}
			}
		}
	}
	return float64(b)
}

func TestEstimateHostMemMatchesSchedule(t *testing.T) {
	// Estimate.HostMem is what the schedules Build makes move through
	// host memory, step by step.
	const chunk, slots = 64 << 10, 4
	tests := []struct {
		coll    Coll
		alg     Algorithm
		labels  []int
		bytes   int
		share   int
		inPlace bool
	}{
		{AllReduce, HostStaged, []int{0, 0, 0, 0, 0, 0, 0}, 1 << 20, 0, false},
		{AllReduce, HostStaged, []int{0, 0}, 3<<20 + 4096, 0, false},
		{AllReduce, HostStaged, []int{0, 0, 1, 1}, 1 << 20, 0, false},
		{AllReduce, HostStaged, []int{0}, 1 << 20, 0, false},
		{AllReduce, HostStaged, []int{0, 0, 0, 0}, 1 << 20, 250, false},
		{AllReduce, HostStaged, []int{0, 0, 0, 0, 0, 0, 0}, 1 << 20, 125, false},
		{AllReduce, HostStaged, []int{0, 0}, 1 << 20, GPUShareOne, false},
		{AllReduce, HostStagedSmall, []int{0, 0, 0, 0, 0, 0, 0}, 8 << 10, 0, false},
		{AllReduce, HostStagedSmall, []int{0, 0}, 64 << 10, 0, false},
		{AllReduce, Ring, []int{0, 0, 0, 0, 0, 0, 0}, 1 << 20, 0, false},
		{AllReduce, Ring, []int{0, 1}, 1 << 20, 0, false},
		{AllReduce, Ring, []int{0}, 1 << 20, 0, false},
		{AllReduce, RingIPC, []int{0, 1, 2}, 1 << 20, 0, false},
		{AllReduce, Hierarchical, []int{0, 0, 0, 0, 0, 0, 0}, 1 << 20, 0, false},
		{AllReduce, Hierarchical, []int{0, 0, 1, 1}, 1 << 20, 0, false},
		{AllReduce, Hierarchical, []int{0, 0, 0, 1, 1, 2, 2, 2}, 1 << 20, 0, false},
		{ReduceScatter, HostStaged, []int{0, 0, 0}, 1 << 18, 0, false},
		{AllGather, HostStaged, []int{0, 0, 0, 0}, 1 << 18, 0, false},
		{AllGather, HostStaged, []int{0, 0}, 1 << 18, 0, false},
		{Broadcast, HostStaged, []int{0, 0, 0, 0, 0}, 1 << 20, 0, true},
		{Broadcast, HostStaged, []int{0, 0, 0}, 1 << 20, 0, false},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%s/%s/%v/share%d", tc.coll, tc.alg, tc.labels, tc.share), func(t *testing.T) {
			g, err := NewGrouping(tc.labels)
			require.NoError(t, err)
			s, err := Build(Params{Coll: tc.coll, Algorithm: tc.alg, World: len(tc.labels), Bytes: tc.bytes, ElemSize: 4,
				Chunk: chunk, Slots: slots, Groups: g, GPUShare: tc.share, InPlace: tc.inPlace})
			require.NoError(t, err)
			e, err := H200().Estimate(Workload{Coll: tc.coll, Algorithm: tc.alg, Groups: g, Bytes: tc.bytes, ReduceThreads: 4,
				GPUShare: tc.share})
			require.NoError(t, err)
			want := scheduleHostMem(s)
			// A share cuts chunks on 64-byte boundaries: within 0.5%.
			require.InDelta(t, want, e.HostMem, want/200+1, "schedule %v bytes, model %v", want, e.HostMem)
		})
	}
}

// scheduleLink is the most bytes one GPU of g copies out and takes in over
// its link in s: copies out, copies in and its kernels' reads of host
// memory (a ReduceIn's Hosts); a ReduceIn of no hosts stays on the device.
func scheduleLink(s Schedule, g Grouping) (out, in float64) {
	outs, ins := map[byte]int{}, map[byte]int{}
	for r, steps := range s.Steps {
		for _, st := range steps {
			switch st.Kind {
			case CopyOut:
				outs[g[r]] += st.Len
			case CopyIn:
				ins[g[r]] += st.Len
			case ReduceIn:
				for _, h := range st.Hosts {
					ins[g[r]] += h.Len
				}
			}
		}
	}
	for gpu := range outs {
		out = max(out, float64(outs[gpu]))
	}
	for gpu := range ins {
		in = max(in, float64(ins[gpu]))
	}
	return out, in
}

// The link bytes of the model are the schedules' for all-gather, and a
// floor of them for broadcast that is reached where the root (rank 0)
// sits on the GPU of most ranks.
func TestEstimateLinkMatchesSchedule(t *testing.T) {
	const chunk, slots, bytes = 64 << 10, 4, 1 << 20
	tests := []struct {
		coll    Coll
		labels  []int
		inPlace bool
		exact   bool
	}{
		{AllGather, []int{0, 0}, false, true},
		{AllGather, []int{0, 0, 0, 0, 0, 0, 0}, false, true},
		{AllGather, []int{0, 0, 1, 1}, false, true},
		{Broadcast, []int{0, 0}, false, true},
		{Broadcast, []int{0, 0}, true, true},
		{Broadcast, []int{0, 0, 0, 0, 0, 0, 0}, false, true},
		{Broadcast, []int{0, 0, 0, 1}, false, true},
		{Broadcast, []int{0, 1, 1, 1}, false, false}, // the root alone on its GPU: 3·S in on the other
		{Broadcast, []int{0, 0, 1, 1}, true, true},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%s/%v/inplace=%v", tc.coll, tc.labels, tc.inPlace), func(t *testing.T) {
			g, err := NewGrouping(tc.labels)
			require.NoError(t, err)
			s, err := Build(Params{Coll: tc.coll, Algorithm: HostStaged, World: len(tc.labels), Bytes: bytes, ElemSize: 4,
				Chunk: chunk, Slots: slots, Groups: g, InPlace: tc.inPlace})
			require.NoError(t, err)
			e, err := H200().Estimate(Workload{Coll: tc.coll, Algorithm: HostStaged, Groups: g, Bytes: bytes, ReduceThreads: 4})
			require.NoError(t, err)
			out, in := scheduleLink(s, g)
			require.LessOrEqual(t, e.LinkOut, out, "a floor")
			require.LessOrEqual(t, e.LinkIn, in, "a floor")
			if tc.exact {
				require.Equal(t, out, e.LinkOut)
				require.Equal(t, in, e.LinkIn)
			}
		})
	}
}

func TestEstimateHostMemTerm(t *testing.T) {
	// 7 ranks of 256 MiB on one H200: (3·7+1)·S = 5.5 GiB through host
	// memory. Below about 5.5 GiB / 37 ms ≈ 148 GiB/s it binds; at 0 or
	// far above, the duplex link does as before.
	const S = 256 << 20
	w := Workload{Coll: AllReduce, Algorithm: HostStaged, Groups: ContiguousGroups(7, 7), Bytes: S, ReduceThreads: 14}
	base, err := H200().Estimate(w)
	require.NoError(t, err)
	require.Equal(t, "duplex", base.Binding)
	for _, tc := range []struct {
		desc     string
		gibs     float64
		host     bool
		alg      Algorithm
		wantBind string
		wantSecs float64 // 0: base's limit
	}{
		{"unknown", 0, false, HostStaged, "duplex", 0},
		{"high", 1000, false, HostStaged, "duplex", 0},
		{"low", 110, false, HostStaged, "hostmem", 22 * 0.25 / 110},
		{"lower", 55, false, HostStaged, "hostmem", 22 * 0.25 / 55},
		// The host backend's copies are CPU copies: no host-memory term.
		{"host backend", 1, true, HostStaged, "host", 0},
		// The IPC ring does not go through host memory.
		{"ipc ring", 1, false, RingIPC, "p2p", 0},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			m := H200()
			m.HostMemGiBs = tc.gibs
			x := w
			x.HostBackend, x.Algorithm = tc.host, tc.alg
			e, err := m.Estimate(x)
			require.NoError(t, err)
			require.Equal(t, tc.wantBind, e.Binding, "%+v", e)
			switch {
			case tc.wantSecs > 0:
				require.InDelta(t, tc.wantSecs+m.RoundTrip.Seconds(), e.Limit.Seconds(), 1e-6, "%+v", e)
				require.InDelta(t, 22*0.25*GiB, e.HostMem, 1)
			case !tc.host && tc.alg == HostStaged:
				require.Equal(t, base.Limit, e.Limit)
			}
		})
	}
	// Choose sees the term: where host memory binds, the ring's 4(n−1)·S
	// (24 S for 7 ranks) loses to host-staged's 22 S all the more.
	m := H200()
	m.HostMemGiBs = 60
	c, err := m.Choose(w, ShmCandidates(w.Groups))
	require.NoError(t, err)
	require.Equal(t, HostStaged, c.Algorithm)
	require.Equal(t, "hostmem", c.Estimates[0].Binding)
	require.Equal(t, "hostmem", c.Estimates[1].Binding)
}
