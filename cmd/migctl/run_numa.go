package main

import (
	"fmt"

	"github.com/migctl/migctl/internal/launcher"
	"github.com/migctl/migctl/internal/numa"
	"github.com/migctl/migctl/mig"
)

// gpuBusIDs are the PCI addresses of the node's GPUs by index, from NVML
// (the simulator's with --sim); none when it cannot be read.
func gpuBusIDs(node *nodeFlags) map[int]string {
	on, err := node.open()
	if err != nil {
		return nil
	}
	defer on.close()
	n, err := mig.Discover(on.lib)
	if err != nil {
		return nil
	}
	out := map[int]string{}
	for _, g := range n.GPUs {
		if g.PCIBusID != "" {
			out[g.Index] = g.PCIBusID
		}
	}
	return out
}

// numaPlacer is launcher.Config.Place for --numa mode and backend (nil:
// none; migctl run's and migctl bench's), with the GPU of each local rank
// from gpuOf (nil: the devices the launcher acquired), and a warning when
// --numa on cannot place anything.
func numaPlacer(node *nodeFlags, mode, backend string, gpuOf func(local int) int) (func([]launcher.Device) []numa.Placement, string) {
	if mode == "off" || backend != "gpu" {
		return nil, ""
	}
	ids := gpuBusIDs(node)
	place, err := numa.Placer(mode, numa.HostSysfs(), ids)
	switch {
	case err != nil && mode == "on":
		return nil, fmt.Sprintf("--numa on: %v; the workers run where the kernel puts them", err)
	case len(ids) == 0 && mode == "on":
		return nil, "--numa on: NVML gave no PCI address of any GPU; the workers run where the kernel puts them"
	case place == nil:
		return nil, ""
	}
	return func(devs []launcher.Device) []numa.Placement {
		gpus := make([]int, len(devs))
		for i, d := range devs {
			gpus[i] = d.GPU
			if gpuOf != nil {
				gpus[i] = gpuOf(i)
			}
		}
		return place(gpus)
	}, ""
}
