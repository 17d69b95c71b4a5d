package mig

import (
	"errors"
	"fmt"
	"strings"
)

// InfeasibleError explains why wants could not be placed.
type InfeasibleError struct {
	GPU     int
	Profile string // the GI profile that could not be placed
	Source  string // the request entry it came from
	Free    string // free memory units at that point ("3,7", "none")
	Placed  Layout // what was placed before it (kept instances included)
	Reason  string
	// Busy names instances kept because they have processes ("1g.18gb@3:1
	// (GI 10) (pid 77 on MIG-…)"); empty when none were.
	Busy string
}

func (e *InfeasibleError) Error() string {
	msg := fmt.Sprintf("GPU %d: cannot place %s (%s): %s; free memory units: %s", e.GPU, e.Profile, e.Source, e.Reason, e.Free)
	if len(e.Placed) > 0 {
		msg += "; placed: " + e.Placed.String()
	}
	if e.Busy != "" {
		msg += "; kept because they have processes: " + e.Busy + " (use --force to let the plan destroy them)"
	}
	return msg
}

// describeWants spells the instances a request adds ("1g.35gb x4 + 1g.18gb"),
// after those already placed ("3g.71gb@4:4 + ...").
func describeWants(fixed Layout, wants []Want) string {
	var parts []string
	for _, f := range fixed.Sorted() {
		parts = append(parts, f.String())
	}
	for i := 0; i < len(wants); {
		j := i
		for j < len(wants) && wants[j].Profile.Name == wants[i].Profile.Name {
			j++
		}
		if j-i == 1 {
			parts = append(parts, wants[i].Profile.Name)
		} else {
			parts = append(parts, fmt.Sprintf("%s x%d", wants[i].Profile.Name, j-i))
		}
		i = j
	}
	return strings.Join(parts, " + ")
}

// Unwrap makes errors.Is(err, ErrInfeasible) true.
func (e *InfeasibleError) Unwrap() error { return ErrInfeasible }

// score ranks complete placements: higher is better.
type score struct {
	room       int // most compute slices further GPU instances could still add
	usableRun  int // longest run of free units some further instance could use
	usable     int // free units some further instance could use
	freeRun    int // longest free run
	fragments  int // free runs (fewer is better)
	valid      bool
	placements []int
}

func (s score) better(o score) bool {
	if !o.valid {
		return true
	}
	if s.room != o.room {
		return s.room > o.room
	}
	if s.usableRun != o.usableRun {
		return s.usableRun > o.usableRun
	}
	if s.usable != o.usable {
		return s.usable > o.usable
	}
	if s.freeRun != o.freeRun {
		return s.freeRun > o.freeRun
	}
	return s.fragments < o.fragments // equal: keep the earlier (lexicographically smaller)
}

// usableMask is the set of free units that some profile could still occupy
// given counts and the 7 compute slices.
func usableMask(profiles []GIProfile, mask uint16, counts map[string]int, slices int) uint16 {
	var u uint16
	for _, p := range profiles {
		if counts[p.Name] >= p.MaxCount || slices+p.Slices > 7 {
			continue
		}
		for _, pl := range p.Placements {
			if pl.Mask()&mask == 0 {
				u |= pl.Mask()
			}
		}
	}
	return u
}

// roomLeft is the most compute slices further GPU instances could still add
// on the free units of mask, given the instances per profile (counts) and the
// compute slices in use: a lone 3g at 4 leaves room for a 4g at 0 (4 slices),
// one at 0 only for another 3g (3). Exhaustive over the few placements of 8
// units; memo caches answers by mask and counts within one planning call.
func roomLeft(profiles []GIProfile, mask uint16, counts map[string]int, slices int, memo map[string]int) int {
	n := make([]int, len(profiles))
	for i, p := range profiles {
		n[i] = counts[p.Name]
	}
	key := fmt.Sprint(mask, n)
	if v, ok := memo[key]; ok {
		return v
	}
	best := 0
	var try func(added int, used uint16, minStart int)
	try = func(added int, used uint16, minStart int) {
		if added > best {
			best = added
		}
		for i, p := range profiles {
			if n[i] >= p.MaxCount || slices+added+p.Slices > 7 {
				continue
			}
			for _, pl := range p.Placements {
				if pl.Start < minStart || pl.Mask()&used != 0 {
					continue
				}
				n[i]++
				try(added+p.Slices, used|pl.Mask(), pl.Start+1)
				n[i]--
			}
		}
	}
	try(0, mask, 0)
	memo[key] = best
	return best
}

// PlaceInstances places wants around the fixed layout on a GPU with the given
// profiles. It searches exhaustively (8 memory units make that cheap),
// honouring allowed placements, maximum counts and the 7 compute slices,
// and returns the fixed layout plus the new instances. Among feasible
// answers it keeps the free space most useful: room for the most compute
// slices further instances could add, then the longest run of units a
// further instance could use, then the most such units, then the longest and
// fewest free runs, then the smallest starts in want order. Deterministic.
// An impossible request returns an *InfeasibleError (wrapping ErrInfeasible).
func PlaceInstances(gpuIndex int, profiles []GIProfile, fixed Layout, wants []Want) (Layout, error) {
	var mask uint16
	counts := map[string]int{}
	slices := 0
	byName := map[string]GIProfile{}
	for _, p := range profiles {
		byName[p.Name] = p
	}
	for _, f := range fixed {
		mask |= f.Placement.Mask()
		counts[f.Profile]++
		slices += byName[f.Profile].Slices
	}
	// quick, explainable refusals
	need, needSlices := 0, 0
	for _, w := range wants {
		need += w.Profile.Size()
		needSlices += w.Profile.Slices
	}
	total := map[string]int{}
	for k, v := range counts {
		total[k] = v
	}
	for _, w := range wants {
		total[w.Profile.Name]++
		if total[w.Profile.Name] > w.Profile.MaxCount {
			return nil, &InfeasibleError{GPU: gpuIndex, Profile: w.Profile.Name, Source: w.Source, Free: freeRanges(mask), Placed: fixed,
				Reason: fmt.Sprintf("at most %d x %s per GPU", w.Profile.MaxCount, w.Profile.Name)}
		}
	}
	if free := len(freeUnits(mask)); need > free && len(wants) > 0 {
		return nil, &InfeasibleError{GPU: gpuIndex, Profile: wants[len(wants)-1].Profile.Name, Source: wants[len(wants)-1].Source,
			Free: freeRanges(mask), Placed: fixed,
			Reason: fmt.Sprintf("%s need %d memory units, the GPU has %d", describeWants(fixed, wants), need+MemoryUnits-free, MemoryUnits)}
	}
	if slices+needSlices > 7 {
		return nil, &InfeasibleError{GPU: gpuIndex, Profile: wants[len(wants)-1].Profile.Name, Source: wants[len(wants)-1].Source,
			Free: freeRanges(mask), Placed: fixed,
			Reason: fmt.Sprintf("%s need %d compute slices, the GPU has 7", describeWants(fixed, wants), slices+needSlices)}
	}

	s := &search{profiles: profiles, wants: wants, starts: make([]int, len(wants)), counts: counts, slices: slices, deepest: -1, memo: map[string]int{}}
	s.dfs(0, mask)
	if !s.best.valid {
		w := wants[s.deepest]
		placed := append(Layout(nil), fixed...)
		for i := 0; i < s.deepest; i++ {
			placed = append(placed, wants[i].spec(s.deepStarts[i]))
		}
		return nil, &InfeasibleError{GPU: gpuIndex, Profile: w.Profile.Name, Source: w.Source, Free: freeRanges(s.deepMask), Placed: placed,
			Reason: fmt.Sprintf("it needs %d memory units starting at %s", w.Profile.Size(), w.Profile.Starts())}
	}
	out := append(Layout(nil), fixed...)
	for i, w := range wants {
		out = append(out, w.spec(s.best.placements[i]))
	}
	return out.Sorted(), nil
}

type search struct {
	profiles []GIProfile
	wants    []Want
	starts   []int
	counts   map[string]int
	slices   int
	best     score
	memo     map[string]int // roomLeft answers
	// the deepest point a search got stuck, for the explanation
	deepest    int
	deepMask   uint16
	deepStarts []int
}

func (s *search) dfs(i int, mask uint16) {
	if i == len(s.wants) {
		// counts/slices of the complete layout
		counts := map[string]int{}
		for k, v := range s.counts {
			counts[k] = v
		}
		sl := s.slices
		for _, w := range s.wants {
			counts[w.Profile.Name]++
			sl += w.Profile.Slices
		}
		u := usableMask(s.profiles, mask, counts, sl)
		sc := score{room: roomLeft(s.profiles, mask, counts, sl, s.memo), usableRun: largestFreeRun(^u), usable: len(freeUnits(^u)), freeRun: largestFreeRun(mask),
			fragments: freeFragments(mask), valid: true, placements: append([]int(nil), s.starts...)}
		if sc.better(s.best) {
			s.best = sc
		}
		return
	}
	w := s.wants[i]
	lo := -1
	// identical, unpinned wants take non-decreasing starts (no permutations)
	if i > 0 && w.Start < 0 && sameWant(s.wants[i-1], w) {
		lo = s.starts[i-1]
	}
	placed := false
	for _, pl := range w.Profile.Placements {
		if (w.Start >= 0 && pl.Start != w.Start) || pl.Start <= lo {
			continue
		}
		if pl.Mask()&mask != 0 {
			continue
		}
		placed = true
		s.starts[i] = pl.Start
		s.dfs(i+1, mask|pl.Mask())
	}
	if !placed && i > s.deepest {
		s.deepest, s.deepMask, s.deepStarts = i, mask, append([]int(nil), s.starts[:i]...)
	}
}

func sameWant(a, b Want) bool {
	if a.Profile.Name != b.Profile.Name || a.Start >= 0 || len(a.CISlices) != len(b.CISlices) {
		return false
	}
	for i := range a.CISlices {
		if a.CISlices[i] != b.CISlices[i] {
			return false
		}
	}
	return true
}

// PlanOptions tune planning.
type PlanOptions struct {
	// Force allows destroying instances that have processes. NVML still
	// refuses to destroy a compute instance while a process runs on it; Force
	// only stops migctl from refusing first.
	Force bool
}

// GPUPlan is the plan for one GPU.
type GPUPlan struct {
	GPU       int     `json:"gpu" yaml:"gpu"`
	UUID      string  `json:"uuid" yaml:"uuid"`
	Name      string  `json:"name" yaml:"name"`
	Request   Request `json:"request" yaml:"request"`
	Current   Layout  `json:"current" yaml:"current"`
	Target    Layout  `json:"target" yaml:"target"`
	Kept      Layout  `json:"kept,omitempty" yaml:"kept,omitempty"`
	EnableMIG bool    `json:"enableMIG,omitempty" yaml:"enableMIG,omitempty"`
	// DisableMIG: the request has MIG off and it is on.
	DisableMIG bool   `json:"disableMIG,omitempty" yaml:"disableMIG,omitempty"`
	Steps      []Step `json:"steps" yaml:"steps"`
}

// NoOp reports a plan that changes nothing.
func (p GPUPlan) NoOp() bool { return len(p.Steps) == 0 }

// PlanGPU plans request req on gpu: which existing instances to keep (as many
// as possible, always the busy ones unless forced), where new instances go,
// and the steps from the current layout to the target. Pure and deterministic.
func PlanGPU(gpu *GPU, req Request, opts PlanOptions) (GPUPlan, error) {
	// Steps starts empty, not nil: a no-op plan prints "steps": [] in JSON as in YAML
	plan := GPUPlan{GPU: gpu.Index, UUID: gpu.UUID, Name: gpu.Name, Request: req, Current: gpu.Layout(), Steps: []Step{}}
	wants, err := Expand(gpu, req)
	if err != nil {
		return plan, err
	}
	if !req.MIGEnabled {
		if !gpu.MIGCapable || (!gpu.MIGEnabled && !gpu.MIGPending) {
			plan.Target = Layout{}
			return plan, nil
		}
		for _, in := range gpu.Instances {
			if in.Busy() && !opts.Force {
				return plan, fmt.Errorf("GPU %d: disabling MIG would destroy %s, which has processes (%s; use --force): %w", gpu.Index, in, in.busyWith(), ErrBusy)
			}
		}
		plan.Target = Layout{}
		plan.DisableMIG = true
		plan.Steps = append(Reconcile(gpu, Layout{}), Step{Op: OpDisableMIG})
		return plan, nil
	}
	// a pending disable (Ampere waits for a reset) is withdrawn too: left
	// alone, the next reset would turn MIG off and take the layout with it
	if !gpu.MIGEnabled || !gpu.MIGPending {
		plan.EnableMIG = true
	}
	target, kept, err := chooseKept(gpu, wants, opts)
	if err != nil {
		return plan, err
	}
	plan.Target, plan.Kept = target, kept
	if plan.EnableMIG {
		plan.Steps = append(plan.Steps, Step{Op: OpEnableMIG})
	}
	plan.Steps = append(plan.Steps, Reconcile(gpu, target)...)
	return plan, nil
}

// chooseKept picks the largest set of existing instances that can stay (busy
// ones always, unless forced) such that the rest of the wants fit around it.
func chooseKept(gpu *GPU, wants []Want, opts PlanOptions) (Layout, Layout, error) {
	cur := gpu.Instances
	if !gpu.MIGEnabled {
		cur = nil
	}
	// candidates: an instance some want could be, in the shape it is kept
	// in. An instance that matches a want exactly is a candidate as it is; a
	// busy one is also a candidate in the shape of every other want it can
	// serve (reshapeBusy), since another busy instance may need the exact
	// match. A subset keeps at most one shape per instance.
	type candidate struct {
		inst  int
		shape InstanceSpec
	}
	var cand []candidate
	for i, in := range cur {
		matched := false
		for _, w := range wants {
			if w.Profile.Name == in.Profile && intsEqual(in.CISlices(), sortedInts(w.CISlices)) && (w.Start < 0 || w.Start == in.Placement.Start) {
				matched = true
			}
		}
		if matched {
			cand = append(cand, candidate{i, in.Spec()})
		}
		if in.Busy() {
			for _, s := range reshapeBusy(in, wants) {
				if !s.Equal(in.Spec()) {
					matched = true
					cand = append(cand, candidate{i, s})
				}
			}
		}
		if !matched && in.Busy() && !opts.Force {
			return nil, nil, fmt.Errorf("GPU %d: the layout has no place for %s (GI %d) as it is, and it has processes (%s; use --force to destroy it): %w",
				gpu.Index, in.Spec(), in.GIID, in.busyWith(), ErrBusy)
		}
	}
	var firstErr error
	for size := len(cand); size >= 0; size-- {
		// found, not best != nil: an empty target (MIG on, no instances) is nil
		found := false
		var best Layout
		var bestKept Layout
		var bestScore score
		for sub := 0; sub < 1<<len(cand); sub++ {
			if popcount(sub) != size {
				continue
			}
			var kept Layout
			busyOK := true
			keep := map[int]bool{}
			for k, c := range cand {
				if sub&(1<<k) != 0 {
					if keep[c.inst] {
						busyOK = false // two shapes of one instance
					}
					kept = append(kept, c.shape)
					keep[c.inst] = true
				}
			}
			for i, in := range cur {
				if in.Busy() && !keep[i] && !opts.Force {
					busyOK = false
				}
			}
			if !busyOK {
				continue
			}
			rest, ok := matchWants(wants, kept)
			if !ok {
				continue
			}
			target, err := PlaceInstances(gpu.Index, gpu.Profiles, kept, rest)
			if err != nil {
				if firstErr == nil || size == 0 {
					firstErr = err
				}
				continue
			}
			sc := layoutScore(gpu.Profiles, target)
			if !found || sc.better(bestScore) {
				found, best, bestKept, bestScore = true, target, kept, sc
			}
		}
		if found {
			if best == nil {
				best = Layout{}
			}
			return best, bestKept.Sorted(), nil
		}
	}
	var busy []string
	for _, in := range cur {
		if in.Busy() && !opts.Force {
			busy = append(busy, fmt.Sprintf("%s (%s)", in, in.busyWith()))
		}
	}
	var ie *InfeasibleError
	if errors.As(firstErr, &ie) && len(busy) > 0 {
		ie.Busy = strings.Join(busy, "; ")
	}
	if firstErr == nil {
		firstErr = fmt.Errorf("GPU %d: %w: instances with processes leave no room for the layout: %s (use --force to destroy them)", gpu.Index, ErrInfeasible, strings.Join(busy, "; "))
	}
	return nil, nil, firstErr
}

// reshapeBusy lists the distinct shapes of the wants a busy GPU instance can
// serve without losing a busy compute instance: same profile (and start, if
// pinned), compute instances all of the size the instance's are, and at
// least as many as it has busy ones. The instance is then kept in the want's
// shape: Reconcile destroys idle compute instances (busy ones are kept first)
// or adds more of the same size, whose aligned slots are free.
func reshapeBusy(in Instance, wants []Want) []InstanceSpec {
	size, busy := -1, 0
	for _, c := range in.Compute {
		if size >= 0 && c.Slices != size {
			return nil
		}
		size = c.Slices
		if len(c.Processes) > 0 {
			busy++
		}
	}
	var out []InstanceSpec
	for _, w := range wants {
		if w.Profile.Name != in.Profile || (w.Start >= 0 && w.Start != in.Placement.Start) || len(w.CISlices) < busy {
			continue
		}
		same := true
		for _, c := range w.CISlices {
			same = same && c == size
		}
		if !same {
			continue
		}
		s := InstanceSpec{Profile: in.Profile, Placement: in.Placement, CISlices: sortedInts(w.CISlices)}
		dup := false
		for _, o := range out {
			dup = dup || o.Equal(s)
		}
		if !dup {
			out = append(out, s)
		}
	}
	return out
}

// layoutScore scores a complete layout like the search does, except for
// room: it ranks which existing instances to keep, and there the earlier
// instances (lower GI ids, first in NVML's order) win ties, so the instances
// callers hold on to (context's leases) stay put rather than the planner
// trading them for a layout with more room. New instances are still placed
// for the most room (PlaceInstances).
func layoutScore(profiles []GIProfile, l Layout) score {
	var mask uint16
	counts := map[string]int{}
	slices := 0
	for _, s := range l {
		mask |= s.Placement.Mask()
		counts[s.Profile]++
		for _, p := range profiles {
			if p.Name == s.Profile {
				slices += p.Slices
			}
		}
	}
	u := usableMask(profiles, mask, counts, slices)
	return score{usableRun: largestFreeRun(^u), usable: len(freeUnits(^u)), freeRun: largestFreeRun(mask), fragments: freeFragments(mask), valid: true}
}

// matchWants removes from wants one want per kept instance (pinned wants
// first); ok is false when some kept instance matches none.
func matchWants(wants []Want, kept Layout) ([]Want, bool) {
	used := make([]bool, len(wants))
	for _, pass := range []bool{true, false} {
		for _, k := range kept {
			if pass != anyPinnedAt(wants, k) {
				continue
			}
			found := false
			for i, w := range wants {
				if used[i] || w.Profile.Name != k.Profile || !intsEqual(sortedInts(w.CISlices), sortedInts(k.CISlices)) {
					continue
				}
				if (pass && w.Start == k.Placement.Start) || (!pass && w.Start < 0) {
					used[i], found = true, true
					break
				}
			}
			if !found {
				return nil, false
			}
		}
	}
	var rest []Want
	for i, w := range wants {
		if !used[i] {
			rest = append(rest, w)
		}
	}
	return rest, true
}

func anyPinnedAt(wants []Want, k InstanceSpec) bool {
	for _, w := range wants {
		if w.Start == k.Placement.Start && w.Profile.Name == k.Profile && intsEqual(sortedInts(w.CISlices), sortedInts(k.CISlices)) {
			return true
		}
	}
	return false
}

func popcount(x int) int {
	n := 0
	for ; x != 0; x &= x - 1 {
		n++
	}
	return n
}

func intsEqual(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func sortedInts(a []int) []int {
	out := append([]int(nil), a...)
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j] < out[j-1]; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}
