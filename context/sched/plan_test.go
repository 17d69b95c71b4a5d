package sched

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const gib = int64(1) << 30

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// at is t0 plus s seconds.
func at(s float64) time.Time { return t0.Add(seconds(s)) }

// res is a resident job switched in at since (s), submitted at sub (s).
func res(id, prio int, g int64, sub, since float64) Job {
	return Job{ID: id, Priority: prio, Bytes: g * gib, Submitted: at(sub), Since: at(since), Resident: true}
}

// wt is a waiting job that started waiting at since (s).
func wt(id, prio int, g int64, sub, since float64) Job {
	return Job{ID: id, Priority: prio, Bytes: g * gib, Submitted: at(sub), Since: at(since)}
}

func withExpected(j Job, exp, used float64) Job {
	j.Expected, j.Used = seconds(exp), seconds(used)
	return j
}

func pinned(j Job) Job { j.Pinned = true; return j }

func TestPlan(t *testing.T) {
	cfg := Config{Cost: Cost{Bandwidth: float64(50 * gib), Fixed: 50 * time.Millisecond}, Quantum: 10 * time.Second}
	prio, _ := New(NamePriority, cfg)
	fair, _ := New(NameFair, cfg)
	srf, _ := New(NameSRF, cfg)
	// fair's quantum for 60-GiB jobs: 20 × 2 × (1.2 s + 50 ms) = 50 s.
	q60 := NewFair(cfg).Quantum(60 * gib).Seconds()
	require.InDelta(t, 50, q60, 0.01)
	tests := []struct {
		desc     string
		policy   Policy
		now      float64
		capacity int64 // GiB
		jobs     []Job
		evict    []int
		admit    []int
		wait     []int
		recheck  float64 // 0: none
	}{
		{desc: "priority: everything fits: the waiting job is admitted", policy: prio, capacity: 100,
			jobs:  []Job{res(1, 0, 40, 0, 0), wt(2, 0, 40, 1, 1)},
			admit: []int{2}},
		{desc: "priority: a higher priority takes the memory of lower ones, lowest first, then most recently submitted",
			policy: prio, capacity: 100,
			jobs:  []Job{res(1, 0, 30, 0, 0), res(2, 0, 30, 5, 5), res(3, -1, 30, 9, 9), wt(4, 5, 60, 10, 10)},
			evict: []int{3, 2}, admit: []int{4}, wait: []int{3, 2}},
		{desc: "priority: equal priorities never preempt each other; first come first served", policy: prio, now: 1000, capacity: 100,
			jobs: []Job{res(1, 0, 60, 5, 5), wt(2, 0, 60, 0, 0), wt(3, 0, 60, 1, 1)},
			wait: []int{2, 3}},
		{desc: "priority: a smaller job behind a big one that does not fit is admitted", policy: prio, capacity: 100,
			jobs:  []Job{res(1, 0, 60, 0, 0), wt(2, 0, 60, 1, 1), wt(3, 0, 30, 2, 2)},
			admit: []int{3}, wait: []int{2}},
		{desc: "priority: a higher priority that cannot fit even alone with lower ones out evicts nobody", policy: prio, capacity: 100,
			jobs: []Job{res(1, 5, 60, 0, 0), res(2, 0, 30, 0, 0), wt(3, 5, 60, 1, 1)},
			wait: []int{3}},
		{desc: "fair: within its quantum a resident job keeps the device; ask again when the quantum ends", policy: fair, now: 30, capacity: 100,
			jobs:    []Job{res(1, 0, 60, 0, 0), wt(2, 0, 60, 1, 1)},
			wait:    []int{2},
			recheck: 50},
		{desc: "fair: after its quantum the job that has waited longest takes the place of the one in longest", policy: fair, now: 50, capacity: 130,
			jobs:  []Job{res(1, 0, 60, 0, 0), res(2, 0, 60, 0, 20), wt(3, 0, 60, 1, 1), wt(4, 0, 60, 2, 2)},
			evict: []int{1}, admit: []int{3}, wait: []int{4, 1},
			recheck: 52}, // job 4 starts starving at 2 + 50
		{desc: "fair: a higher priority preempts within the quantum", policy: fair, now: 5, capacity: 100,
			jobs:  []Job{res(1, 0, 60, 0, 0), wt(2, 1, 60, 4, 4)},
			evict: []int{1}, admit: []int{2}, wait: []int{1},
			recheck: 55}, // job 1 would start starving
		{desc: "fair: nobody waits: an expired job keeps running", policy: fair, now: 500, capacity: 100,
			jobs: []Job{res(1, 0, 60, 0, 0)}},
		{desc: "fair: a starving big job stops its class from admitting smaller ones behind it", policy: fair, now: 90, capacity: 140,
			// The quantum is the 100-GiB job's: 20 × 2 × (2 s + 50 ms) = 82 s.
			jobs: []Job{res(1, 0, 60, 0, 40), res(2, 0, 60, 0, 60), wt(3, 0, 100, 1, 1), wt(4, 0, 10, 2, 2)},
			wait: []int{3, 4}, recheck: 122},
		{desc: "fair: a big job not yet starving lets a smaller one in", policy: fair, now: 30, capacity: 140,
			jobs:  []Job{res(1, 0, 60, 0, 0), res(2, 0, 60, 0, 10), wt(3, 0, 100, 20, 20), wt(4, 0, 10, 21, 21)},
			admit: []int{4}, wait: []int{3}, recheck: 82},
		{desc: "srf: the shortest waiting job is admitted first", policy: srf, capacity: 100,
			jobs: []Job{res(1, 0, 40, 0, 0), withExpected(wt(2, 0, 60, 1, 1), 900, 0), withExpected(wt(3, 0, 60, 2, 2), 100, 0)},
			// 3 first: fits; 2 then does not.
			admit: []int{3}, wait: []int{2}},
		{desc: "srf: a much shorter waiting job preempts a long running one", policy: srf, now: 100, capacity: 100,
			jobs:  []Job{withExpected(res(1, 0, 60, 0, 0), 3600, 100), withExpected(wt(2, 0, 60, 50, 50), 60, 0)},
			evict: []int{1}, admit: []int{2}, wait: []int{1}},
		{desc: "srf: no preemption when the gain is within the margin of the switch's cost", policy: srf, now: 100, capacity: 100,
			// remaining 64 s vs 60 s: gain 4 s < 2 × (2 × 1.25 s + 1.25 s) = 7.5 s.
			jobs: []Job{withExpected(res(1, 0, 60, 0, 0), 164, 100), withExpected(wt(2, 0, 60, 50, 50), 60, 0)},
			wait: []int{2}},
		{desc: "srf: a job without a duration is not preempted by its class", policy: srf, now: 100, capacity: 100,
			jobs: []Job{res(1, 0, 60, 0, 0), withExpected(wt(2, 0, 60, 50, 50), 10, 0)},
			wait: []int{2}},
		{desc: "srf: no durations at all: first come first served", policy: srf, capacity: 100,
			jobs:  []Job{res(1, 0, 50, 0, 0), wt(3, 0, 50, 2, 2), wt(2, 0, 50, 1, 1)},
			admit: []int{2}, wait: []int{3}},
		{desc: "srf: a job without a duration is ranked as a typical one of its class", policy: srf, capacity: 100,
			jobs: []Job{
				withExpected(wt(1, 0, 60, 0, 0), 1000, 0), wt(2, 0, 60, 1, 1), // 2 is taken for the median, 300 s
				withExpected(wt(3, 0, 60, 2, 2), 300, 0), withExpected(wt(4, 0, 60, 3, 3), 100, 0)},
			admit: []int{4}, wait: []int{2, 3, 1}},
		{desc: "pinned: takes memory from its own priority, whatever the policy's order", policy: fair, now: 5, capacity: 100,
			jobs:  []Job{res(1, 0, 60, 0, 0), pinned(res(2, 0, 60, 4, 4))},
			evict: []int{1}, wait: []int{1}, recheck: 54},
		{desc: "pinned: never from a higher priority", policy: srf, capacity: 100,
			jobs: []Job{res(1, 5, 60, 0, 0), pinned(res(2, 0, 60, 4, 4))},
			wait: []int{2}},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			p := tc.policy.Plan(at(tc.now), tc.capacity*gib, tc.jobs)
			require.Equal(t, tc.evict, p.Evict, "evict")
			require.Equal(t, tc.admit, p.Admit, "admit")
			require.Equal(t, tc.wait, p.Wait, "wait")
			if tc.recheck == 0 {
				require.True(t, p.Recheck.IsZero(), "recheck %v", p.Recheck)
			} else {
				require.Equal(t, at(tc.recheck), p.Recheck, "recheck")
			}
			require.NoError(t, checkPlan(tc.capacity*gib, tc.jobs, p))
		})
	}
}

func TestNew(t *testing.T) {
	for _, n := range Names() {
		p, err := New(n, Config{})
		require.NoError(t, err)
		require.Equal(t, n, p.Name())
	}
	_, err := New("lottery", Config{})
	require.ErrorIs(t, err, ErrUnknownPolicy)
}

func TestCostAndQuantum(t *testing.T) {
	// 16.03 GiB: 0.35 s; the H200 measured 0.33 s out (request to free) and 0.35 s in.
	require.InDelta(t, 0.35, DefaultCost.Swap(16030*gib/1000).Seconds(), 0.01)
	f := NewFair(Config{})
	for _, g := range []int64{1, 12, 60, 140} {
		q := f.Quantum(g * gib)
		require.GreaterOrEqual(t, q, 20*2*DefaultCost.Swap(g*gib), "%d GiB", g)
		require.GreaterOrEqual(t, q, 10*time.Second)
	}
}
