package main

import (
	"os"
	"slices"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/migctl/migctl/allreduce"
	"github.com/migctl/migctl/internal/launcher"
	"github.com/migctl/migctl/internal/limits"
	"github.com/migctl/migctl/trainer"
)

// runMachine is the environment entry (trainer.EnvMachine) that hands a
// single-node job's workers the figures `migctl bench limits` cached for
// this host (see machineEnv), or "". devs are the GPUs of --gpus (nil: the
// job leases MIG instances, of any GPU of the node).
func runMachine(devs launcher.RoundRobin) string {
	path, err := limits.DefaultCachePath()
	if err != nil {
		return ""
	}
	host, _ := os.Hostname()
	l, err := limits.Load(path, host)
	if err != nil {
		return ""
	}
	var chosen []string
	for _, d := range devs {
		if strings.HasPrefix(d.Visible, "GPU-") {
			chosen = append(chosen, d.Visible)
		}
	}
	return machineEnv(l, nodeGPUUUIDs(), chosen)
}

// machineEnv is the EnvMachine entry for the cached figures l, when they
// describe GPUs of this node (node: their UUIDs, as NVML reports them) that
// the job uses (chosen; nil: any of the node's), so that the workers choose
// their all-reduce algorithm on this machine rather than on hw/H200.md's;
// "" otherwise: figures of a GPU not here (another host's cache, a fake
// driver's, a simulated node) or of the host alone would weigh a machine
// that is not the one the job runs on. Multi-node jobs get none: every rank
// of a job must see the same figures, and nodes measure differently.
func machineEnv(l limits.Limits, node, chosen []string) string {
	want := node
	if chosen != nil {
		want = nil
		for _, u := range chosen {
			if slices.Contains(node, u) {
				want = append(want, u)
			}
		}
	}
	var uuids []string
	for _, u := range want {
		if g, ok := l.GPU(u); ok && g.H2DGiBs > 0 && !slices.Contains(uuids, u) {
			uuids = append(uuids, u)
		}
	}
	if len(uuids) == 0 {
		return ""
	}
	return trainer.MachineEnv(l.Machine(allreduce.H200(), uuids))
}

// nodeGPUUUIDs lists the UUIDs of this node's GPUs (nil without a driver).
func nodeGPUUUIDs() []string {
	lib := nvml.New()
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return nil
	}
	defer lib.Shutdown()
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil
	}
	var out []string
	for i := range n {
		dev, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			continue
		}
		if u, ret := dev.GetUUID(); ret == nvml.SUCCESS {
			out = append(out, u)
		}
	}
	return out
}
