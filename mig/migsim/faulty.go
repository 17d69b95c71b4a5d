package migsim

import (
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// When says whether an injected fault strikes before a call (the call has
// no effect) or after it (the call took effect, yet the caller sees the
// error, as when a driver call times out after doing its work).
type When int

// The two moments a fault can strike.
const (
	Before When = iota
	After
)

// Call describes a mutating NVML call seen by a Faulty wrapper.
type Call struct {
	Op  string // "SetMigMode", "CreateGpuInstanceWithPlacement", "GpuInstance.Destroy", ...
	Seq int    // 1 for the first mutating call through the wrapper, 2 for the next, ...
}

// Fault decides the fate of a mutating call: SUCCESS lets it through
// untouched; anything else is returned to the caller, before or after the
// call runs depending on when.
type Fault func(c Call) (nvml.Return, When)

// Faulty wraps any nvml.Interface (the simulator, or real NVML) so that every
// mutating call made through it or through the handles it hands out
// (SetMigMode, Create/Destroy of GPU and compute instances) first asks f.
// Read-only calls pass straight through. Safe for concurrent use.
func Faulty(lib nvml.Interface, f Fault) nvml.Interface {
	return &faultyLib{Interface: lib, fs: &faultState{f: f}}
}

type faultState struct {
	mu  sync.Mutex
	seq int
	f   Fault
}

// do runs call under the fault policy.
func (s *faultState) do(op string, call func() nvml.Return) nvml.Return {
	s.mu.Lock()
	s.seq++
	r, when := s.f(Call{Op: op, Seq: s.seq})
	s.mu.Unlock()
	if r != nvml.SUCCESS && when == Before {
		return r
	}
	got := call()
	if r != nvml.SUCCESS {
		return r
	}
	return got
}

// doValue is do for a call that also returns a value (the handle a Create
// makes, the activation status of SetMigMode): the value is whatever the call
// left, or T's zero value when a Before fault kept it from running.
func doValue[T any](s *faultState, op string, call func() (T, nvml.Return)) (T, nvml.Return) {
	var v T
	r := s.do(op, func() nvml.Return {
		var r nvml.Return
		v, r = call()
		return r
	})
	return v, r
}

type faultyLib struct {
	nvml.Interface
	fs *faultState
}

func (l *faultyLib) DeviceGetHandleByIndex(i int) (nvml.Device, nvml.Return) {
	d, r := l.Interface.DeviceGetHandleByIndex(i)
	if r != nvml.SUCCESS {
		return d, r
	}
	return &faultyDevice{Device: d, fs: l.fs}, r
}

type faultyDevice struct {
	nvml.Device
	fs *faultState
}

// SetMigMode returns (activation status, return code), in go-nvml's order;
// a Before fault leaves the activation status at its zero value, SUCCESS.
func (d *faultyDevice) SetMigMode(mode int) (nvml.Return, nvml.Return) {
	return doValue(d.fs, "SetMigMode", func() (nvml.Return, nvml.Return) { return d.Device.SetMigMode(mode) })
}

func (d *faultyDevice) wrapGI(gi nvml.GpuInstance, r nvml.Return) (nvml.GpuInstance, nvml.Return) {
	if r != nvml.SUCCESS || gi == nil {
		return nil, r
	}
	return &faultyGI{GpuInstance: gi, fs: d.fs}, r
}

func (d *faultyDevice) CreateGpuInstance(info *nvml.GpuInstanceProfileInfo) (nvml.GpuInstance, nvml.Return) {
	return d.wrapGI(doValue(d.fs, "CreateGpuInstance", func() (nvml.GpuInstance, nvml.Return) {
		return d.Device.CreateGpuInstance(info)
	}))
}

func (d *faultyDevice) CreateGpuInstanceWithPlacement(info *nvml.GpuInstanceProfileInfo, pl *nvml.GpuInstancePlacement) (nvml.GpuInstance, nvml.Return) {
	return d.wrapGI(doValue(d.fs, "CreateGpuInstanceWithPlacement", func() (nvml.GpuInstance, nvml.Return) {
		return d.Device.CreateGpuInstanceWithPlacement(info, pl)
	}))
}

func (d *faultyDevice) GetGpuInstances(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstance, nvml.Return) {
	gis, r := d.Device.GetGpuInstances(info)
	for i := range gis {
		gis[i] = &faultyGI{GpuInstance: gis[i], fs: d.fs}
	}
	return gis, r
}

func (d *faultyDevice) GetGpuInstanceById(id int) (nvml.GpuInstance, nvml.Return) {
	return d.wrapGI(d.Device.GetGpuInstanceById(id))
}

type faultyGI struct {
	nvml.GpuInstance
	fs *faultState
}

func (g *faultyGI) Destroy() nvml.Return {
	return g.fs.do("GpuInstance.Destroy", g.GpuInstance.Destroy)
}

func (g *faultyGI) wrapCI(ci nvml.ComputeInstance, r nvml.Return) (nvml.ComputeInstance, nvml.Return) {
	if r != nvml.SUCCESS || ci == nil {
		return nil, r
	}
	return &faultyCI{ComputeInstance: ci, fs: g.fs}, r
}

func (g *faultyGI) CreateComputeInstance(info *nvml.ComputeInstanceProfileInfo) (nvml.ComputeInstance, nvml.Return) {
	return g.wrapCI(doValue(g.fs, "CreateComputeInstance", func() (nvml.ComputeInstance, nvml.Return) {
		return g.GpuInstance.CreateComputeInstance(info)
	}))
}

func (g *faultyGI) CreateComputeInstanceWithPlacement(info *nvml.ComputeInstanceProfileInfo, pl *nvml.ComputeInstancePlacement) (nvml.ComputeInstance, nvml.Return) {
	return g.wrapCI(doValue(g.fs, "CreateComputeInstanceWithPlacement", func() (nvml.ComputeInstance, nvml.Return) {
		return g.GpuInstance.CreateComputeInstanceWithPlacement(info, pl)
	}))
}

func (g *faultyGI) GetComputeInstances(info *nvml.ComputeInstanceProfileInfo) ([]nvml.ComputeInstance, nvml.Return) {
	cis, r := g.GpuInstance.GetComputeInstances(info)
	for i := range cis {
		cis[i] = &faultyCI{ComputeInstance: cis[i], fs: g.fs}
	}
	return cis, r
}

func (g *faultyGI) GetComputeInstanceById(id int) (nvml.ComputeInstance, nvml.Return) {
	return g.wrapCI(g.GpuInstance.GetComputeInstanceById(id))
}

type faultyCI struct {
	nvml.ComputeInstance
	fs *faultState
}

func (c *faultyCI) Destroy() nvml.Return {
	return c.fs.do("ComputeInstance.Destroy", c.ComputeInstance.Destroy)
}
