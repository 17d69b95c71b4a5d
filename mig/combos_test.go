package mig_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/mig"
	"github.com/migctl/migctl/mig/migsim"
)

// hwRule is one GPU-instance profile of the H100/H200 geometry as the real
// hardware reports it (../shared/hw/H200.md; the MIG user guide's H100 table
// has the same slices, maxima and placements). Written out here, not taken
// from the simulator, so the planner is checked against the hardware's facts.
type hwRule struct {
	slices, max, size int
	starts            []int
}

var h200Rules = map[string]hwRule{
	"1g.18gb":    {1, 7, 1, []int{0, 1, 2, 3, 4, 5, 6}},
	"1g.18gb+me": {1, 1, 1, []int{0, 1, 2, 3, 4, 5, 6}},
	"1g.35gb":    {1, 4, 2, []int{0, 2, 4, 6}},
	"2g.35gb":    {2, 3, 2, []int{0, 2, 4}},
	"3g.71gb":    {3, 2, 4, []int{0, 4}},
	"4g.71gb":    {4, 1, 4, []int{0}},
	"7g.141gb":   {7, 1, 8, []int{0}},
}

// h100Names maps the H200's profile names to the H100 80GB's.
var h100Names = map[string]string{
	"1g.18gb": "1g.10gb", "1g.18gb+me": "1g.10gb+me", "1g.35gb": "1g.20gb", "2g.35gb": "2g.20gb",
	"3g.71gb": "3g.40gb", "4g.71gb": "4g.40gb", "7g.141gb": "7g.80gb",
}

// checkHardwareRules asserts a planned layout is one the real hardware
// accepts: allowed starts and sizes, no overlap, maxima, at most 7 compute
// slices. names maps the layout's profile names back to the H200's.
func checkHardwareRules(t *testing.T, l mig.Layout, names map[string]string) {
	t.Helper()
	var used [8]bool
	counts := map[string]int{}
	slices := 0
	for _, s := range l {
		name := s.Profile
		if n, ok := names[name]; ok {
			name = n
		}
		r, ok := h200Rules[name]
		require.True(t, ok, "unknown profile %s in %s", s.Profile, l)
		require.Contains(t, r.starts, s.Placement.Start, "%s may not start at %d (%s)", s.Profile, s.Placement.Start, l)
		require.Equal(t, r.size, s.Placement.Size, "%s size (%s)", s.Profile, l)
		for u := s.Placement.Start; u < s.Placement.Start+s.Placement.Size; u++ {
			require.Less(t, u, 8)
			require.False(t, used[u], "memory unit %d used twice in %s", u, l)
			used[u] = true
		}
		counts[name]++
		require.LessOrEqual(t, counts[name], r.max, "%s over its maximum in %s", s.Profile, l)
		slices += r.slices
	}
	require.LessOrEqual(t, slices, 7, "compute slices of %s", l)
}

// TestPlanHardwareCombinations: GPU-instance combinations the MIG user guide
// shows for the 7-slice/8-unit geometry (H100, and so H200) are planned with
// placements the hardware accepts, applied on the simulated node, and
// asserted; combinations the hardware cannot hold are refused with a reason.
// Written as --layout strings with H200 names; the H100 node gets the same
// combinations under its own names.
func TestPlanHardwareCombinations(t *testing.T) {
	feasible := []string{
		"7g.141gb=1",
		"4g.71gb=1,3g.71gb=1",
		"4g.71gb=1,2g.35gb=1,1g.18gb=1",
		"4g.71gb=1,2g.35gb=1,1g.35gb=1",
		"4g.71gb=1,1g.35gb=2",
		"4g.71gb=1,1g.18gb=3",
		"4g.71gb=1,1g.35gb=1,1g.18gb=2",
		"4g.71gb=1,1g.18gb+me=1,1g.18gb=2",
		"3g.71gb=2",
		"3g.71gb=1,2g.35gb=2",
		"3g.71gb=1,2g.35gb=1,1g.18gb=2",
		"3g.71gb=1,2g.35gb=1,1g.35gb=1",
		"3g.71gb=1,1g.18gb=4",
		"3g.71gb=1,1g.35gb=2",
		"3g.71gb=1,1g.35gb=1,1g.18gb=2",
		"3g.71gb=1,1g.18gb+me=1,1g.18gb=3",
		"2g.35gb=3,1g.18gb=1",
		"2g.35gb=3,1g.35gb=1",
		"2g.35gb=2,1g.18gb=3",
		"2g.35gb=2,1g.35gb=2",
		"2g.35gb=2,1g.35gb=1,1g.18gb=2",
		"2g.35gb=1,1g.18gb=5",
		"2g.35gb=1,1g.35gb=3",
		"2g.35gb=1,1g.35gb=2,1g.18gb=2",
		"1g.18gb=7",
		"1g.18gb+me=1,1g.18gb=6",
		"1g.35gb=4",
		"1g.35gb=1,1g.18gb=6",
		"1g.35gb=2,1g.18gb=4",
		"1g.35gb=3,1g.18gb=2",
		"1g.35gb=3,1g.18gb+me=1,1g.18gb=1",
		"3g.71gb@0,1g.35gb=2",
		"3g.71gb@0,2g.35gb@4,1g.18gb@6",
		"2g.35gb@2,1g.18gb=5",
	}
	infeasible := []struct{ layout, reason string }{
		{"7g.141gb=1,1g.18gb=1", "memory units"},
		{"4g.71gb=1,3g.71gb=1,1g.18gb=1", "memory units"},
		{"4g.71gb=1,1g.18gb=4", "compute slices"},
		{"4g.71gb=1,2g.35gb=2", "compute slices"},
		{"3g.71gb=2,1g.18gb=1", "memory units"},
		{"3g.71gb=1,2g.35gb=2,1g.18gb=1", "cannot place"},
		{"2g.35gb=3,1g.18gb=2", "cannot place"}, // unit 7 is no 1g.18gb's
		{"2g.35gb=3,1g.35gb=1,1g.18gb=1", "memory units"},
		{"1g.35gb=4,1g.18gb=1", "memory units"},
		{"1g.18gb=7,1g.35gb=1", "memory units"},
		{"1g.18gb+me=1,1g.18gb=7", "compute slices"},
		{"1g.35gb=3,2g.35gb=1,1g.18gb=1", "memory units"},
		{"3g.71gb@0,4g.71gb=1", "cannot place 4g"},
		{"2g.35gb@2,3g.71gb=2", "memory units"},
	}
	badInput := []struct{ layout, reason string }{
		{"1g.18gb=8", "at most 7"},
		{"1g.18gb+me=2", "at most 1"},
		{"1g.35gb=5", "at most 4"},
		{"2g.35gb=4", "at most 3"},
		{"3g.71gb=3", "at most 2"},
		{"4g.71gb=2", "at most 1"},
		{"1g.18gb@7", "cannot start at memory unit 7"},
		{"2g.35gb@6", "cannot start at memory unit 6"},
		{"3g.71gb@2", "cannot start at memory unit 2"},
		{"1g.35gb@1", "cannot start at memory unit 1"},
		{"3g.71gb@0,2g.35gb@2", "overlaps"},
	}
	ctx := context.Background()
	for _, model := range []migsim.Model{migsim.H200, migsim.H100} {
		names := map[string]string{} // this model's name -> H200 name
		rename := func(s string) string { return s }
		if model.Key == migsim.H100.Key {
			for h200, h100 := range h100Names {
				names[h100] = h200
			}
			rename = func(s string) string {
				// longest names first: "1g.18gb+me" before "1g.18gb"
				for _, from := range []string{"1g.18gb+me", "1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"} {
					s = strings.ReplaceAll(s, from+"=", h100Names[from]+"=")
					s = strings.ReplaceAll(s, from+"@", h100Names[from]+"@")
				}
				return s
			}
		}
		t.Run(model.Key, func(t *testing.T) {
			for _, l := range feasible {
				l := rename(l)
				t.Run("feasible "+l, func(t *testing.T) {
					r, err := mig.ParseLayout(l)
					require.NoError(t, err)
					sim := migsim.New(model, 1)
					m := newManager(t, sim)
					res, err := m.Apply(ctx, map[int]mig.Request{0: r}, mig.ApplyOptions{})
					require.NoError(t, err, l)
					checkHardwareRules(t, res.GPUs[0].Layout, names)
					node, err := m.Discover(ctx)
					require.NoError(t, err)
					require.True(t, node.GPUs[0].Layout().Equal(res.GPUs[0].Layout), "the simulator holds what was planned")
					require.NoError(t, mig.Assert(&node.GPUs[0], r))
				})
			}
			for _, tc := range infeasible {
				l := rename(tc.layout)
				t.Run("infeasible "+l, func(t *testing.T) {
					r, err := mig.ParseLayout(l)
					require.NoError(t, err)
					node, err := mig.Discover(migsim.New(model, 1))
					require.NoError(t, err)
					_, err = mig.PlanGPU(&node.GPUs[0], r, mig.PlanOptions{})
					require.ErrorIs(t, err, mig.ErrInfeasible, l)
					require.Contains(t, err.Error(), rename(tc.reason))
					require.NotContains(t, err.Error(), "\n")
				})
			}
			for _, tc := range badInput {
				l := rename(tc.layout)
				t.Run("bad "+l, func(t *testing.T) {
					r, err := mig.ParseLayout(l)
					require.NoError(t, err)
					node, err := mig.Discover(migsim.New(model, 1))
					require.NoError(t, err)
					_, err = mig.PlanGPU(&node.GPUs[0], r, mig.PlanOptions{})
					require.ErrorIs(t, err, mig.ErrBadConfig, l)
					require.Contains(t, err.Error(), tc.reason)
				})
			}
		})
	}
}

// roomLeft is, by brute force over the hardware rules above, the most compute
// slices further GPU instances could still add to layout l.
func roomLeft(l mig.Layout) int {
	var used [8]bool
	counts := map[string]int{}
	slices := 0
	for _, s := range l {
		for u := s.Placement.Start; u < s.Placement.Start+s.Placement.Size; u++ {
			used[u] = true
		}
		counts[s.Profile]++
		slices += h200Rules[s.Profile].slices
	}
	names := make([]string, 0, len(h200Rules))
	for n := range h200Rules {
		names = append(names, n)
	}
	best := 0
	var try func(added int, used [8]bool, minStart int)
	try = func(added int, used [8]bool, minStart int) {
		if added > best {
			best = added
		}
		for _, n := range names {
			r := h200Rules[n]
			if counts[n] >= r.max || slices+added+r.slices > 7 {
				continue
			}
			for _, st := range r.starts {
				if st < minStart {
					continue
				}
				free := true
				for u := st; u < st+r.size; u++ {
					free = free && !used[u]
				}
				if !free {
					continue
				}
				next := used
				for u := st; u < st+r.size; u++ {
					next[u] = true
				}
				counts[n]++
				try(added+r.slices, next, st+1)
				counts[n]--
			}
		}
	}
	try(0, used, 0)
	return best
}

// TestPlanLeavesMostRoom: among valid placements the planner picks one that
// leaves room for the most compute slices an admin could still add (checked
// against every valid placement by brute force, for every H200 request of up
// to 5 instances). A lone 3g.71gb goes at 4, so a 4g.71gb still fits at 0.
func TestPlanLeavesMostRoom(t *testing.T) {
	g := h200(t)
	p, err := mig.PlanGPU(g, req(dev("3g.71gb", 1)), mig.PlanOptions{})
	require.NoError(t, err)
	require.Equal(t, "3g.71gb@4:4", p.Target.String())
	require.Equal(t, 4, roomLeft(p.Target))

	names := []string{"1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"}
	// every placement of a multiset of profiles, by brute force
	var allLayouts func(ps []string, used [8]bool, minStart int, cur mig.Layout, f func(mig.Layout))
	allLayouts = func(ps []string, used [8]bool, minStart int, cur mig.Layout, f func(mig.Layout)) {
		if len(ps) == 0 {
			f(cur)
			return
		}
		r := h200Rules[ps[0]]
		for _, st := range r.starts {
			if st < minStart {
				continue
			}
			free := true
			for u := st; u < st+r.size; u++ {
				free = free && !used[u]
			}
			if !free {
				continue
			}
			next := used
			for u := st; u < st+r.size; u++ {
				next[u] = true
			}
			nextMin := 0
			if len(ps) > 1 && ps[1] == ps[0] {
				nextMin = st + 1 // identical profiles: one order only
			}
			allLayouts(ps[1:], next, nextMin, append(cur, mig.InstanceSpec{Profile: ps[0], Placement: mig.Placement{Start: st, Size: r.size}}), f)
		}
	}
	checked := 0
	var rec func(i int, ps []string)
	rec = func(i int, ps []string) {
		over := false
		cnt := map[string]int{}
		for _, n := range ps {
			cnt[n]++
			over = over || cnt[n] > h200Rules[n].max
		}
		if over {
			return // a count over the maximum is bad input, checked elsewhere
		}
		if len(ps) > 0 {
			best := -1
			allLayouts(ps, [8]bool{}, 0, nil, func(l mig.Layout) {
				if r := roomLeft(l); r > best {
					best = r
				}
			})
			r := mig.Request{MIGEnabled: true}
			for _, n := range ps {
				r.Devices = append(r.Devices, dev(n, 1))
			}
			p, err := mig.PlanGPU(g, r, mig.PlanOptions{})
			if best < 0 {
				require.Error(t, err, "%v", ps)
			} else {
				require.NoError(t, err, "%v", ps)
				require.Equal(t, best, roomLeft(p.Target), "%v planned as %s", ps, p.Target)
				checked++
			}
		}
		if len(ps) == 5 {
			return
		}
		for j := i; j < len(names); j++ {
			rec(j, append(append([]string(nil), ps...), names[j]))
		}
	}
	rec(0, nil)
	require.Greater(t, checked, 100)
}
