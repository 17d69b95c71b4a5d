package ctxmgr

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/migctl/migctl/mig"
)

// Sentinel errors of the lease registry.
var (
	// ErrNoFreeInstance: no MIG device of that profile is unleased and idle.
	ErrNoFreeInstance = errors.New("no free MIG instance")
	// ErrLeased: a repartition would destroy leased instances.
	ErrLeased = errors.New("instance is leased")
	// ErrNoLease: no such lease.
	ErrNoLease = errors.New("no such lease")
)

// MIGSource is what the lease registry needs of the MIG layer; *mig.Manager
// (over real NVML, or over mig/migsim) is one.
type MIGSource interface {
	Discover(ctx context.Context) (*mig.Node, error)
	Apply(ctx context.Context, reqs map[int]mig.Request, opts mig.ApplyOptions) (*mig.ApplyResult, error)
}

var _ MIGSource = (*mig.Manager)(nil)

// Lease is one MIG device (a compute instance) leased to a job.
type Lease struct {
	Job string `json:"job" yaml:"job"`
	// PID, when not 0, is the process the lease is for: Reap releases the
	// lease once it has exited.
	PID       int           `json:"pid,omitempty" yaml:"pid,omitempty"`
	GPU       int           `json:"gpu" yaml:"gpu"`
	GPUUUID   string        `json:"gpuUUID" yaml:"gpuUUID"`
	UUID      string        `json:"uuid" yaml:"uuid"` // "MIG-…": what CUDA_VISIBLE_DEVICES takes
	Profile   string        `json:"profile" yaml:"profile"`
	GIID      int           `json:"gpuInstanceId" yaml:"gpuInstanceId"`
	CIID      int           `json:"computeInstanceId" yaml:"computeInstanceId"`
	Placement mig.Placement `json:"placement" yaml:"placement"` // of the GPU instance, in memory units
	Since     time.Time     `json:"since" yaml:"since"`
}

// Leases is the registry of MIG devices leased to jobs. It only hands out
// instances that exist (it never creates one to satisfy a lease; Repartition
// does that on request) and never lets a repartition destroy a leased one.
// Safe for concurrent use; methods that take ctx block on the MIG layer.
type Leases struct {
	src MIGSource
	now func() time.Time

	mu     sync.Mutex // held across Repartition so no lease appears mid-way
	byUUID map[string]Lease
}

// NewLeases returns an empty registry over src.
func NewLeases(src MIGSource) *Leases {
	return &Leases{src: src, now: time.Now, byUUID: map[string]Lease{}}
}

// Acquire leases to job one MIG device of profile (as nvidia-smi names the
// compute instance: "3g.71gb" for a whole GPU instance, "1c.2g.35gb" for a
// slice of one) that no lease holds and no process runs on; gpu < 0 means any
// GPU. It prefers the lowest GPU index, then the lowest placement. pid 0 makes
// a job-level lease (ended by Release). Returns ErrNoFreeInstance with what
// exists when none is free.
func (l *Leases) Acquire(ctx context.Context, job string, pid int, profile string, gpu int) (Lease, error) {
	if job == "" {
		return Lease{}, errors.New("leasing: empty job name")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	node, err := l.src.Discover(ctx)
	if err != nil {
		return Lease{}, fmt.Errorf("leasing %s for %s: %w", profile, job, err)
	}
	var cands []Lease
	seen := 0
	for _, g := range node.GPUs {
		if gpu >= 0 && g.Index != gpu {
			continue
		}
		for _, in := range g.Instances {
			for _, ci := range in.Compute {
				if ci.Profile != profile || ci.UUID == "" {
					continue
				}
				seen++
				if _, taken := l.byUUID[ci.UUID]; taken || len(ci.Processes) > 0 {
					continue
				}
				cands = append(cands, Lease{Job: job, PID: pid, GPU: g.Index, GPUUUID: g.UUID, UUID: ci.UUID, Profile: ci.Profile,
					GIID: in.GIID, CIID: ci.CIID, Placement: in.Placement})
			}
		}
	}
	if len(cands) == 0 {
		return Lease{}, fmt.Errorf("leasing %s for %s: %w (%d such instances exist, all leased or busy; repartition to add one)",
			profile, job, ErrNoFreeInstance, seen)
	}
	sort.Slice(cands, func(i, j int) bool {
		a, b := cands[i], cands[j]
		if a.GPU != b.GPU {
			return a.GPU < b.GPU
		}
		if a.Placement.Start != b.Placement.Start {
			return a.Placement.Start < b.Placement.Start
		}
		return a.CIID < b.CIID
	})
	le := cands[0]
	le.Since = l.now()
	l.byUUID[le.UUID] = le
	return le, nil
}

// Release ends every lease of job and returns them.
func (l *Leases) Release(job string) []Lease {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []Lease
	for u, le := range l.byUUID {
		if le.Job == job {
			out = append(out, le)
			delete(l.byUUID, u)
		}
	}
	sortLeases(out)
	return out
}

// ReleaseUUID ends the lease of one MIG device (ErrNoLease if none).
func (l *Leases) ReleaseUUID(uuid string) (Lease, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	le, ok := l.byUUID[uuid]
	if !ok {
		return Lease{}, fmt.Errorf("%s: %w", uuid, ErrNoLease)
	}
	delete(l.byUUID, uuid)
	return le, nil
}

// Reap ends the leases whose process has exited (alive reports false) and
// returns them: a job that dies without releasing gives its instances back.
func (l *Leases) Reap(alive func(pid int) bool) []Lease {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []Lease
	for u, le := range l.byUUID {
		if le.PID != 0 && !alive(le.PID) {
			out = append(out, le)
			delete(l.byUUID, u)
		}
	}
	sortLeases(out)
	return out
}

// List returns the leases, by GPU and placement.
func (l *Leases) List() []Lease {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]Lease, 0, len(l.byUUID))
	for _, le := range l.byUUID {
		out = append(out, le)
	}
	sortLeases(out)
	return out
}

// Repartition converges one GPU to req through the MIG layer's journalled
// apply, unless its plan would destroy a leased instance (or turn MIG off
// under one): then it changes nothing and returns ErrLeased naming the
// leases. Leases of instances the plan keeps stay valid. Acquire waits while
// a repartition runs.
func (l *Leases) Repartition(ctx context.Context, gpu int, req mig.Request) (*mig.ApplyResult, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	node, err := l.src.Discover(ctx)
	if err != nil {
		return nil, fmt.Errorf("repartitioning GPU %d: %w", gpu, err)
	}
	plan, err := mig.PlanNode(node, map[int]mig.Request{gpu: req}, mig.PlanOptions{})
	if err != nil {
		return nil, fmt.Errorf("repartitioning GPU %d: %w", gpu, err)
	}
	var hit []string
	for _, gp := range plan.GPUs {
		for _, le := range l.byUUID {
			if le.GPU != gp.GPU {
				continue
			}
			if destroys(gp, le) {
				hit = append(hit, fmt.Sprintf("%s (%s@%s, job %s)", le.UUID, le.Profile, le.Placement, le.Job))
			}
		}
	}
	if len(hit) > 0 {
		sort.Strings(hit)
		return nil, fmt.Errorf("repartitioning GPU %d to %s would destroy %s: %w", gpu, req, strings.Join(hit, ", "), ErrLeased)
	}
	res, err := l.src.Apply(ctx, map[int]mig.Request{gpu: req}, mig.ApplyOptions{})
	if err != nil {
		return res, fmt.Errorf("repartitioning GPU %d: %w", gpu, err)
	}
	return res, nil
}

// destroys reports whether plan gp removes the leased compute instance.
func destroys(gp mig.GPUPlan, le Lease) bool {
	if gp.DisableMIG {
		return true
	}
	for _, s := range gp.Steps {
		switch s.Op {
		case mig.OpDestroyGI, mig.OpDisableMIG:
			if s.Op == mig.OpDisableMIG || s.GIID == le.GIID {
				return true
			}
		case mig.OpDestroyCI:
			if s.GIID == le.GIID && s.CIID == le.CIID {
				return true
			}
		}
	}
	return false
}

func sortLeases(ls []Lease) {
	sort.Slice(ls, func(i, j int) bool {
		if ls[i].GPU != ls[j].GPU {
			return ls[i].GPU < ls[j].GPU
		}
		if ls[i].Placement.Start != ls[j].Placement.Start {
			return ls[i].Placement.Start < ls[j].Placement.Start
		}
		return ls[i].CIID < ls[j].CIID
	})
}

// PIDAlive reports whether a process with pid exists (for Reap): signal 0
// checks existence; EPERM means it exists but belongs to someone else.
func PIDAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
