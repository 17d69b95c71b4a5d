package mig

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Manager plans and applies MIG layouts on the GPUs behind an nvml.Interface.
// Its methods are safe for concurrent use (they serialise); with a journal,
// they also take the journal's node-wide lock, so separate processes queue.
type Manager struct {
	lib  nvml.Interface
	opts options
	mu   sync.Mutex
}

type options struct {
	journal  *Journal
	progress io.Writer
	hook     func(gpu, n int, s Step)
}

// Option configures a Manager.
type Option func(*options)

// WithJournal records every apply in a journal at path (strongly advised:
// without one, a crash mid-apply cannot be recovered).
func WithJournal(path string) Option {
	return func(o *options) {
		if path != "" {
			o.journal = NewJournal(path)
		}
	}
}

// WithProgress writes one line per step to w (the CLI passes stderr).
func WithProgress(w io.Writer) Option { return func(o *options) { o.progress = w } }

// WithStepHook calls f after each step of a transaction has completed and
// been journalled; n counts steps across the whole Apply from 1. Tests use it
// to crash a process between steps.
func WithStepHook(f func(gpu, n int, s Step)) Option { return func(o *options) { o.hook = f } }

// NewManager returns a Manager over lib, which must be initialised.
func NewManager(lib nvml.Interface, opts ...Option) *Manager {
	m := &Manager{lib: lib}
	for _, o := range opts {
		o(&m.opts)
	}
	return m
}

// Discover reads the node (see [Discover]).
func (m *Manager) Discover(ctx context.Context) (*Node, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return Discover(m.lib)
}

// Plan is a plan for several GPUs.
type Plan struct {
	GPUs []GPUPlan `json:"gpus" yaml:"gpus"`
}

// NoOp reports a plan that changes nothing.
func (p *Plan) NoOp() bool {
	for _, g := range p.GPUs {
		if !g.NoOp() {
			return false
		}
	}
	return true
}

// PlanNode plans reqs (GPU index -> request) against node. Every GPU is
// validated before anything is planned further; the first bad request fails
// the whole plan, so bad input changes nothing.
func PlanNode(node *Node, reqs map[int]Request, opts PlanOptions) (*Plan, error) {
	idx := make([]int, 0, len(reqs))
	for i := range reqs {
		if i < 0 || i >= len(node.GPUs) {
			return nil, fmt.Errorf("%w: device %d out of range (the node has %d GPUs)", ErrBadConfig, i, len(node.GPUs))
		}
		idx = append(idx, i)
	}
	sort.Ints(idx)
	plan := &Plan{}
	for _, i := range idx {
		g, err := PlanGPU(&node.GPUs[i], reqs[i], opts)
		if err != nil {
			return nil, err
		}
		plan.GPUs = append(plan.GPUs, g)
	}
	return plan, nil
}

// Plan discovers the node and plans reqs on it. It changes nothing.
func (m *Manager) Plan(ctx context.Context, reqs map[int]Request, opts PlanOptions) (*Plan, error) {
	node, err := m.Discover(ctx)
	if err != nil {
		return nil, err
	}
	return PlanNode(node, reqs, opts)
}

// ApplyOptions tune Apply.
type ApplyOptions struct {
	PlanOptions
	// DryRun plans and changes nothing (an interrupted transaction is
	// reported in ApplyResult.Recovered with outcome "needed", not recovered).
	DryRun bool
}

// GPUResult is what Apply did to one GPU.
type GPUResult struct {
	GPU     int    `json:"gpu" yaml:"gpu"`
	Outcome string `json:"outcome" yaml:"outcome"` // unchanged, applied, rolled-back, pending, planned
	Steps   int    `json:"steps" yaml:"steps"`
	Layout  Layout `json:"layout" yaml:"layout"`
	// Action tells the admin what to do when Outcome is "pending".
	Action string `json:"action,omitempty" yaml:"action,omitempty"`
	Error  string `json:"error,omitempty" yaml:"error,omitempty"`
}

// ApplyResult reports an Apply.
type ApplyResult struct {
	Recovered *RecoverResult `json:"recovered,omitempty" yaml:"recovered,omitempty"`
	Plan      *Plan          `json:"plan" yaml:"plan"`
	GPUs      []GPUResult    `json:"gpus" yaml:"gpus"`
}

// Apply converges the GPUs named in reqs to their requests: it first
// recovers any interrupted transaction, then discovers, plans (failing
// without changes on bad input or an infeasible layout) and runs each GPU's
// steps as one journalled transaction. A failed step rolls that GPU back to
// its previous layout and Apply stops with an error wrapping ErrRolledBack;
// GPUs already done keep their new layout. A MIG mode change that stays
// pending stops that GPU with outcome "pending" and an error wrapping
// ErrModePending after the other GPUs are done. ctx is checked between steps;
// a cancelled ctx stops the apply like a failed step (the GPU being changed is
// rolled back, ignoring the cancellation).
func (m *Manager) Apply(ctx context.Context, reqs map[int]Request, opts ApplyOptions) (*ApplyResult, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if j := m.opts.journal; j != nil {
		if err := j.Lock(); err != nil {
			return nil, err
		}
		defer j.Unlock()
	}
	res := &ApplyResult{}
	if opts.DryRun {
		if j := m.opts.journal; j != nil {
			if tx, err := j.Pending(); err == nil && tx != nil {
				res.Recovered = &RecoverResult{Tx: tx, Outcome: "needed"}
			}
		}
	} else {
		rec, err := m.recover(ctx)
		if rec != nil && rec.Tx != nil {
			res.Recovered = rec
		}
		if err != nil {
			return res, fmt.Errorf("recovering the interrupted apply: %w", err)
		}
	}
	node, err := m.Discover(ctx)
	if err != nil {
		return res, err
	}
	plan, err := PlanNode(node, reqs, opts.PlanOptions)
	if err != nil {
		return res, err
	}
	res.Plan = plan
	if opts.DryRun {
		for _, g := range plan.GPUs {
			res.GPUs = append(res.GPUs, GPUResult{GPU: g.GPU, Outcome: "planned", Steps: len(g.Steps), Layout: g.Target})
		}
		return res, nil
	}
	var pending []pendingGPU
	n := 0
	for _, gp := range plan.GPUs {
		if gp.NoOp() {
			res.GPUs = append(res.GPUs, GPUResult{GPU: gp.GPU, Outcome: "unchanged", Layout: gp.Current})
			continue
		}
		r, err := m.runTx(ctx, &node.GPUs[gp.GPU], gp, opts.Force, &n)
		res.GPUs = append(res.GPUs, r)
		if errors.Is(err, ErrModePending) {
			pending = append(pending, pendingGPU{gp.GPU, r.Action})
			continue
		}
		if err != nil {
			return res, err
		}
	}
	if len(pending) > 0 {
		return res, fmt.Errorf("%w: %s", ErrModePending, joinPending(pending))
	}
	return res, nil
}

// pendingGPU is a GPU whose MIG mode change stayed pending, and what to do.
type pendingGPU struct {
	gpu    int
	action string
}

// joinPending says what to do for each pending GPU in one line, once for GPUs
// that need the same thing ("GPUs 0,1,2: reset the GPU (sudo nvidia-smi -r
// -i <gpu>; ...)") rather than once per GPU.
func joinPending(ps []pendingGPU) string {
	var keys []string
	groups := map[string][]int{}
	for _, p := range ps {
		k := strings.ReplaceAll(p.action, fmt.Sprintf("-i %d", p.gpu), "-i <gpu>")
		if _, ok := groups[k]; !ok {
			keys = append(keys, k)
		}
		groups[k] = append(groups[k], p.gpu)
	}
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		g := groups[k]
		if len(g) == 1 {
			parts = append(parts, fmt.Sprintf("GPU %d: %s", g[0], strings.ReplaceAll(k, "-i <gpu>", fmt.Sprintf("-i %d", g[0]))))
			continue
		}
		ids := make([]string, len(g))
		for i, x := range g {
			ids[i] = strconv.Itoa(x)
		}
		parts = append(parts, fmt.Sprintf("GPUs %s: %s", strings.Join(ids, ","), k))
	}
	return strings.Join(parts, "; ")
}

func (m *Manager) progressf(format string, args ...any) {
	if m.opts.progress != nil {
		fmt.Fprintf(m.opts.progress, format+"\n", args...)
	}
}

// runTx runs one GPU's plan as a journalled transaction.
func (m *Manager) runTx(ctx context.Context, g *GPU, gp GPUPlan, force bool, n *int) (GPUResult, error) {
	res := GPUResult{GPU: gp.GPU}
	tx := &Tx{
		ID: fmt.Sprintf("%d-%d", time.Now().UnixNano(), gp.GPU), GPU: gp.GPU, UUID: g.UUID, Started: time.Now().UTC(),
		PrevMIGEnabled: g.MIGEnabled, Previous: gp.Current, MIGEnabled: gp.Request.MIGEnabled, Target: gp.Target, Steps: gp.Steps,
	}
	j := m.opts.journal
	if j != nil {
		if err := j.Begin(tx); err != nil {
			return res, fmt.Errorf("GPU %d: journalling the plan: %w", gp.GPU, err)
		}
	}
	dev, ret := m.lib.DeviceGetHandleByIndex(gp.GPU)
	if err := nvmlErr(fmt.Sprintf("opening GPU %d", gp.GPU), ret); err != nil {
		return res, err
	}
	for k, s := range gp.Steps {
		var err error
		if err = ctx.Err(); err == nil {
			m.progressf("GPU %d: [%d/%d] %s", gp.GPU, k+1, len(gp.Steps), s)
			err = execStep(dev, g, s, force)
		}
		var pend *pendingError
		if errors.As(err, &pend) {
			res.Outcome, res.Action, res.Steps = "pending", pend.action, k+1
			res.Layout = Layout{}
			m.progressf("GPU %d: MIG mode change pending: %s", gp.GPU, pend.action)
			if j != nil {
				if err := j.End("pending"); err != nil {
					return res, err
				}
			}
			return res, fmt.Errorf("GPU %d: %w", gp.GPU, ErrModePending)
		}
		if err != nil {
			res.Error = err.Error()
			m.progressf("GPU %d: step %d failed: %v; rolling back to %s", gp.GPU, k+1, err, gp.Current)
			// the rollback runs even when ctx was cancelled: a GPU is never left half-changed
			if rbErr := m.converge(context.WithoutCancel(ctx), gp.GPU, tx.PrevMIGEnabled, tx.Previous, true); rbErr != nil {
				// the journal stays: recover will try again
				return res, fmt.Errorf("GPU %d: step %d (%s) failed: %w; rollback failed too (run migctl partition recover): %v", gp.GPU, k+1, s, err, rbErr)
			}
			if j != nil {
				if err := j.End("rolled-back"); err != nil {
					return res, err
				}
			}
			res.Outcome, res.Layout = "rolled-back", gp.Current
			return res, fmt.Errorf("GPU %d: step %d (%s) failed: %w: %w", gp.GPU, k+1, s, err, ErrRolledBack)
		}
		*n++
		if j != nil {
			if err := j.Step(k + 1); err != nil {
				return res, err
			}
		}
		if m.opts.hook != nil {
			m.opts.hook(gp.GPU, *n, s)
		}
	}
	if j != nil {
		if err := j.End("committed"); err != nil {
			return res, err
		}
	}
	res.Outcome, res.Steps, res.Layout = "applied", len(gp.Steps), gp.Target
	return res, nil
}

// converge re-discovers GPU idx and runs the steps that take it to layout
// (with MIG mode migOn). force allows destroying busy instances.
func (m *Manager) converge(ctx context.Context, idx int, migOn bool, layout Layout, force bool) error {
	dev, ret := m.lib.DeviceGetHandleByIndex(idx)
	if err := nvmlErr(fmt.Sprintf("opening GPU %d", idx), ret); err != nil {
		return err
	}
	g, err := discoverGPU(idx, dev)
	if err != nil {
		return fmt.Errorf("discovering GPU %d: %w", idx, err)
	}
	var steps []Step
	switch {
	case migOn:
		if !g.MIGEnabled {
			steps = append(steps, Step{Op: OpEnableMIG})
		}
		steps = append(steps, Reconcile(&g, layout)...)
	case g.MIGEnabled:
		steps = append(Reconcile(&g, Layout{}), Step{Op: OpDisableMIG})
	}
	for k, s := range steps {
		if err := ctx.Err(); err != nil {
			return err
		}
		m.progressf("GPU %d: [converge %d/%d] %s", idx, k+1, len(steps), s)
		if err := execStep(dev, &g, s, force); err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	return nil
}

// RecoverResult reports what Recover found and did.
type RecoverResult struct {
	Tx      *Tx    `json:"transaction,omitempty" yaml:"transaction,omitempty"`
	Outcome string `json:"outcome" yaml:"outcome"` // nothing, rolled-forward, rolled-back, pending
	Layout  Layout `json:"layout,omitempty" yaml:"layout,omitempty"`
}

// Recover finishes a transaction a crash interrupted: it rolls the GPU
// forward to the journalled target and, if that fails, back to the
// journalled previous layout. Without a journal or an interrupted
// transaction it does nothing.
func (m *Manager) Recover(ctx context.Context) (*RecoverResult, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if j := m.opts.journal; j != nil {
		if err := j.Lock(); err != nil {
			return nil, err
		}
		defer j.Unlock()
	}
	return m.recover(ctx)
}

func (m *Manager) recover(ctx context.Context) (*RecoverResult, error) {
	j := m.opts.journal
	if j == nil {
		return &RecoverResult{Outcome: "nothing"}, nil
	}
	tx, err := j.Pending()
	if err != nil {
		return nil, err
	}
	if tx == nil {
		return &RecoverResult{Outcome: "nothing"}, nil
	}
	res := &RecoverResult{Tx: tx}
	// GPU indices can change across a reboot: the UUID is what identifies it
	if dev, ret := m.lib.DeviceGetHandleByUUID(tx.UUID); ret == nvml.SUCCESS {
		if idx, ret := dev.GetIndex(); ret == nvml.SUCCESS && idx != tx.GPU {
			m.progressf("GPU %s was index %d when the apply was interrupted and is index %d now", tx.UUID, tx.GPU, idx)
			tx.GPU = idx
		}
	}
	dev, ret := m.lib.DeviceGetHandleByIndex(tx.GPU)
	if ret != nvml.SUCCESS {
		return res, fmt.Errorf("journal names GPU %d, which NVML cannot open: %w", tx.GPU, nvmlErr("opening GPU", ret))
	}
	if u, _ := dev.GetUUID(); u != tx.UUID {
		return res, fmt.Errorf("%w: journal %s is for GPU %d %s, which this node does not have (GPU %d is now %s); remove the journal after checking the GPUs by hand",
			ErrBadConfig, j.Path(), tx.GPU, tx.UUID, tx.GPU, u)
	}
	m.progressf("GPU %d: recovering interrupted apply (%d of %d steps journalled done): rolling forward to %s", tx.GPU, tx.Done, len(tx.Steps), tx.Target)
	fwd := m.converge(ctx, tx.GPU, tx.MIGEnabled, tx.Target, false)
	var pend *pendingError
	switch {
	case errors.As(fwd, &pend):
		res.Outcome = "pending"
		m.progressf("GPU %d: MIG mode change pending: %s", tx.GPU, pend.action)
	case fwd == nil:
		res.Outcome, res.Layout = "rolled-forward", tx.Target
	default:
		m.progressf("GPU %d: rolling forward failed (%v); rolling back to %s", tx.GPU, fwd, tx.Previous)
		if back := m.converge(ctx, tx.GPU, tx.PrevMIGEnabled, tx.Previous, false); back != nil {
			return res, fmt.Errorf("GPU %d: recovery failed: forward: %v; back: %w", tx.GPU, fwd, back)
		}
		res.Outcome, res.Layout = "rolled-back", tx.Previous
	}
	if err := j.End("recovered-" + res.Outcome); err != nil {
		return res, err
	}
	return res, nil
}

// pendingError: a MIG mode change did not take effect yet.
type pendingError struct{ action string }

func (e *pendingError) Error() string { return "MIG mode change pending: " + e.action }
func (e *pendingError) Unwrap() error { return ErrModePending }

// pendingAction is what the admin must do after SetMigMode left a change pending.
func pendingAction(idx int, activation nvml.Return, pids []uint32) string {
	switch activation {
	case nvml.ERROR_IN_USE:
		s := fmt.Sprintf("processes are using GPU %d", idx)
		if len(pids) > 0 {
			s += fmt.Sprintf(" (pids %v)", pids)
		}
		return s + fmt.Sprintf("; stop them, then reset the GPU (sudo nvidia-smi -r -i %d) or reboot, and run migctl partition apply again", idx)
	default:
		return fmt.Sprintf("reset the GPU (sudo nvidia-smi -r -i %d; stop GPU services such as nvidia-persistenced/dcgm first) or reboot, then run migctl partition apply again (NVML: %s)", idx, nvml.ErrorString(activation))
	}
}

// execStep runs one step against dev. g supplies the GPU's profiles and the
// instances at planning time (for the busy check).
func execStep(dev nvml.Device, g *GPU, s Step, force bool) error {
	switch s.Op {
	case OpEnableMIG, OpDisableMIG:
		mode := nvml.DEVICE_MIG_ENABLE
		if s.Op == OpDisableMIG {
			mode = nvml.DEVICE_MIG_DISABLE
		}
		act, ret := dev.SetMigMode(mode) // go-nvml returns (activation status, return code)
		if err := nvmlErr("setting MIG mode", ret); err != nil {
			return err
		}
		if act != nvml.SUCCESS {
			var p []uint32
			if procs, r := dev.GetComputeRunningProcesses(); r == nvml.SUCCESS {
				for _, pr := range procs {
					p = append(p, pr.Pid)
				}
			}
			return &pendingError{action: pendingAction(g.Index, act, p)}
		}
		if s.Op == OpEnableMIG && len(g.Profiles) == 0 {
			// profiles are readable with MIG off, but refresh in case
			profs, err := discoverProfiles(dev, g.MemoryBytes)
			if err != nil {
				return err
			}
			g.Profiles = profs
		}
		return nil
	case OpDestroyCI:
		if !force {
			if what, busy := destroysBusy(g, []Step{s}); busy {
				return fmt.Errorf("refusing to destroy %s: %w", what, ErrBusy)
			}
		}
		gi, err := findGI(dev, g, s.Profile, s.Placement)
		if err != nil {
			return err
		}
		ci, ret := gi.GetComputeInstanceById(s.CIID)
		if err := nvmlErr(fmt.Sprintf("finding compute instance %d", s.CIID), ret); err != nil {
			return err
		}
		return nvmlErr("destroying compute instance", ci.Destroy())
	case OpDestroyGI:
		gi, err := findGI(dev, g, s.Profile, s.Placement)
		if err != nil {
			return err
		}
		return nvmlErr("destroying GPU instance", gi.Destroy())
	case OpCreateGI:
		p, ok := g.Profile(s.Profile)
		if !ok {
			return fmt.Errorf("%w: GPU %d has no profile %s", ErrUnknownProfile, g.Index, s.Profile)
		}
		info, ret := dev.GetGpuInstanceProfileInfo(p.Enum)
		if err := nvmlErr("reading GI profile", ret); err != nil {
			return err
		}
		pl := nvml.GpuInstancePlacement{Start: uint32(s.Placement.Start), Size: uint32(s.Placement.Size)}
		_, ret = dev.CreateGpuInstanceWithPlacement(&info, &pl)
		return nvmlErr("creating GPU instance", ret)
	case OpCreateCI:
		gi, err := findGI(dev, g, s.Profile, s.Placement)
		if err != nil {
			return err
		}
		e, ok := ciEnumBySlices[s.CISlices]
		if !ok {
			return fmt.Errorf("%w: no %d-slice compute instance profile", ErrUnknownProfile, s.CISlices)
		}
		info, ret := gi.GetComputeInstanceProfileInfo(e, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if err := nvmlErr("reading CI profile", ret); err != nil {
			return err
		}
		_, ret = gi.CreateComputeInstance(&info)
		return nvmlErr("creating compute instance", ret)
	}
	return fmt.Errorf("unknown step %q", s.Op)
}

// findGI returns the GPU instance of profile at placement.
func findGI(dev nvml.Device, g *GPU, profile string, pl Placement) (nvml.GpuInstance, error) {
	p, ok := g.Profile(profile)
	if !ok {
		return nil, fmt.Errorf("%w: GPU %d has no profile %s", ErrUnknownProfile, g.Index, profile)
	}
	info, ret := dev.GetGpuInstanceProfileInfo(p.Enum)
	if err := nvmlErr("reading GI profile", ret); err != nil {
		return nil, err
	}
	gis, ret := dev.GetGpuInstances(&info)
	if err := nvmlErr("listing GPU instances", ret); err != nil {
		return nil, err
	}
	for _, gi := range gis {
		in, ret := gi.GetInfo()
		if ret == nvml.SUCCESS && int(in.Placement.Start) == pl.Start && int(in.Placement.Size) == pl.Size {
			return gi, nil
		}
	}
	return nil, fmt.Errorf("no %s GPU instance at %s: %w", profile, pl, &NVMLError{Op: "finding GPU instance", Ret: nvml.ERROR_NOT_FOUND})
}

// ModeResult reports a MIG mode change on one GPU.
type ModeResult struct {
	GPU     int    `json:"gpu" yaml:"gpu"`
	Current bool   `json:"current" yaml:"current"`
	Pending bool   `json:"pending" yaml:"pending"`
	Outcome string `json:"outcome" yaml:"outcome"` // unchanged, changed, pending
	Action  string `json:"action,omitempty" yaml:"action,omitempty"`
}

// EnableMIG turns MIG mode on for the given GPUs (instances, if any, are
// untouched: a GPU already in MIG mode is left alone, except that a pending
// disable is withdrawn). It never resets a GPU:
// a change that stays pending is reported with what the admin must do.
// Disabling goes through Apply with Request{MIGEnabled: false}, which
// destroys instances safely first.
func (m *Manager) EnableMIG(ctx context.Context, gpus []int) ([]ModeResult, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	node, err := m.Discover(ctx)
	if err != nil {
		return nil, err
	}
	var out []ModeResult
	for _, i := range gpus {
		if i < 0 || i >= len(node.GPUs) {
			return out, fmt.Errorf("%w: device %d out of range (the node has %d GPUs)", ErrBadConfig, i, len(node.GPUs))
		}
		g := &node.GPUs[i]
		if !g.MIGCapable {
			return out, fmt.Errorf("GPU %d (%s): %w", i, g.Name, ErrNotMIGCapable)
		}
		r := ModeResult{GPU: i, Current: g.MIGEnabled, Pending: g.MIGPending, Outcome: "unchanged"}
		if !g.MIGEnabled || !g.MIGPending { // off, or on with a disable pending
			dev, ret := m.lib.DeviceGetHandleByIndex(i)
			if err := nvmlErr("opening GPU", ret); err != nil {
				return out, err
			}
			err := execStep(dev, g, Step{Op: OpEnableMIG}, false)
			var pend *pendingError
			switch {
			case errors.As(err, &pend):
				r.Outcome, r.Action = "pending", pend.action
			case err != nil:
				return out, fmt.Errorf("GPU %d: %w", i, err)
			default:
				r.Outcome = "changed"
			}
			cur, pen, _ := dev.GetMigMode()
			r.Current, r.Pending = modeBool(cur), modeBool(pen)
		}
		out = append(out, r)
	}
	return out, nil
}
