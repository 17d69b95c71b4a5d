package sched

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Job is one job on a device as a policy sees it (a copy).
type Job struct {
	// ID names the job (the daemon uses the pid).
	ID       int
	Priority int
	// Bytes is the device memory the job needs to run.
	Bytes int64
	// Submitted is when the job arrived.
	Submitted time.Time
	// Expected is the job's declared run time on the device alone (0:
	// unknown).
	Expected time.Duration
	// Used is the GPU time the job has had: how long it has been resident and
	// running.
	Used time.Duration
	// Resident: its memory is on the device now.
	Resident bool
	// Since is when the job last switched in (Resident) or out (waiting);
	// Submitted when it never switched.
	Since time.Time
	// Pinned: the job must be resident after the plan.
	Pinned bool
}

// Remaining is the expected run time left (never negative) and whether it is
// known.
func (j Job) Remaining() (time.Duration, bool) {
	if j.Expected <= 0 {
		return 0, false
	}
	return max(j.Expected-j.Used, 0), true
}

// Plan is a policy's answer: which jobs should be resident.
type Plan struct {
	// Run is every job resident after the plan, Wait every other one; both in
	// the policy's order of preference.
	Run, Wait []int
	// Evict are the resident jobs to swap out, in the order chosen; Admit the
	// waiting ones to bring in, in order. A caller swaps Evict out before it
	// brings Admit in.
	Evict, Admit []int
	// Recheck is when the policy wants to be asked again even if nothing
	// happens (a quantum ends); zero: only on events.
	Recheck time.Time
}

// Policy decides which jobs of one device are resident. Implementations are
// pure and safe for concurrent use.
type Policy interface {
	// Name is the policy's flag value.
	Name() string
	// Plan decides, at now, which of jobs are resident on a device whose jobs
	// may hold capacity bytes in all. It never plans more than capacity
	// except for pinned jobs that do not fit even alone (they are left in
	// Wait; the caller refuses them).
	Plan(now time.Time, capacity int64, jobs []Job) Plan
}

// Cost is the cost of moving a job's memory between device and host: Fixed
// per swap plus the bytes at Bandwidth.
type Cost struct {
	// Bandwidth is in bytes per second.
	Bandwidth float64
	Fixed     time.Duration
}

// DefaultCost is libmigswap.so's swap as measured on the H200
// (shim/RESULTS-H200.md: 16 GiB out at 49.2 GiB/s, in at 45.5 GiB/s, request
// to memory free 0.33 s; 2 GiB freed in 0.046 s): 47 GiB/s and 10 ms per swap
// for quiescing the process and mapping. A process's very first swap-out also
// pins its host arena (seconds per GiB on a fresh VM unless MIGSWAP_PREPIN=1);
// the model leaves that out.
var DefaultCost = Cost{Bandwidth: 47 << 30, Fixed: 10 * time.Millisecond}

// Swap is the time to swap bytes out (or in).
func (c Cost) Swap(bytes int64) time.Duration {
	d := c.Fixed
	if c.Bandwidth > 0 {
		d += time.Duration(float64(bytes) / c.Bandwidth * float64(time.Second))
	}
	return d
}

// Config tunes the policies. The zero value takes the defaults.
type Config struct {
	// Cost is the swap cost model (zero: DefaultCost).
	Cost Cost
	// Quantum is fair's shortest quantum (default 10 s).
	Quantum time.Duration
	// QuantumFactor: fair's quantum is at least this many times the cost of
	// switching the class's largest job out and back in (default 20).
	QuantumFactor float64
	// Margin: srf swaps a running job out for a shorter one only when the
	// difference in remaining time exceeds Margin times the switch's cost
	// (default 2).
	Margin float64
}

func (c Config) withDefaults() Config {
	if c.Cost == (Cost{}) {
		c.Cost = DefaultCost
	}
	if c.Quantum <= 0 {
		c.Quantum = 10 * time.Second
	}
	if c.QuantumFactor <= 0 {
		c.QuantumFactor = 20
	}
	if c.Margin <= 0 {
		c.Margin = 2
	}
	return c
}

// Policy names, the values of `migctl daemon --policy`.
const (
	NamePriority = "priority"
	NameFair     = "fair"
	NameSRF      = "srf"
)

// Names lists the policies.
func Names() []string { return []string{NamePriority, NameFair, NameSRF} }

// ErrUnknownPolicy: New was given a name that is not in Names.
var ErrUnknownPolicy = errors.New("unknown scheduling policy")

// New returns the policy called name.
func New(name string, cfg Config) (Policy, error) {
	cfg = cfg.withDefaults()
	switch name {
	case NamePriority:
		return Priority{}, nil
	case NameFair:
		return &Fair{cfg: cfg}, nil
	case NameSRF:
		return &SRF{cfg: cfg}, nil
	}
	return nil, fmt.Errorf("%q (want %s): %w", name, strings.Join(Names(), ", "), ErrUnknownPolicy)
}

// Priority is today's policy: strict priority, first come first served within
// a priority, no preemption among equals.
type Priority struct{}

var _ Policy = Priority{}

// Name is "priority".
func (Priority) Name() string { return NamePriority }

// Plan implements Policy.
func (Priority) Plan(now time.Time, capacity int64, jobs []Job) Plan {
	return plan(now, capacity, jobs, rules{
		waitBefore:   fifo,
		victimBefore: func(a, b Job) bool { return lifo(a, b) },
	})
}

// Fair is round robin among the jobs of one priority that do not all fit,
// priority between priorities.
type Fair struct{ cfg Config }

var _ Policy = (*Fair)(nil)

// NewFair returns the fair policy.
func NewFair(cfg Config) *Fair { return &Fair{cfg: cfg.withDefaults()} }

// Name is "fair".
func (*Fair) Name() string { return NameFair }

// Quantum is the quantum of a class whose largest job holds bytes: at least
// Config.Quantum and QuantumFactor times the cost of swapping that job out
// and in.
func (f *Fair) Quantum(bytes int64) time.Duration {
	sw := 2 * f.cfg.Cost.Swap(bytes)
	return max(f.cfg.Quantum, time.Duration(math.Ceil(f.cfg.QuantumFactor*float64(sw))))
}

// Plan implements Policy.
func (f *Fair) Plan(now time.Time, capacity int64, jobs []Job) Plan {
	largest := map[int]int64{}
	for _, j := range jobs {
		largest[j.Priority] = max(largest[j.Priority], j.Bytes)
	}
	q := func(j Job) time.Duration { return f.Quantum(largest[j.Priority]) }
	var recheck time.Time
	soon := func(t time.Time) {
		if t.After(now) && (recheck.IsZero() || t.Before(recheck)) {
			recheck = t
		}
	}
	p := plan(now, capacity, jobs, rules{
		// The job that has waited longest first.
		waitBefore: func(a, b Job) bool {
			if !a.Since.Equal(b.Since) {
				return a.Since.Before(b.Since)
			}
			return fifo(a, b)
		},
		// A resident job gives way once it has had its quantum.
		evictable: func(_, r Job) bool { return now.Sub(r.Since) >= q(r) },
		// The one that has been in longest first.
		victimBefore: func(a, b Job) bool {
			if !a.Since.Equal(b.Since) {
				return a.Since.Before(b.Since)
			}
			return lifo(a, b)
		},
		starving: func(w Job) bool { return now.Sub(w.Since) >= q(w) },
	})
	// Ask again when a quantum ends while someone of its class waits, or when
	// a waiting job would start starving.
	waiting := map[int]bool{}
	byID := map[int]Job{}
	for _, j := range jobs {
		byID[j.ID] = j
	}
	evicted := map[int]bool{}
	for _, id := range p.Evict {
		evicted[id] = true
	}
	for _, id := range p.Wait {
		w := byID[id]
		waiting[w.Priority] = true
		since := w.Since
		if evicted[id] {
			since = now // it starts waiting now
		}
		soon(since.Add(q(w)))
	}
	for _, id := range p.Run {
		r := byID[id]
		if waiting[r.Priority] {
			since := r.Since
			if !r.Resident {
				since = now // admitted now: its quantum starts with it
			}
			soon(since.Add(q(r)))
		}
	}
	p.Recheck = recheck
	return p
}

// SRF is shortest remaining first among the jobs of one priority, priority
// between priorities.
type SRF struct{ cfg Config }

var _ Policy = (*SRF)(nil)

// NewSRF returns the shortest-remaining-first policy.
func NewSRF(cfg Config) *SRF { return &SRF{cfg: cfg.withDefaults()} }

// Name is "srf".
func (*SRF) Name() string { return NameSRF }

// Plan implements Policy.
func (s *SRF) Plan(now time.Time, capacity int64, jobs []Job) Plan {
	rem := estimates(jobs)
	before := func(a, b Job) bool {
		if rem[a.ID] != rem[b.ID] {
			return rem[a.ID] < rem[b.ID]
		}
		return fifo(a, b)
	}
	return plan(now, capacity, jobs, rules{
		waitBefore: before,
		evictable: func(w, r Job) bool {
			rw, okw := w.Remaining()
			rr, okr := r.Remaining()
			if !okw || !okr {
				return false // a guess never preempts nor is preempted
			}
			cost := 2*s.cfg.Cost.Swap(r.Bytes) + s.cfg.Cost.Swap(w.Bytes)
			return float64(rr-rw) > s.cfg.Margin*float64(cost)
		},
		// The longest remaining first.
		victimBefore: func(a, b Job) bool { return before(b, a) },
	})
}

// estimates is the remaining time srf ranks each job by: its own when it
// declared a duration; otherwise the median declared duration of the jobs of
// its priority on the device less what it has run (a job that says nothing is
// taken for a typical one), or, when none declared one, 0 for all of them
// (first come, first served).
func estimates(jobs []Job) map[int]time.Duration {
	declared := map[int][]time.Duration{}
	for _, j := range jobs {
		if j.Expected > 0 {
			declared[j.Priority] = append(declared[j.Priority], j.Expected)
		}
	}
	rem := make(map[int]time.Duration, len(jobs))
	for _, j := range jobs {
		if r, ok := j.Remaining(); ok {
			rem[j.ID] = r
			continue
		}
		if d := declared[j.Priority]; len(d) > 0 {
			slices.Sort(d)
			rem[j.ID] = max(d[len(d)/2]-j.Used, 0)
		}
	}
	return rem
}

// fifo orders by submission, then id.
func fifo(a, b Job) bool {
	if !a.Submitted.Equal(b.Submitted) {
		return a.Submitted.Before(b.Submitted)
	}
	return a.ID < b.ID
}

// lifo is the reverse of fifo: most recently submitted first.
func lifo(a, b Job) bool { return fifo(b, a) }
