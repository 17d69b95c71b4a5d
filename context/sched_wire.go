package ctxmgr

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/migctl/migctl/context/sched"
)

// EnvExpected is the environment variable a shimmed process declares its
// expected run time with (a Go duration, "90m", or seconds): the srf policy
// ranks by the time left. The daemon reads it from /proc/PID/environ.
const EnvExpected = "MIGSWAP_EXPECTED"

// Scheduler runs a job-switching policy of package sched (fair, srf) over
// the shimmed processes of each device, in place of the priority policy
// (PlanNeed, PlanSwapIn). Set it as Options.Sched. The Manager consults it
// under its policy lock: for a need (the requester is pinned: it must get its
// memory now, from processes the policy ranks below it, never from a higher
// priority) and at every rebalance (the plan's swap-outs, then its swap-ins),
// and it kicks a rebalance when the plan asks to be consulted again (a
// quantum ends). A process's GPU time is the time the Manager has seen it
// running. Safe for concurrent use.
type Scheduler struct {
	policy   sched.Policy
	expected func(Process) (time.Duration, bool)

	mu    sync.Mutex
	acct  map[int]*usage
	timer *time.Timer
	at    time.Time
}

// usage is what the Scheduler remembers of one process.
type usage struct {
	running  bool
	since    time.Time // last switch in or out (first sight: Started)
	last     time.Time // last observation
	used     time.Duration
	expected time.Duration
	looked   bool
}

// SchedulerOption configures a Scheduler.
type SchedulerOption func(*Scheduler)

// WithExpected replaces how a process's declared duration is found (default:
// MIGSWAP_EXPECTED in /proc/PID/environ). f is called once per process.
func WithExpected(f func(Process) (time.Duration, bool)) SchedulerOption {
	return func(s *Scheduler) { s.expected = f }
}

// NewScheduler returns a Scheduler running p.
func NewScheduler(p sched.Policy, opts ...SchedulerOption) *Scheduler {
	s := &Scheduler{policy: p, expected: expectedFromEnviron, acct: map[int]*usage{}}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Policy is the policy the Scheduler runs.
func (s *Scheduler) Policy() sched.Policy { return s.policy }

// expectedFromEnviron reads EnvExpected from the process's environment (the
// host pid: PeerPID when the shim is in a pid namespace).
func expectedFromEnviron(p Process) (time.Duration, bool) {
	pid := p.PID
	if p.PeerPID != 0 {
		pid = p.PeerPID
	}
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "environ"))
	if err != nil {
		return 0, false
	}
	for _, kv := range bytes.Split(b, []byte{0}) {
		if v, ok := strings.CutPrefix(string(kv), EnvExpected+"="); ok {
			return ParseExpected(v)
		}
	}
	return 0, false
}

// ParseExpected parses a declared duration: a Go duration ("90m", "1h30m")
// or a number of seconds. It reports false for anything else or a duration
// that is not positive.
func ParseExpected(v string) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	d, err := time.ParseDuration(v)
	if err != nil {
		f, ferr := strconv.ParseFloat(v, 64)
		if ferr != nil {
			return 0, false
		}
		d = time.Duration(f * float64(time.Second))
	}
	return d, d > 0
}

// observe brings the accounts up to now from the registry: running time is
// added for processes that were running at the last observation; a change
// between running and not is a switch (since = now).
func (s *Scheduler) observe(now time.Time, procs []Process) {
	s.mu.Lock()
	defer s.mu.Unlock()
	seen := map[int]bool{}
	for _, p := range procs {
		seen[p.PID] = true
		// A process that holds nothing yet (connected, not allocated) is
		// not using the device: its first quantum starts with its memory.
		running := p.State == Running && p.Bytes > 0
		u, ok := s.acct[p.PID]
		if !ok {
			u = &usage{running: running, since: p.Started, last: p.Started}
			s.acct[p.PID] = u
		}
		if !u.looked {
			u.expected, _ = s.expected(p)
			u.looked = true
		}
		if u.running && now.After(u.last) {
			u.used += now.Sub(u.last)
		}
		if running != u.running {
			u.running, u.since = running, now
		}
		u.last = now
	}
	for pid := range s.acct {
		if !seen[pid] {
			delete(s.acct, pid)
		}
	}
}

// jobs is device's processes as the policy sees them, and the memory they
// may hold in all (free memory, less reservations, plus what they hold).
// busy reports a swap in flight on the device.
func (s *Scheduler) jobs(s0 Snapshot, device string) (jobs []sched.Job, capacity int64, busy bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	capacity = s0.Free[device]
	for _, p := range s0.Procs {
		if p.Device != device {
			continue
		}
		capacity += p.GPUBytes()
		swapping := p.State == SwappingOut || p.State == SwappingIn
		busy = busy || swapping
		switch {
		case p.Hold && !p.State.Resident(), // held out by an operator
			p.State == Blocked && p.BlockedEpoch >= s0.Epoch, // no memory freed since its swap-in failed
			p.Bytes <= 0 && !p.Waiting:
			continue
		}
		u := s.acct[p.PID]
		if u == nil {
			u = &usage{since: p.Started}
		}
		jobs = append(jobs, sched.Job{ID: p.PID, Priority: p.Priority, Bytes: p.Bytes, Submitted: p.Started,
			Expected: u.expected, Used: u.used, Resident: p.State.Resident(), Since: u.since,
			Pinned: swapping || (p.Waiting && p.State.Resident()) || (p.Hold && p.State.Resident())})
	}
	return jobs, capacity, busy
}

// recheckAt arranges for kick to run at t (zero: never), replacing the last
// arrangement.
func (s *Scheduler) recheckAt(t, now time.Time, kick func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t.Equal(s.at) && s.timer != nil {
		return
	}
	if s.timer != nil {
		s.timer.Stop()
		s.timer = nil
	}
	s.at = t
	if t.IsZero() {
		return
	}
	s.timer = time.AfterFunc(t.Sub(now)+10*time.Millisecond, kick)
}

// planNeed is the need policy: PlanNeed without a Scheduler; otherwise the
// Scheduler's policy with the requester pinned.
func (m *Manager) planNeed(s Snapshot, r Request) Decision {
	sc := m.opts.Sched
	if sc == nil {
		return PlanNeed(s, r)
	}
	free := s.Free[r.Device]
	d := Decision{Free: free}
	if r.Bytes <= free {
		d.Granted = true
		return d
	}
	now := m.opts.Now()
	sc.observe(now, s.Procs)
	jobs, capacity, _ := sc.jobs(s, r.Device)
	id := r.PID
	if id == 0 {
		id = -1 // a reservation for a job without the shim
	}
	found := false
	for i := range jobs {
		if jobs[i].ID == id {
			jobs[i].Pinned = true
			jobs[i].Bytes += r.Bytes
			found = true
		}
	}
	if !found {
		jobs = append(jobs, sched.Job{ID: id, Priority: r.Priority, Bytes: r.Bytes, Submitted: now, Since: now, Pinned: true})
	}
	byID := map[int]sched.Job{}
	for _, j := range jobs {
		byID[j.ID] = j
	}
	plan := sc.policy.Plan(now, capacity, jobs)
	for _, w := range plan.Wait {
		if w == id {
			var higher int64
			for _, j := range jobs {
				if j.ID != id && j.Priority > r.Priority && j.Resident {
					higher += j.Bytes
				}
			}
			d.Reason = fmt.Sprintf("need %s on device %q: %s free; the %s policy cannot free enough (processes of priority > %d, or waiting for memory themselves, hold %s)",
				FormatBytes(r.Bytes), r.Device, FormatBytes(free), sc.policy.Name(), r.Priority, FormatBytes(higher))
			return d
		}
	}
	for _, v := range plan.Evict {
		if free+d.Freed >= r.Bytes {
			break
		}
		d.Victims = append(d.Victims, v)
		d.Freed += byID[v].Bytes
	}
	d.Granted = free+d.Freed >= r.Bytes
	if !d.Granted {
		d.Reason = fmt.Sprintf("need %s on device %q: %s free; the %s policy's plan frees only %s", FormatBytes(r.Bytes), r.Device,
			FormatBytes(free), sc.policy.Name(), FormatBytes(d.Freed))
		d.Victims, d.Freed = nil, 0
		return d
	}
	sc.switchedIn(r.PID, now)
	return d
}

// switchedIn records that pid got its memory at now (its quantum starts).
func (s *Scheduler) switchedIn(pid int, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if u, ok := s.acct[pid]; ok {
		u.running, u.since, u.last = true, now, now
	}
}

// reconcile applies the Scheduler's plan for every device (Rebalance with a
// Scheduler; the policy lock is held): the plan's swap-outs, then those of
// its swap-ins that fit once they are done. It arranges the next rebalance
// at the plan's recheck time.
func (m *Manager) reconcile(ctx context.Context, s Snapshot) error {
	sc := m.opts.Sched
	now := m.opts.Now()
	sc.observe(now, s.Procs)
	devs := map[string]bool{}
	for _, p := range s.Procs {
		devs[p.Device] = true
	}
	names := make([]string, 0, len(devs))
	for d := range devs {
		names = append(names, d)
	}
	sort.Strings(names)
	var evict, admit []int
	var recheck time.Time
	for _, dev := range names {
		jobs, capacity, busy := sc.jobs(s, dev)
		if busy {
			continue // a swap the policy did not finish waiting for: decide once it ends
		}
		p := sc.policy.Plan(now, capacity, jobs)
		evict = append(evict, p.Evict...)
		admit = append(admit, p.Admit...)
		if !p.Recheck.IsZero() && (recheck.IsZero() || p.Recheck.Before(recheck)) {
			recheck = p.Recheck
		}
	}
	sc.recheckAt(recheck, now, m.Kick)
	if len(evict)+len(admit) == 0 {
		return nil
	}
	m.log.Info("policy switch", "policy", sc.policy.Name(), "out", evict, "in", admit)
	ctx, cancel := context.WithTimeout(ctx, m.opts.SwapTimeout)
	defer cancel()
	var errs []error
	fail := func(results []Result) {
		for _, r := range results {
			if !r.OK {
				errs = append(errs, fmt.Errorf("pid %d %s: %s", r.PID, r.Direction, r.Error))
			}
		}
	}
	if len(evict) > 0 {
		fail(m.swapAll(ctx, SwapOut, evict, false, nil))
	}
	if len(admit) > 0 {
		s2, err := m.snapshot(ctx, "")
		if err != nil {
			return errors.Join(append(errs, err)...)
		}
		state := map[int]Process{}
		for _, p := range s2.Procs {
			state[p.PID] = p
		}
		var in []int
		for _, pid := range admit {
			p, ok := state[pid]
			if ok && (p.State == Out || p.State == Blocked) && p.Bytes <= s2.Free[p.Device] {
				s2.Free[p.Device] -= p.Bytes
				in = append(in, pid)
			}
		}
		if len(in) > 0 {
			results := m.swapAll(ctx, SwapIn, in, false, nil)
			m.noteBlocked(results, s2.Epoch)
			fail(results)
		}
	}
	if s3, err := m.snapshot(ctx, ""); err == nil {
		sc.observe(m.opts.Now(), s3.Procs) // the switches happened now
	}
	return errors.Join(errs...)
}
