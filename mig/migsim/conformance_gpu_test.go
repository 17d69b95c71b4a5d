package migsim_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/mig"
	"github.com/migctl/migctl/mig/migsim"
)

// TestConformanceH200 compares the simulated H200 with the real GPU 0 when
// that is an H200: for every GPU-instance profile enum 0..17 the return code,
// Id, slices, instance count, SMs, copy engines, decoders/encoders/JPEG/OFA,
// memory, name and possible placements, field by field. It is strictly
// read-only on the real GPU: it never changes MIG mode and never creates or
// destroys anything. It skips itself without NVML or without an H200.
//
// Build and run on the GPU machine:
//
//	go test -c -trimpath -ldflags='-s -w' -o bin/migsim.test ./mig/migsim
//	bin/migsim.test -test.run Conformance -test.v
func TestConformanceH200(t *testing.T) {
	lib := nvml.New()
	if ret := lib.Init(); ret != nvml.SUCCESS {
		t.Skipf("NVML not available: %v", ret)
	}
	defer lib.Shutdown()
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS || n == 0 {
		t.Skipf("no GPU: count %d, %v", n, ret)
	}
	real, ret := lib.DeviceGetHandleByIndex(0)
	require.Equal(t, nvml.SUCCESS, ret)
	name, _ := real.GetName()
	if name != migsim.H200.Name {
		t.Skipf("GPU 0 is %q, not an H200", name)
	}
	sim := migsim.New(migsim.H200, 1)
	fake, _ := sim.DeviceGetHandleByIndex(0)
	drv, _ := lib.SystemGetDriverVersion()
	t.Logf("real driver %s", drv)
	rcur, rpend, rret := real.GetMigMode()
	t.Logf("real MIG mode current=%d pending=%d (%v); a fresh simulated node has 0/0", rcur, rpend, rret)
	realName := func(e int) (string, bool) {
		v2, r := real.GetGpuInstanceProfileInfoV(e).V2()
		if r != nvml.SUCCESS {
			t.Logf("enum %2d name: real GetGpuInstanceProfileInfoV answered %v; comparing the name rule only", e, r)
			return "", false
		}
		return cstr(v2.Name[:]), true
	}
	bad := compareH200(t.Logf, real, realName, fake)
	check := func(what string, r, s any) {
		ok := fmt.Sprint(r) == fmt.Sprint(s)
		mark := "ok"
		if !ok {
			mark = "MISMATCH"
			bad = append(bad, fmt.Sprintf("%s: real %v, sim %v", what, r, s))
		}
		t.Logf("%-34s real=%-28v sim=%-28v %s", what, r, s, mark)
	}

	// discovery over real NVML (read-only) sees the same profiles as over the simulator
	simNode, err := mig.Discover(sim)
	require.NoError(t, err)
	if realNode, err := mig.Discover(lib); err != nil {
		check("discovery over real NVML", err, nil)
	} else {
		check("discovered profiles", fmt.Sprintf("%+v", realNode.GPUs[0].Profiles), fmt.Sprintf("%+v", simNode.GPUs[0].Profiles))
	}

	if len(bad) > 0 {
		t.Errorf("simulator differs from the real H200 in %d fields:\n  %s", len(bad), strings.Join(bad, "\n  "))
	} else {
		t.Logf("simulator matches the real H200 in every compared field")
	}
}

func cstr(b []int8) string {
	var s []byte
	for _, c := range b {
		if c == 0 {
			break
		}
		s = append(s, byte(c))
	}
	return string(s)
}

func placements(ps []nvml.GpuInstancePlacement) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = fmt.Sprintf("%d:%d", p.Start, p.Size)
	}
	return strings.Join(s, " ")
}

// compareH200 compares the GPU-instance profiles of dev ("real") with those
// of the simulated H200 sim, field by field, logging every comparison with
// logf, and returns the mismatches. name returns dev's profile name for an
// enum ("MIG 1g.18gb"), ok false when it cannot tell. Read-only on dev.
func compareH200(logf func(string, ...any), dev nvml.Device, name func(int) (string, bool), sim nvml.Device) []string {
	var bad []string
	check := func(what string, r, s any) {
		ok := fmt.Sprint(r) == fmt.Sprint(s)
		mark := "ok"
		if !ok {
			mark = "MISMATCH"
			bad = append(bad, fmt.Sprintf("%s: real %v, sim %v", what, r, s))
		}
		logf("%-34s real=%-28v sim=%-28v %s", what, r, s, mark)
	}
	rname, _ := dev.GetName()
	rpci, _ := dev.GetPciInfo()
	spci, _ := sim.GetPciInfo()
	rmem, _ := dev.GetMemoryInfo()
	smem, _ := sim.GetMemoryInfo()
	check("device name", rname, migsim.H200.Name)
	check("PCI device id", fmt.Sprintf("%#x", rpci.PciDeviceId), fmt.Sprintf("%#x", spci.PciDeviceId))
	check("memory total (bytes)", rmem.Total, smem.Total)
	for e := 0; e < nvml.GPU_INSTANCE_PROFILE_COUNT; e++ {
		ri, rr := dev.GetGpuInstanceProfileInfo(e)
		si, sr := sim.GetGpuInstanceProfileInfo(e)
		p := fmt.Sprintf("enum %2d", e)
		check(p+" return", rr, sr)
		if rr != nvml.SUCCESS || sr != nvml.SUCCESS {
			continue
		}
		check(p+" Id", ri.Id, si.Id)
		check(p+" SliceCount", ri.SliceCount, si.SliceCount)
		check(p+" InstanceCount", ri.InstanceCount, si.InstanceCount)
		check(p+" MultiprocessorCount", ri.MultiprocessorCount, si.MultiprocessorCount)
		check(p+" CopyEngineCount", ri.CopyEngineCount, si.CopyEngineCount)
		check(p+" DecoderCount", ri.DecoderCount, si.DecoderCount)
		check(p+" EncoderCount", ri.EncoderCount, si.EncoderCount)
		check(p+" JpegCount", ri.JpegCount, si.JpegCount)
		check(p+" OfaCount", ri.OfaCount, si.OfaCount)
		check(p+" MemorySizeMB", ri.MemorySizeMB, si.MemorySizeMB)
		sp, _ := migsim.H200.Profile(e)
		if n, ok := name(e); ok {
			check(p+" name", n, "MIG "+sp.Name)
		}
		// migctl's name rule applied to the device's own numbers
		check(p+" name rule", mig.NameFromInfo(rmem.Total, e, ri).String(), sp.Name)
		rp, rpr := dev.GetGpuInstancePossiblePlacements(&ri)
		spl, spr := sim.GetGpuInstancePossiblePlacements(&si)
		check(p+" placements return", rpr, spr)
		check(p+" placements", placements(rp), placements(spl))
	}
	return bad
}
