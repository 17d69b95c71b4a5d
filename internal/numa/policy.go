package numa

import (
	"fmt"
	"slices"
	"strings"
)

// Modes are the placement policies a user may ask for: "auto", "on", "off".
var Modes = []string{"auto", "on", "off"}

// CheckMode returns nil when m is one of Modes, else an error naming them,
// for flags and environment variables to wrap.
func CheckMode(m string) error {
	if slices.Contains(Modes, m) {
		return nil
	}
	return fmt.Errorf("unknown NUMA mode %q: want %s", m, strings.Join(Modes, ", "))
}

// Placer returns how to place processes under mode, each near its physical
// GPU: given one GPU index per process, the placement of each (busIDs maps
// a GPU index to its PCI address as NVML gives it; sys says where that
// device sits).
//
//   - "on": bound to the CPUs local to the GPU, memory preferred on its node.
//   - "auto": only on hosts of more than one NUMA node; memory always
//     preferred on the GPU's node there, CPUs bound only when the job's GPUs
//     sit on more than one node (ranks all near one node keep every CPU:
//     binding them to one socket would take half the host's CPUs from a job
//     that launches kernels from every rank).
//   - "off", "auto" on a host of one node, or no bus ID known: nil, no
//     placement at all.
//
// A GPU without a known bus ID or sysfs entry gets None.
func Placer(mode string, sys Sysfs, busIDs map[int]string) (func(gpus []int) []Placement, error) {
	if err := CheckMode(mode); err != nil {
		return nil, err
	}
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
	return func(gpus []int) []Placement {
		out := make([]Placement, len(gpus))
		used := map[int]bool{}
		for i, gpu := range gpus {
			out[i] = None
			if bus, ok := busIDs[gpu]; ok {
				if p, err := sys.Device(BusID(bus)); err == nil {
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
