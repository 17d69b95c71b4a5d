package main

import (
	"fmt"
	"slices"

	"github.com/migctl/migctl/internal/launcher"
	"github.com/migctl/migctl/internal/numa"
	"github.com/migctl/migctl/mig"
)

// numaModes are --numa's values.
var numaModes = []string{"auto", "on", "off"}

// placer places processes for --numa mode, each near its physical GPU (the
// GPU indexes it is given, one per process → busIDs → sysfs). "on": bound to the
// CPUs local to the GPU and its memory preferred on the GPU's node. "auto":
// only where the host has more than one NUMA node; memory always preferred
// on the GPU's node there, CPUs bound only when the job's GPUs sit on more
// than one node (ranks all near one node keep every CPU: binding them to
// one socket would take half the host's CPUs from a job that launches
// kernels from every rank). "off", a host of one node under "auto", or no
// bus ID known: nil (no placement).
func placer(mode string, sys numa.Sysfs, busIDs map[int]string) (func(gpus []int) []numa.Placement, error) {
	if mode == "off" || len(busIDs) == 0 {
		return nil, nil
	}
	nodes, err := sys.Nodes()
	if err != nil {
		return nil, fmt.Errorf("reading the host's NUMA nodes: %w", err)
	}
	if mode == "auto" && len(nodes) < 2 {
		return nil, nil
	}
	return func(gpus []int) []numa.Placement {
		out := make([]numa.Placement, len(gpus))
		used := map[int]bool{}
		for i, gpu := range gpus {
			out[i] = numa.None
			if bus, ok := busIDs[gpu]; ok {
				if p, err := sys.Device(numa.BusID(bus)); err == nil {
					out[i] = p
					if p.Node >= 0 {
						used[p.Node] = true
					}
				}
			}
		}
		if mode == "auto" && len(used) < 2 {
			for i := range out {
				out[i].CPUs = nil
			}
		}
		return out
	}, nil
}

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
	place, err := placer(mode, numa.HostSysfs(), ids)
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

func validNUMAMode(m string) bool { return slices.Contains(numaModes, m) }
