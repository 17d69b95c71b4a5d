package migsim

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// GIProfile is one GPU-instance profile of a model, as NVML reports it.
type GIProfile struct {
	Enum        int    // NVML GPU_INSTANCE_PROFILE_* index
	ID          uint32 // info.Id
	Name        string // nvidia-smi name without "MIG ", e.g. "1g.18gb"
	Slices      int
	Count       int // maximum instances
	SMs         int
	CopyEngines int
	Decoders    int
	Encoders    int
	JPEGs       int
	OFAs        int
	MemoryMB    uint64
	Starts      []int // allowed placement starts
	Size        int   // memory units per instance
}

// Model describes one GPU product.
type Model struct {
	Key         string // "h200", "h100", "a100-40gb", "a100-80gb"
	Name        string // NVML device name
	PCIDeviceID uint32
	MemoryBytes uint64
	SMs         int
	Arch        nvml.DeviceArchitecture
	CCMajor     int
	CCMinor     int
	// ModeNeedsReset: a MIG mode change stays pending until a GPU reset
	// (Ampere). Hopper applies it at once when the GPU is idle.
	ModeNeedsReset bool
	GIProfiles     []GIProfile
}

// Profile returns the GI profile with NVML enum e.
func (m Model) Profile(e int) (GIProfile, bool) {
	for _, p := range m.GIProfiles {
		if p.Enum == e {
			return p, true
		}
	}
	return GIProfile{}, false
}

// enumRet is what GetGpuInstanceProfileInfo answers for an enum the model
// lacks: NOT_SUPPORTED below GPU_INSTANCE_PROFILE_3_SLICE_GFX (17),
// INVALID_ARGUMENT from there on, as the real H200 does.
func enumRet(e int) nvml.Return {
	if e < 0 || e >= nvml.GPU_INSTANCE_PROFILE_3_SLICE_GFX {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	return nvml.ERROR_NOT_SUPPORTED
}

// H200 is the NVIDIA H200 SXM 141GB, exactly as read from real hardware
// (driver 580.159.04; shared/hw/H200.md).
var H200 = Model{
	Key: "h200", Name: "NVIDIA H200", PCIDeviceID: 0x233510DE, MemoryBytes: 150754820096,
	SMs: 132, Arch: nvml.DEVICE_ARCH_HOPPER, CCMajor: 9, CCMinor: 0,
	GIProfiles: []GIProfile{
		{Enum: 0, ID: 19, Name: "1g.18gb", Slices: 1, Count: 7, SMs: 16, CopyEngines: 1, Decoders: 1, JPEGs: 1, MemoryMB: 16384, Starts: []int{0, 1, 2, 3, 4, 5, 6}, Size: 1},
		{Enum: 1, ID: 14, Name: "2g.35gb", Slices: 2, Count: 3, SMs: 32, CopyEngines: 2, Decoders: 2, JPEGs: 2, MemoryMB: 33280, Starts: []int{0, 2, 4}, Size: 2},
		{Enum: 2, ID: 9, Name: "3g.71gb", Slices: 3, Count: 2, SMs: 60, CopyEngines: 3, Decoders: 3, JPEGs: 3, MemoryMB: 71424, Starts: []int{0, 4}, Size: 4},
		{Enum: 3, ID: 5, Name: "4g.71gb", Slices: 4, Count: 1, SMs: 64, CopyEngines: 4, Decoders: 4, JPEGs: 4, MemoryMB: 71424, Starts: []int{0}, Size: 4},
		{Enum: 4, ID: 0, Name: "7g.141gb", Slices: 7, Count: 1, SMs: 132, CopyEngines: 8, Decoders: 7, JPEGs: 7, OFAs: 1, MemoryMB: 143360, Starts: []int{0}, Size: 8},
		{Enum: 7, ID: 20, Name: "1g.18gb+me", Slices: 1, Count: 1, SMs: 16, CopyEngines: 1, Decoders: 1, JPEGs: 1, OFAs: 1, MemoryMB: 16384, Starts: []int{0, 1, 2, 3, 4, 5, 6}, Size: 1},
		{Enum: 9, ID: 15, Name: "1g.35gb", Slices: 1, Count: 4, SMs: 26, CopyEngines: 1, Decoders: 1, JPEGs: 1, MemoryMB: 33280, Starts: []int{0, 2, 4, 6}, Size: 2},
	},
}

// H100 is the H100 SXM5 80GB (MIG user guide; nvidia-smi mig -lgip).
var H100 = Model{
	Key: "h100", Name: "NVIDIA H100 80GB HBM3", PCIDeviceID: 0x233010DE, MemoryBytes: 85520809984,
	SMs: 132, Arch: nvml.DEVICE_ARCH_HOPPER, CCMajor: 9, CCMinor: 0,
	GIProfiles: []GIProfile{
		{Enum: 0, ID: 19, Name: "1g.10gb", Slices: 1, Count: 7, SMs: 16, CopyEngines: 1, Decoders: 1, JPEGs: 1, MemoryMB: 9984, Starts: []int{0, 1, 2, 3, 4, 5, 6}, Size: 1},
		{Enum: 1, ID: 14, Name: "2g.20gb", Slices: 2, Count: 3, SMs: 32, CopyEngines: 2, Decoders: 2, JPEGs: 2, MemoryMB: 20096, Starts: []int{0, 2, 4}, Size: 2},
		{Enum: 2, ID: 9, Name: "3g.40gb", Slices: 3, Count: 2, SMs: 60, CopyEngines: 3, Decoders: 3, JPEGs: 3, MemoryMB: 40448, Starts: []int{0, 4}, Size: 4},
		{Enum: 3, ID: 5, Name: "4g.40gb", Slices: 4, Count: 1, SMs: 64, CopyEngines: 4, Decoders: 4, JPEGs: 4, MemoryMB: 40448, Starts: []int{0}, Size: 4},
		{Enum: 4, ID: 0, Name: "7g.80gb", Slices: 7, Count: 1, SMs: 132, CopyEngines: 8, Decoders: 7, JPEGs: 7, OFAs: 1, MemoryMB: 81152, Starts: []int{0}, Size: 8},
		{Enum: 7, ID: 20, Name: "1g.10gb+me", Slices: 1, Count: 1, SMs: 16, CopyEngines: 1, Decoders: 1, JPEGs: 1, OFAs: 1, MemoryMB: 9984, Starts: []int{0, 1, 2, 3, 4, 5, 6}, Size: 1},
		{Enum: 9, ID: 15, Name: "1g.20gb", Slices: 1, Count: 4, SMs: 26, CopyEngines: 1, Decoders: 1, JPEGs: 1, MemoryMB: 20096, Starts: []int{0, 2, 4, 6}, Size: 2},
	},
}

// A100_40GB is the A100-SXM4-40GB (MIG user guide). Ampere needs a GPU reset
// for a MIG mode change.
var A100_40GB = Model{
	Key: "a100-40gb", Name: "NVIDIA A100-SXM4-40GB", PCIDeviceID: 0x20B010DE, MemoryBytes: 42505273344,
	SMs: 108, Arch: nvml.DEVICE_ARCH_AMPERE, CCMajor: 8, CCMinor: 0, ModeNeedsReset: true,
	GIProfiles: []GIProfile{
		{Enum: 0, ID: 19, Name: "1g.5gb", Slices: 1, Count: 7, SMs: 14, CopyEngines: 1, MemoryMB: 4864, Starts: []int{0, 1, 2, 3, 4, 5, 6}, Size: 1},
		{Enum: 1, ID: 14, Name: "2g.10gb", Slices: 2, Count: 3, SMs: 28, CopyEngines: 2, Decoders: 1, MemoryMB: 9856, Starts: []int{0, 2, 4}, Size: 2},
		{Enum: 2, ID: 9, Name: "3g.20gb", Slices: 3, Count: 2, SMs: 42, CopyEngines: 3, Decoders: 2, MemoryMB: 20096, Starts: []int{0, 4}, Size: 4},
		{Enum: 3, ID: 5, Name: "4g.20gb", Slices: 4, Count: 1, SMs: 56, CopyEngines: 4, Decoders: 2, MemoryMB: 20096, Starts: []int{0}, Size: 4},
		{Enum: 4, ID: 0, Name: "7g.40gb", Slices: 7, Count: 1, SMs: 98, CopyEngines: 7, Decoders: 5, JPEGs: 1, OFAs: 1, MemoryMB: 40448, Starts: []int{0}, Size: 8},
		{Enum: 7, ID: 20, Name: "1g.5gb+me", Slices: 1, Count: 1, SMs: 14, CopyEngines: 1, Decoders: 1, JPEGs: 1, OFAs: 1, MemoryMB: 4864, Starts: []int{0, 1, 2, 3, 4, 5, 6}, Size: 1},
		{Enum: 9, ID: 15, Name: "1g.10gb", Slices: 1, Count: 4, SMs: 14, CopyEngines: 1, Decoders: 1, MemoryMB: 9856, Starts: []int{0, 2, 4, 6}, Size: 2},
	},
}

// A100_80GB is the A100-SXM4-80GB (MIG user guide).
var A100_80GB = Model{
	Key: "a100-80gb", Name: "NVIDIA A100-SXM4-80GB", PCIDeviceID: 0x20B210DE, MemoryBytes: 85899345920,
	SMs: 108, Arch: nvml.DEVICE_ARCH_AMPERE, CCMajor: 8, CCMinor: 0, ModeNeedsReset: true,
	GIProfiles: []GIProfile{
		{Enum: 0, ID: 19, Name: "1g.10gb", Slices: 1, Count: 7, SMs: 14, CopyEngines: 1, MemoryMB: 9728, Starts: []int{0, 1, 2, 3, 4, 5, 6}, Size: 1},
		{Enum: 1, ID: 14, Name: "2g.20gb", Slices: 2, Count: 3, SMs: 28, CopyEngines: 2, Decoders: 1, MemoryMB: 19968, Starts: []int{0, 2, 4}, Size: 2},
		{Enum: 2, ID: 9, Name: "3g.40gb", Slices: 3, Count: 2, SMs: 42, CopyEngines: 3, Decoders: 2, MemoryMB: 40192, Starts: []int{0, 4}, Size: 4},
		{Enum: 3, ID: 5, Name: "4g.40gb", Slices: 4, Count: 1, SMs: 56, CopyEngines: 4, Decoders: 2, MemoryMB: 40192, Starts: []int{0}, Size: 4},
		{Enum: 4, ID: 0, Name: "7g.80gb", Slices: 7, Count: 1, SMs: 98, CopyEngines: 7, Decoders: 5, JPEGs: 1, OFAs: 1, MemoryMB: 81152, Starts: []int{0}, Size: 8},
		{Enum: 7, ID: 20, Name: "1g.10gb+me", Slices: 1, Count: 1, SMs: 14, CopyEngines: 1, Decoders: 1, JPEGs: 1, OFAs: 1, MemoryMB: 9728, Starts: []int{0, 1, 2, 3, 4, 5, 6}, Size: 1},
		{Enum: 9, ID: 15, Name: "1g.20gb", Slices: 1, Count: 4, SMs: 14, CopyEngines: 1, Decoders: 1, MemoryMB: 19968, Starts: []int{0, 2, 4, 6}, Size: 2},
	},
}

// Models lists the simulated products by key.
var Models = map[string]Model{
	H200.Key: H200, H100.Key: H100, A100_40GB.Key: A100_40GB, A100_80GB.Key: A100_80GB,
}

// aliases maps extra spellings of --sim names to model keys.
var aliases = map[string]string{"a100": "a100-80gb", "h100-80gb": "h100", "h200-141gb": "h200"}

// ParseSpec parses a --sim value: a model key, optionally followed by
// "x<count>" ("h200x8", "h200", "a100-40gbx8", "a100x8"). Without a count the
// node has one GPU.
func ParseSpec(s string) (Model, int, error) {
	s = strings.ToLower(strings.TrimSpace(s))
	count := 1
	if i := strings.LastIndex(s, "x"); i > 0 {
		if n, err := strconv.Atoi(s[i+1:]); err == nil {
			if n < 1 || n > 16 {
				return Model{}, 0, fmt.Errorf("simulated node %q: GPU count must be 1..16", s)
			}
			count, s = n, s[:i]
		}
	}
	if a, ok := aliases[s]; ok {
		s = a
	}
	m, ok := Models[s]
	if !ok {
		keys := make([]string, 0, len(Models))
		for k := range Models {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		return Model{}, 0, fmt.Errorf("unknown simulated GPU %q (want one of %s, optionally with xN)", s, strings.Join(keys, ", "))
	}
	return m, count, nil
}

// ciProfile is one compute-instance profile inside a GPU instance.
type ciProfile struct {
	Enum   int
	Slices int
	SMs    int
	Starts []int
}

// ciEnumBySlices maps compute slices to the COMPUTE_INSTANCE_PROFILE_* enum.
var ciEnumBySlices = map[int]int{
	1: nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, 2: nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE,
	3: nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE, 4: nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE,
	7: nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE,
}

// ciProfiles lists the compute-instance profiles a GPU instance of profile gi
// offers (MIG user guide, nvidia-smi mig -lcip / -lcipp): c-slice CIs with
// c in {1,2,3,4,7}, c <= g, no 3-slice CI in a 4-slice GI; starts aligned to c
// (3-slice CIs of a 7-slice GI at 0 and 4). SMs: the GI's own when c == g,
// otherwise those of the model's c-slice GI profile.
func (m Model) ciProfiles(gi GIProfile) []ciProfile {
	var out []ciProfile
	for _, c := range []int{1, 2, 3, 4, 7} {
		g := gi.Slices
		if c > g || (c == 3 && g == 4) {
			continue
		}
		var starts []int
		switch c {
		case 3:
			starts = []int{0}
			if g == 7 {
				starts = []int{0, 4}
			}
		default:
			for s := 0; s+c <= g; s += c {
				starts = append(starts, s)
			}
		}
		sms := gi.SMs
		if c != g {
			std, _ := m.Profile(ciEnumBySlices[c]) // GI enums 0..4 are the c-slice profiles
			sms = std.SMs
		}
		out = append(out, ciProfile{Enum: ciEnumBySlices[c], Slices: c, SMs: sms, Starts: starts})
	}
	return out
}
