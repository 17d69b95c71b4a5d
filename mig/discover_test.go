package mig_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/mig"
	"github.com/migctl/migctl/mig/migsim"
)

func TestDiscoverProfileNames(t *testing.T) {
	tests := []struct {
		model migsim.Model
		names []string
	}{
		{migsim.H200, []string{"1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"}},
		{migsim.H100, []string{"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"}},
		{migsim.A100_40GB, []string{"1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"}},
		{migsim.A100_80GB, []string{"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"}},
	}
	for _, tc := range tests {
		t.Run(tc.model.Key, func(t *testing.T) {
			node, err := mig.Discover(migsim.New(tc.model, 2))
			require.NoError(t, err)
			require.Len(t, node.GPUs, 2)
			g := node.GPUs[1]
			require.True(t, g.MIGCapable)
			require.False(t, g.MIGEnabled)
			require.Empty(t, g.Instances)
			var names []string
			for _, p := range g.Profiles {
				names = append(names, p.Name)
				// the simulator's own table agrees with the name rule
				sp, ok := tc.model.Profile(p.Enum)
				require.True(t, ok)
				require.Equal(t, sp.Name, p.Name)
			}
			require.Equal(t, tc.names, names)
			require.NotEqual(t, node.GPUs[0].UUID, g.UUID)
			require.NotEmpty(t, g.PCIBusID)
		})
	}
}

func TestProfileNameRoundTrip(t *testing.T) {
	tests := []struct {
		in, out string
		c, g    int
		ok      bool
	}{
		{"1g.18gb", "1g.18gb", 0, 1, true},
		{"1g.18gb+me", "1g.18gb+me", 0, 1, true},
		{"MIG 3g.71gb", "3g.71gb", 0, 3, true},
		{"1c.2g.35gb", "1c.2g.35gb", 1, 2, true},
		{"2c.2g.35gb", "2g.35gb", 2, 2, true},
		{"1c.7g.141gb", "1c.7g.141gb", 1, 7, true},
		{"3c.2g.35gb", "", 0, 0, false},
		{"1g", "", 0, 0, false},
		{"1g.18gb+xx", "", 0, 0, false},
		{"g.18gb", "", 0, 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			p, err := mig.ParseProfileName(tc.in)
			if !tc.ok {
				require.ErrorIs(t, err, mig.ErrUnknownProfile)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.out, p.String())
			require.Equal(t, tc.c, p.C)
			require.Equal(t, tc.g, p.G)
		})
	}
}

func TestMemoryGBRule(t *testing.T) {
	// the H200 reading: 16384 MB -> 18, 33280 -> 35, 71424 -> 71, 143360 -> 141
	for mb, gb := range map[uint64]int{16384: 18, 33280: 35, 71424: 71, 143360: 141} {
		require.Equal(t, gb, mig.MemoryGB(150754820096, mb), "%d MB", mb)
	}
}

func TestMIGDevicesFlattened(t *testing.T) {
	sim := migsim.New(migsim.H200, 2)
	m := mig.NewManager(sim)
	_, err := m.Apply(context.Background(), map[int]mig.Request{1: req(dev("1c.3g.71gb", 3), dev("2g.35gb", 1))}, mig.ApplyOptions{})
	require.NoError(t, err)
	node, err := mig.Discover(sim)
	require.NoError(t, err)
	devs := node.MIGDevices()
	require.Len(t, devs, 4)
	profiles := map[string]int{}
	for _, d := range devs {
		require.Equal(t, 1, d.GPU)
		require.Equal(t, node.GPUs[1].UUID, d.GPUUUID)
		require.Regexp(t, `^MIG-`, d.UUID)
		profiles[d.Profile]++
	}
	require.Equal(t, map[string]int{"1c.3g.71gb": 3, "2g.35gb": 1}, profiles)
}
