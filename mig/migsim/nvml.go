package migsim

import (
	"slices"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// DriverVersion is what SystemGetDriverVersion answers.
const DriverVersion = "580.159.04-sim"

// maxMigDevices is what GetMaxMigDeviceCount answers (7 on every MIG GPU).
const maxMigDevices = 7

// Init always succeeds: the simulator needs no driver.
func (n *Node) Init() nvml.Return { return nvml.SUCCESS }

// Shutdown always succeeds.
func (n *Node) Shutdown() nvml.Return { return nvml.SUCCESS }

// ErrorString names a return code.
func (n *Node) ErrorString(r nvml.Return) string { return r.Error() }

// SystemGetDriverVersion reports a simulated driver version.
func (n *Node) SystemGetDriverVersion() (string, nvml.Return) { return DriverVersion, nvml.SUCCESS }

// DeviceGetCount is the number of simulated GPUs.
func (n *Node) DeviceGetCount() (int, nvml.Return) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.st.GPUs), nvml.SUCCESS
}

// DeviceGetHandleByIndex returns GPU i.
func (n *Node) DeviceGetHandleByIndex(i int) (nvml.Device, nvml.Return) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if i < 0 || i >= len(n.st.GPUs) {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	return &device{n: n, idx: i}, nvml.SUCCESS
}

// DeviceGetHandleByUUID returns the GPU or MIG device with that UUID.
func (n *Node) DeviceGetHandleByUUID(uuid string) (nvml.Device, nvml.Return) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for i, g := range n.st.GPUs {
		if g.UUID == uuid {
			return &device{n: n, idx: i}, nvml.SUCCESS
		}
		for _, gi := range g.GIs {
			for _, ci := range gi.CIs {
				if ci.UUID == uuid {
					return &migDevice{n: n, idx: i, gi: gi.ID, ci: ci.ID, serial: ci.Serial}, nvml.SUCCESS
				}
			}
		}
	}
	return nil, nvml.ERROR_NOT_FOUND
}

// DeviceGetHandleByPciBusId returns the GPU at a PCI bus id.
func (n *Node) DeviceGetHandleByPciBusId(busID string) (nvml.Device, nvml.Return) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for i, g := range n.st.GPUs {
		if strings.EqualFold(g.BusID, busID) {
			return &device{n: n, idx: i}, nvml.SUCCESS
		}
	}
	return nil, nvml.ERROR_NOT_FOUND
}

// device is a handle to a whole simulated GPU.
type device struct {
	mock.Device // method set only
	n           *Node
	idx         int
}

var _ nvml.Device = (*device)(nil)

func (d *device) gpu() *gpuState { return &d.n.st.GPUs[d.idx] }

func (d *device) GetIndex() (int, nvml.Return)       { return d.idx, nvml.SUCCESS }
func (d *device) GetMinorNumber() (int, nvml.Return) { return d.idx, nvml.SUCCESS }
func (d *device) GetName() (string, nvml.Return)     { return d.n.model.Name, nvml.SUCCESS }
func (d *device) IsMigDeviceHandle() (bool, nvml.Return) {
	return false, nvml.SUCCESS
}

func (d *device) GetUUID() (string, nvml.Return) {
	d.n.mu.Lock()
	defer d.n.mu.Unlock()
	return d.gpu().UUID, nvml.SUCCESS
}

func (d *device) GetArchitecture() (nvml.DeviceArchitecture, nvml.Return) {
	return d.n.model.Arch, nvml.SUCCESS
}

func (d *device) GetCudaComputeCapability() (int, int, nvml.Return) {
	return d.n.model.CCMajor, d.n.model.CCMinor, nvml.SUCCESS
}

func (d *device) GetPciInfo() (nvml.PciInfo, nvml.Return) {
	d.n.mu.Lock()
	defer d.n.mu.Unlock()
	var p nvml.PciInfo
	bus := d.gpu().BusID
	copyCString(p.BusId[:], bus)
	copyCString(p.BusIdLegacy[:], bus[4:])
	p.PciDeviceId = d.n.model.PCIDeviceID
	var b uint32
	for _, c := range bus[9:11] {
		b = b*16 + uint32(strings.IndexRune("0123456789ABCDEF", c))
	}
	p.Bus = b
	return p, nvml.SUCCESS
}

func copyCString(dst []int8, s string) {
	for i := 0; i < len(s) && i < len(dst)-1; i++ {
		dst[i] = int8(s[i])
	}
}

func (d *device) GetMemoryInfo() (nvml.Memory, nvml.Return) {
	d.n.mu.Lock()
	defer d.n.mu.Unlock()
	total := d.n.model.MemoryBytes
	var used uint64
	for _, p := range d.gpu().Procs {
		used += p.Used
	}
	return nvml.Memory{Total: total, Used: used, Free: total - used}, nvml.SUCCESS
}

// GetMigMode returns the current and pending MIG modes.
func (d *device) GetMigMode() (int, int, nvml.Return) {
	d.n.mu.Lock()
	defer d.n.mu.Unlock()
	g := d.gpu()
	return g.MIGCurrent, g.MIGPending, nvml.SUCCESS
}

// SetMigMode sets the pending mode and returns (activation status, return
// code) in go-nvml's order. Hopper applies the mode at once when no process
// runs on the GPU (activation SUCCESS), else it stays pending (ERROR_IN_USE).
// Ampere always waits for a reset (ERROR_RESET_REQUIRED). Disabling MIG while
// GPU instances exist fails with ERROR_IN_USE.
func (d *device) SetMigMode(mode int) (nvml.Return, nvml.Return) {
	d.n.mu.Lock()
	defer d.n.mu.Unlock()
	if mode != nvml.DEVICE_MIG_ENABLE && mode != nvml.DEVICE_MIG_DISABLE {
		return nvml.ERROR_INVALID_ARGUMENT, nvml.ERROR_INVALID_ARGUMENT
	}
	g := d.gpu()
	activation := nvml.SUCCESS
	r := d.n.mutate(func() nvml.Return {
		if mode == nvml.DEVICE_MIG_DISABLE && len(g.GIs) > 0 {
			return nvml.ERROR_IN_USE
		}
		g.MIGPending = mode
		switch {
		case g.MIGCurrent == mode:
		case d.n.model.ModeNeedsReset:
			activation = nvml.ERROR_RESET_REQUIRED
		case gpuBusy(g):
			activation = nvml.ERROR_IN_USE
		default:
			g.MIGCurrent = mode
		}
		return nvml.SUCCESS
	})
	if r != nvml.SUCCESS {
		return r, r
	}
	return activation, nvml.SUCCESS
}

func (d *device) migOn() bool { return d.gpu().MIGCurrent == nvml.DEVICE_MIG_ENABLE }

// GetGpuInstanceProfileInfo answers with or without MIG enabled.
func (d *device) GetGpuInstanceProfileInfo(e int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
	p, ok := d.n.model.Profile(e)
	if !ok {
		return nvml.GpuInstanceProfileInfo{}, enumRet(e)
	}
	return profileInfo(p), nvml.SUCCESS
}

func profileInfo(p GIProfile) nvml.GpuInstanceProfileInfo {
	return nvml.GpuInstanceProfileInfo{
		Id: p.ID, SliceCount: uint32(p.Slices), InstanceCount: uint32(p.Count),
		MultiprocessorCount: uint32(p.SMs), CopyEngineCount: uint32(p.CopyEngines),
		DecoderCount: uint32(p.Decoders), EncoderCount: uint32(p.Encoders),
		JpegCount: uint32(p.JPEGs), OfaCount: uint32(p.OFAs), MemorySizeMB: p.MemoryMB,
	}
}

// profileByID finds the model's profile with info.Id id.
func (n *Node) profileByID(info *nvml.GpuInstanceProfileInfo) (GIProfile, bool) {
	if info == nil {
		return GIProfile{}, false
	}
	for _, p := range n.model.GIProfiles {
		if p.ID == info.Id {
			return p, true
		}
	}
	return GIProfile{}, false
}

func (n *Node) profileByEnum(e int) GIProfile { p, _ := n.model.Profile(e); return p }

// GetGpuInstancePossiblePlacements answers with or without MIG enabled.
func (d *device) GetGpuInstancePossiblePlacements(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstancePlacement, nvml.Return) {
	p, ok := d.n.profileByID(info)
	if !ok {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	out := make([]nvml.GpuInstancePlacement, len(p.Starts))
	for i, s := range p.Starts {
		out[i] = nvml.GpuInstancePlacement{Start: uint32(s), Size: uint32(p.Size)}
	}
	return out, nvml.SUCCESS
}

// occupancy returns the memory-unit mask and compute slices in use.
func (d *device) occupancy() (mask uint16, slices int) {
	for _, gi := range d.gpu().GIs {
		mask |= uint16((1<<gi.Size)-1) << gi.Start
		slices += d.n.profileByEnum(gi.Enum).Slices
	}
	return mask, slices
}

func (d *device) countOf(p GIProfile) int {
	c := 0
	for _, gi := range d.gpu().GIs {
		if gi.Enum == p.Enum {
			c++
		}
	}
	return c
}

// fits reports why a GI of p at start cannot be created now (SUCCESS if it can).
func (d *device) fits(p GIProfile, start int) nvml.Return {
	if !slices.Contains(p.Starts, start) {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	mask, slices := d.occupancy()
	if !room(p, start, mask, slices, d.countOf(p)) {
		return nvml.ERROR_INSUFFICIENT_RESOURCES
	}
	return nvml.SUCCESS
}

// room reports whether a GI of p fits at start beside GIs that take the
// memory units in mask, slices compute slices and count GIs of p.
func room(p GIProfile, start int, mask uint16, slices, count int) bool {
	want := uint16((1<<p.Size)-1) << start
	return mask&want == 0 && slices+p.Slices <= 7 && count < p.Count
}

func (d *device) GetGpuInstanceRemainingCapacity(info *nvml.GpuInstanceProfileInfo) (int, nvml.Return) {
	d.n.mu.Lock()
	defer d.n.mu.Unlock()
	if !d.migOn() {
		return 0, nvml.ERROR_NOT_SUPPORTED
	}
	p, ok := d.n.profileByID(info)
	if !ok {
		return 0, nvml.ERROR_INVALID_ARGUMENT
	}
	mask, slices := d.occupancy()
	count := d.countOf(p)
	n := 0
	for _, s := range p.Starts {
		if room(p, s, mask, slices, count+n) {
			mask |= uint16((1<<p.Size)-1) << s
			slices += p.Slices
			n++
		}
	}
	return n, nvml.SUCCESS
}

// giID is the GPU instance id NVML gives a placement: the node's index in the
// binary tree over the 8 memory units (7g -> 0, halves -> 1,2, quarters -> 3..6,
// eighths -> 7..14).
func giID(start, size int) int { return 8/size - 1 + start/size }

func (d *device) createGI(p GIProfile, start int) (nvml.GpuInstance, nvml.Return) {
	if r := d.fits(p, start); r != nvml.SUCCESS {
		return nil, r
	}
	st := giState{ID: giID(start, p.Size), Serial: d.n.nextSerial(), Enum: p.Enum, Start: start, Size: p.Size}
	g := d.gpu()
	g.GIs = append(g.GIs, st)
	return &gpuInstance{n: d.n, idx: d.idx, id: st.ID, serial: st.Serial}, nvml.SUCCESS
}

// CreateGpuInstance creates a GI at the first allowed free placement.
func (d *device) CreateGpuInstance(info *nvml.GpuInstanceProfileInfo) (nvml.GpuInstance, nvml.Return) {
	d.n.mu.Lock()
	defer d.n.mu.Unlock()
	if !d.migOn() {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	p, ok := d.n.profileByID(info)
	if !ok {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	var gi nvml.GpuInstance
	r := d.n.mutate(func() nvml.Return {
		last := nvml.ERROR_INSUFFICIENT_RESOURCES
		for _, s := range p.Starts {
			var r nvml.Return
			if gi, r = d.createGI(p, s); r == nvml.SUCCESS {
				return r
			}
			last = r
		}
		return last
	})
	if r != nvml.SUCCESS {
		return nil, r
	}
	return gi, r
}

// CreateGpuInstanceWithPlacement creates a GI exactly at placement.
func (d *device) CreateGpuInstanceWithPlacement(info *nvml.GpuInstanceProfileInfo, pl *nvml.GpuInstancePlacement) (nvml.GpuInstance, nvml.Return) {
	d.n.mu.Lock()
	defer d.n.mu.Unlock()
	if !d.migOn() {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	p, ok := d.n.profileByID(info)
	if !ok || pl == nil || int(pl.Size) != p.Size {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	var gi nvml.GpuInstance
	r := d.n.mutate(func() nvml.Return {
		var r nvml.Return
		gi, r = d.createGI(p, int(pl.Start))
		return r
	})
	if r != nvml.SUCCESS {
		return nil, r
	}
	return gi, r
}

// GetGpuInstances lists the GIs of one profile.
func (d *device) GetGpuInstances(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstance, nvml.Return) {
	d.n.mu.Lock()
	defer d.n.mu.Unlock()
	if !d.migOn() {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	p, ok := d.n.profileByID(info)
	if !ok {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	var out []nvml.GpuInstance
	for _, gi := range d.gpu().GIs {
		if gi.Enum == p.Enum {
			out = append(out, &gpuInstance{n: d.n, idx: d.idx, id: gi.ID, serial: gi.Serial})
		}
	}
	return out, nvml.SUCCESS
}

func (d *device) GetGpuInstanceById(id int) (nvml.GpuInstance, nvml.Return) {
	d.n.mu.Lock()
	defer d.n.mu.Unlock()
	if !d.migOn() {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	gi := d.n.findGI(d.gpu(), id)
	if gi == nil {
		return nil, nvml.ERROR_NOT_FOUND
	}
	return &gpuInstance{n: d.n, idx: d.idx, id: gi.ID, serial: gi.Serial}, nvml.SUCCESS
}

func (d *device) GetMaxMigDeviceCount() (int, nvml.Return) { return maxMigDevices, nvml.SUCCESS }

// GetMigDeviceHandleByIndex returns the i-th MIG device (compute instance),
// ordered by GI id then CI id; ERROR_NOT_FOUND past the last.
func (d *device) GetMigDeviceHandleByIndex(i int) (nvml.Device, nvml.Return) {
	d.n.mu.Lock()
	defer d.n.mu.Unlock()
	if !d.migOn() {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	if i < 0 || i >= maxMigDevices {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	k := 0
	for _, gi := range sortedGIs(d.gpu().GIs) {
		for _, ci := range sortedCIs(gi.CIs) {
			if k == i {
				return &migDevice{n: d.n, idx: d.idx, gi: gi.ID, ci: ci.ID, serial: ci.Serial}, nvml.SUCCESS
			}
			k++
		}
	}
	return nil, nvml.ERROR_NOT_FOUND
}

// GetComputeRunningProcesses lists every process on the GPU, with its GI and
// CI ids when it runs in a MIG device.
func (d *device) GetComputeRunningProcesses() ([]nvml.ProcessInfo, nvml.Return) {
	d.n.mu.Lock()
	defer d.n.mu.Unlock()
	g := d.gpu()
	var out []nvml.ProcessInfo
	for _, p := range g.Procs {
		out = append(out, nvml.ProcessInfo{Pid: p.PID, UsedGpuMemory: p.Used, GpuInstanceId: 0xFFFFFFFF, ComputeInstanceId: 0xFFFFFFFF})
	}
	for _, gi := range g.GIs {
		for _, ci := range gi.CIs {
			for _, p := range ci.Procs {
				out = append(out, nvml.ProcessInfo{Pid: p.PID, UsedGpuMemory: p.Used, GpuInstanceId: uint32(gi.ID), ComputeInstanceId: uint32(ci.ID)})
			}
		}
	}
	return out, nvml.SUCCESS
}
