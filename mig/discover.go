package mig

import (
	"errors"
	"fmt"
	"sort"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Discover reads every GPU of lib: identity, MIG mode, GPU-instance profiles
// with their placements, existing instances with their compute instances,
// MIG device UUIDs and processes. lib must be initialised. It only reads.
func Discover(lib nvml.Interface) (*Node, error) {
	n, ret := lib.DeviceGetCount()
	if err := nvmlErr("counting GPUs", ret); err != nil {
		return nil, err
	}
	node := &Node{}
	if v, ret := lib.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		node.DriverVersion = v
	}
	for i := 0; i < n; i++ {
		dev, ret := lib.DeviceGetHandleByIndex(i)
		if err := nvmlErr(fmt.Sprintf("opening GPU %d", i), ret); err != nil {
			return nil, err
		}
		g, err := discoverGPU(i, dev)
		if errors.Is(err, nvml.ERROR_NO_PERMISSION) {
			return nil, fmt.Errorf("discovering GPU %d (listing MIG instances needs root): %w", i, err)
		}
		if err != nil {
			return nil, fmt.Errorf("discovering GPU %d: %w", i, err)
		}
		node.GPUs = append(node.GPUs, g)
	}
	return node, nil
}

func cString(b []int8) string {
	out := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		out = append(out, byte(c))
	}
	return string(out)
}

func discoverGPU(i int, dev nvml.Device) (GPU, error) {
	g := GPU{Index: i}
	var ret nvml.Return
	if g.UUID, ret = dev.GetUUID(); ret != nvml.SUCCESS {
		return g, nvmlErr("reading UUID", ret)
	}
	if g.Name, ret = dev.GetName(); ret != nvml.SUCCESS {
		return g, nvmlErr("reading name", ret)
	}
	if pci, ret := dev.GetPciInfo(); ret == nvml.SUCCESS {
		g.PCIBusID = cString(pci.BusId[:])
		g.PCIDeviceID = pci.PciDeviceId
	}
	if mem, ret := dev.GetMemoryInfo(); ret == nvml.SUCCESS {
		g.MemoryBytes = mem.Total
	}
	cur, pend, ret := dev.GetMigMode()
	switch ret {
	case nvml.SUCCESS:
		g.MIGCapable, g.MIGEnabled, g.MIGPending = true, modeBool(cur), modeBool(pend)
	case nvml.ERROR_NOT_SUPPORTED:
		return g, nil
	default:
		return g, nvmlErr("reading MIG mode", ret)
	}
	profs, err := discoverProfiles(dev, g.MemoryBytes)
	if err != nil {
		return g, err
	}
	g.Profiles = profs
	if procs, ret := dev.GetComputeRunningProcesses(); ret == nvml.SUCCESS && !g.MIGEnabled {
		for _, p := range procs {
			g.Processes = append(g.Processes, Process{PID: p.Pid, UsedBytes: p.UsedGpuMemory})
		}
	}
	if !g.MIGEnabled {
		return g, nil
	}
	insts, err := discoverInstances(dev, profs)
	if err != nil {
		return g, err
	}
	g.Instances = insts
	return g, nil
}

// discoverProfiles lists every GI profile enum the GPU answers for.
func discoverProfiles(dev nvml.Device, memBytes uint64) ([]GIProfile, error) {
	var out []GIProfile
	for e := 0; e < nvml.GPU_INSTANCE_PROFILE_COUNT; e++ {
		info, ret := dev.GetGpuInstanceProfileInfo(e)
		if ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_INVALID_ARGUMENT {
			continue
		}
		if ret != nvml.SUCCESS {
			return nil, nvmlErr(fmt.Sprintf("reading GI profile %d", e), ret)
		}
		pls, ret := dev.GetGpuInstancePossiblePlacements(&info)
		if ret != nvml.SUCCESS {
			return nil, nvmlErr(fmt.Sprintf("reading placements of GI profile %d", e), ret)
		}
		p := GIProfile{
			Name: NameFromInfo(memBytes, e, info).String(), Enum: e, ID: info.Id,
			Slices: int(info.SliceCount), MaxCount: int(info.InstanceCount),
			SMs: int(info.MultiprocessorCount), CopyEngines: int(info.CopyEngineCount),
			MemoryMB: info.MemorySizeMB,
		}
		for _, pl := range pls {
			p.Placements = append(p.Placements, Placement{Start: int(pl.Start), Size: int(pl.Size)})
		}
		sort.Slice(p.Placements, func(i, j int) bool { return p.Placements[i].Start < p.Placements[j].Start })
		out = append(out, p)
	}
	sort.SliceStable(out, func(i, j int) bool { return profileLess(out[i], out[j]) })
	return out, nil
}

// profileLess orders profiles as nvidia-smi lists them: by slices, then memory, then name.
func profileLess(a, b GIProfile) bool {
	if a.Slices != b.Slices {
		return a.Slices < b.Slices
	}
	if a.MemoryMB != b.MemoryMB {
		return a.MemoryMB < b.MemoryMB
	}
	return a.Name < b.Name
}

type migDev struct {
	uuid  string
	procs []Process
}

func discoverInstances(dev nvml.Device, profs []GIProfile) ([]Instance, error) {
	// MIG devices: (gi, ci) -> uuid, processes
	devs := map[[2]int]migDev{}
	max, ret := dev.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		max = 7
	}
	for k := 0; k < max; k++ {
		md, ret := dev.GetMigDeviceHandleByIndex(k)
		if ret == nvml.ERROR_NOT_FOUND || ret == nvml.ERROR_INVALID_ARGUMENT {
			continue
		}
		if ret != nvml.SUCCESS {
			return nil, nvmlErr("opening MIG device", ret)
		}
		gi, r1 := md.GetGpuInstanceId()
		ci, r2 := md.GetComputeInstanceId()
		uuid, r3 := md.GetUUID()
		if err := errors.Join(nvmlErr("MIG device GI id", r1), nvmlErr("MIG device CI id", r2), nvmlErr("MIG device UUID", r3)); err != nil {
			return nil, err
		}
		d := migDev{uuid: uuid}
		if procs, ret := md.GetComputeRunningProcesses(); ret == nvml.SUCCESS {
			for _, p := range procs {
				d.procs = append(d.procs, Process{PID: p.Pid, UsedBytes: p.UsedGpuMemory})
			}
		}
		devs[[2]int{gi, ci}] = d
	}
	var out []Instance
	for _, p := range profs {
		info, ret := dev.GetGpuInstanceProfileInfo(p.Enum)
		if ret != nvml.SUCCESS {
			return nil, nvmlErr("reading GI profile", ret)
		}
		gis, ret := dev.GetGpuInstances(&info)
		if ret != nvml.SUCCESS {
			return nil, nvmlErr(fmt.Sprintf("listing %s instances", p.Name), ret)
		}
		gname, _ := ParseProfileName(p.Name)
		for _, gi := range gis {
			gin, ret := gi.GetInfo()
			if ret != nvml.SUCCESS {
				return nil, nvmlErr("reading GI info", ret)
			}
			in := Instance{GIID: int(gin.Id), Profile: p.Name, ProfileID: p.ID,
				Placement: Placement{Start: int(gin.Placement.Start), Size: int(gin.Placement.Size)}}
			for ce := 0; ce < nvml.COMPUTE_INSTANCE_PROFILE_COUNT; ce++ {
				cinfo, ret := gi.GetComputeInstanceProfileInfo(ce, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
				if ret != nvml.SUCCESS {
					continue
				}
				cis, ret := gi.GetComputeInstances(&cinfo)
				if ret != nvml.SUCCESS {
					return nil, nvmlErr("listing compute instances", ret)
				}
				for _, ci := range cis {
					cin, ret := ci.GetInfo()
					if ret != nvml.SUCCESS {
						return nil, nvmlErr("reading CI info", ret)
					}
					cn := gname
					cn.C = int(cinfo.SliceCount)
					c := ComputeInstance{CIID: int(cin.Id), Profile: cn.String(), Slices: int(cinfo.SliceCount),
						Placement: Placement{Start: int(cin.Placement.Start), Size: int(cin.Placement.Size)}}
					if d, ok := devs[[2]int{in.GIID, c.CIID}]; ok {
						c.UUID, c.Processes = d.uuid, d.procs
					}
					in.Compute = append(in.Compute, c)
				}
			}
			sort.Slice(in.Compute, func(a, b int) bool { return in.Compute[a].CIID < in.Compute[b].CIID })
			out = append(out, in)
		}
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Placement.Start < out[b].Placement.Start })
	return out, nil
}
