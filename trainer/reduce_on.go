package trainer

import (
	"fmt"
	"strconv"

	"github.com/migctl/migctl/allreduce"
	"github.com/migctl/migctl/comm"
)

// WithReduceOn says where host-staged all-reduces (ranks on one physical
// GPU, the MIG path) reduce the staged inputs: "cpu" (the CPU threads of
// every rank), "gpu" (every rank's device, reading the peers' staged
// copies of its part from mapped host memory), "split:F" (the fraction F
// of every chunk on the devices, the rest on the CPU), "split" (the cost
// model's best split) or "auto" (the cost model's pick among all of them:
// the default). It is a job setting: every rank must pass the same (the
// rendezvous compares it), and every rank resolves it to the same share.
func WithReduceOn(mode string) Option {
	return func(c *config) error {
		m, share, err := allreduce.ParseReduceOn(mode)
		if err != nil {
			return fmt.Errorf("WithReduceOn: %w", err)
		}
		c.settings[allreduce.SettingReduceOn] = string(m)
		if share >= 0 && m == allreduce.ReduceOnSplit {
			c.settings[allreduce.SettingReduceOn] = mode
		}
		return nil
	}
}

// gpuSharer is the part of the communicator setReduceOn needs.
type gpuSharer interface {
	SetGPUShare(share int) error
	GPUShare() int
}

// setReduceOn resolves the job's reduce-on setting (WithReduceOn, default
// auto) for the host-staged all-reduce of the node's ranks into the share
// of every chunk the devices reduce, and gives it to cm. The inputs are
// the same on every rank (the settings the rendezvous made equal, the
// grouping of the ranks by GPU), as for the algorithm's choice. Other
// algorithms and one rank reduce on the CPU; on the host backend, where
// the "device" reduction is a host stream's, auto picks the CPU threads
// and an explicit share is honoured (the same schedule, tested without a
// GPU).
func (g *Group) setReduceOn(cm any) error {
	sh, ok := cm.(gpuSharer)
	if !ok {
		return nil
	}
	share, err := g.resolveGPUShare()
	if err != nil {
		return err
	}
	return sh.SetGPUShare(share)
}

func (g *Group) resolveGPUShare() (int, error) {
	c := g.cfg
	mode := c.settings[allreduce.SettingReduceOn]
	if g.alg != allreduce.HostStaged || len(g.groups) < 2 {
		if _, _, err := allreduce.ParseReduceOn(mode); err != nil {
			return 0, err
		}
		return 0, nil
	}
	m, err := allreduce.MachineFromSettings(allreduce.H200(), c.settings)
	if err != nil {
		return 0, fmt.Errorf("machine figures for choosing where to reduce: %w (fix or drop the setting)", err)
	}
	size := len(g.groups)
	workers := max(1, min(6, 14/size)) // as chooseAlgorithm: the shared setting or the default
	if v, ok := c.settings[allreduce.SettingReduceWorkers]; ok {
		if workers, err = strconv.Atoi(v); err != nil || workers < 1 {
			return 0, fmt.Errorf("setting %s=%q: want a thread count: %w", allreduce.SettingReduceWorkers, v, comm.ErrInvalid)
		}
	}
	share, err := m.ResolveGPUShare(mode, allreduce.Workload{Coll: allreduce.AllReduce, Groups: g.groups,
		Bytes: 256 << 20, ReduceThreads: size * workers, HostBackend: c.backend == BackendHost})
	if err != nil {
		return 0, fmt.Errorf("choosing where to reduce: %w", err)
	}
	return share, nil
}

// SmallOn says where the group's small-message all-reduces reduce
// (allreduce.Communicator.SmallOn; "cpu" for communicators without the
// choice).
func (g *Group) SmallOn() string {
	if s, ok := any(g.cm).(interface{ SmallOn() string }); ok {
		return s.SmallOn()
	}
	return "cpu"
}

// GPUShare is the part of every chunk of a host-staged all-reduce, in
// thousandths (allreduce.GPUShareOne: all), that the devices reduce; 0
// when the CPU threads reduce it all or another algorithm runs.
func (g *Group) GPUShare() int {
	if sh, ok := any(g.cm).(gpuSharer); ok && g.alg == allreduce.HostStaged {
		return sh.GPUShare()
	}
	return 0
}
