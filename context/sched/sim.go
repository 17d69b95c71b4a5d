package sched

import (
	"fmt"
	"math"
	"sort"
	"time"
)

// SimConfig configures Simulate.
type SimConfig struct {
	// Cost is the swap cost model (zero: DefaultCost). Give the policy the
	// same one.
	Cost Cost
	// Stop ends the simulation at this time if not all jobs have finished
	// (0: run until they have); unfinished jobs have no JCT.
	Stop time.Duration
	// PinArrivals models the daemon's need path instead of a queue: a job
	// that arrives is pinned in the next plan (it gets its memory at once
	// from jobs of its priority or lower, as a process whose allocation
	// failed does under fair and srf) and takes its turn from then on. One
	// that cannot get memory so (higher priorities hold it) waits as usual,
	// where the daemon would fail its allocation.
	PinArrivals bool
	// Check, when set, is called after every event with the device's state;
	// an error stops the simulation and is returned.
	Check func(SimState) error
	// CheckPlan, when set, is called with every plan the policy makes and the
	// jobs it was made over; an error stops the simulation.
	CheckPlan func(now time.Duration, capacity int64, jobs []Job, p Plan) error
}

// SimState is the device during a simulation.
type SimState struct {
	Now      time.Duration
	Capacity int64
	Jobs     []SimJob
}

// SimJob is one arrived, unfinished job during a simulation.
type SimJob struct {
	ID       int
	Priority int
	Bytes    int64
	State    JobState
	Used     time.Duration
}

// JobState is where a simulated job is.
type JobState string

// The states of a simulated job. Only the first four hold device memory.
const (
	StateRunning     JobState = "running"
	StateSwappingOut JobState = "swapping-out"
	StateSwappingIn  JobState = "swapping-in"
	StateStarting    JobState = "starting" // admitted, memory held, the switch before it not yet over
	StateWaiting     JobState = "waiting"
	StateQueued      JobState = "queued" // admitted, waiting for the swap-outs before it
)

// InMemory reports whether a job in state s holds device memory.
func (s JobState) InMemory() bool {
	switch s {
	case StateRunning, StateSwappingOut, StateSwappingIn, StateStarting:
		return true
	}
	return false
}

// JobResult is one job's outcome.
type JobResult struct {
	ID       int
	Name     string
	Kind     string
	Priority int
	Arrival  time.Duration
	// Start is when it first ran; Finish when it ended (0: not finished).
	Start, Finish time.Duration
	// JCT is Finish − Arrival.
	JCT time.Duration
	// GPUTime is how long it was resident and running.
	GPUTime time.Duration
	// Switches counts its swap-outs.
	Switches int
	// LongestWait is its longest stretch waiting (or being switched) after
	// arriving and before finishing.
	LongestWait time.Duration
}

// Result is a policy's outcome on a mix.
type Result struct {
	Policy string
	Jobs   []JobResult
	// AvgJCT and P95JCT are over the finished jobs (p95: nearest rank).
	AvgJCT, P95JCT time.Duration
	// AvgJCTByKind is the average JCT of each kind of job.
	AvgJCTByKind map[string]time.Duration
	// Makespan is from the first arrival to the last finish.
	Makespan time.Duration
	// Utilization is the device's busy compute over the makespan: the
	// integral of min(1, sum of the running jobs' compute shares).
	Utilization float64
	// Switches counts swap-outs; SwapTime is how long the host link was busy
	// with swaps.
	Switches int
	SwapTime time.Duration
}

type simJob struct {
	spec     MixJob
	bytes    int64
	arrived  bool
	done     bool
	state    JobState
	work     float64 // solo seconds left
	used     float64 // seconds resident and running
	since    float64 // last switch (or arrival)
	hasRun   bool
	pin      bool
	at, end  float64 // queued: when the switch-in starts; swapping: when it ends
	started  bool
	start    float64
	finish   float64
	switches int
	waitFrom float64 // when its current wait began (-1: not waiting)
	maxWait  float64
}

const eps = 1e-9

// Simulate runs mix under p with the cost model of cfg. It returns an error
// for an invalid mix, a job that can never run, or a failed check.
func Simulate(mix Mix, p Policy, cfg SimConfig) (Result, error) {
	if err := mix.Validate(); err != nil {
		return Result{}, err
	}
	if cfg.Cost == (Cost{}) {
		cfg.Cost = DefaultCost
	}
	base := time.Unix(0, 0).UTC()
	capacity := mix.Device.Capacity()
	jobs := make([]*simJob, len(mix.Jobs))
	for i, s := range mix.Jobs {
		jobs[i] = &simJob{spec: s, bytes: s.Bytes(), work: s.DurationS, waitFrom: -1}
	}
	sort.SliceStable(jobs, func(a, b int) bool { return jobs[a].spec.ArrivalS < jobs[b].spec.ArrivalS })
	stop := math.Inf(1)
	if cfg.Stop > 0 {
		stop = cfg.Stop.Seconds()
	}
	var (
		now      float64
		replan   = true
		recheck  = math.Inf(1)
		busy     float64
		swapTime float64
		res      = Result{Policy: p.Name()}
	)
	at := func(s float64) time.Time { return base.Add(seconds(s)) }
	state := func() SimState {
		st := SimState{Now: seconds(now), Capacity: capacity}
		for _, j := range jobs {
			if j.arrived && !j.done {
				st.Jobs = append(st.Jobs, SimJob{ID: j.spec.ID, Priority: j.spec.Priority, Bytes: j.bytes, State: j.state, Used: seconds(j.used)})
			}
		}
		return st
	}
	switching := func() bool {
		for _, j := range jobs {
			if j.arrived && !j.done && j.state != StateRunning && j.state != StateWaiting {
				return true
			}
		}
		return false
	}
	wait := func(j *simJob) {
		if j.waitFrom < 0 {
			j.waitFrom = now
		}
	}
	unwait := func(j *simJob) {
		if j.waitFrom >= 0 {
			j.maxWait = max(j.maxWait, now-j.waitFrom)
			j.waitFrom = -1
		}
	}
	for iter := 0; ; iter++ {
		if iter > 2_000_000 {
			return res, fmt.Errorf("simulation of %s did not end after %d events", p.Name(), iter)
		}
		// Decide when no switch is in flight (the daemon serialises them).
		if replan && !switching() {
			replan = false
			recheck = math.Inf(1)
			var view []Job
			byID := map[int]*simJob{}
			for _, j := range jobs {
				if !j.arrived || j.done {
					continue
				}
				byID[j.spec.ID] = j
				var expected time.Duration
				if j.spec.Declares {
					expected = seconds(j.spec.DurationS)
				}
				view = append(view, Job{ID: j.spec.ID, Priority: j.spec.Priority, Bytes: j.bytes,
					Submitted: at(j.spec.ArrivalS), Expected: expected, Used: seconds(j.used),
					Resident: j.state == StateRunning, Since: at(j.since), Pinned: j.pin && j.state == StateWaiting})
			}
			pl := p.Plan(at(now), capacity, view)
			if cfg.CheckPlan != nil {
				if err := cfg.CheckPlan(seconds(now), capacity, view, pl); err != nil {
					return res, fmt.Errorf("plan at %.3f s: %w", now, err)
				}
			}
			if !pl.Recheck.IsZero() {
				recheck = pl.Recheck.Sub(base).Seconds()
			}
			t := now
			for _, id := range pl.Evict {
				j := byID[id]
				if j == nil || j.state != StateRunning {
					return res, fmt.Errorf("%s evicts job %d, which is not running", p.Name(), id)
				}
				t += cfg.Cost.Swap(j.bytes).Seconds()
				j.state, j.end = StateSwappingOut, t
				j.switches++
				res.Switches++
				wait(j)
			}
			outsEnd := t
			admit := pl.Admit
			for _, id := range pl.Run {
				if j := byID[id]; j.pin && j.state == StateWaiting {
					admit = append(admit, id)
				}
			}
			for _, j := range byID {
				j.pin = false
			}
			for _, id := range admit {
				j := byID[id]
				if j == nil || j.state != StateWaiting {
					return res, fmt.Errorf("%s admits job %d, which is not waiting", p.Name(), id)
				}
				j.state, j.at, j.end = StateQueued, outsEnd, outsEnd
				if j.hasRun { // a job that never ran has nothing to swap in
					t += cfg.Cost.Swap(j.bytes).Seconds()
					j.end = t
				}
			}
			swapTime += t - now
		}
		// Start the switch-ins whose turn has come.
		for _, j := range jobs {
			if j.arrived && !j.done && j.state == StateQueued && j.at <= now+eps {
				j.state = StateStarting
				if j.hasRun {
					j.state = StateSwappingIn
				}
			}
		}
		// Wait states end only when the whole switch is over (the daemon's
		// plan is applied as one step).
		if cfg.Check != nil {
			if err := cfg.Check(state()); err != nil {
				return res, fmt.Errorf("at %.3f s: %w", now, err)
			}
		}
		// The next event.
		share := 0.0
		for _, j := range jobs {
			if j.arrived && !j.done && j.state == StateRunning {
				share += j.spec.Compute
			}
		}
		speed := 1 / math.Max(1, share)
		next := math.Min(recheck, stop)
		pending := false
		for _, j := range jobs {
			switch {
			case !j.arrived:
				next = math.Min(next, j.spec.ArrivalS)
				pending = true
			case j.done:
			case j.state == StateRunning:
				next = math.Min(next, now+j.work/speed)
			case j.state == StateQueued:
				next = math.Min(next, j.at)
			case j.state == StateSwappingOut, j.state == StateSwappingIn, j.state == StateStarting:
				next = math.Min(next, j.end)
			}
		}
		if math.IsInf(next, 1) {
			var stuck []int
			for _, j := range jobs {
				if !j.done {
					stuck = append(stuck, j.spec.ID)
				}
			}
			if len(stuck) == 0 {
				break
			}
			if !pending {
				return res, fmt.Errorf("%s leaves jobs %v waiting with nothing running and nothing to come", p.Name(), stuck)
			}
		}
		dt := math.Max(0, next-now)
		busy += math.Min(1, share) * dt
		for _, j := range jobs {
			if j.arrived && !j.done && j.state == StateRunning {
				j.work -= speed * dt
				j.used += dt
			}
		}
		now = next
		if now >= stop-eps {
			break
		}
		if now >= recheck-eps {
			recheck = math.Inf(1)
			replan = true
		}
		for _, j := range jobs {
			switch {
			case !j.arrived:
				if j.spec.ArrivalS <= now+eps {
					j.arrived, j.state, j.since = true, StateWaiting, j.spec.ArrivalS
					j.pin = cfg.PinArrivals
					wait(j)
					replan = true
				}
			case j.done:
			case j.state == StateRunning && j.work <= eps*math.Max(1, j.spec.DurationS):
				j.done, j.finish = true, now
				replan = true
			case (j.state == StateSwappingOut) && j.end <= now+eps:
				j.state, j.since, j.hasRun = StateWaiting, now, true
				replan = true
			case (j.state == StateSwappingIn || j.state == StateStarting) && j.end <= now+eps:
				j.state, j.since = StateRunning, now
				if !j.started {
					j.started, j.start = true, now
				}
				unwait(j)
				replan = true
			}
		}
	}
	// Report.
	var jcts []float64
	sum := map[string]float64{}
	count := map[string]int{}
	first, last := math.Inf(1), 0.0
	for _, j := range jobs {
		first = math.Min(first, j.spec.ArrivalS)
		if j.waitFrom >= 0 {
			j.maxWait = max(j.maxWait, now-j.waitFrom)
		}
		r := JobResult{ID: j.spec.ID, Name: j.spec.Name, Kind: j.spec.Kind, Priority: j.spec.Priority,
			Arrival: seconds(j.spec.ArrivalS), GPUTime: seconds(j.used), Switches: j.switches, LongestWait: seconds(j.maxWait)}
		if j.started {
			r.Start = seconds(j.start)
		}
		if j.done {
			r.Finish = seconds(j.finish)
			jct := j.finish - j.spec.ArrivalS
			r.JCT = seconds(jct)
			jcts = append(jcts, jct)
			sum[j.spec.Kind] += jct
			count[j.spec.Kind]++
			last = math.Max(last, j.finish)
		}
		res.Jobs = append(res.Jobs, r)
	}
	sort.Slice(res.Jobs, func(a, b int) bool { return res.Jobs[a].ID < res.Jobs[b].ID })
	if len(jcts) > 0 {
		sort.Float64s(jcts)
		total := 0.0
		for _, x := range jcts {
			total += x
		}
		res.AvgJCT = seconds(total / float64(len(jcts)))
		res.P95JCT = seconds(jcts[int(math.Ceil(0.95*float64(len(jcts))))-1])
		res.AvgJCTByKind = map[string]time.Duration{}
		for k, s := range sum {
			res.AvgJCTByKind[k] = seconds(s / float64(count[k]))
		}
	}
	if cfg.Stop > 0 {
		last = now
	}
	res.Makespan = seconds(last - first)
	if last > first {
		res.Utilization = busy / (last - first)
	}
	res.SwapTime = seconds(swapTime)
	return res, nil
}
