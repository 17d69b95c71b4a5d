package ctxmgr

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/migctl/migctl/mig"
)

// The ways Acquire may make room on a GPU, tried in this order over all
// GPUs: the least disruptive first.
const (
	tierKeepAll   = iota // MIG on: add instances, destroy nothing
	tierEnableMIG        // MIG off, GPU idle: turn MIG on and add instances (LeaseOptions.EnableMIG)
	tierReshape          // MIG on: keep leased and busy instances, destroy only unleased idle ones
)

// gpuCreate is a planned change of one GPU: apply req to gain n instances;
// undo converges it back if a later GPU fails.
type gpuCreate struct {
	gpu  int
	tier int
	n    int
	req  mig.Request
	undo mig.Request
}

// planCreate plans need new instances of req.Profile on the GPUs in scope,
// never touching a GPU instance that protected (leased, or about to be) or
// a process holds. It returns the plans and how many it could not place.
func (l *Leases) planCreate(node *mig.Node, req AcquireRequest, name mig.ProfileName, need int, protected func(uuid string) bool) ([]gpuCreate, int) {
	chosen := map[int]gpuCreate{}
	left := need
	for _, tier := range []int{tierKeepAll, tierEnableMIG, tierReshape} {
		for i := range node.GPUs {
			g := &node.GPUs[i]
			if left == 0 {
				break
			}
			if req.GPU >= 0 && g.Index != req.GPU {
				continue
			}
			have := chosen[g.Index].n
			c, ok := l.maxAdd(g, tier, req.Profile, have+left, protected)
			if ok && c.n > have {
				left -= c.n - have
				chosen[g.Index] = c
			}
		}
	}
	out := make([]gpuCreate, 0, len(chosen))
	for _, c := range chosen {
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].gpu < out[j].gpu })
	return out, left
}

// maxAdd finds the most new instances of profile (up to limit) that tier
// allows on g, and the request that makes them.
func (l *Leases) maxAdd(g *mig.GPU, tier int, profile string, limit int, protected func(string) bool) (gpuCreate, bool) {
	if !g.MIGCapable || g.ModePending() {
		return gpuCreate{}, false
	}
	var keep func(mig.Instance) bool
	undo, undoOK := layoutRequest(g, func(mig.Instance) bool { return true })
	switch tier {
	case tierKeepAll:
		if !g.MIGEnabled || !undoOK {
			return gpuCreate{}, false
		}
		keep = func(mig.Instance) bool { return true }
	case tierEnableMIG:
		if g.MIGEnabled || !l.opts.EnableMIG || len(g.Processes) > 0 {
			return gpuCreate{}, false
		}
		undo = mig.Request{MIGEnabled: false}
		keep = func(mig.Instance) bool { return false }
	case tierReshape:
		if !g.MIGEnabled {
			return gpuCreate{}, false
		}
		keep = func(in mig.Instance) bool { return holds(in, protected) }
		if !undoOK {
			undo, _ = layoutRequest(g, keep)
		}
	}
	base, ok := layoutRequest(g, keep)
	if !ok {
		return gpuCreate{}, false
	}
	base.MIGEnabled = true
	for n := limit; n >= 1; n-- {
		r := base
		r.Devices = append(append([]mig.DeviceRequest(nil), base.Devices...), mig.DeviceRequest{Profile: profile, Count: n, Source: "lease request"})
		if safePlan(g, r, tier, protected) {
			return gpuCreate{gpu: g.Index, tier: tier, n: n, req: r, undo: undo}, true
		}
	}
	return gpuCreate{}, false
}

// holds reports whether a GPU instance must stay: one of its compute
// instances is protected or has processes.
func holds(in mig.Instance, protected func(string) bool) bool {
	for _, c := range in.Compute {
		if protected(c.UUID) || len(c.Processes) > 0 {
			return true
		}
	}
	return false
}

// safePlan plans r on g and checks that it destroys no protected or busy
// compute instance (and, keeping all, nothing at all).
func safePlan(g *mig.GPU, r mig.Request, tier int, protected func(string) bool) bool {
	gp, err := mig.PlanGPU(g, r, mig.PlanOptions{})
	if err != nil {
		return false
	}
	for _, s := range gp.Steps {
		if tier == tierKeepAll && (s.Op == mig.OpDestroyCI || s.Op == mig.OpDestroyGI) {
			return false
		}
	}
	if !g.MIGEnabled {
		return true
	}
	for _, in := range g.Instances {
		for _, c := range in.Compute {
			if (protected(c.UUID) || len(c.Processes) > 0) && destroys(gp, in.GIID, c.CIID) {
				return false
			}
		}
	}
	return true
}

// layoutRequest expresses the GPU instances of g that keep selects as a
// request pinned to their placements, each with its compute instances. It
// fails for a GPU instance the request syntax cannot express (compute
// instances of mixed sizes, or none).
func layoutRequest(g *mig.GPU, keep func(mig.Instance) bool) (mig.Request, bool) {
	r := mig.Request{MIGEnabled: g.MIGEnabled}
	if !g.MIGEnabled {
		return r, true
	}
	for _, in := range g.Instances {
		if !keep(in) {
			continue
		}
		if len(in.Compute) == 0 {
			return r, false
		}
		size := in.Compute[0].Slices
		for _, c := range in.Compute {
			if c.Slices != size {
				return r, false
			}
		}
		name, err := mig.ParseProfileName(in.Profile)
		if err != nil {
			return r, false
		}
		name.C = size
		r.Devices = append(r.Devices, mig.DeviceRequest{Profile: name.String(), Count: len(in.Compute),
			Starts: []int{in.Placement.Start}, Source: fmt.Sprintf("kept %s GI %d", in.Profile, in.GIID)})
	}
	return r, true
}

// applyCreate applies plans GPU by GPU and returns the need new instances
// (unleased, idle, of the profile, absent before). On any failure it
// converges the GPUs it touched back (the failing one is already rolled
// back by the journal) and returns the error: nothing is left created.
func (l *Leases) applyCreate(ctx context.Context, before *mig.Node, req AcquireRequest, plans []gpuCreate, need int) ([]Lease, error) {
	// A client that goes away mid-apply must not tear a GPU half-changed:
	// the apply and any undo run to the end.
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Minute)
	defer cancel()
	existed := map[string]bool{}
	for _, d := range before.MIGDevices() {
		existed[d.UUID] = true
	}
	var touched []gpuCreate
	fail := func(err error) ([]Lease, error) {
		if uerr := l.undo(actx, touched); uerr != nil {
			err = fmt.Errorf("%w; undoing the GPUs changed so far also failed (%v): check with 'migctl partition show'", err, uerr)
		}
		return nil, fmt.Errorf("leasing %d × %s for %s: %w (nothing leased)", req.Count, req.Profile, req.Job, err)
	}
	for _, c := range plans {
		touched = append(touched, c)
		l.log.Info("creating MIG instances", "job", req.Job, "gpu", c.gpu, "profile", req.Profile, "count", c.n, "request", c.req.String())
		if _, err := l.src.Apply(actx, map[int]mig.Request{c.gpu: c.req}, mig.ApplyOptions{}); err != nil {
			return fail(fmt.Errorf("creating %d × %s on GPU %d: %w", c.n, req.Profile, c.gpu, err))
		}
	}
	after, err := l.src.Discover(actx)
	if err != nil {
		return fail(err)
	}
	leased := l.leasedUUIDs()
	var out []Lease
	for _, c := range plans {
		got := 0
		for _, le := range freeInstances(after, AcquireRequest{Profile: req.Profile, GPU: c.gpu}, leased) {
			if !existed[le.UUID] && got < c.n {
				le.Created = true
				out = append(out, le)
				got++
			}
		}
	}
	for u, job := range leased {
		if !deviceExists(after, u) {
			l.log.Error("a leased MIG device vanished during a repartition", "uuid", u, "job", job)
		}
	}
	if len(out) < need {
		return fail(fmt.Errorf("created %d new %s instances, %d needed", len(out), req.Profile, need))
	}
	sortLeases(out)
	return out[:need], nil
}

// undo converges each touched GPU back to its undo request, last first.
func (l *Leases) undo(ctx context.Context, touched []gpuCreate) error {
	var errs []error
	for i := len(touched) - 1; i >= 0; i-- {
		c := touched[i]
		if _, err := l.src.Apply(ctx, map[int]mig.Request{c.gpu: c.undo}, mig.ApplyOptions{}); err != nil {
			errs = append(errs, fmt.Errorf("GPU %d: %w", c.gpu, err))
		}
	}
	return errors.Join(errs...)
}

func deviceExists(node *mig.Node, uuid string) bool {
	for _, d := range node.MIGDevices() {
		if d.UUID == uuid {
			return true
		}
	}
	return false
}

// Obstacle is a MIG device that stands in the way of a request: leased to
// a job, or running processes.
type Obstacle struct {
	GPU       int           `json:"gpu" yaml:"gpu"`
	UUID      string        `json:"uuid" yaml:"uuid"`
	Profile   string        `json:"profile" yaml:"profile"`
	Placement mig.Placement `json:"placement" yaml:"placement"`
	Job       string        `json:"job,omitempty" yaml:"job,omitempty"` // leased to
	PID       int           `json:"pid,omitempty" yaml:"pid,omitempty"` // the lease's process
	Busy      []uint32      `json:"busy,omitempty" yaml:"busy,omitempty"`
}

func (o Obstacle) String() string {
	var who []string
	if o.Job != "" {
		s := "leased by job " + o.Job
		if o.PID != 0 {
			s += fmt.Sprintf(" (pid %d)", o.PID)
		}
		who = append(who, s)
	}
	if len(o.Busy) > 0 {
		who = append(who, fmt.Sprintf("processes %v run on it", o.Busy))
	}
	return fmt.Sprintf("%s@%s %s %s", o.Profile, o.Placement, shortUUID(o.UUID), strings.Join(who, ", "))
}

func shortUUID(u string) string {
	if len(u) > 13 {
		return u[:13] + "…"
	}
	return u
}

// RefusalError is why Acquire cannot lease: how many devices are free, how
// many more it could create without destroying leased or busy instances,
// what stands in the way and the most the GPUs could ever hold. It matches
// ErrNoFreeInstance.
type RefusalError struct {
	Job       string `json:"job"`
	Profile   string `json:"profile"`
	Count     int    `json:"count"`
	Free      int    `json:"free"`
	Creatable int    `json:"creatable"`
	// Max is the most devices of the profile the GPUs in scope could hold
	// with nothing leased or running.
	Max      int        `json:"max"`
	InTheWay []Obstacle `json:"inTheWay,omitempty"`
	// Note adds what else limits the request (MIG off on GPUs the daemon
	// may not turn it on for).
	Note string `json:"note,omitempty"`
}

func (e *RefusalError) Unwrap() error { return ErrNoFreeInstance }

func (e *RefusalError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "cannot lease %d × %s for job %s: %v: %d free, room to create %d more without destroying leased or busy instances",
		e.Count, e.Profile, e.Job, ErrNoFreeInstance, e.Free, e.Creatable)
	if e.Count > e.Max {
		fmt.Fprintf(&b, "; these GPUs can never hold more than %d × %s: ask for at most %d", e.Max, e.Profile, e.Max)
	}
	if len(e.InTheWay) > 0 {
		// leased devices grouped by GPU, job, process and profile; busy
		// ones one by one
		type group struct {
			gpu     int
			job     string
			pid     int
			profile string
		}
		var order []group
		n := map[group]int{}
		var parts, jobList []string
		jobs := map[string]bool{}
		for _, o := range e.InTheWay {
			if o.Job != "" && !jobs[o.Job] {
				jobs[o.Job] = true
				jobList = append(jobList, o.Job)
			}
			if o.Job == "" || len(o.Busy) > 0 {
				parts = append(parts, fmt.Sprintf("GPU %d: %s", o.GPU, o))
				continue
			}
			g := group{o.GPU, o.Job, o.PID, o.Profile}
			if n[g] == 0 {
				order = append(order, g)
			}
			n[g]++
		}
		var leased []string
		for _, g := range order {
			s := fmt.Sprintf("GPU %d: %d × %s leased by job %s", g.gpu, n[g], g.profile, g.job)
			if g.pid != 0 {
				s += fmt.Sprintf(" (pid %d)", g.pid)
			}
			leased = append(leased, s)
		}
		parts = append(leased, parts...)
		const show = 8
		if len(parts) > show {
			parts = append(parts[:show], fmt.Sprintf("and %d more", len(parts)-show))
		}
		fmt.Fprintf(&b, "; in the way: %s", strings.Join(parts, "; "))
		switch len(jobList) {
		case 0:
		case 1:
			fmt.Fprintf(&b, "; to make room, job %s would have to release its leases ('migctl lease release --job %s')", jobList[0], jobList[0])
		default:
			fmt.Fprintf(&b, "; to make room, jobs %s would have to release their leases ('migctl lease release --job %s', ...)", strings.Join(jobList, ", "), jobList[0])
		}
	}
	if e.Note != "" {
		b.WriteString("; " + e.Note)
	}
	if e.Count <= e.Max {
		b.WriteString("; or ask for fewer, or wait and try again")
	}
	return b.String()
}

// refusal explains why need more devices could not be placed: what the GPUs
// could hold empty, and the leased or busy instances on the GPUs that could
// hold more without them.
func (l *Leases) refusal(node *mig.Node, req AcquireRequest, name mig.ProfileName, free, creatable int, leased map[string]string) error {
	e := &RefusalError{Job: req.Job, Profile: req.Profile, Count: req.Count, Free: free, Creatable: creatable}
	pids := map[string]int{}
	for _, le := range l.List() {
		pids[le.UUID] = le.PID
	}
	var off []string
	none := func(string) bool { return false }
	for i := range node.GPUs {
		g := node.GPUs[i]
		if (req.GPU >= 0 && g.Index != req.GPU) || !g.MIGCapable {
			continue
		}
		empty := g
		empty.MIGEnabled, empty.MIGPending, empty.Instances, empty.Processes = true, true, nil, nil
		c, _ := l.maxAdd(&empty, tierKeepAll, req.Profile, req.Count, none)
		e.Max += c.n
		if !g.MIGEnabled && !l.opts.EnableMIG {
			off = append(off, fmt.Sprint(g.Index))
			continue
		}
		if c.n == 0 {
			continue
		}
		for _, in := range g.Instances {
			for _, ci := range in.Compute {
				o := Obstacle{GPU: g.Index, UUID: ci.UUID, Profile: ci.Profile, Placement: in.Placement, Job: leased[ci.UUID], PID: pids[ci.UUID]}
				for _, p := range ci.Processes {
					o.Busy = append(o.Busy, p.PID)
				}
				if o.Job != "" || len(o.Busy) > 0 {
					e.InTheWay = append(e.InTheWay, o)
				}
			}
		}
		if !g.MIGEnabled && len(g.Processes) > 0 {
			var ps []uint32
			for _, p := range g.Processes {
				ps = append(ps, p.PID)
			}
			e.InTheWay = append(e.InTheWay, Obstacle{GPU: g.Index, Profile: "whole GPU (MIG off)", Busy: ps})
		}
	}
	if len(off) > 0 {
		e.Note = fmt.Sprintf("GPU %s: MIG is off and the daemon may not turn it on (start it with --enable-mig, or turn MIG on: 'migctl partition mode enable --gpus %s')",
			strings.Join(off, ","), strings.Join(off, ","))
	}
	return e
}
