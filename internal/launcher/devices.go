package launcher

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/migctl/migctl/internal/numa"
)

// Device is what one local rank runs on.
type Device struct {
	// Visible is the rank's CUDA_VISIBLE_DEVICES: a MIG device UUID
	// ("MIG-…"), a GPU UUID ("GPU-…") or a CUDA ordinal.
	Visible string `json:"visible" yaml:"visible"`
	// Ordinal is the CUDA ordinal the rank uses within what it sees
	// (MIGCTL_DEVICE): 0 whenever Visible names one device.
	Ordinal int `json:"ordinal" yaml:"ordinal"`
	// GPU is the physical GPU's index on the node (-1 unknown).
	GPU int `json:"gpu" yaml:"gpu"`
	// Profile is the MIG profile ("" for a whole GPU).
	Profile string `json:"profile,omitempty" yaml:"profile,omitempty"`
	// NUMA is where the rank's process was placed (Config.Place; nil:
	// nowhere in particular).
	NUMA *numa.Placement `json:"numa,omitempty" yaml:"numa,omitempty"`
}

// Devices hands out one Device per local rank for a job and takes them
// back. Implementations: RoundRobin (whole GPUs, --gpus) and Leases (MIG
// devices leased from the daemon).
type Devices interface {
	// Acquire returns n devices for job, by local rank. It blocks; ctx
	// cancels it. On error nothing stays acquired.
	Acquire(ctx context.Context, job string, n int) ([]Device, error)
	// Release gives back everything acquired for job. Safe to call when
	// Acquire failed or never ran.
	Release(ctx context.Context, job string) error
}

// RoundRobin spreads ranks over a fixed list of devices: rank r gets
// devs[r % len(devs)], so several ranks may share one GPU. Nothing is
// reserved; Release does nothing.
type RoundRobin []Device

var _ Devices = RoundRobin(nil)

// GPUOrdinals is a RoundRobin over CUDA ordinals, each made the only
// visible device of its ranks (CUDA_VISIBLE_DEVICES=<ordinal>, device 0).
func GPUOrdinals(ords []int) RoundRobin {
	rr := make(RoundRobin, len(ords))
	for i, o := range ords {
		rr[i] = Device{Visible: strconv.Itoa(o), GPU: o}
	}
	return rr
}

// Acquire implements Devices.
func (rr RoundRobin) Acquire(_ context.Context, _ string, n int) ([]Device, error) {
	if len(rr) == 0 {
		return nil, errors.New("no GPUs to spread the ranks over: give --gpus 0,1,...")
	}
	out := make([]Device, n)
	for i := range out {
		out[i] = rr[i%len(rr)]
	}
	return out, nil
}

// Release implements Devices.
func (RoundRobin) Release(context.Context, string) error { return nil }

// Lease is one MIG device leased from the daemon.
type Lease struct {
	UUID    string // "MIG-…"
	GPU     int
	Profile string
}

// Leaser is what Leases needs of the daemon's client (ctxmgr.Client through
// a thin adapter in cmd/): lease count devices of profile for job at once
// (all or nothing; gpu -1: any GPU; pid: the leases end when it exits), and
// end job's leases of the MIG devices uuids — only those: another run under
// the same job name keeps its own, and a device whose lease is gone or now
// another job's is left alone.
type Leaser interface {
	Acquire(ctx context.Context, job, profile string, count, gpu, pid int) ([]Lease, error)
	Release(ctx context.Context, job string, uuids []string) error
}

// Leases leases one MIG device of Profile per rank through the daemon.
// Every rank sees its instance as CUDA device 0. Release gives back only
// what this Leases acquired, so two runs that share a job name (--job) do
// not end each other's leases. Acquire and Release are not to be called
// concurrently.
type Leases struct {
	Client  Leaser
	Profile string
	// GPU restricts the leases to one GPU (-1: any).
	GPU int
	// PID is the process whose exit ends the leases (the launcher's own,
	// so a launcher killed with SIGKILL leaks nothing); 0: none.
	PID int

	held []string // the UUIDs Acquire leased, for Release
}

var _ Devices = (*Leases)(nil)

// Acquire implements Devices.
func (l *Leases) Acquire(ctx context.Context, job string, n int) ([]Device, error) {
	ls, err := l.Client.Acquire(ctx, job, l.Profile, n, l.GPU, l.PID)
	if err != nil {
		return nil, err
	}
	for _, le := range ls {
		l.held = append(l.held, le.UUID)
	}
	if len(ls) != n {
		return nil, fmt.Errorf("the daemon leased %d devices of %s for %d ranks", len(ls), l.Profile, n)
	}
	out := make([]Device, n)
	for i, le := range ls {
		out[i] = Device{Visible: le.UUID, GPU: le.GPU, Profile: le.Profile}
	}
	return out, nil
}

// Release implements Devices: it ends the leases Acquire got, not every
// lease of job.
func (l *Leases) Release(ctx context.Context, job string) error {
	if len(l.held) == 0 {
		return nil
	}
	if err := l.Client.Release(ctx, job, l.held); err != nil {
		return err
	}
	l.held = nil
	return nil
}
