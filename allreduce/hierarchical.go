package allreduce

import (
	"fmt"
	"slices"
)

// Grouping maps ranks to groups: byte r is rank r's group. Groups are
// numbered by first appearance, so equal partitions are equal values, and
// a Grouping is comparable (Params stays a map key). At most 256 groups.
type Grouping string

// NewGrouping builds a Grouping from any rank → group labels: ranks with
// equal labels share a group.
func NewGrouping(groupOf []int) (Grouping, error) {
	ids := map[int]byte{}
	b := make([]byte, len(groupOf))
	for r, g := range groupOf {
		id, ok := ids[g]
		if !ok {
			if len(ids) == 256 {
				return "", fmt.Errorf("more than 256 groups of ranks: %w", ErrUnsupported)
			}
			id = byte(len(ids))
			ids[g] = id
		}
		b[r] = id
	}
	return Grouping(b), nil
}

// GroupByKey groups ranks whose keys are equal (say, the physical GPU each
// rank's device belongs to).
func GroupByKey(keys []string) (Grouping, error) {
	ids := map[string]int{}
	labels := make([]int, len(keys))
	for r, k := range keys {
		id, ok := ids[k]
		if !ok {
			id = len(ids)
			ids[k] = id
		}
		labels[r] = id
	}
	return NewGrouping(labels)
}

// ContiguousGroups puts ranks [0, per) in group 0, [per, 2·per) in group 1
// and so on (the last group may be smaller): how the launcher places ranks
// over GPUs.
func ContiguousGroups(world, per int) Grouping {
	per = max(per, 1)
	labels := make([]int, world)
	for r := range labels {
		labels[r] = r / per
	}
	g, _ := NewGrouping(labels) // "" beyond 256 groups, which Build refuses
	return g
}

// Group is rank r's group.
func (g Grouping) Group(r int) int { return int(g[r]) }

// Count is the number of groups.
func (g Grouping) Count() int {
	n := 0
	for i := range len(g) {
		n = max(n, int(g[i])+1)
	}
	return n
}

// Members lists every group's ranks in rank order.
func (g Grouping) Members() [][]int {
	m := make([][]int, g.Count())
	for r := range len(g) {
		m[g[r]] = append(m[g[r]], r)
	}
	return m
}

// Sizes is every group's number of ranks.
func (g Grouping) Sizes() []int {
	s := make([]int, g.Count())
	for r := range len(g) {
		s[g[r]]++
	}
	return s
}

// buildHierarchicalAllReduce: for chunk c in slot c mod K, rank r = member
// j of its group of m (parts of the chunk per group: split(ln, m, ·)):
//
//	out lane:    m ≥ 2: copy every part but j to in[r][slot]        sets staged
//	             m = 1: copy the whole chunk to in[r][slot]         sets staged, partial
//	in lane:     Recv[part j] = Send[part j] + peers' in[q][slot][part j]  (device)
//	             copy Recv[part j] to in[r][slot][part j]           sets partial
//	reduce lane: out[slot][piece r] = Σ over groups of the partials (CPU) sets reduced
//	in lane:     copy out[slot] to Recv, one chunk behind           sets fetched
//
// With one group, the partials are the result: the in lane copies the
// other members' parts straight from their areas (sets fetched) and there
// is no CPU step. A rank restages a slot once it fetched the slot's
// previous chunk, and the CPU reduction overwrites a result slot once every
// rank fetched it; it also waits until every rank entered the call, so consecutive
// hierarchical calls need no fence (see needsFence).
func buildHierarchicalAllReduce(s *Schedule) {
	p := s.Params
	n, K, C, es := p.World, p.Slots, p.Chunk, p.ElemSize
	if n == 1 {
		buildStagedAllReduce(s)
		return
	}
	s.HostBytes = ArenaBytes(n, C, K)
	groups := p.Groups.Members()
	G := len(groups)
	index := make([]int, n) // rank → position in its group
	for _, mem := range groups {
		for j, q := range mem {
			index[q] = j
		}
	}
	nc := ceilDiv(p.Bytes, C)
	lag := min(K-1, 1) // fetch a chunk behind, so waiting for it does not stall the next reduction
	for r := range n {
		g := p.Groups.Group(r)
		mem, j := groups[g], index[r]
		m := len(mem)
		var outL, redL, inL []Step
		fetch := func(c int) {
			off := c * C
			ln := min(C, p.Bytes-off)
			slot, v := c%K, uint64(c+1)
			if G > 1 {
				inL = append(inL, Step{Lane: LaneIn, Kind: CopyIn, Buf: Recv, Off: off, Len: ln,
					Host: Span{stagedOut(p, slot), ln}, Wait: allRanks(n, roleC, v), Set: []Cond{{FlagOf(r, roleD), v}}})
				return
			}
			// One group: the other members' parts, from their areas.
			for k := 1; k < m; k++ {
				jq := (j + k) % m
				lo, hi := split(ln, es, m, jq), split(ln, es, m, jq+1)
				st := Step{Lane: LaneIn, Kind: CopyIn, Buf: Recv, Off: off + lo, Len: hi - lo,
					Host: Span{stagedIn(p, mem[jq], slot) + lo, hi - lo}, Wait: []Cond{{FlagOf(mem[jq], roleB), v}}}
				if k == m-1 {
					st.Set = []Cond{{FlagOf(r, roleD), v}}
				}
				inL = append(inL, st)
			}
		}
		for c := range nc {
			off := c * C
			ln := min(C, p.Bytes-off)
			slot, v := c%K, uint64(c+1)
			// The slot's previous chunk: once this rank fetched all of it,
			// every reduction that read this rank's area for it is done.
			// With one group, peers fetch from this area: wait until every
			// rank fetched (a last, shorter chunk cuts its parts elsewhere).
			var reuse []Cond
			if c >= K {
				reuse = []Cond{{FlagOf(r, roleD), uint64(c - K + 1)}}
				if G == 1 {
					reuse = allRanks(n, roleD, uint64(c-K+1))
				}
			}
			in := stagedIn(p, r, slot)
			if m == 1 {
				// The group partial is this rank's input.
				outL = append(outL, Step{Lane: LaneOut, Kind: CopyOut, Buf: Send, Off: off, Len: ln,
					Host: Span{in, ln}, Wait: reuse, Set: []Cond{{FlagOf(r, roleA), v}, {FlagOf(r, roleB), v}}})
			} else {
				lo, hi := split(ln, es, m, j), split(ln, es, m, j+1)
				var spans [][2]int
				for _, sp := range [][2]int{{0, lo}, {hi, ln}} {
					if sp[1] > sp[0] {
						spans = append(spans, sp)
					}
				}
				if len(spans) == 0 {
					spans = [][2]int{{0, 0}}
				}
				for i, sp := range spans {
					st := Step{Lane: LaneOut, Kind: CopyOut, Buf: Send, Off: off + sp[0], Len: sp[1] - sp[0],
						Host: Span{in + sp[0], sp[1] - sp[0]}}
					if i == 0 {
						st.Wait = reuse
					}
					if i == len(spans)-1 {
						st.Set = []Cond{{FlagOf(r, roleA), v}}
					}
					outL = append(outL, st)
				}
				red := Step{Lane: LaneIn, Kind: ReduceIn, Buf: Recv, Off: off + lo, Len: hi - lo, Src: Send, SrcOff: off + lo,
					Final: p.Avg && G == 1}
				for _, q := range mem {
					if q != r {
						red.Hosts = append(red.Hosts, Span{stagedIn(p, q, slot) + lo, hi - lo})
						red.Wait = append(red.Wait, Cond{FlagOf(q, roleA), v})
					}
				}
				inL = append(inL, red, Step{Lane: LaneIn, Kind: CopyOut, Buf: Recv, Off: off + lo, Len: hi - lo,
					Host: Span{in + lo, hi - lo}, Set: []Cond{{FlagOf(r, roleB), v}}})
			}
			if G > 1 {
				redL = append(redL, levelTwo(p, groups, r, c)...)
			}
			if c-lag >= 0 {
				fetch(c - lag)
			}
		}
		for c := max(0, nc-lag); c < nc; c++ {
			fetch(c)
		}
		s.Steps[r] = slices.Concat(outL, redL, inL)
	}
}

// levelTwo is rank r's CPU reduction of chunk c: its piece r of n of the
// chunk, cut wherever a group's part ends, each cut the sum of the G group
// partials found in the areas of the ranks that own that part.
func levelTwo(p Params, groups [][]int, r, c int) []Step {
	n, K, C, es := p.World, p.Slots, p.Chunk, p.ElemSize
	off := c * C
	ln := min(C, p.Bytes-off)
	slot, v := c%K, uint64(c+1)
	a0, b0 := split(ln, es, n, r), split(ln, es, n, r+1)
	cuts := []int{a0, b0}
	for _, mem := range groups {
		for k := 1; k < len(mem); k++ {
			if x := split(ln, es, len(mem), k); x > a0 && x < b0 {
				cuts = append(cuts, x)
			}
		}
	}
	slices.Sort(cuts)
	cuts = slices.Compact(cuts)
	// Every rank entered this call (so nobody still reads out[slot] for
	// the previous call), and the slot's previous chunk was fetched.
	wait := allRanks(n, roleA, 1)
	if c >= K {
		wait = allRanks(n, roleD, uint64(c-K+1))
	}
	spans := [][2]int{{a0, a0}} // an empty piece still sets the flag
	if len(cuts) > 1 {
		spans = spans[:0]
		for i := 0; i+1 < len(cuts); i++ {
			spans = append(spans, [2]int{cuts[i], cuts[i+1]})
		}
	}
	owners := map[int]bool{}
	var steps []Step
	for _, sp := range spans {
		a, b := sp[0], sp[1]
		st := Step{Lane: LaneReduce, Kind: HostReduce, Host: Span{stagedOut(p, slot) + a, b - a}, Final: p.Avg, Div: n}
		if b > a {
			for _, mem := range groups {
				m := len(mem)
				k := 0
				for split(ln, es, m, k+1) <= a {
					k++
				}
				owners[mem[k]] = true
				st.Hosts = append(st.Hosts, Span{stagedIn(p, mem[k], slot) + a, b - a})
			}
		}
		steps = append(steps, st)
	}
	for q := range n {
		if owners[q] {
			wait = append(wait, Cond{FlagOf(q, roleB), v})
		}
	}
	steps[0].Wait = wait
	steps[len(steps)-1].Set = []Cond{{FlagOf(r, roleC), v}}
	return steps
}
