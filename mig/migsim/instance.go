package migsim

import (
	"fmt"
	"slices"
	"sort"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

func sortedGIs(gis []giState) []giState {
	out := append([]giState(nil), gis...)
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

func sortedCIs(cis []ciState) []ciState {
	out := append([]ciState(nil), cis...)
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// gpuInstance is a handle to one GPU instance; serial detects stale handles.
type gpuInstance struct {
	mock.GpuInstance // method set only
	n                *Node
	idx              int
	id               int
	serial           uint64
}

var _ nvml.GpuInstance = (*gpuInstance)(nil)

// resolve finds the GI the handle names. Callers hold n.mu.
func (h *gpuInstance) resolve() (*giState, nvml.Return) {
	g := &h.n.st.GPUs[h.idx]
	gi := h.n.findGI(g, h.id)
	if gi == nil || gi.Serial != h.serial || g.MIGCurrent != nvml.DEVICE_MIG_ENABLE {
		return nil, nvml.ERROR_NOT_FOUND
	}
	return gi, nvml.SUCCESS
}

func (h *gpuInstance) GetInfo() (nvml.GpuInstanceInfo, nvml.Return) {
	h.n.mu.Lock()
	defer h.n.mu.Unlock()
	gi, r := h.resolve()
	if r != nvml.SUCCESS {
		return nvml.GpuInstanceInfo{}, r
	}
	return nvml.GpuInstanceInfo{
		Device:    &device{n: h.n, idx: h.idx},
		Id:        uint32(gi.ID),
		ProfileId: h.n.profileByEnum(gi.Enum).ID,
		Placement: nvml.GpuInstancePlacement{Start: uint32(gi.Start), Size: uint32(gi.Size)},
	}, nvml.SUCCESS
}

// Destroy answers ERROR_IN_USE while compute instances exist.
func (h *gpuInstance) Destroy() nvml.Return {
	h.n.mu.Lock()
	defer h.n.mu.Unlock()
	if _, r := h.resolve(); r != nvml.SUCCESS {
		return r
	}
	return h.n.mutate(func() nvml.Return {
		gi, _ := h.resolve()
		if len(gi.CIs) > 0 {
			return nvml.ERROR_IN_USE
		}
		g := &h.n.st.GPUs[h.idx]
		for i := range g.GIs {
			if g.GIs[i].ID == h.id {
				g.GIs = append(g.GIs[:i], g.GIs[i+1:]...)
				break
			}
		}
		return nvml.SUCCESS
	})
}

func (h *gpuInstance) profile() GIProfile {
	gi, _ := h.resolve()
	return h.n.profileByEnum(gi.Enum)
}

func (h *gpuInstance) ciProfile(e int) (ciProfile, bool) {
	for _, c := range h.n.model.ciProfiles(h.profile()) {
		if c.Enum == e {
			return c, true
		}
	}
	return ciProfile{}, false
}

func (h *gpuInstance) GetComputeInstanceProfileInfo(e, eng int) (nvml.ComputeInstanceProfileInfo, nvml.Return) {
	h.n.mu.Lock()
	defer h.n.mu.Unlock()
	if _, r := h.resolve(); r != nvml.SUCCESS {
		return nvml.ComputeInstanceProfileInfo{}, r
	}
	if e < 0 || e >= nvml.COMPUTE_INSTANCE_PROFILE_COUNT || eng != nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED {
		return nvml.ComputeInstanceProfileInfo{}, nvml.ERROR_INVALID_ARGUMENT
	}
	c, ok := h.ciProfile(e)
	if !ok {
		return nvml.ComputeInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
	}
	gp := h.profile()
	return nvml.ComputeInstanceProfileInfo{
		Id: uint32(c.Enum), SliceCount: uint32(c.Slices), InstanceCount: uint32(len(c.Starts)),
		MultiprocessorCount: uint32(c.SMs), SharedCopyEngineCount: uint32(gp.CopyEngines),
		SharedDecoderCount: uint32(gp.Decoders), SharedEncoderCount: uint32(gp.Encoders),
		SharedJpegCount: uint32(gp.JPEGs), SharedOfaCount: uint32(gp.OFAs),
	}, nvml.SUCCESS
}

func (h *gpuInstance) ciFromInfo(info *nvml.ComputeInstanceProfileInfo) (ciProfile, nvml.Return) {
	if info == nil {
		return ciProfile{}, nvml.ERROR_INVALID_ARGUMENT
	}
	c, ok := h.ciProfile(int(info.Id))
	if !ok {
		return ciProfile{}, nvml.ERROR_INVALID_ARGUMENT
	}
	return c, nvml.SUCCESS
}

func (h *gpuInstance) GetComputeInstancePossiblePlacements(info *nvml.ComputeInstanceProfileInfo) ([]nvml.ComputeInstancePlacement, nvml.Return) {
	h.n.mu.Lock()
	defer h.n.mu.Unlock()
	if _, r := h.resolve(); r != nvml.SUCCESS {
		return nil, r
	}
	c, r := h.ciFromInfo(info)
	if r != nvml.SUCCESS {
		return nil, r
	}
	out := make([]nvml.ComputeInstancePlacement, len(c.Starts))
	for i, s := range c.Starts {
		out[i] = nvml.ComputeInstancePlacement{Start: uint32(s), Size: uint32(c.Slices)}
	}
	return out, nvml.SUCCESS
}

// ciFits reports whether a CI of c fits at start in gi (SUCCESS if so).
func ciFits(gi *giState, c ciProfile, start int) nvml.Return {
	if !slices.Contains(c.Starts, start) {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	var mask uint16
	n := 0
	for _, ci := range gi.CIs {
		mask |= uint16((1<<ci.Size)-1) << ci.Start
		if ci.Enum == c.Enum {
			n++
		}
	}
	if mask&(uint16((1<<c.Slices)-1)<<start) != 0 || n >= len(c.Starts) {
		return nvml.ERROR_INSUFFICIENT_RESOURCES
	}
	return nvml.SUCCESS
}

func (h *gpuInstance) GetComputeInstanceRemainingCapacity(info *nvml.ComputeInstanceProfileInfo) (int, nvml.Return) {
	h.n.mu.Lock()
	defer h.n.mu.Unlock()
	gi, r := h.resolve()
	if r != nvml.SUCCESS {
		return 0, r
	}
	c, r := h.ciFromInfo(info)
	if r != nvml.SUCCESS {
		return 0, r
	}
	tmp := *gi
	tmp.CIs = append([]ciState(nil), gi.CIs...)
	n := 0
	for _, s := range c.Starts {
		if ciFits(&tmp, c, s) == nvml.SUCCESS {
			tmp.CIs = append(tmp.CIs, ciState{Enum: c.Enum, Start: s, Size: c.Slices})
			n++
		}
	}
	return n, nvml.SUCCESS
}

func (h *gpuInstance) createCI(info *nvml.ComputeInstanceProfileInfo, pl *nvml.ComputeInstancePlacement) (nvml.ComputeInstance, nvml.Return) {
	h.n.mu.Lock()
	defer h.n.mu.Unlock()
	gi, r := h.resolve()
	if r != nvml.SUCCESS {
		return nil, r
	}
	c, r := h.ciFromInfo(info)
	if r != nvml.SUCCESS {
		return nil, r
	}
	if pl != nil && int(pl.Size) != c.Slices {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	var out nvml.ComputeInstance
	r = h.n.mutate(func() nvml.Return {
		starts := c.Starts
		if pl != nil {
			starts = []int{int(pl.Start)}
		}
		last := nvml.ERROR_INSUFFICIENT_RESOURCES
		for _, s := range starts {
			if last = ciFits(gi, c, s); last != nvml.SUCCESS {
				continue
			}
			id := 0
			for h.n.findCI(&h.n.st.GPUs[h.idx], gi.ID, id) != nil {
				id++
			}
			serial := h.n.nextSerial()
			st := ciState{ID: id, Serial: serial, Enum: c.Enum, Start: s, Size: c.Slices,
				UUID: "MIG-" + uuidFrom(fmt.Sprintf("%s/%d/%d/%d", h.n.st.GPUs[h.idx].UUID, gi.ID, id, serial))}
			gi.CIs = append(gi.CIs, st)
			out = &computeInstance{n: h.n, idx: h.idx, gi: gi.ID, giSerial: gi.Serial, id: id, serial: serial}
			return nvml.SUCCESS
		}
		return last
	})
	if r != nvml.SUCCESS {
		return nil, r
	}
	return out, r
}

func (h *gpuInstance) CreateComputeInstance(info *nvml.ComputeInstanceProfileInfo) (nvml.ComputeInstance, nvml.Return) {
	return h.createCI(info, nil)
}

func (h *gpuInstance) CreateComputeInstanceWithPlacement(info *nvml.ComputeInstanceProfileInfo, pl *nvml.ComputeInstancePlacement) (nvml.ComputeInstance, nvml.Return) {
	if pl == nil {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	return h.createCI(info, pl)
}

func (h *gpuInstance) GetComputeInstances(info *nvml.ComputeInstanceProfileInfo) ([]nvml.ComputeInstance, nvml.Return) {
	h.n.mu.Lock()
	defer h.n.mu.Unlock()
	gi, r := h.resolve()
	if r != nvml.SUCCESS {
		return nil, r
	}
	c, r := h.ciFromInfo(info)
	if r != nvml.SUCCESS {
		return nil, r
	}
	var out []nvml.ComputeInstance
	for _, ci := range sortedCIs(gi.CIs) {
		if ci.Enum == c.Enum {
			out = append(out, &computeInstance{n: h.n, idx: h.idx, gi: gi.ID, giSerial: gi.Serial, id: ci.ID, serial: ci.Serial})
		}
	}
	return out, nvml.SUCCESS
}

func (h *gpuInstance) GetComputeInstanceById(id int) (nvml.ComputeInstance, nvml.Return) {
	h.n.mu.Lock()
	defer h.n.mu.Unlock()
	gi, r := h.resolve()
	if r != nvml.SUCCESS {
		return nil, r
	}
	ci := h.n.findCI(&h.n.st.GPUs[h.idx], gi.ID, id)
	if ci == nil {
		return nil, nvml.ERROR_NOT_FOUND
	}
	return &computeInstance{n: h.n, idx: h.idx, gi: gi.ID, giSerial: gi.Serial, id: id, serial: ci.Serial}, nvml.SUCCESS
}

// computeInstance is a handle to one compute instance.
type computeInstance struct {
	mock.ComputeInstance // method set only
	n                    *Node
	idx                  int
	gi                   int
	giSerial             uint64
	id                   int
	serial               uint64
}

var _ nvml.ComputeInstance = (*computeInstance)(nil)

func (h *computeInstance) resolve() (*giState, *ciState, nvml.Return) {
	gih := &gpuInstance{n: h.n, idx: h.idx, id: h.gi, serial: h.giSerial}
	gi, r := gih.resolve()
	if r != nvml.SUCCESS {
		return nil, nil, r
	}
	ci := h.n.findCI(&h.n.st.GPUs[h.idx], h.gi, h.id)
	if ci == nil || ci.Serial != h.serial {
		return nil, nil, nvml.ERROR_NOT_FOUND
	}
	return gi, ci, nvml.SUCCESS
}

func (h *computeInstance) GetInfo() (nvml.ComputeInstanceInfo, nvml.Return) {
	h.n.mu.Lock()
	defer h.n.mu.Unlock()
	_, ci, r := h.resolve()
	if r != nvml.SUCCESS {
		return nvml.ComputeInstanceInfo{}, r
	}
	return nvml.ComputeInstanceInfo{
		Device:      &device{n: h.n, idx: h.idx},
		GpuInstance: &gpuInstance{n: h.n, idx: h.idx, id: h.gi, serial: h.giSerial},
		Id:          uint32(ci.ID),
		ProfileId:   uint32(ci.Enum),
		Placement:   nvml.ComputeInstancePlacement{Start: uint32(ci.Start), Size: uint32(ci.Size)},
	}, nvml.SUCCESS
}

// Destroy answers ERROR_IN_USE while processes run on the instance.
func (h *computeInstance) Destroy() nvml.Return {
	h.n.mu.Lock()
	defer h.n.mu.Unlock()
	if _, _, r := h.resolve(); r != nvml.SUCCESS {
		return r
	}
	return h.n.mutate(func() nvml.Return {
		gi, ci, _ := h.resolve()
		if len(ci.Procs) > 0 {
			return nvml.ERROR_IN_USE
		}
		for i := range gi.CIs {
			if gi.CIs[i].ID == h.id {
				gi.CIs = append(gi.CIs[:i], gi.CIs[i+1:]...)
				break
			}
		}
		return nvml.SUCCESS
	})
}

// migDevice is the device handle of one MIG device (a GI/CI pair).
type migDevice struct {
	mock.Device // method set only
	n           *Node
	idx         int
	gi, ci      int
	serial      uint64
}

var _ nvml.Device = (*migDevice)(nil)

func (m *migDevice) resolve() (*giState, *ciState, nvml.Return) {
	g := &m.n.st.GPUs[m.idx]
	gi := m.n.findGI(g, m.gi)
	ci := m.n.findCI(g, m.gi, m.ci)
	if gi == nil || ci == nil || ci.Serial != m.serial {
		return nil, nil, nvml.ERROR_NOT_FOUND
	}
	return gi, ci, nvml.SUCCESS
}

func (m *migDevice) IsMigDeviceHandle() (bool, nvml.Return) { return true, nvml.SUCCESS }

func (m *migDevice) GetUUID() (string, nvml.Return) {
	m.n.mu.Lock()
	defer m.n.mu.Unlock()
	_, ci, r := m.resolve()
	if r != nvml.SUCCESS {
		return "", r
	}
	return ci.UUID, nvml.SUCCESS
}

func (m *migDevice) GetName() (string, nvml.Return) {
	m.n.mu.Lock()
	defer m.n.mu.Unlock()
	gi, _, r := m.resolve()
	if r != nvml.SUCCESS {
		return "", r
	}
	return m.n.model.Name + " MIG " + m.n.profileByEnum(gi.Enum).Name, nvml.SUCCESS
}

func (m *migDevice) GetGpuInstanceId() (int, nvml.Return)     { return m.gi, nvml.SUCCESS }
func (m *migDevice) GetComputeInstanceId() (int, nvml.Return) { return m.ci, nvml.SUCCESS }

func (m *migDevice) GetDeviceHandleFromMigDeviceHandle() (nvml.Device, nvml.Return) {
	return &device{n: m.n, idx: m.idx}, nvml.SUCCESS
}

func (m *migDevice) GetMemoryInfo() (nvml.Memory, nvml.Return) {
	m.n.mu.Lock()
	defer m.n.mu.Unlock()
	gi, ci, r := m.resolve()
	if r != nvml.SUCCESS {
		return nvml.Memory{}, r
	}
	total := m.n.profileByEnum(gi.Enum).MemoryMB << 20
	var used uint64
	for _, p := range ci.Procs {
		used += p.Used
	}
	return nvml.Memory{Total: total, Used: used, Free: total - used}, nvml.SUCCESS
}

func (m *migDevice) GetComputeRunningProcesses() ([]nvml.ProcessInfo, nvml.Return) {
	m.n.mu.Lock()
	defer m.n.mu.Unlock()
	_, ci, r := m.resolve()
	if r != nvml.SUCCESS {
		return nil, r
	}
	var out []nvml.ProcessInfo
	for _, p := range ci.Procs {
		out = append(out, nvml.ProcessInfo{Pid: p.PID, UsedGpuMemory: p.Used, GpuInstanceId: uint32(m.gi), ComputeInstanceId: uint32(m.ci)})
	}
	return out, nvml.SUCCESS
}
