package migsim_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/mig/migsim"
)

func gpu0(t *testing.T, n *migsim.Node) nvml.Device {
	t.Helper()
	d, ret := n.DeviceGetHandleByIndex(0)
	require.Equal(t, nvml.SUCCESS, ret)
	return d
}

func info(t *testing.T, d nvml.Device, enum int) nvml.GpuInstanceProfileInfo {
	t.Helper()
	i, ret := d.GetGpuInstanceProfileInfo(enum)
	require.Equal(t, nvml.SUCCESS, ret)
	return i
}

func enableMIG(t *testing.T, d nvml.Device) {
	t.Helper()
	act, ret := d.SetMigMode(nvml.DEVICE_MIG_ENABLE) // go-nvml order: activation, return
	require.Equal(t, nvml.SUCCESS, ret)
	require.Equal(t, nvml.SUCCESS, act)
}

// The H200 table of shared/hw/H200.md, row by row.
func TestH200ProfilesMatchReading(t *testing.T) {
	type row struct {
		enum                  int
		id                    uint32
		slices, count, sm, ce uint32
		memMB                 uint64
		starts                []uint32
		size                  uint32
	}
	rows := []row{
		{0, 19, 1, 7, 16, 1, 16384, []uint32{0, 1, 2, 3, 4, 5, 6}, 1},
		{7, 20, 1, 1, 16, 1, 16384, []uint32{0, 1, 2, 3, 4, 5, 6}, 1},
		{9, 15, 1, 4, 26, 1, 33280, []uint32{0, 2, 4, 6}, 2},
		{1, 14, 2, 3, 32, 2, 33280, []uint32{0, 2, 4}, 2},
		{2, 9, 3, 2, 60, 3, 71424, []uint32{0, 4}, 4},
		{3, 5, 4, 1, 64, 4, 71424, []uint32{0}, 4},
		{4, 0, 7, 1, 132, 8, 143360, []uint32{0}, 8},
	}
	d := gpu0(t, migsim.New(migsim.H200, 1))
	name, _ := d.GetName()
	require.Equal(t, "NVIDIA H200", name)
	pci, _ := d.GetPciInfo()
	require.Equal(t, uint32(0x233510DE), pci.PciDeviceId)
	mem, _ := d.GetMemoryInfo()
	require.Equal(t, uint64(150754820096), mem.Total)
	for _, r := range rows {
		i := info(t, d, r.enum)
		require.Equal(t, r.id, i.Id, "enum %d", r.enum)
		require.Equal(t, r.slices, i.SliceCount)
		require.Equal(t, r.count, i.InstanceCount)
		require.Equal(t, r.sm, i.MultiprocessorCount)
		require.Equal(t, r.ce, i.CopyEngineCount)
		require.Equal(t, r.memMB, i.MemorySizeMB)
		pls, ret := d.GetGpuInstancePossiblePlacements(&i)
		require.Equal(t, nvml.SUCCESS, ret)
		require.Len(t, pls, len(r.starts))
		for k, p := range pls {
			require.Equal(t, r.starts[k], p.Start)
			require.Equal(t, r.size, p.Size)
		}
	}
	for _, e := range []int{5, 6, 8, 10, 11, 12, 13, 14, 15, 16} {
		_, ret := d.GetGpuInstanceProfileInfo(e)
		require.Equal(t, nvml.ERROR_NOT_SUPPORTED, ret, "enum %d", e)
	}
	_, ret := d.GetGpuInstanceProfileInfo(17)
	require.Equal(t, nvml.ERROR_INVALID_ARGUMENT, ret)
}

func TestMIGCallsRefusedWhileOff(t *testing.T) {
	d := gpu0(t, migsim.New(migsim.H200, 1))
	cur, pend, ret := d.GetMigMode()
	require.Equal(t, nvml.SUCCESS, ret)
	require.Equal(t, nvml.DEVICE_MIG_DISABLE, cur)
	require.Equal(t, nvml.DEVICE_MIG_DISABLE, pend)
	i := info(t, d, 2)
	_, ret = d.CreateGpuInstanceWithPlacement(&i, &nvml.GpuInstancePlacement{Start: 0, Size: 4})
	require.Equal(t, nvml.ERROR_NOT_SUPPORTED, ret)
	_, ret = d.GetGpuInstances(&i)
	require.Equal(t, nvml.ERROR_NOT_SUPPORTED, ret)
	_, ret = d.GetMigDeviceHandleByIndex(0)
	require.Equal(t, nvml.ERROR_NOT_SUPPORTED, ret)
	// profile info and placements answer regardless, as on the real H200
	pls, ret := d.GetGpuInstancePossiblePlacements(&i)
	require.Equal(t, nvml.SUCCESS, ret)
	require.Len(t, pls, 2)
}

func TestOccupancyCountsAndInUse(t *testing.T) {
	n := migsim.New(migsim.H200, 1)
	d := gpu0(t, n)
	enableMIG(t, d)
	g3 := info(t, d, 2)  // 3g.71gb
	g2 := info(t, d, 1)  // 2g.35gb
	g1 := info(t, d, 0)  // 1g.18gb
	g1b := info(t, d, 9) // 1g.35gb

	gi, ret := d.CreateGpuInstanceWithPlacement(&g3, &nvml.GpuInstancePlacement{Start: 0, Size: 4})
	require.Equal(t, nvml.SUCCESS, ret)
	tests := []struct {
		name string
		info *nvml.GpuInstanceProfileInfo
		pl   nvml.GpuInstancePlacement
		want nvml.Return
	}{
		{"overlap 2g@2", &g2, nvml.GpuInstancePlacement{Start: 2, Size: 2}, nvml.ERROR_INSUFFICIENT_RESOURCES},
		{"1g.18gb@7 not allowed", &g1, nvml.GpuInstancePlacement{Start: 7, Size: 1}, nvml.ERROR_INVALID_ARGUMENT},
		{"2g@6 not allowed", &g2, nvml.GpuInstancePlacement{Start: 6, Size: 2}, nvml.ERROR_INVALID_ARGUMENT},
		{"wrong size", &g2, nvml.GpuInstancePlacement{Start: 4, Size: 1}, nvml.ERROR_INVALID_ARGUMENT},
		{"1g.35gb@6 ok", &g1b, nvml.GpuInstancePlacement{Start: 6, Size: 2}, nvml.SUCCESS},
		{"1g.35gb@6 again", &g1b, nvml.GpuInstancePlacement{Start: 6, Size: 2}, nvml.ERROR_INSUFFICIENT_RESOURCES},
		{"2g@4 ok", &g2, nvml.GpuInstancePlacement{Start: 4, Size: 2}, nvml.SUCCESS},
		{"full", &g1, nvml.GpuInstancePlacement{Start: 0, Size: 1}, nvml.ERROR_INSUFFICIENT_RESOURCES},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pl := tc.pl
			_, ret := d.CreateGpuInstanceWithPlacement(tc.info, &pl)
			require.Equal(t, tc.want, ret)
		})
	}
	capLeft, ret := d.GetGpuInstanceRemainingCapacity(&g1)
	require.Equal(t, nvml.SUCCESS, ret)
	require.Zero(t, capLeft)

	// compute instances: a 3g GI holds 3 x 1c, or 1 x 2c + 1 x 1c
	c1, ret := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	require.Equal(t, nvml.SUCCESS, ret)
	require.Equal(t, uint32(3), c1.InstanceCount)
	_, ret = gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	require.Equal(t, nvml.ERROR_NOT_SUPPORTED, ret)
	c2, _ := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	ci2, ret := gi.CreateComputeInstance(&c2)
	require.Equal(t, nvml.SUCCESS, ret)
	_, ret = gi.CreateComputeInstance(&c1)
	require.Equal(t, nvml.SUCCESS, ret)
	_, ret = gi.CreateComputeInstance(&c1)
	require.Equal(t, nvml.ERROR_INSUFFICIENT_RESOURCES, ret, "2c+1c fill a 3-slice GI")

	// a process on the 2c CI: destroying it or its GI answers IN_USE
	cinfo, _ := ci2.GetInfo()
	require.NoError(t, n.AttachProcess(0, 1, int(cinfo.Id), 4242, 1<<30))
	require.Equal(t, nvml.ERROR_IN_USE, ci2.Destroy())
	require.Equal(t, nvml.ERROR_IN_USE, gi.Destroy())
	require.NoError(t, n.DetachProcess(0, 4242))
	require.Equal(t, nvml.SUCCESS, ci2.Destroy())
	require.Equal(t, nvml.ERROR_IN_USE, gi.Destroy(), "GI still has a compute instance")
	require.Equal(t, nvml.ERROR_NOT_FOUND, ci2.Destroy(), "stale handle")

	// MIG devices have MIG- UUIDs; disabling MIG with instances answers IN_USE
	md, ret := d.GetMigDeviceHandleByIndex(0)
	require.Equal(t, nvml.SUCCESS, ret)
	u, _ := md.GetUUID()
	require.True(t, strings.HasPrefix(u, "MIG-"), u)
	_, ret = d.SetMigMode(nvml.DEVICE_MIG_DISABLE)
	require.Equal(t, nvml.ERROR_IN_USE, ret)
}

func TestModePendingOnAmpereAndBusyHopper(t *testing.T) {
	a := migsim.New(migsim.A100_80GB, 1)
	d := gpu0(t, a)
	act, ret := d.SetMigMode(nvml.DEVICE_MIG_ENABLE)
	require.Equal(t, nvml.SUCCESS, ret)
	require.Equal(t, nvml.ERROR_RESET_REQUIRED, act)
	cur, pend, _ := d.GetMigMode()
	require.Equal(t, [2]int{0, 1}, [2]int{cur, pend})
	require.Equal(t, nvml.SUCCESS, a.Reset(0))
	cur, pend, _ = d.GetMigMode()
	require.Equal(t, [2]int{1, 1}, [2]int{cur, pend})

	h := migsim.New(migsim.H200, 1)
	require.NoError(t, h.AttachProcess(0, -1, -1, 77, 1<<20))
	d = gpu0(t, h)
	act, ret = d.SetMigMode(nvml.DEVICE_MIG_ENABLE)
	require.Equal(t, nvml.SUCCESS, ret)
	require.Equal(t, nvml.ERROR_IN_USE, act)
	cur, pend, _ = d.GetMigMode()
	require.Equal(t, [2]int{0, 1}, [2]int{cur, pend})
}

func TestStateFilePersistsAcrossOpens(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.json")
	n, err := migsim.Open(path, migsim.H200, 8)
	require.NoError(t, err)
	d, _ := n.DeviceGetHandleByIndex(3)
	enableMIG(t, d)
	i := info(t, d, 2)
	_, ret := d.CreateGpuInstanceWithPlacement(&i, &nvml.GpuInstancePlacement{Start: 4, Size: 4})
	require.Equal(t, nvml.SUCCESS, ret)
	require.NoError(t, n.Close())

	n2, err := migsim.Open(path, migsim.H200, 8)
	require.NoError(t, err)
	defer n2.Close()
	d2, _ := n2.DeviceGetHandleByIndex(3)
	cur, _, _ := d2.GetMigMode()
	require.Equal(t, nvml.DEVICE_MIG_ENABLE, cur)
	gis, ret := d2.GetGpuInstances(&i)
	require.Equal(t, nvml.SUCCESS, ret)
	require.Len(t, gis, 1)
	gin, _ := gis[0].GetInfo()
	require.Equal(t, uint32(4), gin.Placement.Start)
	require.Equal(t, uint32(2), gin.Id, "3g at 4 is GI 2 (binary-tree id)")

	_, err = migsim.Open(filepath.Join(t.TempDir(), "x", "node.json"), migsim.H100, 2)
	require.NoError(t, err)
}

func TestStateFileRefusesOtherModel(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.json")
	n, err := migsim.Open(path, migsim.H200, 8)
	require.NoError(t, err)
	require.NoError(t, n.Close())
	_, err = migsim.Open(path, migsim.H100, 8)
	require.Error(t, err)
	require.Contains(t, err.Error(), "h200")
}

func TestParseSpec(t *testing.T) {
	tests := []struct {
		in    string
		model string
		count int
		ok    bool
	}{
		{"h200x8", "h200", 8, true}, {"h200", "h200", 1, true}, {"h100x8", "h100", 8, true},
		{"a100x8", "a100-80gb", 8, true}, {"a100-40gbx8", "a100-40gb", 8, true}, {"a100-80gb", "a100-80gb", 1, true},
		{"v100x8", "", 0, false}, {"h200x0", "", 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			m, c, err := migsim.ParseSpec(tc.in)
			if !tc.ok {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.model, m.Key)
			require.Equal(t, tc.count, c)
		})
	}
}

func TestComputeInstanceRulesAndHandles(t *testing.T) {
	n := migsim.New(migsim.H100, 1)
	d := gpu0(t, n)
	enableMIG(t, d)
	g7 := info(t, d, 4) // 7g.80gb
	gi, ret := d.CreateGpuInstance(&g7)
	require.Equal(t, nvml.SUCCESS, ret)
	g1 := info(t, d, 0)
	left, ret := d.GetGpuInstanceRemainingCapacity(&g1)
	require.Equal(t, nvml.SUCCESS, ret)
	require.Zero(t, left, "a 7g instance fills the GPU")

	tests := []struct {
		ciEnum   int
		count    uint32
		starts   []uint32
		wantSupp nvml.Return
	}{
		{nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, 7, []uint32{0, 1, 2, 3, 4, 5, 6}, nvml.SUCCESS},
		{nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE, 3, []uint32{0, 2, 4}, nvml.SUCCESS},
		{nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE, 2, []uint32{0, 4}, nvml.SUCCESS},
		{nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE, 1, []uint32{0}, nvml.SUCCESS},
		{nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE, 1, []uint32{0}, nvml.SUCCESS},
		{nvml.COMPUTE_INSTANCE_PROFILE_6_SLICE, 0, nil, nvml.ERROR_NOT_SUPPORTED},
	}
	for _, tc := range tests {
		ci, ret := gi.GetComputeInstanceProfileInfo(tc.ciEnum, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		require.Equal(t, tc.wantSupp, ret, "CI enum %d", tc.ciEnum)
		if ret != nvml.SUCCESS {
			continue
		}
		require.Equal(t, tc.count, ci.InstanceCount)
		pls, ret := gi.GetComputeInstancePossiblePlacements(&ci)
		require.Equal(t, nvml.SUCCESS, ret)
		var starts []uint32
		for _, p := range pls {
			starts = append(starts, p.Start)
		}
		require.Equal(t, tc.starts, starts)
	}
	c3, _ := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	c1, _ := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	_, ret = gi.CreateComputeInstanceWithPlacement(&c3, &nvml.ComputeInstancePlacement{Start: 1, Size: 3})
	require.Equal(t, nvml.ERROR_INVALID_ARGUMENT, ret, "3-slice CIs start at 0 or 4")
	ciA, ret := gi.CreateComputeInstanceWithPlacement(&c3, &nvml.ComputeInstancePlacement{Start: 4, Size: 3})
	require.Equal(t, nvml.SUCCESS, ret)
	_, ret = gi.CreateComputeInstanceWithPlacement(&c1, &nvml.ComputeInstancePlacement{Start: 5, Size: 1})
	require.Equal(t, nvml.ERROR_INSUFFICIENT_RESOURCES, ret, "slice 5 belongs to the 3-slice CI")
	rem, ret := gi.GetComputeInstanceRemainingCapacity(&c1)
	require.Equal(t, nvml.SUCCESS, ret)
	require.Equal(t, 4, rem)

	// MIG device handles: by index, by UUID, processes through the handle
	md, ret := d.GetMigDeviceHandleByIndex(0)
	require.Equal(t, nvml.SUCCESS, ret)
	_, ret = d.GetMigDeviceHandleByIndex(1)
	require.Equal(t, nvml.ERROR_NOT_FOUND, ret)
	uuid, _ := md.GetUUID()
	byUUID, ret := n.DeviceGetHandleByUUID(uuid)
	require.Equal(t, nvml.SUCCESS, ret)
	isMig, _ := byUUID.IsMigDeviceHandle()
	require.True(t, isMig)
	cinfo, _ := ciA.GetInfo()
	giInfo, _ := gi.GetInfo()
	require.NoError(t, n.AttachProcess(0, int(giInfo.Id), int(cinfo.Id), 7, 1<<30))
	procs, ret := md.GetComputeRunningProcesses()
	require.Equal(t, nvml.SUCCESS, ret)
	require.Len(t, procs, 1)
	require.Equal(t, uint32(7), procs[0].Pid)
	require.Equal(t, nvml.ERROR_IN_USE, ciA.Destroy())
	require.NoError(t, n.DetachProcess(0, 7))
	require.Equal(t, nvml.SUCCESS, ciA.Destroy())
	require.Equal(t, nvml.SUCCESS, gi.Destroy())
	_, ret = gi.GetInfo()
	require.Equal(t, nvml.ERROR_NOT_FOUND, ret, "stale GPU instance handle")
	_, ret = md.GetUUID()
	require.Equal(t, nvml.ERROR_NOT_FOUND, ret, "stale MIG device handle")
	left, _ = d.GetGpuInstanceRemainingCapacity(&g1)
	require.Equal(t, 7, left)
}

// TestAttachProcessLikeAContext: a fake process takes memory as a CUDA
// context would: no more than is free where it runs (the compute instances
// of a GPU instance share its memory; the whole GPU's when MIG is off), once
// per place; detaching a process that runs nowhere says so.
func TestAttachProcessLikeAContext(t *testing.T) {
	n := migsim.New(migsim.H200, 2)
	d := gpu0(t, n)
	enableMIG(t, d)
	g3 := info(t, d, 2) // 3g.71gb: 71424 MiB
	gi, ret := d.CreateGpuInstanceWithPlacement(&g3, &nvml.GpuInstancePlacement{Start: 0, Size: 4})
	require.Equal(t, nvml.SUCCESS, ret)
	c1, ret := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	require.Equal(t, nvml.SUCCESS, ret)
	var cis []int
	for range 2 {
		ci, ret := gi.CreateComputeInstance(&c1)
		require.Equal(t, nvml.SUCCESS, ret)
		ci0, _ := ci.GetInfo()
		cis = append(cis, int(ci0.Id))
	}
	giInfo, _ := gi.GetInfo()
	giID := int(giInfo.Id)
	const gib = uint64(1) << 30
	tests := []struct {
		name     string
		gpu, gi  int
		ci       int
		pid      uint32
		bytes    uint64
		wantErr  string
		wantSame error
	}{
		{"first process", 0, giID, cis[0], 10, 60 * gib, "", nil},
		{"the same process twice in one place", 0, giID, cis[0], 10, gib, "attached already", nil},
		{"the same process on the other compute instance", 0, giID, cis[1], 10, gib, "", nil},
		{"more than the GPU instance has left", 0, giID, cis[1], 11, 9 * gib, "GiB free", nil},
		{"what is left", 0, giID, cis[1], 11, 71424<<20 - 61*gib, "", nil},
		{"a byte more", 0, giID, cis[0], 12, 1, "GiB free", nil},
		{"no such compute instance", 0, giID, 99, 13, gib, "", migsim.ErrNoInstance},
		{"a whole GPU: more than it has", 1, -1, -1, 14, 200 * gib, "GiB free", nil},
		{"a whole GPU", 1, -1, -1, 14, 100 * gib, "", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := n.AttachProcess(tc.gpu, tc.gi, tc.ci, tc.pid, tc.bytes)
			switch {
			case tc.wantSame != nil:
				require.ErrorIs(t, err, tc.wantSame)
			case tc.wantErr != "":
				require.ErrorContains(t, err, tc.wantErr)
			default:
				require.NoError(t, err)
			}
		})
	}
	procs, ret := gpu0(t, n).GetComputeRunningProcesses()
	require.Equal(t, nvml.SUCCESS, ret)
	require.Len(t, procs, 3, "refused attaches left no trace: %+v", procs)

	require.NoError(t, n.DetachProcess(0, 10))
	require.ErrorIs(t, n.DetachProcess(0, 10), migsim.ErrNoProcess)
	require.ErrorIs(t, n.DetachProcess(0, 14), migsim.ErrNoProcess, "14 runs on GPU 1")
	require.NoError(t, n.DetachProcess(1, 14))
}
