package mig

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// ProfileName is a MIG profile name as nvidia-smi prints it: "1g.18gb",
// "1g.18gb+me" (GPU instance) or "1c.2g.35gb" (compute instance of C slices
// inside a G-slice GPU instance). C is 0 for a GPU-instance name.
type ProfileName struct {
	C     int
	G     int
	GB    int
	Attrs []string // "me", "me.all", "gfx", "-me" as "-me"
}

// ParseProfileName parses "1g.18gb", "1g.18gb+me", "1c.2g.35gb" (an optional
// leading "MIG " as in nvidia-smi tables is accepted).
func ParseProfileName(s string) (ProfileName, error) {
	orig := s
	s = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(s), "MIG "))
	bad := func(why string) (ProfileName, error) {
		return ProfileName{}, fmt.Errorf("%w: %q: %s (want e.g. 1g.18gb, 1g.18gb+me or 1c.2g.35gb)", ErrUnknownProfile, orig, why)
	}
	var p ProfileName
	// attributes: +me, +me.all, +gfx, -me
	if i := strings.IndexAny(s, "+-"); i >= 0 {
		for _, a := range splitAttrs(s[i:]) {
			switch a {
			case "+me", "+me.all", "+gfx", "-me":
				p.Attrs = append(p.Attrs, a)
			default:
				return bad("unknown attribute " + a)
			}
		}
		s = s[:i]
	}
	parts := strings.Split(s, ".")
	num := func(part, suffix string) (int, bool) {
		if !strings.HasSuffix(part, suffix) {
			return 0, false
		}
		n, err := strconv.Atoi(strings.TrimSuffix(part, suffix))
		return n, err == nil && n > 0
	}
	var ok bool
	switch len(parts) {
	case 2:
		if p.G, ok = num(parts[0], "g"); !ok {
			return bad("bad slice count")
		}
		if p.GB, ok = num(parts[1], "gb"); !ok {
			return bad("bad memory size")
		}
	case 3:
		if p.C, ok = num(parts[0], "c"); !ok {
			return bad("bad compute slice count")
		}
		if p.G, ok = num(parts[1], "g"); !ok {
			return bad("bad slice count")
		}
		if p.GB, ok = num(parts[2], "gb"); !ok {
			return bad("bad memory size")
		}
		if p.C > p.G {
			return bad("more compute slices than the GPU instance has")
		}
	default:
		return bad("malformed")
	}
	return p, nil
}

func splitAttrs(s string) []string {
	var out []string
	for len(s) > 0 {
		j := strings.IndexAny(s[1:], "+-")
		if j < 0 {
			out = append(out, s)
			break
		}
		out = append(out, s[:j+1])
		s = s[j+1:]
	}
	return out
}

// String prints the name; a compute instance spanning its whole GPU instance
// prints as the GPU instance ("2g.35gb", not "2c.2g.35gb"), as nvidia-smi does
// for MIG devices.
func (p ProfileName) String() string {
	s := fmt.Sprintf("%dg.%dgb%s", p.G, p.GB, strings.Join(p.Attrs, ""))
	if p.C != 0 && p.C != p.G {
		s = fmt.Sprintf("%dc.%s", p.C, s)
	}
	return s
}

// GI is the name of the GPU instance profile (C dropped).
func (p ProfileName) GI() ProfileName { q := p; q.C = 0; return q }

// ComputeSlices is C, or G for a whole-GPU-instance name.
func (p ProfileName) ComputeSlices() int {
	if p.C == 0 {
		return p.G
	}
	return p.C
}

// attrForEnum is the name suffix NVML's profile enums imply.
func attrForEnum(e int) string {
	switch e {
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1:
		return "+me"
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME, nvml.GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME:
		return "+me.all"
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_NO_ME, nvml.GPU_INSTANCE_PROFILE_2_SLICE_NO_ME:
		return "-me"
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_GFX, nvml.GPU_INSTANCE_PROFILE_2_SLICE_GFX,
		nvml.GPU_INSTANCE_PROFILE_4_SLICE_GFX, nvml.GPU_INSTANCE_PROFILE_3_SLICE_GFX:
		return "+gfx"
	}
	return ""
}

// MemoryGB is the "Ngb" of a profile name: the profile's memory as a fraction
// of the device rounded up to eighths, times the device's memory in whole GiB
// (rounded up), rounded to the nearest integer. This is the rule nvidia-smi
// and go-nvlib use: 16384 MB on a 150754820096-byte H200 gives 18.
func MemoryGB(deviceBytes, profileMB uint64) int {
	const gib = 1 << 30
	frac := float64(profileMB<<20) / float64(deviceBytes)
	frac = math.Ceil(frac*8) / 8
	total := float64((deviceBytes + gib - 1) / gib)
	return int(math.Round(frac * total))
}

// NameFromInfo builds the nvidia-smi name of GPU-instance profile enum e.
func NameFromInfo(deviceBytes uint64, e int, info nvml.GpuInstanceProfileInfo) ProfileName {
	p := ProfileName{G: int(info.SliceCount), GB: MemoryGB(deviceBytes, info.MemorySizeMB)}
	if a := attrForEnum(e); a != "" {
		p.Attrs = []string{a}
	}
	return p
}

// GIProfile is a GPU-instance profile of one GPU as NVML reports it.
type GIProfile struct {
	Name        string      `json:"name" yaml:"name"`
	Enum        int         `json:"enum" yaml:"enum"` // NVML GPU_INSTANCE_PROFILE_* index
	ID          uint32      `json:"id" yaml:"id"`     // info.Id
	Slices      int         `json:"slices" yaml:"slices"`
	MaxCount    int         `json:"maxCount" yaml:"maxCount"`
	SMs         int         `json:"sms" yaml:"sms"`
	CopyEngines int         `json:"copyEngines" yaml:"copyEngines"`
	MemoryMB    uint64      `json:"memoryMB" yaml:"memoryMB"`
	Placements  []Placement `json:"placements" yaml:"placements"`
}

// Size is the profile's memory units.
func (p GIProfile) Size() int {
	if len(p.Placements) == 0 {
		return 0
	}
	return p.Placements[0].Size
}

// Allows reports whether start is one of the profile's placements.
func (p GIProfile) Allows(start int) bool {
	for _, pl := range p.Placements {
		if pl.Start == start {
			return true
		}
	}
	return false
}

// Starts lists the allowed starts, for messages.
func (p GIProfile) Starts() string {
	s := make([]string, len(p.Placements))
	for i, pl := range p.Placements {
		s[i] = strconv.Itoa(pl.Start)
	}
	return strings.Join(s, ",")
}

// ciEnumBySlices maps compute slices to NVML's COMPUTE_INSTANCE_PROFILE_* enum.
var ciEnumBySlices = map[int]int{
	1: nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, 2: nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE,
	3: nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE, 4: nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE,
	6: nvml.COMPUTE_INSTANCE_PROFILE_6_SLICE, 7: nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE,
	8: nvml.COMPUTE_INSTANCE_PROFILE_8_SLICE,
}

// CICapacity is how many c-slice compute instances fit in a g-slice GPU
// instance (MIG user guide: c in {1,2,3,4,7}, no 3-slice CI in a 4-slice GI;
// 3-slice CIs of a 7-slice GI at 0 and 4). Zero means not offered.
func CICapacity(g, c int) int {
	switch {
	case c > g || c <= 0:
		return 0
	case c == g:
		return 1
	case c == 1:
		return g
	case c == 2:
		return g / 2
	case c == 3 && g == 7:
		return 2
	case c == 4 && g == 7:
		return 1
	}
	return 0
}

// Profile looks a GPU-instance profile up by name on this GPU.
func (g *GPU) Profile(name string) (GIProfile, bool) {
	for _, p := range g.Profiles {
		if p.Name == name {
			return p, true
		}
	}
	return GIProfile{}, false
}

// ProfileNames lists the GPU's GI profile names, for messages.
func (g *GPU) ProfileNames() string {
	s := make([]string, len(g.Profiles))
	for i, p := range g.Profiles {
		s[i] = p.Name
	}
	return strings.Join(s, ", ")
}
