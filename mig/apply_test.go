package mig_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/mig"
	"github.com/migctl/migctl/mig/migsim"
)

func all(n int, r mig.Request) map[int]mig.Request {
	out := map[int]mig.Request{}
	for i := 0; i < n; i++ {
		out[i] = r
	}
	return out
}

func layouts(t *testing.T, lib nvml.Interface) []mig.Layout {
	t.Helper()
	node, err := mig.Discover(lib)
	require.NoError(t, err)
	out := make([]mig.Layout, len(node.GPUs))
	for i := range node.GPUs {
		out[i] = node.GPUs[i].Layout()
	}
	return out
}

// fastTempDir is a temporary directory on tmpfs when there is one: the
// journal fsyncs every step, and these tests run thousands of steps.
func fastTempDir(t *testing.T) string {
	t.Helper()
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		d, err := os.MkdirTemp("/dev/shm", "migtest-")
		if err == nil {
			t.Cleanup(func() { os.RemoveAll(d) })
			return d
		}
	}
	return t.TempDir()
}

func newManager(t *testing.T, sim *migsim.Node, opts ...mig.Option) *mig.Manager {
	t.Helper()
	opts = append([]mig.Option{mig.WithJournal(filepath.Join(fastTempDir(t), "journal"))}, opts...)
	return mig.NewManager(sim, opts...)
}

func TestApplyAndIdempotence(t *testing.T) {
	ctx := context.Background()
	sim := migsim.New(migsim.H200, 8)
	m := newManager(t, sim)
	r := req(dev("3g.71gb", 1), dev("2g.35gb", 1), dev("1g.18gb", 1))
	res, err := m.Apply(ctx, all(8, r), mig.ApplyOptions{})
	require.NoError(t, err)
	require.Len(t, res.GPUs, 8)
	for i, l := range layouts(t, sim) {
		require.Equal(t, "applied", res.GPUs[i].Outcome)
		require.True(t, l.Equal(res.Plan.GPUs[i].Target), "GPU %d: %s", i, l)
		require.Len(t, l, 3)
	}
	node, err := m.Discover(ctx)
	require.NoError(t, err)
	uuids := map[string]bool{}
	for _, g := range node.GPUs {
		require.True(t, g.MIGEnabled)
		for _, in := range g.Instances {
			require.Len(t, in.Compute, 1)
			require.Regexp(t, `^MIG-[0-9a-f-]{36}$`, in.Compute[0].UUID)
			uuids[in.Compute[0].UUID] = true
		}
	}
	require.Len(t, uuids, 24, "every MIG device has its own UUID")

	res, err = m.Apply(ctx, all(8, r), mig.ApplyOptions{})
	require.NoError(t, err)
	for _, g := range res.GPUs {
		require.Equal(t, "unchanged", g.Outcome)
	}
}

func TestReconfigureKeepsMatchingInstances(t *testing.T) {
	ctx := context.Background()
	sim := migsim.New(migsim.H200, 1)
	m := newManager(t, sim)
	_, err := m.Apply(ctx, all(1, req(dev("3g.71gb", 2))), mig.ApplyOptions{})
	require.NoError(t, err)
	before, err := m.Discover(ctx)
	require.NoError(t, err)

	// keep one 3g, replace the other with two 2g: only one GI may be destroyed
	plan, err := m.Plan(ctx, all(1, req(dev("3g.71gb", 1), dev("2g.35gb", 2))), mig.PlanOptions{})
	require.NoError(t, err)
	destroyed := 0
	for _, s := range plan.GPUs[0].Steps {
		if s.Op == mig.OpDestroyGI {
			destroyed++
		}
	}
	require.Equal(t, 1, destroyed, "%v", plan.GPUs[0].Steps)
	require.Len(t, plan.GPUs[0].Kept, 1)

	_, err = m.Apply(ctx, all(1, req(dev("3g.71gb", 1), dev("2g.35gb", 2))), mig.ApplyOptions{})
	require.NoError(t, err)
	after, err := m.Discover(ctx)
	require.NoError(t, err)
	kept := 0
	for _, a := range after.GPUs[0].Instances {
		for _, b := range before.GPUs[0].Instances {
			if a.Compute[0].UUID == b.Compute[0].UUID {
				kept++
			}
		}
	}
	require.Equal(t, 1, kept, "the surviving 3g.71gb is the same MIG device")
	require.Len(t, after.GPUs[0].Instances, 3)
}

func TestBusyInstancesAreKeptOrRefused(t *testing.T) {
	ctx := context.Background()
	sim := migsim.New(migsim.H200, 1)
	m := newManager(t, sim)
	_, err := m.Apply(ctx, all(1, req(dev("3g.71gb", 1, 4))), mig.ApplyOptions{})
	require.NoError(t, err)
	node, _ := m.Discover(ctx)
	in := node.GPUs[0].Instances[0]
	require.NoError(t, sim.AttachProcess(0, in.GIID, in.Compute[0].CIID, 999, 1<<30))

	// a layout with no room for it is refused, nothing changes
	before := layouts(t, sim)
	_, err = m.Apply(ctx, all(1, req(dev("7g.141gb", 1))), mig.ApplyOptions{})
	require.ErrorIs(t, err, mig.ErrBusy)
	require.ErrorContains(t, err, "pid 999 on "+in.Compute[0].UUID, "the refusal names the process and its MIG device")
	require.Equal(t, before, layouts(t, sim))

	// a layout that can keep it plans around it: 2g at 0 and 2, 3g stays at 4
	res, err := m.Apply(ctx, all(1, req(dev("3g.71gb", 1), dev("2g.35gb", 2))), mig.ApplyOptions{})
	require.NoError(t, err)
	require.Equal(t, "2g.35gb@0:2, 2g.35gb@2:2, 3g.71gb@4:4", res.GPUs[0].Layout.String())
	node, _ = m.Discover(ctx)
	require.Equal(t, in.Compute[0].UUID, node.GPUs[0].Instances[2].Compute[0].UUID)

	// a layout that would move it (3g pinned at 0) is refused
	_, err = m.Apply(ctx, all(1, req(dev("3g.71gb", 1, 0))), mig.ApplyOptions{})
	require.ErrorIs(t, err, mig.ErrBusy)

	// a layout that keeps it but cannot fit around it says why it was kept
	_, err = m.Apply(ctx, all(1, req(dev("3g.71gb", 1), dev("4g.71gb", 1), dev("1g.18gb", 1))), mig.ApplyOptions{})
	require.ErrorIs(t, err, mig.ErrInfeasible)
	require.ErrorContains(t, err, "kept because they have processes: 3g.71gb@4:4 (GI 2) (pid 999 on "+in.Compute[0].UUID+")")
}

func TestDisableAndPendingMode(t *testing.T) {
	ctx := context.Background()
	sim := migsim.New(migsim.A100_40GB, 1)
	m := newManager(t, sim)
	_, err := m.Apply(ctx, all(1, req(dev("1g.5gb", 7))), mig.ApplyOptions{})
	require.ErrorIs(t, err, mig.ErrModePending)
	require.Contains(t, err.Error(), "nvidia-smi -r -i 0")
	node, _ := m.Discover(ctx)
	require.False(t, node.GPUs[0].MIGEnabled)
	require.True(t, node.GPUs[0].MIGPending)
	require.Equal(t, nvml.SUCCESS, sim.Reset(0)) // the admin resets the GPU
	res, err := m.Apply(ctx, all(1, req(dev("1g.5gb", 7))), mig.ApplyOptions{})
	require.NoError(t, err)
	require.Len(t, res.GPUs[0].Layout, 7)

	h := migsim.New(migsim.H200, 1)
	mh := newManager(t, h)
	_, err = mh.Apply(ctx, all(1, req(dev("2g.35gb", 3))), mig.ApplyOptions{})
	require.NoError(t, err)
	_, err = mh.Apply(ctx, all(1, mig.Request{MIGEnabled: false}), mig.ApplyOptions{})
	require.NoError(t, err)
	node, _ = mh.Discover(ctx)
	require.False(t, node.GPUs[0].MIGEnabled)
	require.Empty(t, node.GPUs[0].Instances)
}

// TestFaultInjectionEveryCall wraps the simulator so that each mutating NVML
// call of an apply fails in turn — before it takes effect, or after (the call
// did its work but reports an error) — and checks every GPU ends in its old
// layout or the new one, never in between. When NVML keeps failing from that
// call on, the rollback cannot finish; once NVML is healthy again, recover
// and apply must converge to the new layout.
func TestFaultInjectionEveryCall(t *testing.T) {
	ctx := context.Background()
	oldReq := req(dev("3g.71gb", 1), dev("2g.35gb", 1), dev("1c.2g.35gb", 2))
	newReq := req(dev("1g.18gb", 3), dev("1c.3g.71gb", 2))
	setup := func(t *testing.T) (*migsim.Node, string) {
		sim := migsim.New(migsim.H200, 2)
		journal := filepath.Join(fastTempDir(t), "journal")
		_, err := mig.NewManager(sim, mig.WithJournal(journal)).Apply(ctx, all(2, oldReq), mig.ApplyOptions{})
		require.NoError(t, err)
		return sim, journal
	}
	// count the mutating calls of a clean apply
	sim, journal := setup(t)
	oldL := layouts(t, sim)
	calls := 0
	counting := migsim.Faulty(sim, func(migsim.Call) (nvml.Return, migsim.When) { calls++; return nvml.SUCCESS, migsim.Before })
	_, err := mig.NewManager(counting, mig.WithJournal(journal)).Apply(ctx, all(2, newReq), mig.ApplyOptions{})
	require.NoError(t, err)
	newL := layouts(t, sim)
	require.NotEqual(t, oldL, newL)
	require.Greater(t, calls, 10)

	for k := 1; k <= calls; k++ {
		for _, when := range []migsim.When{migsim.Before, migsim.After} {
			for _, persistent := range []bool{false, true} {
				name := fmt.Sprintf("call %d when=%d persistent=%v", k, when, persistent)
				sim, journal := setup(t)
				faulty := migsim.Faulty(sim, func(c migsim.Call) (nvml.Return, migsim.When) {
					if c.Seq == k || (persistent && c.Seq > k) {
						return nvml.ERROR_UNKNOWN, when
					}
					return nvml.SUCCESS, when
				})
				_, err := mig.NewManager(faulty, mig.WithJournal(journal)).Apply(ctx, all(2, newReq), mig.ApplyOptions{})
				require.Error(t, err, name)
				if !persistent {
					require.ErrorIs(t, err, mig.ErrRolledBack, name)
					got := layouts(t, sim)
					for g := range got {
						require.True(t, got[g].Equal(oldL[g]) || got[g].Equal(newL[g]),
							"%s: GPU %d is in between: %s (old %s, new %s)", name, g, got[g], oldL[g], newL[g])
					}
					continue
				}
				healthy := mig.NewManager(sim, mig.WithJournal(journal))
				_, err = healthy.Recover(ctx)
				require.NoError(t, err, name)
				got := layouts(t, sim)
				for g := range got {
					require.True(t, got[g].Equal(oldL[g]) || got[g].Equal(newL[g]),
						"%s: after recover GPU %d is in between: %s", name, g, got[g])
				}
				_, err = healthy.Apply(ctx, all(2, newReq), mig.ApplyOptions{})
				require.NoError(t, err, name)
				final := layouts(t, sim)
				for g := range final {
					require.True(t, final[g].Equal(newL[g]), "%s: GPU %d: %s", name, g, final[g])
				}
			}
		}
	}
}

// TestRecoverAfterInterruptedApply stops the applying goroutine dead after
// step k (runtime.Goexit: no rollback, the journal stays) and checks that
// Recover rolls the GPU forward to the target.
func TestRecoverAfterInterruptedApply(t *testing.T) {
	ctx := context.Background()
	target := req(dev("2g.35gb", 2), dev("1g.18gb", 3))
	for k := 1; k <= 8; k++ {
		sim := migsim.New(migsim.H200, 1)
		journal := filepath.Join(fastTempDir(t), "journal")
		base := mig.NewManager(sim, mig.WithJournal(journal))
		_, err := base.Apply(ctx, all(1, req(dev("4g.71gb", 1), dev("3g.71gb", 1))), mig.ApplyOptions{})
		require.NoError(t, err)
		crashing := mig.NewManager(sim, mig.WithJournal(journal), mig.WithStepHook(func(_, n int, _ mig.Step) {
			if n == k {
				runtime.Goexit()
			}
		}))
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _ = crashing.Apply(ctx, all(1, target), mig.ApplyOptions{})
		}()
		<-done
		tx, err := mig.NewJournal(journal).Pending()
		require.NoError(t, err)
		require.NotNil(t, tx, "step %d: the journal must survive the crash", k)
		require.Equal(t, k, tx.Done)

		rec, err := mig.NewManager(sim, mig.WithJournal(journal)).Recover(ctx)
		require.NoError(t, err)
		require.Equal(t, "rolled-forward", rec.Outcome)
		got := layouts(t, sim)[0]
		require.True(t, got.Equal(tx.Target), "step %d: %s", k, got)
		tx, err = mig.NewJournal(journal).Pending()
		require.NoError(t, err)
		require.Nil(t, tx)
	}
}

// TestApplyAroundBusyAgainstBruteForce: random existing layouts with random
// busy instances, random new requests. Apply must succeed exactly when an
// independent brute force finds a layout that keeps every busy instance where
// it is, and then the busy MIG devices must survive untouched.
func TestApplyAroundBusyAgainstBruteForce(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(3, 4))
	g := h200(t)
	profs := g.Profiles
	randomReq := func() mig.Request {
		r := mig.Request{MIGEnabled: true}
		for i, k := 0, 1+rng.IntN(4); i < k; i++ {
			r.Devices = append(r.Devices, dev(profs[rng.IntN(len(profs))].Name, 1))
		}
		return r
	}
	ok, fail := 0, 0
	for n := 0; n < 300; n++ {
		sim := migsim.New(migsim.H200, 1)
		m := mig.NewManager(sim)
		if _, err := m.Apply(ctx, all(1, randomReq()), mig.ApplyOptions{}); err != nil {
			continue // infeasible start: not this test's business
		}
		node, _ := m.Discover(ctx)
		var busy []mig.Instance
		for _, in := range node.GPUs[0].Instances {
			if rng.IntN(2) == 0 {
				require.NoError(t, sim.AttachProcess(0, in.GIID, in.Compute[0].CIID, uint32(1000+in.GIID), 1<<20))
				busy = append(busy, in)
			}
		}
		r := randomReq()
		// brute force: each want takes an allowed placement; a busy instance's
		// units may only be taken by a want of its profile at exactly its place
		var wants []mig.GIProfile
		for _, d := range r.Devices {
			p, _ := g.Profile(d.Profile)
			wants = append(wants, p)
		}
		var try func(i int, used uint16, claimed map[int]bool) bool
		try = func(i int, used uint16, claimed map[int]bool) bool {
			if i == len(wants) {
				return len(claimed) == len(busy)
			}
			for _, pl := range wants[i].Placements {
				if used&pl.Mask() != 0 {
					continue
				}
				clash, claim := false, -1
				for b, in := range busy {
					if in.Placement.Overlaps(pl) {
						if in.Placement == pl && in.Profile == wants[i].Name && !claimed[b] {
							claim = b
						} else {
							clash = true
						}
					}
				}
				if clash {
					continue
				}
				next := map[int]bool{}
				for k, v := range claimed {
					next[k] = v
				}
				if claim >= 0 {
					next[claim] = true
				}
				if try(i+1, used|pl.Mask(), next) {
					return true
				}
			}
			return false
		}
		counts := map[string]int{}
		slices, over := 0, false
		for _, w := range wants {
			counts[w.Name]++
			slices += w.Slices
			over = over || counts[w.Name] > w.MaxCount
		}
		feasible := !over && slices <= 7 && try(0, 0, map[int]bool{})
		_, err := m.Apply(ctx, all(1, r), mig.ApplyOptions{})
		require.Equal(t, feasible, err == nil, "case %d: busy %v, request %v: %v", n, busy, r, err)
		if err != nil {
			fail++
			require.True(t, errors.Is(err, mig.ErrBusy) || errors.Is(err, mig.ErrInfeasible) || errors.Is(err, mig.ErrBadConfig), "%v", err)
			continue
		}
		ok++
		after, _ := m.Discover(ctx)
		for _, b := range busy {
			found := false
			for _, in := range after.GPUs[0].Instances {
				found = found || (in.Compute[0].UUID == b.Compute[0].UUID && in.Placement == b.Placement)
			}
			require.True(t, found, "case %d: busy %s was not kept", n, b)
		}
		require.NoError(t, mig.Assert(&after.GPUs[0], r))
	}
	require.Greater(t, ok, 30)
	require.Greater(t, fail, 30)
}

// TestApplyEmptyLayout: "MIG enabled, no instances" (--layout none,
// mig-parted's `mig-devices: {}`) turns MIG on on a fresh GPU and destroys
// every idle instance on a partitioned one.
func TestApplyEmptyLayout(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name  string
		first *mig.Request // applied before the empty layout, if any
	}{
		{"fresh GPU, MIG off", nil},
		{"MIG on, no instances", &mig.Request{MIGEnabled: true}},
		{"partitioned GPU", ptr(req(dev("3g.71gb", 1), dev("2g.35gb", 1), dev("1g.18gb", 1)))},
		{"MIG off again", &mig.Request{MIGEnabled: false}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sim := migsim.New(migsim.H200, 2)
			m := newManager(t, sim)
			if tc.first != nil {
				_, err := m.Apply(ctx, all(2, *tc.first), mig.ApplyOptions{})
				require.NoError(t, err)
			}
			plan, err := m.Plan(ctx, all(2, mig.Request{MIGEnabled: true}), mig.PlanOptions{})
			require.NoError(t, err)
			require.NotNil(t, plan.GPUs[0].Target, "an empty target is empty, not absent")
			require.Empty(t, plan.GPUs[0].Target)
			_, err = m.Apply(ctx, all(2, mig.Request{MIGEnabled: true}), mig.ApplyOptions{})
			require.NoError(t, err)
			node, err := m.Discover(ctx)
			require.NoError(t, err)
			for _, g := range node.GPUs {
				require.True(t, g.MIGEnabled, "GPU %d", g.Index)
				require.Empty(t, g.Instances, "GPU %d", g.Index)
				require.NoError(t, mig.Assert(&g, mig.Request{MIGEnabled: true}))
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// TestPendingModeOnManyGPUsIsOneShortLine: GPUs that need the same thing
// are named together, not each with the whole instruction again.
func TestPendingModeOnManyGPUsIsOneShortLine(t *testing.T) {
	ctx := context.Background()
	sim := migsim.New(migsim.A100_40GB, 8)
	m := newManager(t, sim)
	_, err := m.Apply(ctx, all(8, req(dev("1g.5gb", 7))), mig.ApplyOptions{})
	require.ErrorIs(t, err, mig.ErrModePending)
	msg := err.Error()
	require.Contains(t, msg, "GPUs 0,1,2,3,4,5,6,7: reset the GPU (sudo nvidia-smi -r -i <gpu>")
	require.Equal(t, 1, strings.Count(msg, "nvidia-smi"), msg)
	require.NotContains(t, msg, "\n")
}

// TestRecoverFindsTheGPUByUUID: after a reboot GPU indices can change; the
// journal's GPU is found by its UUID, not trusted by index.
func TestRecoverFindsTheGPUByUUID(t *testing.T) {
	ctx := context.Background()
	sim := migsim.New(migsim.H200, 2)
	journal := filepath.Join(fastTempDir(t), "journal")
	target := req(dev("3g.71gb", 2))
	crashing := mig.NewManager(sim, mig.WithJournal(journal), mig.WithStepHook(func(gpu, n int, _ mig.Step) {
		if gpu == 1 && n >= 1 {
			runtime.Goexit()
		}
	}))
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = crashing.Apply(ctx, map[int]mig.Request{1: target}, mig.ApplyOptions{})
	}()
	<-done
	// the GPU that was index 1 is index 0 now, as far as the journal knows
	b, err := os.ReadFile(journal)
	require.NoError(t, err)
	require.Contains(t, string(b), `"gpu":1,`)
	require.NoError(t, os.WriteFile(journal, []byte(strings.Replace(string(b), `"gpu":1,`, `"gpu":0,`, 1)), 0o644))

	rec, err := mig.NewManager(sim, mig.WithJournal(journal)).Recover(ctx)
	require.NoError(t, err)
	require.Equal(t, "rolled-forward", rec.Outcome)
	got := layouts(t, sim)
	require.Empty(t, got[0], "GPU 0 is not the journal's GPU and is left alone")
	require.Equal(t, "3g.71gb@0:4, 3g.71gb@4:4", got[1].String())
}

// TestBusyGPUInstanceKeepsItsBusyComputeInstances: a GPU instance split into
// compute instances, one of them busy, may gain or lose idle compute
// instances of the same size; the busy one stays, with its MIG UUID.
func TestBusyGPUInstanceKeepsItsBusyComputeInstances(t *testing.T) {
	ctx := context.Background()
	sim := migsim.New(migsim.H200, 1)
	m := newManager(t, sim)
	_, err := m.Apply(ctx, all(1, req(dev("1c.3g.71gb", 3), dev("3g.71gb", 1))), mig.ApplyOptions{})
	require.NoError(t, err)
	node, err := m.Discover(ctx)
	require.NoError(t, err)
	var busyUUID string
	for _, in := range node.GPUs[0].Instances {
		if len(in.Compute) == 3 {
			busyUUID = in.Compute[1].UUID
			require.NoError(t, sim.AttachProcess(0, in.GIID, in.Compute[1].CIID, 77, 1<<20))
		}
	}
	require.NotEmpty(t, busyUUID)

	for _, tc := range []struct {
		req  mig.Request
		want string
	}{
		{req(dev("1c.3g.71gb", 2), dev("3g.71gb", 1)), "3g.71gb@0:4[1c+1c], 3g.71gb@4:4"},
		{req(dev("1c.3g.71gb", 1), dev("2g.35gb", 1), dev("1g.35gb", 1)), "3g.71gb@0:4[1c], 2g.35gb@4:2, 1g.35gb@6:2"},
		{req(dev("1c.3g.71gb", 3), dev("1g.18gb", 3)), "3g.71gb@0:4[1c+1c+1c], 1g.18gb@4:1, 1g.18gb@5:1, 1g.18gb@6:1"},
	} {
		res, err := m.Apply(ctx, all(1, tc.req), mig.ApplyOptions{})
		require.NoError(t, err, "%v", tc.req)
		require.Equal(t, tc.want, res.GPUs[0].Layout.String())
		node, err := m.Discover(ctx)
		require.NoError(t, err)
		found := false
		for _, d := range node.MIGDevices() {
			found = found || (d.UUID == busyUUID && len(d.Processes) == 1)
		}
		require.True(t, found, "the busy MIG device survives: %v", tc.req)
	}

	// a different compute-instance size would destroy the busy one: refused
	_, err = m.Apply(ctx, all(1, req(dev("3g.71gb", 2))), mig.ApplyOptions{})
	require.ErrorIs(t, err, mig.ErrBusy)
}

// TestBusyGPUInstancesMayEachBeReshaped: a busy GPU instance that matches
// one wanted instance exactly may still have to serve another of the same
// profile and compute-instance size (with fewer or more compute instances),
// because a second busy one takes the exact match. The planner must consider
// both shapes for each busy instance rather than only the exact one.
func TestBusyGPUInstancesMayEachBeReshaped(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name   string
		first  mig.Request
		busyCI []int // compute instance (index in its GI) made busy in every GI
		next   mig.Request
		want   string
	}{
		{"two busy 2g halves, one loses its idle CI", req(dev("1c.2g.35gb", 4)), []int{0},
			req(dev("1c.2g.35gb", 3)), "2g.35gb@0:2[1c], 2g.35gb@2:2[1c+1c]"},
		{"two busy 3g, one loses two idle CIs", req(dev("1c.3g.71gb", 6)), []int{0},
			req(dev("1c.3g.71gb", 4)), "3g.71gb@0:4[1c], 3g.71gb@4:4[1c+1c+1c]"},
		{"two busy 3g, one loses one idle CI", req(dev("1c.3g.71gb", 6)), []int{0},
			req(dev("1c.3g.71gb", 5)), "3g.71gb@0:4[1c+1c], 3g.71gb@4:4[1c+1c+1c]"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sim := migsim.New(migsim.H200, 1)
			m := newManager(t, sim)
			_, err := m.Apply(ctx, all(1, tc.first), mig.ApplyOptions{})
			require.NoError(t, err)
			node, err := m.Discover(ctx)
			require.NoError(t, err)
			var busy []string
			for _, in := range node.GPUs[0].Instances {
				for _, k := range tc.busyCI {
					require.NoError(t, sim.AttachProcess(0, in.GIID, in.Compute[k].CIID, uint32(100+in.GIID), 1<<20))
					busy = append(busy, in.Compute[k].UUID)
				}
			}
			res, err := m.Apply(ctx, all(1, tc.next), mig.ApplyOptions{})
			require.NoError(t, err)
			require.Equal(t, tc.want, res.GPUs[0].Layout.String())
			after, err := m.Discover(ctx)
			require.NoError(t, err)
			require.NoError(t, mig.Assert(&after.GPUs[0], tc.next))
			have := map[string]bool{}
			for _, d := range after.MIGDevices() {
				have[d.UUID] = len(d.Processes) > 0
			}
			for _, u := range busy {
				require.True(t, have[u], "busy MIG device %s survives", u)
			}
		})
	}
}

// TestPendingDisableIsUndoneByEnable: on Ampere, turning MIG off stays
// pending until a reset, and the GPU keeps MIG on meanwhile. A layout (or
// mode enable) applied then must turn the pending mode back on: otherwise
// apply and assert say all is well and the admin's next reset turns MIG off
// and takes the new layout with it.
func TestPendingDisableIsUndoneByEnable(t *testing.T) {
	ctx := context.Background()
	layout := req(dev("3g.20gb", 2))
	tests := []struct {
		name string
		act  func(t *testing.T, m *mig.Manager)
	}{
		{"apply a layout", func(t *testing.T, m *mig.Manager) {
			_, err := m.Apply(ctx, all(1, layout), mig.ApplyOptions{})
			require.NoError(t, err)
		}},
		{"mode enable, then apply", func(t *testing.T, m *mig.Manager) {
			res, err := m.EnableMIG(ctx, []int{0})
			require.NoError(t, err)
			require.Equal(t, "changed", res[0].Outcome)
			require.True(t, res[0].Pending)
			_, err = m.Apply(ctx, all(1, layout), mig.ApplyOptions{})
			require.NoError(t, err)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sim := migsim.New(migsim.A100_40GB, 1)
			m := newManager(t, sim)
			_, err := m.EnableMIG(ctx, []int{0})
			require.NoError(t, err)
			require.Equal(t, nvml.SUCCESS, sim.Reset(0))
			_, err = m.Apply(ctx, all(1, mig.Request{MIGEnabled: false}), mig.ApplyOptions{})
			require.ErrorIs(t, err, mig.ErrModePending)
			node, err := m.Discover(ctx)
			require.NoError(t, err)
			require.True(t, node.GPUs[0].MIGEnabled)
			require.False(t, node.GPUs[0].MIGPending)

			tc.act(t, m)
			node, err = m.Discover(ctx)
			require.NoError(t, err)
			require.True(t, node.GPUs[0].MIGPending, "the pending disable is withdrawn")
			require.NoError(t, mig.Assert(&node.GPUs[0], layout))
			require.Equal(t, nvml.SUCCESS, sim.Reset(0)) // the admin's next reset keeps the layout
			require.Equal(t, "3g.20gb@0:4, 3g.20gb@4:4", layouts(t, sim)[0].String())
		})
	}
}

// TestAssertSeesAPendingDisable: instances created while a disable is
// pending (nvidia-smi allows it) vanish at the next reset; assert says so.
func TestAssertSeesAPendingDisable(t *testing.T) {
	ctx := context.Background()
	sim := migsim.New(migsim.A100_40GB, 1)
	m := newManager(t, sim)
	_, err := m.EnableMIG(ctx, []int{0})
	require.NoError(t, err)
	require.Equal(t, nvml.SUCCESS, sim.Reset(0))
	dev0, ret := sim.DeviceGetHandleByIndex(0)
	require.Equal(t, nvml.SUCCESS, ret)
	_, ret = dev0.SetMigMode(nvml.DEVICE_MIG_DISABLE)
	require.Equal(t, nvml.SUCCESS, ret)
	info, ret := dev0.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_7_SLICE)
	require.Equal(t, nvml.SUCCESS, ret)
	gi, ret := dev0.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: 0, Size: 8})
	require.Equal(t, nvml.SUCCESS, ret)
	ci, ret := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	require.Equal(t, nvml.SUCCESS, ret)
	_, ret = gi.CreateComputeInstance(&ci)
	require.Equal(t, nvml.SUCCESS, ret)

	node, err := m.Discover(ctx)
	require.NoError(t, err)
	err = mig.Assert(&node.GPUs[0], req(dev("7g.40gb", 1)))
	require.ErrorIs(t, err, mig.ErrMismatch)
	require.ErrorContains(t, err, "disabled is pending")
}
