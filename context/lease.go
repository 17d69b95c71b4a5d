package ctxmgr

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/migctl/migctl/mig"
)

// Sentinel errors of the lease registry.
var (
	// ErrNoFreeInstance: the request does not fit in free instances nor in
	// capacity the daemon may repartition (the error is a *RefusalError that
	// says what is in the way).
	ErrNoFreeInstance = errors.New("no free MIG instance")
	// ErrLeased: a repartition would destroy leased instances.
	ErrLeased = errors.New("instance is leased")
	// ErrNoLease: no such lease.
	ErrNoLease = errors.New("no such lease")
	// ErrBadRequest: a malformed request (empty job, bad count, a pid that is
	// not running, a GPU out of range).
	ErrBadRequest = errors.New("bad request")
	// ErrNoMIG: the daemon runs without a MIG source, so it cannot lease.
	ErrNoMIG = errors.New("the daemon has no MIG devices to lease")
)

// MIGSource is what the lease registry needs of the MIG layer; *mig.Manager
// (over real NVML, or over mig/migsim) is one, and so is ReopeningSource.
type MIGSource interface {
	Discover(ctx context.Context) (*mig.Node, error)
	Apply(ctx context.Context, reqs map[int]mig.Request, opts mig.ApplyOptions) (*mig.ApplyResult, error)
}

var _ MIGSource = (*mig.Manager)(nil)

// Lease is one MIG device (a compute instance) leased to a job.
type Lease struct {
	Job string `json:"job" yaml:"job"`
	// PID, when not 0, is the process the lease is for: the lease ends when
	// that process exits.
	PID       int           `json:"pid,omitempty" yaml:"pid,omitempty"`
	GPU       int           `json:"gpu" yaml:"gpu"`
	GPUUUID   string        `json:"gpuUUID" yaml:"gpuUUID"`
	UUID      string        `json:"uuid" yaml:"uuid"` // "MIG-…": what CUDA_VISIBLE_DEVICES takes
	Profile   string        `json:"profile" yaml:"profile"`
	GIID      int           `json:"gpuInstanceId" yaml:"gpuInstanceId"`
	CIID      int           `json:"computeInstanceId" yaml:"computeInstanceId"`
	Placement mig.Placement `json:"placement" yaml:"placement"` // of the GPU instance, in memory units
	Since     time.Time     `json:"since" yaml:"since"`
	// Created: the daemon created this instance for the lease.
	Created bool `json:"created,omitempty" yaml:"created,omitempty"`
	// BoundToConnection: the lease ends when the control connection of the
	// client that acquired it closes.
	BoundToConnection bool `json:"boundToConnection,omitempty" yaml:"boundToConnection,omitempty"`
}

// AcquireRequest asks for Count MIG devices of Profile for Job.
type AcquireRequest struct {
	Job string `json:"job" yaml:"job"`
	// Profile as nvidia-smi names the MIG device: "1g.18gb", "3g.71gb",
	// "1c.2g.35gb" (a compute instance of a 2g.35gb GPU instance).
	Profile string `json:"profile" yaml:"profile"`
	// Count of devices, all or nothing; 0 means 1.
	Count int `json:"count" yaml:"count"`
	// GPU restricts the devices to one GPU index; -1 means any GPU (note:
	// 0 is GPU 0).
	GPU int `json:"gpu" yaml:"gpu"`
	// PID, when not 0, ties the leases to a running process: they end when
	// it exits (a reused pid is told apart by its start time).
	PID int `json:"pid,omitempty" yaml:"pid,omitempty"`
	// BindToConnection ties the leases to the client's control connection
	// (Client.Acquire): they end when it closes. Over the library API the
	// control server sets conn instead.
	BindToConnection bool `json:"bindToConnection,omitempty" yaml:"bindToConnection,omitempty"`

	conn uint64 // the control connection the leases die with (0: none)
}

// LeaseOptions configure a Leases registry. The zero value keeps leases in
// memory only and never turns MIG on.
type LeaseOptions struct {
	// StatePath is the state file leases are written to after every change
	// (atomically) and re-adopted from by Restore; "" keeps them in memory.
	StatePath string
	// EnableMIG lets Acquire turn MIG on for an idle GPU whose MIG mode is
	// off when it needs room (GPUs already in MIG mode are used first).
	EnableMIG bool
	// OnEvent receives every lease event (acquired, released, expired). It is
	// called with the registry's lock held: it must not block or call back.
	OnEvent func(Event)
	// Logger receives the registry's log; nil discards it.
	Logger *slog.Logger
	// Now is the clock; nil is time.Now.
	Now func() time.Time
	// ProcStart returns a process's start time, to tell an exited process
	// from a new one that reuses its pid; nil reads /proc/<pid>/stat.
	ProcStart func(pid int) (uint64, error)
}

// Leases is the registry of MIG devices leased to jobs. Acquire hands out
// free instances and, when too few are free, creates more by repartitioning
// unleased, idle capacity through the MIG layer's journalled apply; nothing
// here ever destroys a leased or busy instance. Safe for concurrent use;
// methods that take ctx block on the MIG layer.
type Leases struct {
	src  MIGSource
	opts LeaseOptions
	log  *slog.Logger

	op sync.Mutex // serialises what reads the node and changes it (Acquire, Repartition, Restore, Prune)

	mu     sync.Mutex // guards byUUID and conns; never held across MIG calls
	byUUID map[string]*leaseRec
	conns  map[uint64]bool // control connections open now (connOpened .. ReleaseConn)
}

// leaseRec is a lease and what the registry needs to keep it honest.
type leaseRec struct {
	Lease
	PIDStart uint64 `json:"pidStart,omitempty"`
	conn     uint64
}

// NewLeases returns an empty registry over src (Restore loads a state file).
func NewLeases(src MIGSource, opts LeaseOptions) *Leases {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.ProcStart == nil {
		opts.ProcStart = procStart
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Leases{src: src, opts: opts, log: log, byUUID: map[string]*leaseRec{}, conns: map[uint64]bool{}}
}

// validate normalises req and checks what can be checked without the node.
func (l *Leases) validate(req AcquireRequest) (AcquireRequest, mig.ProfileName, uint64, error) {
	if req.Count == 0 {
		req.Count = 1
	}
	var start uint64
	switch {
	case strings.TrimSpace(req.Job) == "" || strings.ContainsAny(req.Job, " \t\n\r"):
		return req, mig.ProfileName{}, 0, fmt.Errorf("%w: job %q: give a job name without spaces", ErrBadRequest, req.Job)
	case req.Count < 0 || req.Count > 1024:
		return req, mig.ProfileName{}, 0, fmt.Errorf("%w: count %d: ask for 1 to 1024 devices", ErrBadRequest, req.Count)
	case req.GPU < -1:
		return req, mig.ProfileName{}, 0, fmt.Errorf("%w: GPU %d: give a GPU index, or -1 for any", ErrBadRequest, req.GPU)
	case req.PID < 0:
		return req, mig.ProfileName{}, 0, fmt.Errorf("%w: pid %d", ErrBadRequest, req.PID)
	}
	name, err := mig.ParseProfileName(req.Profile)
	if err != nil {
		return req, name, 0, err
	}
	req.Profile = name.String()
	if req.PID != 0 {
		if start, err = l.opts.ProcStart(req.PID); err != nil {
			return req, name, 0, fmt.Errorf("%w: pid %d is not running (a lease tied to a process needs it alive)", ErrBadRequest, req.PID)
		}
	}
	return req, name, start, nil
}

// Acquire leases req.Count MIG devices of req.Profile to req.Job, all or
// nothing. Free instances (existing, unleased, no processes) come first,
// lowest GPU and placement first; for the rest it plans new instances with
// the mig planner on each GPU in turn — first keeping every instance there,
// then (with EnableMIG) on idle GPUs whose MIG is off, then destroying only
// unleased, idle instances — and applies the plans with the journalled
// apply. If an apply fails, GPUs already changed are converged back and
// nothing is leased. When the request cannot fit it returns a *RefusalError
// (matching ErrNoFreeInstance) naming what is leased, by which job, and what
// would have to go. Blocks for the MIG calls.
func (l *Leases) Acquire(ctx context.Context, req AcquireRequest) ([]Lease, error) {
	req, name, start, err := l.validate(req)
	if err != nil {
		return nil, fmt.Errorf("leasing for job %q: %w", req.Job, err)
	}
	l.op.Lock()
	defer l.op.Unlock()
	node, err := l.src.Discover(ctx)
	if err != nil {
		return nil, fmt.Errorf("leasing %s for %s: %w", req.Profile, req.Job, err)
	}
	if req.GPU >= len(node.GPUs) {
		return nil, fmt.Errorf("leasing %s for %s: %w: GPU %d out of range (the node has %d GPUs)", req.Profile, req.Job, ErrBadRequest, req.GPU, len(node.GPUs))
	}
	if err := checkProfile(node, name, req.GPU); err != nil {
		return nil, fmt.Errorf("leasing %s for %s: %w", req.Profile, req.Job, err)
	}
	leased := l.leasedUUIDs()
	free := freeInstances(node, req, leased)
	picked := free
	if len(picked) > req.Count {
		picked = picked[:req.Count]
	}
	var created []Lease
	if need := req.Count - len(picked); need > 0 {
		taken := map[string]bool{}
		for _, le := range picked {
			taken[le.UUID] = true
		}
		plans, short := l.planCreate(node, req, name, need, func(uuid string) bool { return leased[uuid] != "" || taken[uuid] })
		if short > 0 {
			return nil, l.refusal(node, req, name, len(picked), need-short, leased)
		}
		if created, err = l.applyCreate(ctx, node, req, plans, need); err != nil {
			return nil, err
		}
	}
	if err := ctx.Err(); err != nil {
		// The client gave up while instances were made: leasing now would
		// hand them to a job that never learns of them.
		return nil, fmt.Errorf("leasing %s for %s: the request was abandoned (%w); nothing leased, the %d instances created stay free",
			req.Profile, req.Job, err, len(created))
	}
	now := l.opts.Now().UTC().Round(0) // as the state file and the wire give it back
	out := make([]Lease, 0, req.Count)
	for _, le := range append(picked, created...) {
		le.Job, le.PID, le.Since, le.BoundToConnection = req.Job, req.PID, now, req.conn != 0
		out = append(out, le)
	}
	sortLeases(out)
	l.mu.Lock()
	defer l.mu.Unlock()
	if req.conn != 0 && !l.conns[req.conn] {
		return nil, fmt.Errorf("leasing %s for %s: the connection the leases were to be bound to has closed; nothing leased", req.Profile, req.Job)
	}
	for _, le := range out {
		l.byUUID[le.UUID] = &leaseRec{Lease: le, PIDStart: start, conn: req.conn}
	}
	if err := l.persistLocked(); err != nil {
		for _, le := range out {
			delete(l.byUUID, le.UUID)
		}
		return nil, fmt.Errorf("leasing %s for %s: %w (nothing was leased; instances it created stay free)", req.Profile, req.Job, err)
	}
	l.emitLocked(EventAcquired, out, "")
	l.log.Info("leased", "job", req.Job, "profile", req.Profile, "count", len(out), "created", len(created), "pid", req.PID)
	return out, nil
}

// checkProfile fails when no GPU in scope offers the profile.
func checkProfile(node *mig.Node, name mig.ProfileName, gpu int) error {
	var offered []string
	for _, g := range node.GPUs {
		if gpu >= 0 && g.Index != gpu {
			continue
		}
		if !g.MIGCapable {
			continue
		}
		if gp, ok := g.Profile(name.GI().String()); ok {
			if mig.CICapacity(gp.Slices, name.ComputeSlices()) > 0 {
				return nil
			}
		}
		offered = append(offered, g.ProfileNames())
	}
	if len(offered) == 0 {
		return fmt.Errorf("%w: no MIG-capable GPU here ('migctl partition show' lists the GPUs)", ErrNoFreeInstance)
	}
	return fmt.Errorf("%w: %s is not a MIG device these GPUs can make (they offer %s; 'migctl partition profiles' lists them)",
		mig.ErrUnknownProfile, name, offered[0])
}

// freeInstances lists the existing, unleased, idle compute instances that
// match req, by GPU then placement.
func freeInstances(node *mig.Node, req AcquireRequest, leased map[string]string) []Lease {
	var out []Lease
	for _, g := range node.GPUs {
		if (req.GPU >= 0 && g.Index != req.GPU) || !g.MIGEnabled {
			continue
		}
		for _, in := range g.Instances {
			for _, ci := range in.Compute {
				if ci.Profile != req.Profile || ci.UUID == "" || leased[ci.UUID] != "" || len(ci.Processes) > 0 {
					continue
				}
				out = append(out, Lease{GPU: g.Index, GPUUUID: g.UUID, UUID: ci.UUID, Profile: ci.Profile,
					GIID: in.GIID, CIID: ci.CIID, Placement: in.Placement})
			}
		}
	}
	sortLeases(out)
	return out
}

// leasedUUIDs maps every leased MIG device to its job.
func (l *Leases) leasedUUIDs() map[string]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]string, len(l.byUUID))
	for u, r := range l.byUUID {
		out[u] = r.Job
	}
	return out
}

// Release ends every lease of job and returns them (none: an empty slice).
func (l *Leases) Release(job string) []Lease {
	return l.end(func(r *leaseRec) bool { return r.Job == job }, EventReleased, "released")
}

// ReleaseUUID ends the lease of one MIG device (ErrNoLease if none).
func (l *Leases) ReleaseUUID(uuid string) (Lease, error) {
	out := l.end(func(r *leaseRec) bool { return r.UUID == uuid }, EventReleased, "released")
	if len(out) == 0 {
		return Lease{}, fmt.Errorf("%s: %w", uuid, ErrNoLease)
	}
	return out[0], nil
}

// connOpened records a control connection leases may be bound to.
func (l *Leases) connOpened(conn uint64) {
	l.mu.Lock()
	l.conns[conn] = true
	l.mu.Unlock()
}

// ReleaseConn ends the leases bound to control connection conn (it closed);
// an Acquire for it still in flight then leases nothing.
func (l *Leases) ReleaseConn(conn uint64) []Lease {
	if conn == 0 {
		return nil
	}
	l.mu.Lock()
	delete(l.conns, conn)
	l.mu.Unlock()
	return l.end(func(r *leaseRec) bool { return r.conn == conn }, EventExpired, "the client's connection closed")
}

// Reap ends the leases whose process has exited (or whose pid now belongs
// to another process) and returns them: a job that dies without releasing
// gives its instances back.
func (l *Leases) Reap() []Lease {
	return l.end(func(r *leaseRec) bool { return r.PID != 0 && !l.alive(r) }, EventExpired, "its process exited")
}

// alive reports whether the lease's process still runs (same start time).
func (l *Leases) alive(r *leaseRec) bool {
	st, err := l.opts.ProcStart(r.PID)
	return err == nil && (r.PIDStart == 0 || st == r.PIDStart)
}

// end removes the leases match selects, persists, emits one event per job
// and returns them sorted.
func (l *Leases) end(match func(*leaseRec) bool, typ EventType, reason string) []Lease {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := []Lease{}
	for u, r := range l.byUUID {
		if match(r) {
			out = append(out, r.Lease)
			delete(l.byUUID, u)
		}
	}
	if len(out) == 0 {
		return out
	}
	sortLeases(out)
	if err := l.persistLocked(); err != nil {
		l.log.Error("writing the lease state", "err", err)
	}
	l.emitLocked(typ, out, reason)
	for _, le := range out {
		l.log.Info("lease ended", "job", le.Job, "uuid", le.UUID, "pid", le.PID, "why", reason)
	}
	return out
}

// List returns the leases, by GPU and placement.
func (l *Leases) List() []Lease {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]Lease, 0, len(l.byUUID))
	for _, r := range l.byUUID {
		out = append(out, r.Lease)
	}
	sortLeases(out)
	return out
}

// Prune ends the leases whose MIG device no longer exists (destroyed behind
// the daemon's back, e.g. by 'partition apply --force').
func (l *Leases) Prune(ctx context.Context) ([]Lease, error) {
	l.op.Lock()
	defer l.op.Unlock()
	node, err := l.src.Discover(ctx)
	if err != nil {
		return nil, err
	}
	exists := map[string]bool{}
	for _, d := range node.MIGDevices() {
		exists[d.UUID] = true
	}
	return l.end(func(r *leaseRec) bool { return !exists[r.UUID] }, EventExpired, "its MIG device no longer exists"), nil
}

// Repartition converges one GPU to req through the MIG layer's journalled
// apply, unless its plan would destroy a leased instance (or turn MIG off
// under one): then it changes nothing and returns ErrLeased naming the
// leases. Leases of instances the plan keeps stay valid. Acquire waits while
// a repartition runs.
func (l *Leases) Repartition(ctx context.Context, gpu int, req mig.Request) (*mig.ApplyResult, error) {
	l.op.Lock()
	defer l.op.Unlock()
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
		for _, le := range l.List() {
			if le.GPU == gp.GPU && destroys(gp, le.GIID, le.CIID) {
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

// destroys reports whether plan gp removes compute instance (giid, ciid).
func destroys(gp mig.GPUPlan, giid, ciid int) bool {
	if gp.DisableMIG {
		return true
	}
	for _, s := range gp.Steps {
		switch s.Op {
		case mig.OpDisableMIG:
			return true
		case mig.OpDestroyGI:
			if s.GIID == giid {
				return true
			}
		case mig.OpDestroyCI:
			if s.GIID == giid && s.CIID == ciid {
				return true
			}
		}
	}
	return false
}

func sortLeases(ls []Lease) {
	sort.Slice(ls, func(i, j int) bool { return leaseLess(ls[i], ls[j]) })
}

// leaseLess orders leases by GPU, placement, compute instance.
func leaseLess(a, b Lease) bool {
	if a.GPU != b.GPU {
		return a.GPU < b.GPU
	}
	if a.Placement.Start != b.Placement.Start {
		return a.Placement.Start < b.Placement.Start
	}
	return a.CIID < b.CIID
}

// emitLocked sends one event per job of ls. Callers hold mu.
func (l *Leases) emitLocked(typ EventType, ls []Lease, reason string) {
	if l.opts.OnEvent == nil {
		return
	}
	byJob := map[string][]Lease{}
	var jobs []string
	for _, le := range ls {
		if _, ok := byJob[le.Job]; !ok {
			jobs = append(jobs, le.Job)
		}
		byJob[le.Job] = append(byJob[le.Job], le)
	}
	now := l.opts.Now()
	for _, j := range jobs {
		l.opts.OnEvent(Event{Type: typ, Job: j, Time: now, Leases: byJob[j], Reason: reason})
	}
}

// PIDAlive reports whether a process with pid exists: signal 0 checks
// existence; EPERM means it exists but belongs to someone else.
func PIDAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
