package mig

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Node is what discovery found: the GPUs of one machine.
type Node struct {
	DriverVersion string `json:"driverVersion,omitempty" yaml:"driverVersion,omitempty"`
	GPUs          []GPU  `json:"gpus" yaml:"gpus"`
}

// GPU is one physical GPU and its MIG state.
type GPU struct {
	Index       int    `json:"index" yaml:"index"`
	UUID        string `json:"uuid" yaml:"uuid"`
	PCIBusID    string `json:"pciBusId" yaml:"pciBusId"`
	PCIDeviceID uint32 `json:"pciDeviceId" yaml:"pciDeviceId"`
	Name        string `json:"name" yaml:"name"`
	MemoryBytes uint64 `json:"memoryBytes" yaml:"memoryBytes"`
	MIGCapable  bool   `json:"migCapable" yaml:"migCapable"`
	// MIGEnabled is the current mode; MIGPending the mode after the next reset
	// (equal to MIGEnabled when nothing is pending).
	MIGEnabled bool        `json:"migEnabled" yaml:"migEnabled"`
	MIGPending bool        `json:"migPending" yaml:"migPending"`
	Profiles   []GIProfile `json:"profiles,omitempty" yaml:"profiles,omitempty"`
	Instances  []Instance  `json:"instances,omitempty" yaml:"instances,omitempty"`
	// Processes on the whole GPU (MIG off), or those NVML did not attribute.
	Processes []Process `json:"processes,omitempty" yaml:"processes,omitempty"`
}

// ModePending reports a MIG mode change waiting for a GPU reset.
func (g *GPU) ModePending() bool { return g.MIGEnabled != g.MIGPending }

// Instance is one GPU instance and its compute instances.
type Instance struct {
	GIID      int               `json:"gpuInstanceId" yaml:"gpuInstanceId"`
	Profile   string            `json:"profile" yaml:"profile"`
	ProfileID uint32            `json:"profileId" yaml:"profileId"`
	Placement Placement         `json:"placement" yaml:"placement"`
	Compute   []ComputeInstance `json:"computeInstances,omitempty" yaml:"computeInstances,omitempty"`
}

// ComputeInstance is one compute instance: a MIG device.
type ComputeInstance struct {
	CIID      int       `json:"computeInstanceId" yaml:"computeInstanceId"`
	Profile   string    `json:"profile" yaml:"profile"` // "1c.2g.35gb", or "2g.35gb" for a full one
	Slices    int       `json:"slices" yaml:"slices"`
	Placement Placement `json:"placement" yaml:"placement"`
	UUID      string    `json:"uuid,omitempty" yaml:"uuid,omitempty"`
	Processes []Process `json:"processes,omitempty" yaml:"processes,omitempty"`
}

// Process is a process NVML reports on a MIG device or GPU.
type Process struct {
	PID       uint32 `json:"pid" yaml:"pid"`
	UsedBytes uint64 `json:"usedBytes" yaml:"usedBytes"`
}

// Busy reports whether any compute instance of i has processes.
func (i Instance) Busy() bool {
	for _, c := range i.Compute {
		if len(c.Processes) > 0 {
			return true
		}
	}
	return false
}

// busyWith names the processes on i's MIG devices ("pid 4242 on
// MIG-…"), for errors that refuse to destroy it.
func (i Instance) busyWith() string {
	var parts []string
	for _, c := range i.Compute {
		for _, p := range c.Processes {
			parts = append(parts, fmt.Sprintf("pid %d on %s", p.PID, c.UUID))
		}
	}
	return strings.Join(parts, ", ")
}

// CISlices lists the compute slices of i's compute instances, sorted.
func (i Instance) CISlices() []int {
	out := make([]int, len(i.Compute))
	for k, c := range i.Compute {
		out[k] = c.Slices
	}
	sort.Ints(out)
	return out
}

// Spec is the shape of i (profile, placement, compute instances) without ids.
func (i Instance) Spec() InstanceSpec {
	return InstanceSpec{Profile: i.Profile, Placement: i.Placement, CISlices: i.CISlices()}
}

// String prints "3g.71gb@4:4 [GI 2]".
func (i Instance) String() string {
	return fmt.Sprintf("%s@%s (GI %d)", i.Profile, i.Placement, i.GIID)
}

// InstanceSpec is one GPU instance of a layout: its profile, placement and
// the compute slices of its compute instances (one entry per CI).
type InstanceSpec struct {
	Profile   string    `json:"profile" yaml:"profile"`
	Placement Placement `json:"placement" yaml:"placement"`
	CISlices  []int     `json:"ciSlices" yaml:"ciSlices"`
}

// String prints "2g.35gb@0:2" or "2g.35gb@0:2[1c+1c]" for split GIs.
func (s InstanceSpec) String() string {
	out := s.Profile + "@" + s.Placement.String()
	if len(s.CISlices) != 1 || !s.full() {
		parts := make([]string, len(s.CISlices))
		for i, c := range s.CISlices {
			parts[i] = fmt.Sprintf("%dc", c)
		}
		out += "[" + strings.Join(parts, "+") + "]"
	}
	return out
}

// full reports a single compute instance spanning the whole GI.
func (s InstanceSpec) full() bool {
	p, err := ParseProfileName(s.Profile)
	return err == nil && len(s.CISlices) == 1 && s.CISlices[0] == p.G
}

// Equal compares profile, placement and compute slices.
func (s InstanceSpec) Equal(o InstanceSpec) bool {
	if s.Profile != o.Profile || s.Placement != o.Placement || len(s.CISlices) != len(o.CISlices) {
		return false
	}
	a, b := append([]int(nil), s.CISlices...), append([]int(nil), o.CISlices...)
	sort.Ints(a)
	sort.Ints(b)
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Layout is the instance layout of one GPU, sorted by placement.
type Layout []InstanceSpec

// MarshalJSON writes an empty layout as [], as the YAML encoder does, never
// as null: -o json and -o yaml must say the same thing.
func (l Layout) MarshalJSON() ([]byte, error) {
	if l == nil {
		return []byte("[]"), nil
	}
	return json.Marshal([]InstanceSpec(l))
}

// Sorted returns a copy ordered by placement start.
func (l Layout) Sorted() Layout {
	out := append(Layout(nil), l...)
	sort.Slice(out, func(i, j int) bool { return out[i].Placement.Start < out[j].Placement.Start })
	return out
}

// Equal compares two layouts as sets.
func (l Layout) Equal(o Layout) bool {
	if len(l) != len(o) {
		return false
	}
	a, b := l.Sorted(), o.Sorted()
	for i := range a {
		if !a[i].Equal(b[i]) {
			return false
		}
	}
	return true
}

// String prints "3g.71gb@0:4, 2g.35gb@4:2" ("empty" for none).
func (l Layout) String() string {
	if len(l) == 0 {
		return "empty"
	}
	s := make([]string, len(l))
	for i, x := range l.Sorted() {
		s[i] = x.String()
	}
	return strings.Join(s, ", ")
}

// Layout is the GPU's current instance layout.
func (g *GPU) Layout() Layout {
	out := make(Layout, len(g.Instances))
	for i, in := range g.Instances {
		out[i] = in.Spec()
	}
	return out.Sorted()
}

// mode helpers
func modeBool(m int) bool { return m == nvml.DEVICE_MIG_ENABLE }

// MIGDevice is one MIG device (a compute instance) flattened with its GPU
// and GPU instance, as a scheduler leasing instances wants it.
type MIGDevice struct {
	GPU       int       `json:"gpu" yaml:"gpu"`
	GPUUUID   string    `json:"gpuUuid" yaml:"gpuUuid"`
	GIID      int       `json:"gpuInstanceId" yaml:"gpuInstanceId"`
	CIID      int       `json:"computeInstanceId" yaml:"computeInstanceId"`
	Profile   string    `json:"profile" yaml:"profile"` // MIG device name: "3g.71gb", "1c.2g.35gb"
	Placement Placement `json:"placement" yaml:"placement"`
	UUID      string    `json:"uuid" yaml:"uuid"` // what CUDA_VISIBLE_DEVICES takes
	MemoryMB  uint64    `json:"memoryMB" yaml:"memoryMB"`
	Processes []Process `json:"processes,omitempty" yaml:"processes,omitempty"`
}

// MIGDevices lists every MIG device of the node, by GPU, then placement,
// then compute instance id.
func (n *Node) MIGDevices() []MIGDevice {
	var out []MIGDevice
	for _, g := range n.GPUs {
		for _, in := range g.Instances {
			p, _ := g.Profile(in.Profile)
			for _, c := range in.Compute {
				out = append(out, MIGDevice{GPU: g.Index, GPUUUID: g.UUID, GIID: in.GIID, CIID: c.CIID,
					Profile: c.Profile, Placement: in.Placement, UUID: c.UUID, MemoryMB: p.MemoryMB, Processes: c.Processes})
			}
		}
	}
	return out
}
