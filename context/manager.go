package ctxmgr

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sort"
	"sync"
	"time"

	"github.com/migctl/migctl/context/swapproto"
)

// Options configure a Manager. The zero value works: declared capacity 0
// (nothing fits without a swap) unless Memory or GPUMemory is set.
type Options struct {
	// Memory reports free device memory. Nil: GPUMemory per device minus the
	// bytes the registry holds there.
	Memory MemoryInfo
	// GPUMemory is the declared capacity of every device when Memory is nil.
	GPUMemory int64
	// Headroom is added to every need and reservation when the policy checks
	// whether it fits (what it grants is still the asked bytes): with NVML, an
	// allocation can fail while the device reports exactly enough free
	// (granularity, context overhead). 0 for none.
	Headroom int64
	// SwapTimeout bounds each swap the policy starts (default 90 s, under the shim's 120-s wait for an answer to need); a
	// victim that does not finish in time makes its need denied.
	SwapTimeout time.Duration
	// ReservationTTL is how long memory granted to a need is kept from the
	// policy before the process's next usage report arrives (default 5 s).
	ReservationTTL time.Duration
	// RebalanceEvery re-runs the swap-in policy periodically, for memory freed
	// outside the registry's sight (default 5 s; negative: never).
	RebalanceEvery time.Duration
	// HelloTimeout bounds the wait for a shim's hello (default 10 s).
	HelloTimeout time.Duration
	// Logger receives the daemon's log; nil discards it.
	Logger *slog.Logger
	// Now is the clock (tests); nil is time.Now.
	Now func() time.Time
	// Sched, when set, replaces the priority policy (PlanNeed, PlanSwapIn)
	// with a job-switching policy (fair, srf: sched_wire.go).
	Sched *Scheduler
	// Gate is the priority launch gating of every shimmed process
	// (SetGatePolicy overrides it per process); the zero value is off: the
	// shims are told nothing and behave as before.
	Gate GatePolicy
	// OnSwapStart, when set, is called as a swap of one process starts
	// (Result carries pid, job and direction); OnSwapDone with its result.
	// Both run on the swapping goroutine and must not block.
	OnSwapStart func(Result)
	OnSwapDone  func(Result)
}

// Manager is the registry of shimmed processes and the driver of their
// swaps. All methods are safe for concurrent use.
type Manager struct {
	opts Options
	mem  MemoryInfo
	log  *slog.Logger

	// policy serialises decisions and the swaps they start (a 1-slot
	// semaphore, so that waiting for it honours ctx).
	policy chan struct{}
	kick   chan struct{}

	mu       sync.Mutex
	procs    map[int]*proc
	reserved map[uint64]*reservation
	nextRes  uint64
	// epoch counts events that freed memory (a usage that went down, an exit,
	// a finished swap-out, a released or expired reservation, a periodic tick).
	epoch uint64

	// gateMu orders priority-gating decisions and their messages (gate.go);
	// taken before mu. gates: each device's shared page.
	gateMu sync.Mutex
	gates  map[string]*gatePage
}

type proc struct {
	Process
	conn   *shimConn
	nextID uint64
	ops    map[swapproto.ID]*op
	// waitingN counts the needs in flight.
	waitingN int

	// priority gating (gate.go): the slot on the device's page (-1 none), a
	// per-process policy (nil: the daemon's), what the shim was last told.
	slot       int
	gatePolicy *GatePolicy
	gateSent   gateMsg
	gateSentOK bool
	pageSent   bool
	gone       bool
}

// reservation keeps granted memory from the policy until the grantee reports
// its usage (pid > 0), it is released, or it expires.
type reservation struct {
	pid     int
	device  string
	bytes   int64
	expires time.Time
}

// Direction is which way a swap goes.
type Direction int

// The two swaps.
const (
	SwapOut Direction = iota + 1
	SwapIn
)

func (d Direction) String() string {
	if d == SwapIn {
		return "swap-in"
	}
	return "swap-out"
}

// Result is how one process's swap ended.
type Result struct {
	PID       int           `json:"pid" yaml:"pid"`
	Job       string        `json:"job" yaml:"job"`
	Direction string        `json:"direction" yaml:"direction"`
	OK        bool          `json:"ok" yaml:"ok"`
	Bytes     int64         `json:"bytes" yaml:"bytes"`
	Seconds   float64       `json:"seconds" yaml:"seconds"`
	Error     string        `json:"error,omitempty" yaml:"error,omitempty"`
	Elapsed   time.Duration `json:"-" yaml:"-"`
}

// Progress is one progress report of a swap in flight.
type Progress struct {
	PID         int
	Done, Total int64
}

type op struct {
	dir      Direction
	pid      int
	job      string
	started  time.Time
	progress chan Progress
	done     chan Result // buffered 1, written once
}

// NewManager returns a Manager; Serve runs it.
func NewManager(opts Options) *Manager {
	if opts.SwapTimeout <= 0 {
		opts.SwapTimeout = 90 * time.Second
	}
	if opts.ReservationTTL <= 0 {
		opts.ReservationTTL = 5 * time.Second
	}
	if opts.RebalanceEvery == 0 {
		opts.RebalanceEvery = 5 * time.Second
	}
	if opts.HelloTimeout <= 0 {
		opts.HelloTimeout = 10 * time.Second
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	m := &Manager{
		opts:     opts,
		log:      opts.Logger,
		policy:   make(chan struct{}, 1),
		kick:     make(chan struct{}, 1),
		procs:    map[int]*proc{},
		reserved: map[uint64]*reservation{},
		gates:    map[string]*gatePage{},
	}
	if m.log == nil {
		m.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	m.mem = opts.Memory
	if m.mem == nil {
		m.mem = &declaredMemory{capacity: opts.GPUMemory, used: m.residentBytes}
	}
	return m
}

// Serve accepts shim connections on ln (use ListenUnix) and runs the
// rebalancer until ctx is done; it then closes ln and every shim connection
// and returns nil. It blocks.
func (m *Manager) Serve(ctx context.Context, ln net.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); m.rebalanceLoop(ctx) }()
	go func() { <-ctx.Done(); ln.Close() }()
	var conns sync.Map
	defer func() {
		conns.Range(func(k, _ any) bool { k.(net.Conn).Close(); return true })
		wg.Wait()
		m.closeGates()
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("accepting shim connection: %w", err)
			}
			// EMFILE and friends: keep serving the connections we have.
			m.log.Warn("accepting shim connection", "err", err)
			select {
			case <-time.After(100 * time.Millisecond):
			case <-ctx.Done():
			}
			continue
		}
		conns.Store(c, nil)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer conns.Delete(c)
			m.serveConn(ctx, c)
		}()
	}
}

// Status returns the registry (sorted by pid) and the free memory of each
// device a process is on, less reservations.
func (m *Manager) Status(ctx context.Context) ([]Process, map[string]int64, error) {
	s, err := m.snapshot(ctx, "")
	return s.Procs, s.Free, err
}

// snapshot copies the registry and reads free memory for every device in it
// (and extra, if not empty), less live reservations.
func (m *Manager) snapshot(ctx context.Context, extra string) (Snapshot, error) {
	now := m.opts.Now()
	m.mu.Lock()
	s := Snapshot{Free: map[string]int64{}}
	devs := map[string]bool{}
	if extra != "" {
		devs[extra] = true
	}
	for _, p := range m.procs {
		s.Procs = append(s.Procs, p.Process)
		devs[p.Device] = true
	}
	res := map[string]int64{}
	for k, r := range m.reserved {
		if now.After(r.expires) {
			delete(m.reserved, k)
			m.epoch++
			continue
		}
		res[r.device] += r.bytes
		devs[r.device] = true
	}
	s.Epoch = m.epoch
	m.mu.Unlock()
	sort.Slice(s.Procs, func(i, j int) bool { return s.Procs[i].PID < s.Procs[j].PID })
	for d := range devs {
		f, err := m.mem.Free(ctx, d)
		if err != nil {
			return s, fmt.Errorf("reading free memory of device %q: %w", d, err)
		}
		s.Free[d] = f - res[d]
	}
	return s, nil
}

func (m *Manager) residentBytes(device string) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	var n int64
	for _, p := range m.procs {
		if p.Device == device {
			n += p.GPUBytes()
		}
	}
	return n
}

func (m *Manager) lockPolicy(ctx context.Context) error {
	select {
	case m.policy <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for the policy lock: %w", ctx.Err())
	}
}

func (m *Manager) unlockPolicy() { <-m.policy }

// freed records an event that freed memory and kicks the rebalancer.
func (m *Manager) freed() {
	m.mu.Lock()
	m.epoch++
	m.mu.Unlock()
	m.Kick()
}

// Kick asks the rebalancer to try swapping processes back in; it never blocks.
func (m *Manager) Kick() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

func (m *Manager) rebalanceLoop(ctx context.Context) {
	var tick <-chan time.Time
	if m.opts.RebalanceEvery > 0 {
		t := time.NewTicker(m.opts.RebalanceEvery)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.kick:
		case <-tick:
			m.freed() // memory may have been freed outside the registry's sight
		}
		if err := m.Rebalance(ctx); err != nil && ctx.Err() == nil {
			m.log.Warn("rebalance", "err", err)
		}
	}
}

// Rebalance runs the swap-in policy once: it swaps back in the processes
// PlanSwapIn picks and waits for them (each bounded by SwapTimeout). It blocks.
func (m *Manager) Rebalance(ctx context.Context) error {
	if err := m.lockPolicy(ctx); err != nil {
		return err
	}
	defer m.unlockPolicy()
	s, err := m.snapshot(ctx, "")
	if err != nil {
		return err
	}
	if m.opts.Sched != nil {
		return m.reconcile(ctx, s)
	}
	pids := PlanSwapIn(s)
	if len(pids) == 0 {
		return nil
	}
	m.log.Info("swapping back in", "pids", pids)
	ctx, cancel := context.WithTimeout(ctx, m.opts.SwapTimeout)
	defer cancel()
	var errs []error
	results := m.swapAll(ctx, SwapIn, pids, false, nil)
	m.noteBlocked(results, s.Epoch)
	for _, r := range results {
		if !r.OK {
			errs = append(errs, fmt.Errorf("pid %d: %s", r.PID, r.Error))
		}
	}
	return errors.Join(errs...)
}

// Target names the processes a swap is for: one pid, or every process of a job.
type Target struct {
	PID int
	Job string
}

func (t Target) String() string {
	if t.PID != 0 {
		return fmt.Sprintf("pid %d", t.PID)
	}
	return fmt.Sprintf("job %q", t.Job)
}

// Swap swaps the target's processes out or in at an operator's request and
// waits for them, calling progress (if not nil, from one goroutine at a time)
// as the shims report. A manual swap-out holds the process out (the policy
// will not bring it back); a manual swap-in clears the hold. It returns
// ErrNoSuchProcess, ErrNoSuchJob, ErrAlreadyOut, ErrAlreadyIn or ErrBusy
// before starting anything. If ctx ends first, the swaps go on in the shims
// and the registry follows them; Swap returns ctx's error.
func (m *Manager) Swap(ctx context.Context, dir Direction, t Target, progress func(Progress)) ([]Result, error) {
	if err := m.lockPolicy(ctx); err != nil {
		return nil, err
	}
	defer m.unlockPolicy()
	pids, err := m.eligible(dir, t)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	epoch := m.epoch
	m.mu.Unlock()
	res := m.swapAll(ctx, dir, pids, true, progress)
	if dir == SwapIn {
		m.noteBlocked(res, epoch)
	}
	if ctx.Err() != nil {
		return res, fmt.Errorf("waiting for %s of %s: %w", dir, t, ctx.Err())
	}
	if dir == SwapOut {
		m.freed() // a blocked process may fit now
	}
	return res, nil
}

// noteBlocked records, for each failed swap-in, the memory epoch it was tried
// at, so that the policy retries it only after memory has been freed since.
func (m *Manager) noteBlocked(results []Result, epoch uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range results {
		if p, ok := m.procs[r.PID]; ok && !r.OK && p.State == Blocked {
			p.BlockedEpoch = epoch
		}
	}
}

// eligible resolves t to the pids that can go dir now.
func (m *Manager) eligible(dir Direction, t Target) ([]int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var match []*proc
	if t.PID != 0 {
		p, ok := m.procs[t.PID]
		if !ok {
			for _, q := range m.procs {
				if q.PeerPID == t.PID {
					p, ok = q, true
				}
			}
		}
		if !ok {
			return nil, fmt.Errorf("pid %d: %w", t.PID, ErrNoSuchProcess)
		}
		match = append(match, p)
	} else {
		for _, p := range m.procs {
			if p.Job == t.Job {
				match = append(match, p)
			}
		}
		if len(match) == 0 {
			return nil, fmt.Errorf("job %q: %w", t.Job, ErrNoSuchJob)
		}
	}
	var pids []int
	busy := false
	for _, p := range match {
		switch {
		case canStart(dir, p.State):
			pids = append(pids, p.PID)
		case dir == SwapOut && p.State == SwappingIn, dir == SwapIn && p.State == SwappingOut:
			busy = true
		}
	}
	sort.Ints(pids)
	switch {
	case len(pids) > 0:
		return pids, nil
	case busy:
		return nil, fmt.Errorf("%s: %w", t, ErrBusy)
	case dir == SwapOut:
		return nil, fmt.Errorf("%s: %w", t, ErrAlreadyOut)
	default:
		return nil, fmt.Errorf("%s: %w", t, ErrAlreadyIn)
	}
}

// canStart reports whether a process in state s can start swap dir.
func canStart(dir Direction, s State) bool {
	if dir == SwapOut {
		return s == Running
	}
	return s == Out || s == Blocked
}

// swapAll starts dir on every pid at once and waits for all of them (or ctx).
// manual sets (out) or clears (in) the operator hold. Processes that cannot
// start (gone, wrong state) yield a failed Result.
func (m *Manager) swapAll(ctx context.Context, dir Direction, pids []int, manual bool, progress func(Progress)) []Result {
	results := make([]Result, len(pids))
	var wg sync.WaitGroup
	var pmu sync.Mutex
	for i, pid := range pids {
		o, err := m.startSwap(dir, pid, manual)
		if err != nil {
			results[i] = Result{PID: pid, Direction: dir.String(), Error: err.Error()}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = m.wait(ctx, o, func(p Progress) {
				if progress != nil {
					pmu.Lock()
					progress(p)
					pmu.Unlock()
				}
			})
		}()
	}
	wg.Wait()
	if f := m.opts.OnSwapDone; f != nil {
		for _, r := range results {
			if r.Job == "" {
				r.Job = m.jobOf(r.PID)
			}
			f(r)
		}
	}
	return results
}

// jobOf is the job of a registered pid ("" if gone).
func (m *Manager) jobOf(pid int) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if p, ok := m.procs[pid]; ok {
		return p.Job
	}
	return ""
}

// startSwap moves pid into the swapping state and sends the request.
func (m *Manager) startSwap(dir Direction, pid int, manual bool) (*op, error) {
	m.mu.Lock()
	p, ok := m.procs[pid]
	if !ok {
		m.mu.Unlock()
		return nil, fmt.Errorf("pid %d: %w", pid, ErrNoSuchProcess)
	}
	if !canStart(dir, p.State) {
		st := p.State
		m.mu.Unlock()
		return nil, fmt.Errorf("pid %d is %s: %w", pid, st, ErrBusy)
	}
	msg := swapproto.Message{Type: swapproto.TypeSwapOut}
	p.State = SwappingOut
	if dir == SwapIn {
		msg.Type, p.State = swapproto.TypeSwapIn, SwappingIn
	}
	if manual {
		p.Hold = dir == SwapOut // a manual swap-out holds; a manual swap-in clears the hold
	}
	p.nextID++
	msg.ID = swapproto.IntID(p.nextID)
	o := &op{dir: dir, pid: pid, job: p.Job, started: m.opts.Now(),
		progress: make(chan Progress, 16), done: make(chan Result, 1)}
	p.ops[msg.ID] = o
	p.Done, p.Total = 0, 0
	c := p.conn
	m.mu.Unlock()
	m.log.Info("swap", "dir", dir, "pid", pid, "job", o.job, "id", string(msg.ID))
	if f := m.opts.OnSwapStart; f != nil {
		f(Result{PID: pid, Job: o.job, Direction: dir.String()})
	}
	if err := c.send(msg); err != nil {
		c.close() // the reader sees it and fails the op with ErrDisconnected
	}
	return o, nil
}

// wait blocks until o finishes or ctx ends, forwarding progress.
func (m *Manager) wait(ctx context.Context, o *op, progress func(Progress)) Result {
	for {
		select {
		case r := <-o.done:
			// Progress sent before the result is still buffered: forward it
			// first, or a watcher would miss the last reports.
			for {
				select {
				case p := <-o.progress:
					progress(p)
				default:
					return r
				}
			}
		case p := <-o.progress:
			progress(p)
		case <-ctx.Done():
			return Result{PID: o.pid, Job: o.job, Direction: o.dir.String(),
				Error: fmt.Sprintf("no result after %s: %v", m.opts.Now().Sub(o.started).Round(time.Millisecond), ctx.Err())}
		}
	}
}
