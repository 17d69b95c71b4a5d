package ctxmgr

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// MemoryInfo reports free device memory. Implementations are safe for
// concurrent use.
type MemoryInfo interface {
	// Free returns the bytes free on device (a GPU/MIG UUID or an ordinal, as
	// the shim names it) now.
	Free(ctx context.Context, device string) (int64, error)
}

// declaredMemory is a declared capacity per device minus what the registry
// holds there: for tests and machines without NVML (--gpu-memory).
type declaredMemory struct {
	capacity int64
	used     func(device string) int64
}

var _ MemoryInfo = (*declaredMemory)(nil)

func (d *declaredMemory) Free(_ context.Context, device string) (int64, error) {
	return d.capacity - d.used(device), nil
}

// Total is the declared capacity (0: none declared) of any device.
func (d *declaredMemory) Total(context.Context, string) (int64, error) { return d.capacity, nil }

// nvmlMemory reads free memory from NVML.
type nvmlMemory struct {
	lib nvml.Interface
}

var _ MemoryInfo = (*nvmlMemory)(nil)

// NewNVMLMemory returns a MemoryInfo over an initialised NVML. A device named
// "GPU-…" or "MIG-…" is looked up by UUID (a "GPU-…" that NVML does not know
// is tried as "MIG-…": CUDA reports a MIG device's UUID with the GPU- prefix
// through cuDeviceGetUuid); a number by NVML index (which
// equals the CUDA ordinal when CUDA_DEVICE_ORDER=PCI_BUS_ID and no
// CUDA_VISIBLE_DEVICES reorders them; shims that send UUIDs avoid the question).
func NewNVMLMemory(lib nvml.Interface) MemoryInfo { return &nvmlMemory{lib: lib} }

func (n *nvmlMemory) Free(_ context.Context, device string) (int64, error) {
	mem, err := n.info(device)
	return int64(mem.Free), err
}

// Total returns the device's total memory; an error for a device NVML does not know.
func (n *nvmlMemory) Total(_ context.Context, device string) (int64, error) {
	mem, err := n.info(device)
	return int64(mem.Total), err
}

func (n *nvmlMemory) info(device string) (nvml.Memory, error) {
	var dev nvml.Device
	var ret nvml.Return
	if strings.HasPrefix(device, "GPU-") || strings.HasPrefix(device, "MIG-") {
		dev, ret = n.lib.DeviceGetHandleByUUID(device)
		if ret == nvml.ERROR_NOT_FOUND && strings.HasPrefix(device, "GPU-") {
			dev, ret = n.lib.DeviceGetHandleByUUID("MIG-" + strings.TrimPrefix(device, "GPU-"))
		}
	} else {
		idx, err := strconv.Atoi(device)
		if err != nil {
			return nvml.Memory{}, fmt.Errorf("device %q is neither a UUID nor an ordinal", device)
		}
		dev, ret = n.lib.DeviceGetHandleByIndex(idx)
	}
	if ret != nvml.SUCCESS {
		return nvml.Memory{}, fmt.Errorf("finding device %q: %s", device, n.lib.ErrorString(ret))
	}
	mem, ret := dev.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return nvml.Memory{}, fmt.Errorf("reading memory of device %q: %s", device, n.lib.ErrorString(ret))
	}
	return mem, nil
}
