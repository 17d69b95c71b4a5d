package main

import (
	"os"
	"strings"

	"github.com/migctl/migctl/allreduce"
	"github.com/migctl/migctl/internal/launcher"
	"github.com/migctl/migctl/internal/limits"
	"github.com/migctl/migctl/trainer"
)

// runMachine is the environment entry (trainer.EnvMachine) that hands a
// single-node job's workers the figures `migctl bench limits` cached for
// this host and the GPUs in devs (nil: every cached GPU), so that they
// choose their all-reduce algorithm on this machine rather than on
// hw/H200.md's; "" when nothing is cached. Multi-node jobs get none: every
// rank of a job must see the same figures, and nodes measure differently.
func runMachine(devs launcher.RoundRobin) string {
	path, err := limits.DefaultCachePath()
	if err != nil {
		return ""
	}
	host, _ := os.Hostname()
	l, err := limits.Load(path, host)
	if err != nil || l.Host.ReduceThreadGiBs <= 0 && len(l.GPUs) == 0 {
		return ""
	}
	var uuids []string
	for _, d := range devs {
		if strings.HasPrefix(d.Visible, "GPU-") {
			uuids = append(uuids, d.Visible)
		}
	}
	if len(uuids) == 0 {
		uuids = nil
	}
	return trainer.MachineEnv(l.Machine(allreduce.H200(), uuids))
}
