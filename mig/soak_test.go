package mig_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/mig"
	"github.com/migctl/migctl/mig/migsim"
)

// TestApplySequencesKeepInvariants applies random layouts one after another
// on one simulated H200 (GI and CI profiles, pins, "none", MIG off), with
// fake processes coming and going, and checks after every apply: a success
// leaves a layout the hardware accepts that asserts as requested, with every
// busy MIG device still there under its UUID; a refusal changes nothing.
func TestApplySequencesKeepInvariants(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(7, 11))
	gis := []string{"1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"}
	cis := []string{"1c.2g.35gb", "1c.3g.71gb", "2c.3g.71gb", "1c.4g.71gb", "2c.4g.71gb", "1c.7g.141gb", "3c.7g.141gb"}
	randomReq := func() mig.Request {
		switch rng.IntN(12) {
		case 0:
			return mig.Request{MIGEnabled: false}
		case 1:
			return mig.Request{MIGEnabled: true}
		}
		r := mig.Request{MIGEnabled: true}
		seen := map[string]bool{}
		for i, k := 0, 1+rng.IntN(4); i < k; i++ {
			name := gis[rng.IntN(len(gis))]
			if rng.IntN(4) == 0 {
				name = cis[rng.IntN(len(cis))]
			}
			if seen[name] {
				continue
			}
			seen[name] = true
			d := mig.DeviceRequest{Profile: name, Count: 1 + rng.IntN(3)}
			if rng.IntN(5) == 0 {
				d.Starts = []int{[]int{0, 2, 4, 6}[rng.IntN(4)]}
			}
			r.Devices = append(r.Devices, d)
		}
		return r
	}
	sim := migsim.New(migsim.H200, 1)
	m := newManager(t, sim)
	applied, refused := 0, 0
	for step := 0; step < 1500; step++ {
		before, err := m.Discover(ctx)
		require.NoError(t, err)
		busy := map[string]bool{}
		for _, d := range before.MIGDevices() {
			if len(d.Processes) > 0 {
				busy[d.UUID] = true
			}
		}
		r := randomReq()
		force := rng.IntN(10) == 0
		_, err = m.Apply(ctx, map[int]mig.Request{0: r}, mig.ApplyOptions{PlanOptions: mig.PlanOptions{Force: force}})
		after, derr := m.Discover(ctx)
		require.NoError(t, derr)
		g := &after.GPUs[0]
		what := fmt.Sprintf("step %d: %v (force %v) on %s", step, r, force, before.GPUs[0].Layout())
		if err != nil {
			refused++
			require.Equal(t, before.GPUs[0].MIGEnabled, g.MIGEnabled, what)
			require.True(t, before.GPUs[0].Layout().Equal(g.Layout()), "%s: refused (%v) but changed to %s", what, err, g.Layout())
		} else {
			applied++
			require.NoError(t, mig.Assert(g, r), what)
			checkHardwareRules(t, g.Layout(), nil)
		}
		have := map[string]bool{}
		for _, d := range after.MIGDevices() {
			have[d.UUID] = true
		}
		for u := range busy {
			require.True(t, have[u], "%s: busy MIG device %s was destroyed (err %v)", what, u, err)
		}
		// processes come and go
		devs := after.MIGDevices()
		if len(devs) > 0 && rng.IntN(3) == 0 {
			d := devs[rng.IntN(len(devs))]
			require.NoError(t, sim.AttachProcess(0, d.GIID, d.CIID, uint32(1000+step), 1<<20))
		}
		if rng.IntN(3) == 0 {
			for _, d := range devs {
				for _, p := range d.Processes {
					require.NoError(t, sim.DetachProcess(0, p.PID))
				}
			}
		}
	}
	require.Greater(t, applied, 250)
	require.Greater(t, refused, 100)
}
