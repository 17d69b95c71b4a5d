package mig

import (
	"fmt"
	"sort"
	"strings"
)

// Request is what a layout asks of one GPU.
type Request struct {
	// MIGEnabled false asks for MIG off (and then Devices must be empty).
	MIGEnabled bool            `json:"migEnabled" yaml:"migEnabled"`
	Devices    []DeviceRequest `json:"devices,omitempty" yaml:"devices,omitempty"`
}

// DeviceRequest asks for Count MIG devices of one profile.
type DeviceRequest struct {
	// Profile as written: a GI profile ("3g.71gb") for one full compute
	// instance per GPU instance, or a CI profile ("1c.2g.35gb") for GPU
	// instances split into compute instances of that size, packed.
	Profile string `json:"profile" yaml:"profile"`
	Count   int    `json:"count" yaml:"count"`
	// Starts optionally pins GPU instances to memory-unit starts (migctl's
	// extension to mig-parted); at most one start per GPU instance.
	Starts []int `json:"starts,omitempty" yaml:"starts,omitempty"`
	// Source says where the entry came from ("layout.yaml:12: mig-devices
	// \"1g.18gb\""), for error messages.
	Source string `json:"-" yaml:"-"`
}

func (d DeviceRequest) where() string {
	if d.Source != "" {
		return d.Source
	}
	return fmt.Sprintf("%q", d.Profile)
}

// String prints a request in --layout syntax ("3g.71gb=1,1g.18gb@6").
func (r Request) String() string {
	if !r.MIGEnabled {
		return "mig disabled"
	}
	if len(r.Devices) == 0 {
		return "mig enabled, no instances"
	}
	var parts []string
	for _, d := range r.Devices {
		free := d.Count - len(d.Starts)
		if free > 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", d.Profile, free))
		}
		for _, s := range d.Starts {
			parts = append(parts, fmt.Sprintf("%s@%d", d.Profile, s))
		}
	}
	return strings.Join(parts, ",")
}

// Want is one GPU instance a request asks for.
type Want struct {
	Profile  GIProfile
	CISlices []int
	Start    int // -1: the planner chooses
	Source   string
}

func (w Want) spec(start int) InstanceSpec {
	return InstanceSpec{Profile: w.Profile.Name, Placement: Placement{Start: start, Size: w.Profile.Size()}, CISlices: append([]int(nil), w.CISlices...)}
}

// Expand validates req against gpu and turns it into GPU instances to place.
// Errors name the offending entry: an unknown profile, a profile this GPU
// lacks, a count over the profile's maximum, a start the profile does not
// allow, or explicit placements that overlap.
func Expand(gpu *GPU, req Request) ([]Want, error) {
	if !req.MIGEnabled {
		if len(req.Devices) > 0 {
			return nil, fmt.Errorf("%w: GPU %d: mig-devices given with mig-enabled: false", ErrBadConfig, gpu.Index)
		}
		return nil, nil
	}
	if !gpu.MIGCapable {
		return nil, fmt.Errorf("GPU %d (%s): %w", gpu.Index, gpu.Name, ErrNotMIGCapable)
	}
	var wants []Want
	perProfile := map[string]int{}
	type pinned struct {
		pl  Placement
		src string
	}
	var pins []pinned
	for _, d := range req.Devices {
		name, err := ParseProfileName(d.Profile)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", d.where(), err)
		}
		gp, ok := gpu.Profile(name.GI().String())
		if !ok {
			return nil, fmt.Errorf("%s: %w: GPU %d (%s) has no profile %s (it has %s)",
				d.where(), ErrUnknownProfile, gpu.Index, gpu.Name, name.GI(), gpu.ProfileNames())
		}
		if d.Count < 0 {
			return nil, fmt.Errorf("%s: %w: negative count %d", d.where(), ErrBadConfig, d.Count)
		}
		if d.Count == 0 && len(d.Starts) == 0 {
			continue
		}
		c := name.ComputeSlices()
		per := CICapacity(gp.Slices, c)
		if per == 0 {
			return nil, fmt.Errorf("%s: %w: a %s GPU instance cannot hold %d-slice compute instances", d.where(), ErrUnknownProfile, gp.Name, c)
		}
		nGI := (d.Count + per - 1) / per
		if len(d.Starts) > nGI {
			return nil, fmt.Errorf("%s: %w: %d placements given for %d GPU instances", d.where(), ErrBadConfig, len(d.Starts), nGI)
		}
		perProfile[gp.Name] += nGI
		if perProfile[gp.Name] > gp.MaxCount {
			return nil, fmt.Errorf("%s: %w: %d x %s requested, GPU %d (%s) allows at most %d",
				d.where(), ErrBadConfig, perProfile[gp.Name], gp.Name, gpu.Index, gpu.Name, gp.MaxCount)
		}
		left := d.Count
		for k := 0; k < nGI; k++ {
			n := per
			if left < per {
				n = left
			}
			left -= n
			cis := make([]int, n)
			for j := range cis {
				cis[j] = c
			}
			w := Want{Profile: gp, CISlices: cis, Start: -1, Source: d.where()}
			if k < len(d.Starts) {
				s := d.Starts[k]
				if !gp.Allows(s) {
					return nil, fmt.Errorf("%s: %w: %s cannot start at memory unit %d (allowed starts: %s)", d.where(), ErrBadConfig, gp.Name, s, gp.Starts())
				}
				pl := Placement{Start: s, Size: gp.Size()}
				for _, p := range pins {
					if p.pl.Overlaps(pl) {
						return nil, fmt.Errorf("%s: %w: %s@%s overlaps %s", d.where(), ErrBadConfig, gp.Name, pl, p.src)
					}
				}
				pins = append(pins, pinned{pl: pl, src: fmt.Sprintf("%s@%s (%s)", gp.Name, pl, d.where())})
				w.Start = s
			}
			wants = append(wants, w)
		}
	}
	sort.SliceStable(wants, func(i, j int) bool { return wantLess(wants[i], wants[j]) })
	return wants, nil
}

// wantLess orders wants for the search: pinned first, then bigger first.
func wantLess(a, b Want) bool {
	if (a.Start >= 0) != (b.Start >= 0) {
		return a.Start >= 0
	}
	if a.Profile.Size() != b.Profile.Size() {
		return a.Profile.Size() > b.Profile.Size()
	}
	if a.Profile.Slices != b.Profile.Slices {
		return a.Profile.Slices > b.Profile.Slices
	}
	if a.Profile.Name != b.Profile.Name {
		return a.Profile.Name < b.Profile.Name
	}
	return len(a.CISlices) > len(b.CISlices)
}
