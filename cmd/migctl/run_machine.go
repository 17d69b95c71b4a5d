package main

import (
	"os"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/migctl/migctl/allreduce"
	"github.com/migctl/migctl/internal/launcher"
	"github.com/migctl/migctl/internal/limits"
	"github.com/migctl/migctl/trainer"
)

// runMachine is the environment entry (trainer.EnvMachine) that hands a
// single-node job's workers the figures `migctl bench limits` cached for
// this host and the job's GPUs (limits.Limits.NodeMachine), so that they
// choose their all-reduce algorithm on this machine rather than on
// hw/H200.md's; "" when the cache describes none of them. devs are the
// GPUs of --gpus (nil: the job leases MIG instances, of any GPU of the
// node). Multi-node jobs get none: every rank of a job must see the same
// figures, and nodes measure differently. A cache that cannot be read is
// returned as the error (the job goes on without figures).
func runMachine(devs launcher.RoundRobin) (string, error) {
	path, err := limits.DefaultCachePath()
	if err != nil {
		return "", nil
	}
	host, _ := os.Hostname()
	l, err := limits.Load(path, host)
	if err != nil {
		return "", err
	}
	var chosen []string
	for _, d := range devs {
		if strings.HasPrefix(d.Visible, "GPU-") {
			chosen = append(chosen, d.Visible)
		}
	}
	m, ok := l.NodeMachine(allreduce.H200(), nodeGPUUUIDs(), chosen)
	if !ok {
		return "", nil
	}
	return trainer.MachineEnv(m), nil
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
