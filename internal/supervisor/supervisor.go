package supervisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/migctl/migctl/internal/numa"
)

// Sentinel errors of Run.
var (
	// ErrInvalid: the Config cannot be run.
	ErrInvalid = errors.New("invalid supervisor config")
	// ErrStart: a worker could not be started (no restart is tried).
	ErrStart = errors.New("starting a worker")
	// ErrWorkerFailed: a worker failed and no restart was left.
	ErrWorkerFailed = errors.New("worker failed")
	// ErrInterrupted: a termination signal or the context ended the run.
	ErrInterrupted = errors.New("interrupted")
)

// Worker is one worker process of one generation as Config's callbacks see
// it.
type Worker struct {
	// Rank is FirstRank + LocalRank.
	Rank int
	// LocalRank is the worker's index on this node, 0..N-1.
	LocalRank int
	// Generation counts restarts: 0 for the first start.
	Generation int
	// ErrorFile is where the worker may write its error record (also in the
	// environment under Config.ErrorFileEnv).
	ErrorFile string
	// LogDir is the worker's log directory of this generation ("" without
	// Config.LogDir).
	LogDir string
}

// Config describes the workers and how to supervise them.
type Config struct {
	// N is the number of workers (> 0).
	N int
	// FirstRank is the rank of local rank 0 (the node's offset).
	FirstRank int
	// Command is the worker's argv; Command[0] is looked up in PATH.
	Command []string
	// Dir is the workers' working directory ("" : the caller's).
	Dir string
	// Env returns what a worker's environment adds to this process's
	// (later entries win). nil adds nothing.
	Env func(w Worker) []string
	// ErrorFileEnv, when set, is the variable that tells a worker where its
	// error file is (torchrun: "TORCHELASTIC_ERROR_FILE").
	ErrorFileEnv string

	// Stdout and Stderr receive the workers' prefixed lines (nil: dropped).
	Stdout, Stderr io.Writer
	// Prefix is a worker's line prefix (nil: "[rank]: ").
	Prefix func(rank int) string
	// LogDir, when set, gets LogDir/attempt_<g>/<local rank>/{stdout,stderr}.log
	// and error.json; Tee then says which streams also reach Stdout/Stderr.
	LogDir string
	Tee    Tee

	// MaxRestarts is how often a failed generation is restarted (>= 0).
	MaxRestarts int
	// Settle is how long the other workers may take to exit on their own
	// after the first failure before they get SIGTERM (0: at once).
	Settle time.Duration
	// Grace is the time between SIGTERM and SIGKILL (> 0).
	Grace time.Duration

	// Signals, when not nil, delivers the signals to forward (the caller
	// registers them with signal.Notify; this package never does).
	Signals <-chan os.Signal
	// Ready, when not nil, is asked when a termination signal arrives
	// whether the generation's workers are past start-up (e.g. all
	// registered at a rendezvous); if not, they are killed at once instead
	// of getting Grace. nil: ready once every process is started.
	Ready func(generation int) bool
	// Placement, when not nil, is where a worker runs: its CPUs and the
	// NUMA node its memory is preferred on (numa.Start). What the kernel
	// refuses of it goes to PlacementFailed (nil: dropped); the worker
	// starts anyway.
	Placement       func(w Worker) numa.Placement
	PlacementFailed func(w Worker, err error)
	// OnStart is called after each worker starts (nil: nothing).
	OnStart func(w Worker, pid int)
	// OnFailure is called with a generation's root cause as soon as it is
	// known, before the other workers are stopped (nil: nothing).
	OnFailure func(f Failure)
	// OnExit is called with each worker's exit as it is reaped, before what
	// the exit means for the generation is decided (nil: nothing).
	OnExit func(e Exit)
	// Suspect, when not nil, is asked when a generation's first worker
	// fails which rank the caller knows to be at fault, -1 when none: a
	// rank that dies takes down its peers (they see it go, through the
	// rendezvous or their collectives) faster than its own exit may reach
	// this package, so the first exit reaped can be a consequence. When
	// the suspect is another rank still unreaped, the root cause (and
	// OnFailure) waits for its exit until the other workers are signalled
	// (Settle): if it failed by then it is the root cause, else the first
	// failure is.
	Suspect func(f Failure) int
	// BeforeRestart is called between a failed generation and the next one
	// (generation is the next one's number); an error ends the run.
	BeforeRestart func(ctx context.Context, generation int) error
}

// Exit is how one worker ended.
type Exit struct {
	Rank      int `json:"rank" yaml:"rank"`
	LocalRank int `json:"localRank" yaml:"localRank"`
	PID       int `json:"pid" yaml:"pid"`
	// ExitCode is the exit status, -1 when a signal ended the worker.
	ExitCode int `json:"exitCode" yaml:"exitCode"`
	// Signal names the signal that ended the worker ("SIGKILL"), "" when it
	// exited.
	Signal string `json:"signal,omitempty" yaml:"signal,omitempty"`
}

// Failed reports whether the worker did not exit 0.
func (e Exit) Failed() bool { return e.ExitCode != 0 }

// Failure is the root cause of a failed generation: its first worker to
// fail.
type Failure struct {
	Exit       `yaml:",inline"`
	Generation int       `json:"generation" yaml:"generation"`
	Time       time.Time `json:"time" yaml:"time"`
	// ErrorFile is the worker's error file when it wrote one and it is kept
	// (under LogDir); Error is what it holds.
	ErrorFile string       `json:"errorFile,omitempty" yaml:"errorFile,omitempty"`
	Error     *ErrorRecord `json:"error,omitempty" yaml:"error,omitempty"`
}

// String says who failed and how: "rank 3 (pid 4242) was killed by
// SIGKILL", "rank 0 (pid 17) exited with code 1: ValueError: bad input".
func (f Failure) String() string {
	s := fmt.Sprintf("rank %d (pid %d) ", f.Rank, f.PID)
	if f.Signal != "" {
		s += "was killed by " + f.Signal
	} else {
		s += "exited with code " + strconv.Itoa(f.ExitCode)
	}
	if f.Error != nil && f.Error.Message != "" {
		msg, _, _ := strings.Cut(strings.TrimSpace(f.Error.Message), "\n")
		s += ": " + msg
	}
	return s
}

// Result is the outcome of Run.
type Result struct {
	// Restarts is the number of generations started after the first.
	Restarts int `json:"restarts" yaml:"restarts"`
	// Failures has the root cause of each failed generation, oldest first.
	Failures []Failure `json:"failures,omitempty" yaml:"failures,omitempty"`
	// Interrupted names what ended the run early: a signal ("SIGINT") or
	// the context's error; "" otherwise.
	Interrupted string `json:"interrupted,omitempty" yaml:"interrupted,omitempty"`
	// Workers are the last generation's exits, by local rank (a worker that
	// was never started has PID 0).
	Workers []Exit `json:"workers" yaml:"workers"`
}

// RootCause is the last failed generation's root cause, nil when none
// failed.
func (r *Result) RootCause() *Failure {
	if len(r.Failures) == 0 {
		return nil
	}
	return &r.Failures[len(r.Failures)-1]
}

func (c *Config) validate() error {
	switch {
	case c.N < 1:
		return fmt.Errorf("%d workers: %w", c.N, ErrInvalid)
	case len(c.Command) == 0 || c.Command[0] == "":
		return fmt.Errorf("no worker command: %w", ErrInvalid)
	case c.MaxRestarts < 0:
		return fmt.Errorf("max restarts %d: %w", c.MaxRestarts, ErrInvalid)
	case c.Grace <= 0 || c.Settle < 0:
		return fmt.Errorf("grace %v, settle %v: %w", c.Grace, c.Settle, ErrInvalid)
	case c.Tee > TeeAll:
		return fmt.Errorf("tee %d: %w", c.Tee, ErrInvalid)
	}
	return nil
}

// Run starts the workers and supervises them until every worker of a
// generation exits 0 (nil error), the restarts are used up
// (ErrWorkerFailed), a termination signal or ctx ends it (ErrInterrupted),
// or a worker cannot be started (ErrStart). It blocks; when it returns, no
// worker process and nothing left in a worker's process group is alive. The
// Result is never nil once the Config is valid.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.Prefix == nil {
		cfg.Prefix = func(rank int) string { return "[" + strconv.Itoa(rank) + "]: " }
	}
	if cfg.Signals == nil {
		cfg.Signals = make(chan os.Signal) // never ready
	}
	s := &run{cfg: cfg, con: &console{out: cfg.Stdout, errOut: cfg.Stderr}}
	if cfg.LogDir == "" {
		dir, err := os.MkdirTemp("", "migctl-workers-")
		if err != nil {
			return nil, fmt.Errorf("%w: making a directory for error files: %v", ErrStart, err)
		}
		defer os.RemoveAll(dir)
		s.errDir = dir
	}
	res := &Result{}
	for gen := 0; ; gen++ {
		g := s.generation(ctx, gen)
		res.Workers = g.exits
		if g.failure != nil {
			res.Failures = append(res.Failures, *g.failure)
		}
		switch {
		case g.startErr != nil:
			return res, g.startErr
		case g.interrupted != "":
			res.Interrupted = g.interrupted
			return res, fmt.Errorf("%w by %s", ErrInterrupted, g.interrupted)
		case g.failure == nil:
			return res, nil
		case res.Restarts >= cfg.MaxRestarts:
			return res, fmt.Errorf("%w: %s%s", ErrWorkerFailed, g.failure, restartsNote(res.Restarts))
		}
		if cfg.BeforeRestart != nil {
			if err := cfg.BeforeRestart(ctx, gen+1); err != nil {
				return res, fmt.Errorf("restarting the workers after %s: %w", g.failure, err)
			}
		}
		res.Restarts++
	}
}

func restartsNote(n int) string {
	switch n {
	case 0:
		return ""
	case 1:
		return " (after 1 restart)"
	}
	return fmt.Sprintf(" (after %d restarts)", n)
}

type run struct {
	cfg    Config
	con    *console
	errDir string // error files without LogDir
}

// proc is one started worker.
type proc struct {
	w       Worker
	cmd     *exec.Cmd
	pid     int
	streams []*stream
	files   []*os.File
	reaped  bool
	exit    Exit
	at      time.Time
}

type genResult struct {
	exits       []Exit
	failure     *Failure
	interrupted string
	startErr    error
}

// IsTermination reports whether sig ends a run (SIGINT, SIGTERM, SIGHUP,
// SIGQUIT) rather than only being forwarded.
func IsTermination(sig os.Signal) bool {
	switch sig {
	case syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT:
		return true
	}
	return false
}

// SignalName names sig as the kernel does ("SIGINT").
func SignalName(sig os.Signal) string {
	if s, ok := sig.(syscall.Signal); ok {
		if n := unix.SignalName(s); n != "" {
			return n
		}
	}
	return sig.String()
}

// generation starts every worker and waits until all of them exited.
func (s *run) generation(ctx context.Context, gen int) (g genResult) {
	cfg := s.cfg
	procs := make([]*proc, cfg.N)
	exited := make(chan *proc, cfg.N)
	started := 0
	defer func() {
		s.cleanup(procs[:started])
		g.exits = make([]Exit, cfg.N)
		for i := range cfg.N {
			g.exits[i] = Exit{Rank: cfg.FirstRank + i, LocalRank: i}
			if i < started {
				g.exits[i] = procs[i].exit
			}
		}
	}()
	signalAll := func(sig syscall.Signal) {
		for _, p := range procs[:started] {
			if !p.reaped {
				_ = syscall.Kill(-p.pid, sig)
			}
		}
	}
	reapAll := func() {
		for n := 0; n < started; n++ {
			p := <-exited
			if p.exit.Failed() && g.failure == nil && g.interrupted == "" {
				g.failure = s.failure(p)
			}
		}
	}
	// Start, checking between workers for a reason to stop at once.
	for i := range cfg.N {
		stop := ""
		select {
		case sig := <-cfg.Signals:
			if ss, ok := sig.(syscall.Signal); ok {
				signalAll(ss)
			}
			if IsTermination(sig) {
				stop = SignalName(sig)
			}
		case <-ctx.Done():
			stop = ctx.Err().Error()
		default:
		}
		if stop != "" {
			signalAll(syscall.SIGKILL)
			g.interrupted = stop
			reapAll()
			return g
		}
		w := Worker{Rank: cfg.FirstRank + i, LocalRank: i, Generation: gen}
		p, err := s.start(w)
		if err != nil {
			signalAll(syscall.SIGKILL)
			reapAll()
			g.startErr = fmt.Errorf("%w for rank %d: %v", ErrStart, w.Rank, err)
			return g
		}
		procs[i] = p
		started++
		go func() {
			_ = p.cmd.Wait()
			p.at = time.Now()
			p.exit.ExitCode = p.cmd.ProcessState.ExitCode()
			if ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				p.exit.Signal = SignalName(ws.Signal())
			}
			exited <- p
		}()
		if cfg.OnStart != nil {
			cfg.OnStart(p.w, p.pid)
		}
	}

	isReady := func() bool { return cfg.Ready == nil || cfg.Ready(gen) }
	var settleC, graceC <-chan time.Time
	// pending is the first failure while the root cause waits for the
	// suspect's exit (local rank suspect).
	var pending *Failure
	suspect := -1
	blame := func(f *Failure) {
		g.failure, pending, suspect = f, nil, -1
		if cfg.OnFailure != nil {
			cfg.OnFailure(*f)
		}
	}
	// giveUp ends the wait for the suspect: the first failure is it.
	giveUp := func() {
		if pending != nil {
			blame(pending)
		}
	}
	terminating := false
	terminate := func() {
		if terminating {
			return
		}
		giveUp()
		terminating = true
		signalAll(syscall.SIGTERM)
		signalAll(syscall.SIGCONT)
		graceC = time.After(cfg.Grace)
	}
	ctxDone := ctx.Done()
	for remaining := started; remaining > 0; {
		select {
		case p := <-exited:
			remaining--
			p.reaped = true
			if cfg.OnExit != nil {
				cfg.OnExit(p.exit)
			}
			switch {
			case pending != nil && p.exit.LocalRank == suspect:
				if p.exit.Failed() {
					blame(s.failure(p))
				} else {
					blame(pending)
				}
			case !p.exit.Failed() || g.failure != nil || pending != nil || g.interrupted != "":
			default:
				f := s.failure(p)
				if r := s.suspect(*f, procs[:started]); r >= 0 {
					pending, suspect = f, r
				} else {
					blame(f)
				}
				if cfg.Settle > 0 {
					settleC = time.After(cfg.Settle)
				} else {
					terminate()
				}
			}
		case sig := <-cfg.Signals:
			ss, ok := sig.(syscall.Signal)
			if !ok {
				break
			}
			if !IsTermination(sig) {
				signalAll(ss)
				break
			}
			giveUp()
			switch {
			case g.interrupted != "" || !isReady():
				// A second Ctrl-C, or one during start-up: now.
				signalAll(syscall.SIGKILL)
			case !terminating:
				signalAll(ss)
				signalAll(syscall.SIGCONT)
				terminating = true
				graceC = time.After(cfg.Grace)
			default:
				signalAll(ss)
			}
			if g.interrupted == "" {
				g.interrupted = SignalName(sig)
			}
		case <-ctxDone:
			ctxDone = nil
			if g.interrupted == "" {
				g.interrupted = ctx.Err().Error()
			}
			terminate()
		case <-settleC:
			settleC = nil
			terminate()
		case <-graceC:
			graceC = nil
			signalAll(syscall.SIGKILL)
		}
	}
	giveUp() // a guard: the suspect's exit or terminate has resolved it; a pending failure must never be lost
	return g
}

// start starts one worker with its pipes, log files and error file.
func (s *run) start(w Worker) (*proc, error) {
	cfg := s.cfg
	var dir string
	if cfg.LogDir != "" {
		dir = filepath.Join(cfg.LogDir, "attempt_"+strconv.Itoa(w.Generation), strconv.Itoa(w.LocalRank))
		w.LogDir = dir
	} else {
		dir = filepath.Join(s.errDir, strconv.Itoa(w.Generation), strconv.Itoa(w.LocalRank))
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("making the worker's directory: %w", err)
	}
	w.ErrorFile = filepath.Join(dir, "error.json")
	if err := os.Remove(w.ErrorFile); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("removing an old error file: %w", err)
	}
	p := &proc{w: w}
	ok := false
	defer func() {
		if !ok {
			for _, f := range p.files {
				_ = f.Close()
			}
		}
	}()
	cmd := exec.Command(cfg.Command[0], cfg.Command[1:]...)
	cmd.Dir = cfg.Dir
	cmd.Env = os.Environ()
	if cfg.ErrorFileEnv != "" {
		cmd.Env = append(cmd.Env, cfg.ErrorFileEnv+"="+w.ErrorFile)
	}
	if cfg.Env != nil {
		cmd.Env = append(cmd.Env, cfg.Env(w)...)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	var writers []*os.File
	for _, name := range []string{"stdout", "stderr"} {
		r, wr, err := os.Pipe()
		if err != nil {
			for _, x := range writers {
				_ = x.Close()
			}
			return nil, fmt.Errorf("making a pipe: %w", err)
		}
		p.files = append(p.files, r)
		writers = append(writers, wr)
		st := &stream{r: r, con: s.con, prefix: cfg.Prefix(w.Rank), done: make(chan struct{})}
		show, dst := TeeStdout, s.con.out
		if name == "stderr" {
			show, dst = TeeStderr, s.con.errOut
		}
		if cfg.LogDir == "" || cfg.Tee&show != 0 {
			st.dst = dst
		}
		if cfg.LogDir != "" {
			f, err := os.OpenFile(filepath.Join(dir, name+".log"), os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o600)
			if err != nil {
				for _, x := range writers {
					_ = x.Close()
				}
				return nil, fmt.Errorf("opening the worker's log: %w", err)
			}
			p.files = append(p.files, f)
			st.file = f
		}
		p.streams = append(p.streams, st)
	}
	cmd.Stdout, cmd.Stderr = writers[0], writers[1]
	place := numa.None
	if cfg.Placement != nil {
		place = cfg.Placement(w)
	}
	placeErr, err := numa.Start(place, cmd.Start)
	if placeErr != nil && err == nil && cfg.PlacementFailed != nil {
		cfg.PlacementFailed(w, placeErr)
	}
	for _, x := range writers {
		_ = x.Close()
	}
	if err != nil {
		return nil, err
	}
	ok = true
	p.cmd, p.pid = cmd, cmd.Process.Pid
	p.exit = Exit{Rank: w.Rank, LocalRank: w.LocalRank, PID: p.pid}
	for _, st := range p.streams {
		go st.copy()
	}
	return p, nil
}

// suspect is the local rank Config.Suspect names for first failure f when
// it is another worker of procs not yet reaped, else -1.
func (s *run) suspect(f Failure, procs []*proc) int {
	if s.cfg.Suspect == nil {
		return -1
	}
	i := s.cfg.Suspect(f) - s.cfg.FirstRank
	if i < 0 || i >= len(procs) || i == f.LocalRank || procs[i].reaped {
		return -1
	}
	return i
}

// failure records p's exit (set by its waiter) as a root cause.
func (s *run) failure(p *proc) *Failure {
	f := &Failure{Exit: p.exit, Generation: p.w.Generation, Time: p.at}
	f.Error = readErrorFile(p.w.ErrorFile)
	if f.Error != nil && s.cfg.LogDir != "" {
		f.ErrorFile = p.w.ErrorFile
	}
	return f
}

// streamDrain bounds the wait for a worker's pipes to reach EOF once its
// process group is dead (something that left the group may hold them).
const streamDrain = 2 * time.Second

// cleanup kills whatever is left in the workers' process groups, drains
// their output and closes their files.
func (s *run) cleanup(procs []*proc) {
	for _, p := range procs {
		_ = syscall.Kill(-p.pid, syscall.SIGKILL)
	}
	deadline := time.After(streamDrain)
	for _, p := range procs {
		for _, st := range p.streams {
			select {
			case <-st.done:
			case <-deadline:
				_ = st.r.Close()
				<-st.done
			}
		}
		for _, f := range p.files {
			_ = f.Close()
		}
	}
}
