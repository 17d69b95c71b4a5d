package mig_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/mig"
	"github.com/migctl/migctl/mig/migsim"
)

// h200 discovers a fresh simulated H200 (MIG off, no instances).
func h200(t testing.TB) *mig.GPU {
	t.Helper()
	node, err := mig.Discover(migsim.New(migsim.H200, 1))
	require.NoError(t, err)
	return &node.GPUs[0]
}

func req(devs ...mig.DeviceRequest) mig.Request {
	return mig.Request{MIGEnabled: true, Devices: devs}
}

func dev(profile string, count int, starts ...int) mig.DeviceRequest {
	return mig.DeviceRequest{Profile: profile, Count: count, Starts: starts}
}

// checkValid asserts a layout obeys the H200's rules on its own terms.
func checkValid(t *testing.T, g *mig.GPU, l mig.Layout) {
	t.Helper()
	var mask uint16
	counts := map[string]int{}
	slices := 0
	for _, s := range l {
		p, ok := g.Profile(s.Profile)
		require.True(t, ok, s.Profile)
		require.True(t, p.Allows(s.Placement.Start), "%s not allowed at %d", s.Profile, s.Placement.Start)
		require.Equal(t, p.Size(), s.Placement.Size)
		require.Zero(t, mask&s.Placement.Mask(), "overlap at %s", s)
		mask |= s.Placement.Mask()
		counts[s.Profile]++
		require.LessOrEqual(t, counts[s.Profile], p.MaxCount)
		slices += p.Slices
	}
	require.LessOrEqual(t, slices, 7)
}

// TestPlanH200Feasible: every feasible request gets a valid layout with every
// requested device, pins honoured, and free space as useful as any placement
// of the same instances allows (bestRoom, a brute force that shares nothing
// with the planner): the planner's first promise, checked instead of its
// output string.
func TestPlanH200Feasible(t *testing.T) {
	g := h200(t)
	tests := []struct {
		name string
		req  mig.Request
		room int // compute slices a further instance can still add (the oracle must agree)
	}{
		{"7x1g.18gb", req(dev("1g.18gb", 7)), 0},
		{"4x1g.35gb", req(dev("1g.35gb", 4)), 0},
		{"2x3g.71gb", req(dev("3g.71gb", 2)), 0},
		{"4g+3g", req(dev("4g.71gb", 1), dev("3g.71gb", 1)), 0},
		{"2x2g+3g", req(dev("2g.35gb", 2), dev("3g.71gb", 1)), 0},
		{"3x2g+1g", req(dev("2g.35gb", 3), dev("1g.18gb", 1)), 0},
		{"3x2g+1g.35gb", req(dev("2g.35gb", 3), dev("1g.35gb", 1)), 0},
		{"7g", req(dev("7g.141gb", 1)), 0},
		{"3g+4x1g.18gb", req(dev("3g.71gb", 1), dev("1g.18gb", 4)), 0},
		{"me+6x1g", req(dev("1g.18gb+me", 1), dev("1g.18gb", 6)), 0},
		{"pinned 3g@4", req(dev("3g.71gb", 1, 4)), 4},
		{"pinned 3g@0", req(dev("3g.71gb", 1, 0)), 3},
		{"split 1c.2g.35gb=3", req(dev("1c.2g.35gb", 3)), 3}, // two 2g GIs
		// 3g@0 would force 2g@4 and 1g@6 and strand unit 7; 3g@4 leaves a
		// unit a further 1g.18gb can use
		{"demo layout", req(dev("3g.71gb", 1), dev("2g.35gb", 1), dev("1g.18gb", 1)), 1},
		{"one 1g.18gb", req(dev("1g.18gb", 1)), 6},
		{"2g+1g", req(dev("2g.35gb", 1), dev("1g.18gb", 1)), 4},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := mig.PlanGPU(g, tc.req, mig.PlanOptions{})
			require.NoError(t, err)
			checkValid(t, g, p.Target)
			require.True(t, p.EnableMIG, "MIG is off on a fresh GPU; the plan must turn it on")
			require.Equal(t, mig.OpEnableMIG, p.Steps[0].Op)
			// every requested device is there
			n := 0
			for _, s := range p.Target {
				n += len(s.CISlices)
			}
			want := 0
			for _, d := range tc.req.Devices {
				want += d.Count
			}
			require.Equal(t, want, n)
			// every pin is honoured
			for _, d := range tc.req.Devices {
				for _, st := range d.Starts {
					found := false
					for _, s := range p.Target {
						found = found || s.Placement.Start == st && (s.Profile == d.Profile || strings.HasSuffix(d.Profile, "."+s.Profile))
					}
					require.True(t, found, "%s pinned at %d: %s", d.Profile, st, p.Target)
				}
			}
			// the free space is as useful as the best placement's
			wants, err := mig.Expand(g, tc.req)
			require.NoError(t, err)
			best := bestRoom(g, wants)
			require.Equal(t, tc.room, best, "the oracle's room for %v", tc.req)
			require.Equal(t, best, roomOf(g, p.Target), "plan %s leaves less room than the best placement", p.Target)
		})
	}
}

// unitMask is the set of memory units from start, size long: computed here,
// not with the package's Placement.Mask.
func unitMask(start, size int) uint16 {
	var m uint16
	for u := start; u < start+size; u++ {
		m |= 1 << u
	}
	return m
}

// roomOf is the most compute slices further GPU instances could add to
// layout l (within each profile's maximum count and the GPU's 7 slices):
// brute force over every set of further instances.
func roomOf(g *mig.GPU, l mig.Layout) int {
	var used uint16
	counts := map[string]int{}
	slices := 0
	for _, s := range l {
		p, _ := g.Profile(s.Profile)
		used |= unitMask(s.Placement.Start, s.Placement.Size)
		counts[p.Name]++
		slices += p.Slices
	}
	return further(g.Profiles, 0, 0, used, counts, slices)
}

// further adds instances in (profile, placement) order from (pi, pj) on, so
// that every set is tried once, and returns the most slices they can add.
func further(profs []mig.GIProfile, pi, pj int, used uint16, counts map[string]int, slices int) int {
	best := 0
	for i := pi; i < len(profs); i++ {
		p := profs[i]
		if counts[p.Name] >= p.MaxCount || slices+p.Slices > 7 {
			continue
		}
		j0 := 0
		if i == pi {
			j0 = pj
		}
		for j := j0; j < len(p.Placements); j++ {
			m := unitMask(p.Placements[j].Start, p.Placements[j].Size)
			if used&m != 0 {
				continue
			}
			counts[p.Name]++
			best = max(best, p.Slices+further(profs, i, j+1, used|m, counts, slices+p.Slices))
			counts[p.Name]--
		}
	}
	return best
}

// bestRoom is the most room (roomOf) any valid placement of wants leaves:
// brute force over every placement of every want, pins respected.
func bestRoom(g *mig.GPU, wants []mig.Want) int {
	best := -1
	var l mig.Layout
	var place func(i int, used uint16)
	place = func(i int, used uint16) {
		if i == len(wants) {
			best = max(best, roomOf(g, l))
			return
		}
		w := wants[i]
		for _, pl := range w.Profile.Placements {
			m := unitMask(pl.Start, pl.Size)
			if used&m != 0 || (w.Start >= 0 && pl.Start != w.Start) {
				continue
			}
			l = append(l, mig.InstanceSpec{Profile: w.Profile.Name, Placement: pl})
			place(i+1, used|m)
			l = l[:len(l)-1]
		}
	}
	place(0, 0)
	return best
}

func TestPlanH200Infeasible(t *testing.T) {
	g := h200(t)
	tests := []struct {
		name    string
		req     mig.Request
		profile string // the profile the error must name
		errIs   error
	}{
		{"4x1g.35gb + 1g.18gb", req(dev("1g.35gb", 4), dev("1g.18gb", 1)), "1g.18gb", mig.ErrInfeasible},
		{"4x1g.35gb + 2g", req(dev("1g.35gb", 4), dev("2g.35gb", 1)), "", mig.ErrInfeasible},
		{"8x1g.18gb", req(dev("1g.18gb", 8)), "1g.18gb", mig.ErrBadConfig},
		{"3x3g", req(dev("3g.71gb", 3)), "3g.71gb", mig.ErrBadConfig},
		{"7g + 1g", req(dev("7g.141gb", 1), dev("1g.18gb", 1)), "", mig.ErrInfeasible},
		{"4g + 4g", req(dev("4g.71gb", 2)), "4g.71gb", mig.ErrBadConfig},
		{"4g + 3g + 1g", req(dev("4g.71gb", 1), dev("3g.71gb", 1), dev("1g.18gb", 1)), "", mig.ErrInfeasible},
		{"3x2g + 2x1g.18gb", req(dev("2g.35gb", 3), dev("1g.18gb", 2)), "1g.18gb", mig.ErrInfeasible},
		{"1g.18gb pinned at 7", req(dev("1g.18gb", 1, 7)), "1g.18gb", mig.ErrBadConfig},
		{"overlapping pins", req(dev("3g.71gb", 1, 0), dev("2g.35gb", 1, 2)), "2g.35gb", mig.ErrBadConfig},
		{"unknown profile", req(dev("5g.99gb", 1)), "5g.99gb", mig.ErrUnknownProfile},
		{"H100 name on H200", req(dev("1g.10gb", 1)), "1g.10gb", mig.ErrUnknownProfile},
		{"malformed", req(dev("one-g", 1)), "one-g", mig.ErrUnknownProfile},
		{"2x1g.18gb+me", req(dev("1g.18gb+me", 2)), "1g.18gb+me", mig.ErrBadConfig},
		{"3g + 2g pinned at 4 and 1g.35gb x2", req(dev("3g.71gb", 1, 0), dev("2g.35gb", 1, 4), dev("1g.35gb", 2)), "1g.35gb", mig.ErrInfeasible},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := mig.PlanGPU(g, tc.req, mig.PlanOptions{})
			require.Error(t, err)
			require.ErrorIs(t, err, tc.errIs)
			if tc.profile != "" {
				require.Contains(t, err.Error(), tc.profile)
			}
			if tc.errIs == mig.ErrInfeasible {
				require.Contains(t, err.Error(), "free memory units")
			}
		})
	}
}

// TestPlanExhaustiveAgainstBruteForce checks feasibility for every request of
// up to 7 instances against an independent brute force over placements, and
// that every feasible plan leaves as much room as the best placement.
func TestPlanExhaustiveAgainstBruteForce(t *testing.T) {
	g := h200(t)
	profs := g.Profiles
	var counts []int
	var rec func(i, total int)
	checked := 0
	rec = func(i, total int) {
		if i == len(profs) {
			if total == 0 {
				return
			}
			var r mig.Request
			r.MIGEnabled = true
			for k, c := range counts {
				if c > 0 {
					r.Devices = append(r.Devices, dev(profs[k].Name, c))
				}
			}
			plan, err := mig.PlanGPU(g, r, mig.PlanOptions{})
			feasible := bruteForce(profs, counts)
			require.Equal(t, feasible, err == nil, "%v: planner says %v", r, err)
			if feasible {
				wants, err := mig.Expand(g, r)
				require.NoError(t, err)
				require.Equal(t, bestRoom(g, wants), roomOf(g, plan.Target), "%v: plan %s leaves less room than the best placement", r, plan.Target)
			}
			checked++
			return
		}
		for c := 0; c <= profs[i].MaxCount && total+c <= 7; c++ {
			counts = append(counts, c)
			rec(i+1, total+c)
			counts = counts[:len(counts)-1]
		}
	}
	rec(0, 0)
	require.Greater(t, checked, 100)
}

// bruteForce tries every assignment of placements independently of the planner.
func bruteForce(profs []mig.GIProfile, counts []int) bool {
	var items []mig.GIProfile
	slices := 0
	for k, c := range counts {
		if c > profs[k].MaxCount {
			return false
		}
		for j := 0; j < c; j++ {
			items = append(items, profs[k])
			slices += profs[k].Slices
		}
	}
	if slices > 7 {
		return false
	}
	var try func(i int, used [8]bool) bool
	try = func(i int, used [8]bool) bool {
		if i == len(items) {
			return true
		}
		for _, pl := range items[i].Placements {
			ok := true
			for u := pl.Start; u < pl.Start+pl.Size; u++ {
				ok = ok && !used[u]
			}
			if !ok {
				continue
			}
			next := used
			for u := pl.Start; u < pl.Start+pl.Size; u++ {
				next[u] = true
			}
			if try(i+1, next) {
				return true
			}
		}
		return false
	}
	return try(0, [8]bool{})
}

func TestPlanDeterministic(t *testing.T) {
	g := h200(t)
	r := req(dev("1g.18gb", 2), dev("2g.35gb", 1), dev("1g.35gb", 1))
	first, err := mig.PlanGPU(g, r, mig.PlanOptions{})
	require.NoError(t, err)
	for i := 0; i < 20; i++ {
		p, err := mig.PlanGPU(g, r, mig.PlanOptions{})
		require.NoError(t, err)
		require.Equal(t, first.Target.String(), p.Target.String())
		require.Equal(t, first.Steps, p.Steps)
	}
}

func BenchmarkPlanFullNode(b *testing.B) {
	node, err := mig.Discover(migsim.New(migsim.H200, 8))
	require.NoError(b, err)
	layouts := []mig.Request{
		req(dev("1g.18gb", 7)),
		req(dev("3g.71gb", 1), dev("2g.35gb", 1), dev("1g.18gb", 1)),
		req(dev("1g.35gb", 4)),
		req(dev("2g.35gb", 3), dev("1g.18gb", 1)),
		req(dev("4g.71gb", 1), dev("3g.71gb", 1)),
		req(dev("1g.18gb", 3), dev("2g.35gb", 2)),
		req(dev("3g.71gb", 2)),
		req(dev("1g.18gb+me", 1), dev("1g.18gb", 4), dev("2g.35gb", 1)),
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for k := range node.GPUs {
			if _, err := mig.PlanGPU(&node.GPUs[k], layouts[k], mig.PlanOptions{}); err != nil {
				b.Fatal(fmt.Errorf("GPU %d: %w", k, err))
			}
		}
	}
}

// TestPlanPinnedAgainstBruteForce: random requests with some instances pinned
// to starts; the planner's verdict must match an independent brute force,
// and a feasible plan must honour every pin.
func TestPlanPinnedAgainstBruteForce(t *testing.T) {
	g := h200(t)
	rng := rand.New(rand.NewPCG(1, 2))
	profs := g.Profiles
	for n := 0; n < 3000; n++ {
		type item struct {
			p     mig.GIProfile
			start int
		}
		var items []item
		r := mig.Request{MIGEnabled: true}
		k := 1 + rng.IntN(5)
		for i := 0; i < k; i++ {
			p := profs[rng.IntN(len(profs))]
			it := item{p: p, start: -1}
			if rng.IntN(3) == 0 {
				it.start = p.Placements[rng.IntN(len(p.Placements))].Start
			}
			items = append(items, it)
			d := mig.DeviceRequest{Profile: p.Name, Count: 1}
			if it.start >= 0 {
				d.Starts = []int{it.start}
			}
			r.Devices = append(r.Devices, d)
		}
		// brute force with pins
		counts := map[string]int{}
		slices := 0
		over := false
		pinMask := uint16(0)
		for _, it := range items {
			counts[it.p.Name]++
			slices += it.p.Slices
			over = over || counts[it.p.Name] > it.p.MaxCount
		}
		var try func(i int, used uint16) bool
		try = func(i int, used uint16) bool {
			if i == len(items) {
				return true
			}
			for _, pl := range items[i].p.Placements {
				if items[i].start >= 0 && pl.Start != items[i].start {
					continue
				}
				if used&pl.Mask() == 0 && try(i+1, used|pl.Mask()) {
					return true
				}
			}
			return false
		}
		feasible := !over && slices <= 7 && try(0, pinMask)
		plan, err := mig.PlanGPU(g, r, mig.PlanOptions{})
		require.Equal(t, feasible, err == nil, "%v: %v", r, err)
		if err != nil {
			continue
		}
		checkValid(t, g, plan.Target)
		for _, it := range items {
			if it.start < 0 {
				continue
			}
			found := false
			for _, s := range plan.Target {
				found = found || (s.Profile == it.p.Name && s.Placement.Start == it.start)
			}
			require.True(t, found, "%v: pin %s@%d not honoured in %s", r, it.p.Name, it.start, plan.Target)
		}
	}
}
