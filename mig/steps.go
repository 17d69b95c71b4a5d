package mig

import (
	"fmt"
	"sort"
)

// StepOp is one kind of change to a GPU.
type StepOp string

// The step kinds, in the order a plan uses them.
const (
	OpEnableMIG  StepOp = "enable-mig"
	OpDestroyCI  StepOp = "destroy-ci"
	OpDestroyGI  StepOp = "destroy-gi"
	OpCreateGI   StepOp = "create-gi"
	OpCreateCI   StepOp = "create-ci"
	OpDisableMIG StepOp = "disable-mig"
)

// Step is one NVML change. GPU instances are named by profile and placement,
// which survive a crash (ids of new instances are not known in advance).
type Step struct {
	Op        StepOp    `json:"op" yaml:"op"`
	Profile   string    `json:"profile,omitempty" yaml:"profile,omitempty"`
	Placement Placement `json:"placement,omitzero" yaml:"placement,omitempty"`
	GIID      int       `json:"gpuInstanceId,omitempty" yaml:"gpuInstanceId,omitempty"` // informational
	CIID      int       `json:"computeInstanceId,omitempty" yaml:"computeInstanceId,omitempty"`
	CISlices  int       `json:"ciSlices,omitempty" yaml:"ciSlices,omitempty"`
}

// String prints the step for humans.
func (s Step) String() string {
	switch s.Op {
	case OpEnableMIG:
		return "enable MIG mode"
	case OpDisableMIG:
		return "disable MIG mode"
	case OpDestroyCI:
		return fmt.Sprintf("destroy compute instance %d of %s@%s (GI %d)", s.CIID, s.Profile, s.Placement, s.GIID)
	case OpDestroyGI:
		return fmt.Sprintf("destroy GPU instance %s@%s (GI %d)", s.Profile, s.Placement, s.GIID)
	case OpCreateGI:
		return fmt.Sprintf("create GPU instance %s@%s", s.Profile, s.Placement)
	case OpCreateCI:
		return fmt.Sprintf("create %d-slice compute instance in %s@%s", s.CISlices, s.Profile, s.Placement)
	}
	return string(s.Op)
}

// Reconcile lists the steps that turn gpu's current instances into target:
// instances that already match (profile, placement, compute slices) stay;
// a GI at the right place with other compute instances only has those
// changed; everything else is destroyed (compute instances first) and then
// created with explicit placements, larger instances first. Mode steps are
// not included.
func Reconcile(gpu *GPU, target Layout) []Step {
	var cur []Instance
	if gpu.MIGEnabled {
		cur = gpu.Instances
	}
	var destroyCI, destroyGI, create []Step
	matched := make([]bool, len(cur))
	for _, t := range target.Sorted() {
		idx := -1
		for i, in := range cur {
			if !matched[i] && in.Profile == t.Profile && in.Placement == t.Placement {
				idx = i
				break
			}
		}
		if idx < 0 {
			create = append(create, Step{Op: OpCreateGI, Profile: t.Profile, Placement: t.Placement})
			for _, c := range sortedInts(t.CISlices) {
				create = append(create, Step{Op: OpCreateCI, Profile: t.Profile, Placement: t.Placement, CISlices: c})
			}
			continue
		}
		matched[idx] = true
		in := cur[idx]
		// diff compute instances by slice count, keeping busy ones first
		need := map[int]int{}
		for _, c := range t.CISlices {
			need[c]++
		}
		cis := append([]ComputeInstance(nil), in.Compute...)
		sort.SliceStable(cis, func(a, b int) bool { return len(cis[a].Processes) > len(cis[b].Processes) })
		for _, c := range cis {
			if need[c.Slices] > 0 {
				need[c.Slices]--
				continue
			}
			destroyCI = append(destroyCI, Step{Op: OpDestroyCI, Profile: in.Profile, Placement: in.Placement, GIID: in.GIID, CIID: c.CIID})
		}
		for _, c := range sortedInts(t.CISlices) {
			if need[c] > 0 {
				need[c]--
				create = append(create, Step{Op: OpCreateCI, Profile: t.Profile, Placement: t.Placement, CISlices: c})
			}
		}
	}
	for i, in := range cur {
		if matched[i] {
			continue
		}
		for _, c := range in.Compute {
			destroyCI = append(destroyCI, Step{Op: OpDestroyCI, Profile: in.Profile, Placement: in.Placement, GIID: in.GIID, CIID: c.CIID})
		}
		destroyGI = append(destroyGI, Step{Op: OpDestroyGI, Profile: in.Profile, Placement: in.Placement, GIID: in.GIID})
	}
	// create bigger GPU instances first (each followed by its CIs)
	sort.SliceStable(create, func(a, b int) bool {
		return create[a].Placement.Size > create[b].Placement.Size
	})
	out := append(destroyCI, destroyGI...)
	return append(out, create...)
}

// destroysBusy returns the busy instance a step list would destroy, if any.
func destroysBusy(gpu *GPU, steps []Step) (string, bool) {
	for _, s := range steps {
		if s.Op != OpDestroyCI {
			continue
		}
		for _, in := range gpu.Instances {
			if in.Placement != s.Placement {
				continue
			}
			for _, c := range in.Compute {
				if c.CIID == s.CIID && len(c.Processes) > 0 {
					return fmt.Sprintf("compute instance %d of %s (pids %v)", c.CIID, in, pids(c.Processes)), true
				}
			}
		}
	}
	return "", false
}

func pids(ps []Process) []uint32 {
	out := make([]uint32, len(ps))
	for i, p := range ps {
		out[i] = p.PID
	}
	return out
}
