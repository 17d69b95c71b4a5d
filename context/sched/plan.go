package sched

import (
	"sort"
	"time"
)

// rules are what tells the policies apart; plan does the rest.
type rules struct {
	// waitBefore orders the waiting jobs of one priority: first is admitted
	// first.
	waitBefore func(a, b Job) bool
	// evictable says whether waiting job w may take resident r's place when
	// both have the same priority (nil: never). Strictly lower priorities
	// always may be evicted.
	evictable func(w, r Job) bool
	// victimBefore orders the evictable residents of one priority: first is
	// swapped out first.
	victimBefore func(a, b Job) bool
	// starving says whether waiting job w, which does not fit, has waited so
	// long that its priority class admits nobody else until it fits (nil:
	// never).
	starving func(w Job) bool
}

// plan is the admission loop every policy shares. Pinned jobs come first and
// may take memory from any unpinned job of their priority or lower. Then the
// waiting jobs, highest priority first and in waitBefore order within one,
// are admitted when they fit in free memory, or when swapping out residents
// they may evict (lower priorities first, lowest first; then evictable ones of
// their own priority, in victimBefore order) makes them fit; otherwise they
// wait and do not stop a smaller job behind them (unless starving). A job
// admitted by this plan is not evicted by it.
func plan(_ time.Time, capacity int64, jobs []Job, r rules) Plan {
	var pinned, waiting []Job
	resident := map[int]Job{}
	free := capacity
	for _, j := range jobs {
		switch {
		case j.Pinned:
			pinned = append(pinned, j)
		case j.Resident:
			resident[j.ID] = j
			free -= j.Bytes
		default:
			waiting = append(waiting, j)
		}
	}
	sort.SliceStable(pinned, func(a, b int) bool {
		if pinned[a].Priority != pinned[b].Priority {
			return pinned[a].Priority > pinned[b].Priority
		}
		return fifo(pinned[a], pinned[b])
	})
	sort.SliceStable(waiting, func(a, b int) bool {
		if waiting[a].Priority != waiting[b].Priority {
			return waiting[a].Priority > waiting[b].Priority
		}
		return r.waitBefore(waiting[a], waiting[b])
	})

	var p Plan
	admitted := map[int]bool{}
	var run []Job
	// victims returns the residents w may evict, in eviction order.
	victims := func(w Job, anyEqual bool) []Job {
		var v []Job
		for _, x := range resident {
			switch {
			case x.Priority < w.Priority:
				v = append(v, x)
			case x.Priority == w.Priority && (anyEqual || (r.evictable != nil && r.evictable(w, x))):
				v = append(v, x)
			}
		}
		sort.Slice(v, func(a, b int) bool {
			if v[a].Priority != v[b].Priority {
				return v[a].Priority < v[b].Priority
			}
			return r.victimBefore(v[a], v[b])
		})
		return v
	}
	// take admits w if it fits after evicting a prefix of cands.
	take := func(w Job, cands []Job) bool {
		need := w.Bytes - free
		var n int
		var freed int64
		for n < len(cands) && freed < need {
			freed += cands[n].Bytes
			n++
		}
		if freed < need {
			return false
		}
		// Keep the victims w does not need after all (an early small one
		// made redundant by a bigger one after it).
		chosen := append([]Job(nil), cands[:n]...)
		for k := len(chosen) - 2; k >= 0; k-- {
			if freed-chosen[k].Bytes >= need {
				freed -= chosen[k].Bytes
				chosen = append(chosen[:k], chosen[k+1:]...)
			}
		}
		for _, x := range chosen {
			delete(resident, x.ID)
			p.Evict = append(p.Evict, x.ID)
			free += x.Bytes
		}
		free -= w.Bytes
		admitted[w.ID] = true
		run = append(run, w)
		return true
	}
	var refused []Job
	for _, w := range pinned {
		if !take(w, victims(w, true)) {
			refused = append(refused, w)
		}
	}
	// Passes over the waiting jobs until one admits nobody: an eviction late
	// in a pass can free memory an earlier job fits in.
	blocked := map[int]bool{}
	left := waiting
	for more := true; more; {
		more = false
		todo := left
		left = nil
		for _, w := range todo {
			if blocked[w.Priority] || !take(w, victims(w, false)) {
				left = append(left, w)
				if !blocked[w.Priority] && r.starving != nil && r.starving(w) {
					blocked[w.Priority] = true
				}
				continue
			}
			p.Admit = append(p.Admit, w.ID)
			more = true
		}
	}

	// Run: pinned and admitted in admission order, then the residents kept
	// (highest priority first, in the order they would be evicted last).
	var kept []Job
	for _, x := range resident {
		kept = append(kept, x)
	}
	sort.Slice(kept, func(a, b int) bool {
		if kept[a].Priority != kept[b].Priority {
			return kept[a].Priority > kept[b].Priority
		}
		return r.victimBefore(kept[b], kept[a])
	})
	for _, x := range run {
		p.Run = append(p.Run, x.ID)
	}
	for _, x := range kept {
		p.Run = append(p.Run, x.ID)
	}
	for _, x := range refused {
		p.Wait = append(p.Wait, x.ID)
	}
	for _, x := range left {
		p.Wait = append(p.Wait, x.ID)
	}
	// Evicted jobs wait behind the others (they just ran).
	p.Wait = append(p.Wait, p.Evict...)
	return p
}
