package migsim_test

import (
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/mig/migsim"
)

// skewed is an H200 with the errors shared/hw/H200.md documents in go-nvml's
// dgxh200 mock: Id equal to the enum, PCI id 0x233310DE, 1g.35gb placements
// of size 1, 3g with 48 SMs.
type skewed struct{ nvml.Device }

func (s skewed) GetPciInfo() (nvml.PciInfo, nvml.Return) {
	p, r := s.Device.GetPciInfo()
	p.PciDeviceId = 0x233310DE
	return p, r
}

func (s skewed) GetGpuInstanceProfileInfo(e int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
	i, r := s.Device.GetGpuInstanceProfileInfo(e)
	if e == nvml.GPU_INSTANCE_PROFILE_3_SLICE {
		i.MultiprocessorCount = 48
	}
	i.Id = uint32(e)
	return i, r
}

func (s skewed) GetGpuInstancePossiblePlacements(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstancePlacement, nvml.Return) {
	if info.Id == nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2 {
		var out []nvml.GpuInstancePlacement
		for i := uint32(0); i < 7; i++ {
			out = append(out, nvml.GpuInstancePlacement{Start: i, Size: 1})
		}
		return out, nvml.SUCCESS
	}
	// the real enum-to-id mapping, to reach the right profile
	e := int(info.Id)
	real, _ := s.Device.GetGpuInstanceProfileInfo(e)
	return s.Device.GetGpuInstancePossiblePlacements(&real)
}

// The comparator of the GPU conformance test, checked without a GPU: a
// simulated H200 matches itself, and a device carrying the documented errors
// of go-nvml's dgxh200 mock is caught on exactly those fields.
func TestConformanceComparator(t *testing.T) {
	a, _ := migsim.New(migsim.H200, 1).DeviceGetHandleByIndex(0)
	b, _ := migsim.New(migsim.H200, 1).DeviceGetHandleByIndex(0)
	simName := func(e int) (string, bool) {
		p, ok := migsim.H200.Profile(e)
		return "MIG " + p.Name, ok
	}
	var lines int
	bad := compareH200(func(string, ...any) { lines++ }, a, simName, b)
	require.Empty(t, bad)
	require.Greater(t, lines, 7*14, "every field of every profile is compared and logged")

	bad = compareH200(func(string, ...any) {}, skewed{a}, simName, b)
	joined := strings.Join(bad, "\n")
	for _, want := range []string{"PCI device id", "enum  0 Id: real 0, sim 19", "enum  9 placements", "enum  2 MultiprocessorCount: real 48, sim 60"} {
		require.Contains(t, joined, want)
	}
	require.NotContains(t, joined, "MemorySizeMB", "fields that agree are not reported")
	require.NotContains(t, joined, "enum  2 placements")
}
