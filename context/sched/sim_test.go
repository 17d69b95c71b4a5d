package sched

import (
	"errors"
	"fmt"
	"math"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// checkPlan checks what every plan must satisfy: Run and Wait split the jobs,
// Evict are residents and Admit waiting ones, Run fits in capacity (pinned
// jobs that do not fit are left waiting), every pinned job that runs is in
// Run, and no job waits while jobs of lower priority hold memory it would fit
// in (a higher priority never waits for a lower one).
func checkPlan(capacity int64, jobs []Job, p Plan) error {
	byID := map[int]Job{}
	for _, j := range jobs {
		byID[j.ID] = j
	}
	seen := map[int]bool{}
	var used int64
	for _, id := range p.Run {
		if seen[id] {
			return fmt.Errorf("job %d twice in the plan", id)
		}
		seen[id] = true
		used += byID[id].Bytes
	}
	for _, id := range p.Wait {
		if seen[id] {
			return fmt.Errorf("job %d twice in the plan", id)
		}
		seen[id] = true
	}
	if len(seen) != len(jobs) {
		return fmt.Errorf("the plan names %d jobs, not the %d given", len(seen), len(jobs))
	}
	if used > capacity {
		return fmt.Errorf("the plan runs %d GiB on %d GiB", used/gib, capacity/gib)
	}
	running := map[int]bool{}
	for _, id := range p.Run {
		running[id] = true
	}
	for _, id := range p.Evict {
		if j := byID[id]; !j.Resident || j.Pinned || running[id] {
			return fmt.Errorf("evicts job %d, which is not a resident that stops", id)
		}
	}
	for _, id := range p.Admit {
		if j := byID[id]; j.Resident || !running[id] {
			return fmt.Errorf("admits job %d, which is not a waiting job that runs", id)
		}
	}
	for _, id := range p.Wait {
		w := byID[id]
		var atLeast int64
		lower := false
		for _, r := range p.Run {
			if byID[r].Priority >= w.Priority {
				atLeast += byID[r].Bytes
			} else {
				lower = true
			}
		}
		if lower && w.Bytes <= capacity-atLeast {
			return fmt.Errorf("job %d (priority %d, %d GiB) waits while lower priorities hold the memory it fits in", id, w.Priority, w.Bytes/gib)
		}
	}
	return nil
}

// checkWorkConserving fails when a waiting job fits in the memory the plan
// leaves free (fair may leave memory free for a starving job; the others
// never do).
func checkWorkConserving(capacity int64, jobs []Job, p Plan) error {
	byID := map[int]Job{}
	for _, j := range jobs {
		byID[j.ID] = j
	}
	free := capacity
	for _, id := range p.Run {
		free -= byID[id].Bytes
	}
	for _, id := range p.Wait {
		if byID[id].Bytes <= free {
			return fmt.Errorf("job %d (%d GiB) waits with %d GiB free", id, byID[id].Bytes/gib, free/gib)
		}
	}
	return nil
}

// checkMemory fails when the jobs in memory hold more than the capacity.
func checkMemory(s SimState) error {
	var held int64
	for _, j := range s.Jobs {
		if j.State.InMemory() {
			held += j.Bytes
		}
	}
	if held > s.Capacity {
		return fmt.Errorf("%d bytes in memory on %d", held, s.Capacity)
	}
	return nil
}

func recordedMix(t *testing.T) Mix {
	t.Helper()
	m, err := LoadMix(mixPath)
	require.NoError(t, err)
	return m
}

// equalMix is n jobs of one priority and size, all arriving in the first
// minute, durations from 600 s up.
func equalMix(n int, g float64, sizes ...float64) Mix {
	m := Mix{Description: "equal", Device: MixDevice{Name: "test", MemoryGiB: 140}}
	for i := range n {
		size := g
		if len(sizes) > 0 {
			size = sizes[i%len(sizes)]
		}
		m.Jobs = append(m.Jobs, MixJob{ID: i + 1, Name: fmt.Sprintf("j%d", i+1), Kind: "training",
			ArrivalS: float64(7 * i), DurationS: float64(600 + 300*i), MemoryGiB: size, Compute: 1, Declares: true})
	}
	return m
}

func TestSimulateInvariants(t *testing.T) {
	mixes := map[string]Mix{"recorded": recordedMix(t), "equal-60GiB": equalMix(8, 60), "equal-mixed-sizes": equalMix(9, 0, 20, 100, 45)}
	for seed := uint64(1); seed <= 4; seed++ {
		mixes[fmt.Sprintf("seed-%d", seed)] = genMixWith(seed)
	}
	for name, mix := range mixes {
		for _, pn := range append(Names(), "fair-pinned", "srf-pinned") {
			t.Run(name+"/"+pn, func(t *testing.T) {
				base, pin := strings.CutSuffix(pn, "-pinned")
				p, err := New(base, Config{})
				require.NoError(t, err)
				checks := 0
				r, err := Simulate(mix, p, SimConfig{PinArrivals: pin,
					Check: func(s SimState) error { checks++; return checkMemory(s) },
					CheckPlan: func(_ time.Duration, capacity int64, jobs []Job, pl Plan) error {
						if err := checkPlan(capacity, jobs, pl); err != nil || base == NameFair {
							return err
						}
						return checkWorkConserving(capacity, jobs, pl)
					},
				})
				require.NoError(t, err)
				require.Greater(t, checks, len(mix.Jobs))
				require.Len(t, r.Jobs, len(mix.Jobs))
				for _, j := range r.Jobs {
					require.Positive(t, j.Finish, "job %d never finished", j.ID)
					require.GreaterOrEqual(t, j.Start, j.Arrival)
					// A job runs at most its duration alone; sharing only slows it.
					require.GreaterOrEqual(t, j.JCT.Seconds(), mix.Jobs[j.ID-1].DurationS-1e-6, "job %d", j.ID)
				}
				require.Greater(t, r.Utilization, 0.0)
				require.LessOrEqual(t, r.Utilization, 1.0+1e-9)
			})
		}
	}
}

func TestSimulateErrors(t *testing.T) {
	ok := equalMix(2, 60)
	tests := []struct {
		desc string
		mix  func(Mix) Mix
		want error
	}{
		{desc: "a job bigger than the device", mix: func(m Mix) Mix { m.Jobs[0].MemoryGiB = 141; return m }, want: ErrBadMix},
		{desc: "no jobs", mix: func(m Mix) Mix { m.Jobs = nil; return m }, want: ErrBadMix},
		{desc: "a duplicate id", mix: func(m Mix) Mix { m.Jobs[1].ID = m.Jobs[0].ID; return m }, want: ErrBadMix},
		{desc: "no duration", mix: func(m Mix) Mix { m.Jobs[0].DurationS = 0; return m }, want: ErrBadMix},
		{desc: "a compute share above 1", mix: func(m Mix) Mix { m.Jobs[0].Compute = 1.5; return m }, want: ErrBadMix},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			m := ok
			m.Jobs = append([]MixJob(nil), ok.Jobs...)
			_, err := Simulate(tc.mix(m), Priority{}, SimConfig{})
			require.ErrorIs(t, err, tc.want)
		})
	}
	t.Run("a failing check stops the simulation", func(t *testing.T) {
		boom := errors.New("boom")
		_, err := Simulate(ok, Priority{}, SimConfig{Check: func(SimState) error { return boom }})
		require.ErrorIs(t, err, boom)
	})
}

// TestFairEqualGPUTime: jobs of one priority that do not all fit get equal GPU
// time under fair (within a quantum and a switch each), where first come
// first served gives the first ones all of it.
func TestFairEqualGPUTime(t *testing.T) {
	tests := []struct {
		desc  string
		mix   Mix
		stop  time.Duration
		tol   float64 // of the mean
		fifoΔ float64 // the least spread priority has (max-min over mean)
	}{
		// 4 × 60 GiB on 140 GiB: two at a time.
		{desc: "four equal jobs, two fit", mix: equalMix(4, 60), stop: 1200 * time.Second, tol: 0.1, fifoΔ: 1.5},
		// 5 × 45 GiB: three at a time.
		{desc: "five equal jobs, three fit", mix: equalMix(5, 45), stop: 1500 * time.Second, tol: 0.1, fifoΔ: 1.5},
		// Sizes 30, 50, 70, 90 GiB: how many fit changes as they rotate.
		{desc: "four jobs of different sizes", mix: equalMix(4, 0, 30, 50, 70, 90), stop: 1500 * time.Second, tol: 0.25, fifoΔ: 0.5},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			for i := range tc.mix.Jobs {
				tc.mix.Jobs[i].ArrivalS = 0
				tc.mix.Jobs[i].DurationS = 10000 // nobody finishes before stop
			}
			spread := func(p Policy) (float64, []time.Duration) {
				r, err := Simulate(tc.mix, p, SimConfig{Stop: tc.stop})
				require.NoError(t, err)
				var lo, hi, sum float64 = math.Inf(1), 0, 0
				var got []time.Duration
				for _, j := range r.Jobs {
					s := j.GPUTime.Seconds()
					lo, hi, sum = math.Min(lo, s), math.Max(hi, s), sum+s
					got = append(got, j.GPUTime.Round(time.Second))
				}
				return (hi - lo) / (sum / float64(len(r.Jobs))), got
			}
			fair, got := spread(NewFair(Config{}))
			t.Logf("fair: GPU time per job at %v: %v (spread %.0f%% of the mean)", tc.stop, got, 100*fair)
			require.LessOrEqual(t, fair, tc.tol, "fair: GPU time per job %v", got)
			fifo, got := spread(Priority{})
			t.Logf("priority: %v (spread %.0f%%)", got, 100*fifo)
			require.GreaterOrEqual(t, fifo, tc.fifoΔ, "priority: GPU time per job %v", got)
		})
	}
}

// TestFairNoStarvation: under fair no job of the only priority waits longer
// than one turn of every other job (a quantum and two switches each), plus
// the quantum a starving job waits before its class stops for it; under
// priority (first come first served) the same mixes make jobs wait far longer.
func TestFairNoStarvation(t *testing.T) {
	for _, tc := range []struct {
		desc string
		mix  Mix
	}{
		{desc: "8 × 60 GiB", mix: equalMix(8, 60)},
		{desc: "9 jobs of 20, 100 and 45 GiB", mix: equalMix(9, 0, 20, 100, 45)},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			f := NewFair(Config{})
			var largest int64
			for _, j := range tc.mix.Jobs {
				largest = max(largest, j.Bytes())
			}
			q := f.Quantum(largest)
			turn := q + 2*DefaultCost.Swap(largest)
			bound := time.Duration(len(tc.mix.Jobs))*turn + q
			longest := func(p Policy) time.Duration {
				r, err := Simulate(tc.mix, p, SimConfig{})
				require.NoError(t, err)
				var w time.Duration
				for _, j := range r.Jobs {
					w = max(w, j.LongestWait)
				}
				return w
			}
			lf, lp := longest(f), longest(Priority{})
			t.Logf("longest wait: fair %v (bound %v, quantum %v), priority %v", lf.Round(time.Second), bound.Round(time.Second), q, lp.Round(time.Second))
			require.LessOrEqual(t, lf, bound, "fair (quantum %v)", q)
			require.Greater(t, lp, 2*bound, "priority")
		})
	}
}

// TestSRFBeatsFIFO: shortest remaining first lowers the average JCT of the
// recorded mix by a clear margin against first come first served (the
// priority policy), and does not lose on other mixes of its shape.
func TestSRFBeatsFIFO(t *testing.T) {
	avg := func(m Mix, p Policy) float64 {
		r, err := Simulate(m, p, SimConfig{})
		require.NoError(t, err)
		return r.AvgJCT.Seconds()
	}
	srf := NewSRF(Config{})
	fifo, got := avg(recordedMix(t), Priority{}), avg(recordedMix(t), srf)
	require.Less(t, got, 0.88*fifo, "recorded mix: srf %.0f s, priority %.0f s", got, fifo)
	pinned, err := Simulate(recordedMix(t), srf, SimConfig{PinArrivals: true})
	require.NoError(t, err)
	require.Less(t, pinned.AvgJCT.Seconds(), 0.88*fifo, "recorded mix, the daemon's need path: srf %v, priority %.0f s", pinned.AvgJCT, fifo)
	var gains []float64
	for seed := uint64(1); seed <= 20; seed++ {
		m := genMixWith(seed)
		f, s := avg(m, Priority{}), avg(m, srf)
		require.Less(t, s, f, "seed %d: srf %.0f s, priority %.0f s", seed, s, f)
		gains = append(gains, 1-s/f)
	}
	sort.Float64s(gains)
	require.Greater(t, gains[len(gains)/2], 0.1, "median gain over 20 mixes: %v", gains)
}

// envWriteTable makes TestJCTTable write its section of docs/daemon.md.
const envWriteTable = "MIGCTL_WRITE_SCHED_TABLE"

const (
	docPath    = "../../docs/daemon.md"
	tableBegin = "<!-- sched-table: generated by TestJCTTable, do not edit -->"
	tableEnd   = "<!-- end sched-table -->"
)

// jctSection is the generated part of docs/daemon.md.
func jctSection(t *testing.T) string {
	m := recordedMix(t)
	var rs []Result
	for _, n := range Names() {
		p, err := New(n, Config{})
		require.NoError(t, err)
		r, err := Simulate(m, p, SimConfig{})
		require.NoError(t, err)
		rs = append(rs, r)
	}
	for _, n := range []string{NameFair, NameSRF} {
		p, err := New(n, Config{})
		require.NoError(t, err)
		r, err := Simulate(m, p, SimConfig{PinArrivals: true})
		require.NoError(t, err)
		r.Policy += " (daemon: arrivals pinned)"
		rs = append(rs, r)
	}
	var b strings.Builder
	b.WriteString(tableBegin + "\n")
	fmt.Fprintf(&b, "Generated by `%s=1 go test -count=1 -run JCTTable ./context/sched` (without the variable the test checks this table is current).\n", envWriteTable)
	fmt.Fprintf(&b, "Mix: `context/sched/testdata/jobmix.json`, %d jobs on one %s (%.0f GiB). %s\n", len(m.Jobs), m.Device.Name, m.Device.MemoryGiB, m.Description)
	fmt.Fprintf(&b, "Swap cost: %s + bytes at %.0f GiB/s per swap; fair's quantum 20 × the switch (out and in) of the largest job of the class, at least 10 s; srf's margin 2 × the switch.\n\n",
		DefaultCost.Fixed, DefaultCost.Bandwidth/float64(gib))
	b.WriteString(Markdown(rs, []string{"inference", "training"}))
	b.WriteString("\nThe first three rows queue a job that arrives and does not fit; the last two model the daemon's need path " +
		"(SimConfig.PinArrivals: an arriving job gets its memory at once from its priority or lower, then takes its turn).\n")
	b.WriteString(tableEnd + "\n")
	return b.String()
}

func TestJCTTable(t *testing.T) {
	want := jctSection(t)
	t.Log("\n" + want)
	b, err := os.ReadFile(docPath)
	require.NoError(t, err)
	doc := string(b)
	i, j := strings.Index(doc, tableBegin), strings.Index(doc, tableEnd)
	if os.Getenv(envWriteTable) == "1" {
		if i < 0 || j < i {
			doc = strings.TrimRight(doc, "\n") + "\n\n" + want
		} else {
			doc = doc[:i] + want + doc[j+len(tableEnd)+1:]
		}
		require.NoError(t, os.WriteFile(docPath, []byte(doc), 0o644))
		return
	}
	require.True(t, i >= 0 && j > i, "docs/daemon.md has no generated JCT table: run %s=1 go test -run JCTTable ./context/sched", envWriteTable)
	require.Equal(t, want, doc[i:j+len(tableEnd)+1], "docs/daemon.md's JCT table is stale: run %s=1 go test -run JCTTable ./context/sched", envWriteTable)
}

// BenchmarkSimulate runs the recorded mix under each policy and reports the
// average and p95 JCT, the makespan and the switches as metrics.
func BenchmarkSimulate(b *testing.B) {
	m, err := LoadMix(mixPath)
	require.NoError(b, err)
	for _, n := range Names() {
		b.Run(n, func(b *testing.B) {
			p, err := New(n, Config{})
			require.NoError(b, err)
			var r Result
			for b.Loop() {
				if r, err = Simulate(m, p, SimConfig{}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(r.AvgJCT.Seconds(), "avgJCT-s")
			b.ReportMetric(r.P95JCT.Seconds(), "p95JCT-s")
			b.ReportMetric(r.Makespan.Seconds(), "makespan-s")
			b.ReportMetric(float64(r.Switches), "switches")
		})
	}
}
