package ctxmgr

import (
	"fmt"
	"sort"
)

// Snapshot is what the policy decides over: the free memory of each device
// (already less any reservations) and the shimmed processes. Epoch counts the
// events that freed memory so far (see Process.BlockedEpoch).
type Snapshot struct {
	Free  map[string]int64
	Procs []Process
	Epoch uint64
}

// Request asks for Bytes on Device for a process (PID, 0 for a non-shimmed
// job) of the given Priority.
type Request struct {
	PID      int
	Device   string
	Bytes    int64
	Priority int
}

// Decision is the policy's answer to a Request.
type Decision struct {
	// Granted: the request fits once Victims are swapped out.
	Granted bool
	// Victims are the pids to swap out, in the order chosen.
	Victims []int
	// Free is the free memory the decision started from; Freed what the
	// victims hold.
	Free, Freed int64
	// Reason explains a denial.
	Reason string
}

// PlanNeed is the priority policy's answer to a need (the daemon's default;
// with Options.Sched, the Scheduler's policy answers instead). It decides how
// to satisfy r. If r fits in free memory, it is granted
// with no victims. Otherwise candidates are the running processes on r's
// device with a strictly lower priority than r (not r's own process, not one
// that is itself waiting on a need), taken lowest priority first, then most
// recently started, then highest pid, until the freed bytes make r fit. If all
// of them together cannot, r is denied with the reason and no victims.
func PlanNeed(s Snapshot, r Request) Decision {
	free := s.Free[r.Device]
	d := Decision{Free: free}
	if r.Bytes <= free {
		d.Granted = true
		return d
	}
	var cands []Process
	var sameOrHigher int64
	for _, p := range s.Procs {
		if p.Device != r.Device || p.PID == r.PID || p.State != Running || p.Bytes <= 0 {
			continue
		}
		if p.Priority >= r.Priority || p.Waiting {
			sameOrHigher += p.Bytes
			continue
		}
		cands = append(cands, p)
	}
	sort.SliceStable(cands, func(i, j int) bool {
		a, b := cands[i], cands[j]
		if a.Priority != b.Priority {
			return a.Priority < b.Priority
		}
		if !a.Started.Equal(b.Started) {
			return a.Started.After(b.Started)
		}
		return a.PID > b.PID
	})
	for _, p := range cands {
		d.Victims = append(d.Victims, p.PID)
		d.Freed += p.Bytes
		if free+d.Freed >= r.Bytes {
			d.Granted = true
			return d
		}
	}
	d.Reason = fmt.Sprintf("need %s on device %q: %s free, lower-priority jobs (priority < %d) hold %s; %s more is held by processes of priority >= %d or not running",
		FormatBytes(r.Bytes), r.Device, FormatBytes(free), r.Priority, FormatBytes(d.Freed), FormatBytes(sameOrHigher), r.Priority)
	d.Victims, d.Freed = nil, 0
	return d
}

// PlanSwapIn picks the swapped-out processes to bring back: those out or
// blocked and not held by an operator (a blocked one only when memory was
// freed since its last swap-in failed: BlockedEpoch < Epoch), highest priority first, then oldest
// (earliest started), then lowest pid; each is taken if its bytes fit in what
// is still free on its device (a bigger one does not stop a smaller one behind
// it). It returns their pids in that order.
func PlanSwapIn(s Snapshot) []int {
	var cands []Process
	for _, p := range s.Procs {
		if (p.State == Out || p.State == Blocked) && !p.Hold {
			cands = append(cands, p)
		}
	}
	sort.SliceStable(cands, func(i, j int) bool {
		a, b := cands[i], cands[j]
		if a.Priority != b.Priority {
			return a.Priority > b.Priority
		}
		if !a.Started.Equal(b.Started) {
			return a.Started.Before(b.Started)
		}
		return a.PID < b.PID
	})
	free := make(map[string]int64, len(s.Free))
	for d, f := range s.Free {
		free[d] = f
	}
	var in []int
	for _, p := range cands {
		if p.State == Blocked && p.BlockedEpoch >= s.Epoch {
			continue
		}
		if p.Bytes <= free[p.Device] {
			free[p.Device] -= p.Bytes
			in = append(in, p.PID)
		}
	}
	return in
}

// FormatBytes renders n in binary units (e.g. "1.5 GiB").
func FormatBytes(n int64) string {
	const unit = 1024
	if n < unit && n > -unit {
		return fmt.Sprintf("%d B", n)
	}
	f := float64(n)
	for _, u := range []string{"KiB", "MiB", "GiB", "TiB"} {
		f /= unit
		if f < unit && f > -unit {
			return fmt.Sprintf("%.1f %s", f, u)
		}
	}
	return fmt.Sprintf("%.1f PiB", f/unit)
}

func sortedKeys(m map[string]int64) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
