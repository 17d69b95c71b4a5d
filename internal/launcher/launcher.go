package launcher

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/migctl/migctl/comm/rendezvous"
	"github.com/migctl/migctl/comm/shm"
	"github.com/migctl/migctl/internal/numa"
	"github.com/migctl/migctl/internal/supervisor"
)

// Sentinel errors of Run (besides supervisor's ErrWorkerFailed,
// ErrInterrupted and ErrStart, which Run's errors wrap as they come).
var (
	// ErrInvalid: the Config cannot be run.
	ErrInvalid = errors.New("invalid launch")
	// ErrWorkerNotFound: the worker command is not an executable.
	ErrWorkerNotFound = errors.New("worker program not found")
	// ErrPortInUse: the rendezvous endpoint's port is taken.
	ErrPortInUse = errors.New("rendezvous port in use")
	// ErrDevices: the devices could not be obtained.
	ErrDevices = errors.New("obtaining devices")
)

// Defaults of Config's zero values.
const (
	DefaultTimeout = 5 * time.Minute
	DefaultGrace   = 5 * time.Second
	DefaultSettle  = time.Second
	// releaseTimeout bounds giving the devices back at the end.
	releaseTimeout = 10 * time.Second
)

// Swap runs the workers under the memory-swap shim.
type Swap struct {
	// Library is libmigswap.so's absolute path (prepended to LD_PRELOAD).
	Library string
	// Socket is the daemon's swap socket (MIGSWAP_SOCKET; "": the shim's
	// default).
	Socket   string
	Priority int
}

// Config describes one node's part of a job.
type Config struct {
	// Command is the worker's argv; Command[0] must be an executable (a
	// path, or a name found in PATH).
	Command []string
	Dir     string
	// NProc is the number of workers on this node (> 0).
	NProc int
	// NNodes is the number of nodes (0 means 1); NodeRank this node's.
	NNodes   int
	NodeRank int
	// RdzvEndpoint (host:port) is where node 0 hosts the rendezvous and the
	// other nodes' workers join it; required when NNodes > 1.
	RdzvEndpoint string
	// Listen, for one node, hosts the rendezvous at this address ("unix:///p"
	// or host:port) instead of a private Unix socket, so that ranks started
	// elsewhere can join (migctl bench --listen).
	Listen string
	// World is the job's rank count when it is more than NNodes·NProc
	// (ranks that join from elsewhere); 0: NNodes·NProc.
	World int
	// Job names the job ("": "run-<random>", or with several nodes
	// "run-<hash of the token>", the same on every node); Token guards its
	// rendezvous ("": random; required when NNodes > 1, the same on every
	// node).
	Job   string
	Token string
	// Devices gives each local rank a device (nil: none;
	// CUDA_VISIBLE_DEVICES is then inherited).
	Devices Devices
	// Backend is MIGCTL_BACKEND: "gpu" or "host".
	Backend string
	// Timeout is the collective deadline (MIGCTL_TIMEOUT; 0: 5m).
	Timeout time.Duration
	// MaxRestarts, Grace (0: 5 s) and Settle (0: 1 s; < 0: none) as in
	// supervisor.Config.
	MaxRestarts int
	Grace       time.Duration
	Settle      time.Duration
	LogDir      string
	Tee         supervisor.Tee
	// Stdout and Stderr get the workers' prefixed lines; Log the launcher's
	// own progress lines (nil: none).
	Stdout, Stderr, Log io.Writer
	// Signals as in supervisor.Config; a termination signal before the
	// workers start ends Run at once with nothing left behind.
	Signals <-chan os.Signal
	// DaemonSocket is MIGCTL_SOCKET for the workers ("": not set).
	DaemonSocket string
	Swap         *Swap
	// Env is added to every worker's environment last.
	Env []string
	// ShmRoot, when set, is where the workers make their shared-memory
	// segments (MIGCTL_SHM_ROOT), swept of segments whose creator is dead
	// after every generation (what a worker killed mid-setup leaves).
	ShmRoot string
	// OnStart is called as each worker starts (global rank, pid).
	OnStart func(rank, pid int)
	// Place, when not nil, gives the placement of each rank's process
	// (CPUs, preferred NUMA node; numa.None for none) from the devices
	// acquired for them, by local rank (without Devices: NProc devices of
	// GPU -1, the ranks finding theirs themselves). Placements the kernel refuses are
	// warned of on Stderr; the workers start anyway.
	Place func(devs []Device) []numa.Placement
	// Warnings go to Stderr, each on a line of its own after "run:
	// warning: ", once everything is ready and just before the workers
	// start (a job that fails to start prints its error alone).
	Warnings []string
}

// Result is the outcome of Run.
type Result struct {
	Job      string   `json:"job" yaml:"job"`
	World    int      `json:"world" yaml:"world"`
	Nodes    int      `json:"nodes" yaml:"nodes"`
	NodeRank int      `json:"nodeRank" yaml:"nodeRank"`
	Local    int      `json:"local" yaml:"local"`
	Devices  []Device `json:"devices,omitempty" yaml:"devices,omitempty"`
	// Rendezvous is the address the workers met at.
	Rendezvous string        `json:"rendezvous" yaml:"rendezvous"`
	Restarts   int           `json:"restarts" yaml:"restarts"`
	Duration   time.Duration `json:"-" yaml:"-"`
	// Seconds is Duration in seconds (for JSON and YAML).
	Seconds float64 `json:"seconds" yaml:"seconds"`
	// RootCause is the last failed generation's first failure (nil when
	// the job succeeded or never started).
	RootCause   *supervisor.Failure  `json:"rootCause,omitempty" yaml:"rootCause,omitempty"`
	Failures    []supervisor.Failure `json:"failures,omitempty" yaml:"failures,omitempty"`
	Interrupted string               `json:"interrupted,omitempty" yaml:"interrupted,omitempty"`
	// Blame is why the rendezvous had aborted the job when the first worker
	// failed ("" if it had not): a rank that noticed a stalled or dead peer
	// says so there ("rank 2: ... rank 1 has not heartbeaten for 5s"), so
	// this names the culprit when the first to exit is only a witness.
	Blame   string            `json:"blame,omitempty" yaml:"blame,omitempty"`
	Workers []supervisor.Exit `json:"workers,omitempty" yaml:"workers,omitempty"`
	// Error is Run's error as text ("" on success), for printing.
	Error string `json:"error,omitempty" yaml:"error,omitempty"`
}

// plan is a Config resolved for running.
type plan struct {
	cfg        Config
	world      int
	firstRank  int
	rdzvAddr   string
	masterAddr string
	masterPort int
	devs       []Device
	place      []numa.Placement // by local rank (Config.Place)
	blame      string           // set by the supervisor's OnFailure (its goroutine)
	// accepts counts connections to the rendezvous; genAccepts is the
	// count when the current generation started.
	accepts    atomic.Int64
	genAccepts int64
}

// countingListener counts accepted connections: a worker that connected to
// the rendezvous uses the SDK, so until the world forms it is still
// starting up.
type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// maxSocketPath is the longest Unix socket path used (sun_path is 108
// bytes with its NUL).
const maxSocketPath = 100

// SocketDir makes a private (0700) directory for Unix sockets under
// $TMPDIR, or under /tmp when $TMPDIR is so deep that a socket path in it
// would not fit.
func SocketDir(prefix string) (string, error) {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return "", err
	}
	if len(dir)+len("/rendezvous.sock") <= maxSocketPath {
		return dir, nil
	}
	_ = os.Remove(dir)
	return os.MkdirTemp("/tmp", prefix)
}

// complete fills Config's defaults and checks it; nothing is created.
func (c *Config) complete() error {
	if c.NNodes == 0 {
		c.NNodes = 1
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.Grace == 0 {
		c.Grace = DefaultGrace
	}
	switch {
	case c.Settle == 0:
		c.Settle = DefaultSettle
	case c.Settle < 0:
		c.Settle = 0
	}
	if c.Backend == "" {
		c.Backend = "gpu"
	}
	switch {
	case c.NProc < 1:
		return fmt.Errorf("%w: %d workers per node; give at least 1 (--np)", ErrInvalid, c.NProc)
	case c.NNodes < 1 || c.NodeRank < 0 || c.NodeRank >= c.NNodes:
		return fmt.Errorf("%w: node rank %d of %d nodes; give 0 <= --node-rank < --nnodes", ErrInvalid, c.NodeRank, c.NNodes)
	case c.NNodes > 1 && c.RdzvEndpoint == "":
		return fmt.Errorf("%w: %d nodes need --rdzv-endpoint host:port (node 0 hosts the rendezvous there)", ErrInvalid, c.NNodes)
	case c.NNodes > 1 && c.Token == "":
		return fmt.Errorf("%w: %d nodes need the same job token on every node: export %s=<secret> on each", ErrInvalid, c.NNodes, EnvJobToken)
	case c.NNodes > 1 && c.Listen != "":
		return fmt.Errorf("%w: a private listen address is for one node; several nodes meet at --rdzv-endpoint", ErrInvalid)
	case c.World != 0 && c.World < c.NNodes*c.NProc:
		return fmt.Errorf("%w: world of %d ranks < %d nodes x %d workers", ErrInvalid, c.World, c.NNodes, c.NProc)
	case c.Timeout < 0 || c.Grace < 0 || c.MaxRestarts < 0:
		return fmt.Errorf("%w: timeout %v, grace %v and max restarts %d must not be negative", ErrInvalid, c.Timeout, c.Grace, c.MaxRestarts)
	case c.Backend != "gpu" && c.Backend != "host":
		return fmt.Errorf("%w: backend %q: want gpu or host", ErrInvalid, c.Backend)
	case c.Swap != nil && !filepath.IsAbs(c.Swap.Library):
		return fmt.Errorf("%w: the swap library %q must be an absolute path", ErrInvalid, c.Swap.Library)
	case len(c.Command) == 0 || c.Command[0] == "":
		return fmt.Errorf("%w: no worker command: put it after --, e.g. -- python train.py", ErrInvalid)
	}
	if c.Swap != nil {
		if _, err := os.Stat(c.Swap.Library); err != nil {
			return fmt.Errorf("%w: the swap library: %v (build it with 'make shim')", ErrInvalid, err)
		}
	}
	if err := CheckCommand(c.Command[0], c.Dir); err != nil {
		return err
	}
	if c.Token == "" {
		c.Token = randomHex(16)
	}
	if c.Job == "" {
		c.Job = "run-" + randomHex(3)
		if c.NNodes > 1 {
			// The same name on every node, from what they share, without
			// putting the token itself in a name.
			h := sha256.Sum256([]byte("migctl job name\x00" + c.Token))
			c.Job = "run-" + hex.EncodeToString(h[:3])
		}
	}
	return nil
}

// CheckCommand fails with ErrWorkerNotFound unless name is an executable
// (a path, taken relative to dir when relative, or a name in PATH).
func CheckCommand(name, dir string) error {
	p := name
	if strings.ContainsRune(name, '/') {
		if !filepath.IsAbs(p) && dir != "" {
			p = filepath.Join(dir, p)
		}
		st, err := os.Stat(p)
		switch {
		case err != nil:
			return fmt.Errorf("%w: %s does not exist; check the path after --", ErrWorkerNotFound, name)
		case st.IsDir() || st.Mode()&0o111 == 0:
			return fmt.Errorf("%w: %s is not an executable file; chmod +x it or run it through its interpreter (-- python %s)", ErrWorkerNotFound, name, name)
		}
		return nil
	}
	if _, err := exec.LookPath(name); err != nil {
		return fmt.Errorf("%w: %q is not in PATH; give its path or install it", ErrWorkerNotFound, name)
	}
	return nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails on Linux
	return hex.EncodeToString(b)
}

// Run runs this node's part of a job: it checks the worker program,
// hosts the rendezvous (node 0), obtains the devices, starts and supervises
// the workers (restarting all of them up to MaxRestarts, with a new
// rendezvous generation each time), and in every path (success, failure,
// signal, panic) gives the devices back and removes the sockets it made.
// It blocks. The Result is nil only when the Config is invalid.
func Run(ctx context.Context, cfg Config) (res *Result, err error) {
	if err := cfg.complete(); err != nil {
		return nil, err
	}
	started := time.Now()
	p := &plan{cfg: cfg, world: cfg.World, firstRank: cfg.NodeRank * cfg.NProc}
	if p.world == 0 {
		p.world = cfg.NNodes * cfg.NProc
	}
	res = &Result{Job: cfg.Job, World: p.world, Nodes: cfg.NNodes, NodeRank: cfg.NodeRank, Local: cfg.NProc}
	defer func() {
		res.Duration = time.Since(started).Round(time.Millisecond)
		res.Seconds = res.Duration.Seconds()
		if err != nil {
			res.Error = err.Error()
		}
	}()

	// Undo everything made, whatever happens (a panic included: the
	// deferred cleanups run while it unwinds).
	var undo []func()
	defer func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}()

	// Signals: before the workers start, a termination signal cancels the
	// preparation; every signal is passed on to the supervisor, which acts
	// on those still pending when it starts.
	prepCtx, cancelPrep := context.WithCancel(ctx)
	undo = append(undo, cancelPrep)
	supSigs := make(chan os.Signal, 16)
	var sigMu sync.Mutex
	var prepSig os.Signal
	supervising := false
	if cfg.Signals != nil {
		stop := make(chan struct{})
		undo = append(undo, func() { close(stop) })
		go func() {
			for {
				select {
				case sig := <-cfg.Signals:
					sigMu.Lock()
					if !supervising && supervisor.IsTermination(sig) && prepSig == nil {
						prepSig = sig
						cancelPrep()
					}
					sigMu.Unlock()
					select {
					case supSigs <- sig:
					default:
					}
				case <-stop:
					return
				}
			}
		}()
	}
	interrupted := func(what string) error {
		sigMu.Lock()
		defer sigMu.Unlock()
		if prepSig != nil {
			res.Interrupted = supervisor.SignalName(prepSig)
			return fmt.Errorf("%w by %s while %s; nothing was left running", supervisor.ErrInterrupted, res.Interrupted, what)
		}
		return nil
	}

	// The rendezvous.
	srv, err := p.hostRendezvous(&undo)
	if err != nil {
		return res, err
	}
	res.Rendezvous = p.rdzvAddr
	if err := p.pickMaster(); err != nil {
		return res, err
	}

	// The devices.
	if cfg.Devices != nil {
		undo = append(undo, func() {
			rctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
			defer cancel()
			if err := cfg.Devices.Release(rctx, cfg.Job); err != nil {
				p.logf("run: releasing the devices of job %s: %v", cfg.Job, err)
			}
		})
		devs, err := cfg.Devices.Acquire(prepCtx, cfg.Job, cfg.NProc)
		if err != nil {
			if ierr := interrupted("obtaining devices"); ierr != nil {
				return res, ierr
			}
			return res, fmt.Errorf("%w: %w", ErrDevices, err)
		}
		p.devs = devs
		res.Devices = devs
	}
	if cfg.Place != nil {
		devs := p.devs
		if len(devs) == 0 { // ranks that find their devices themselves (migctl bench)
			devs = make([]Device, cfg.NProc)
			for i := range devs {
				devs[i].GPU = -1
			}
		}
		p.place = cfg.Place(devs)
		for i := range p.devs {
			if i < len(p.place) && !p.place[i].IsNone() {
				pl := p.place[i]
				p.devs[i].NUMA = &pl
			}
		}
	}
	if ierr := interrupted("preparing"); ierr != nil {
		return res, ierr
	}
	if cfg.ShmRoot != "" {
		undo = append(undo, func() { _, _ = shm.Sweep(cfg.ShmRoot) })
	}
	if cfg.Stderr != nil {
		for _, w := range cfg.Warnings {
			fmt.Fprintf(cfg.Stderr, "run: warning: %s\n", w)
		}
	}
	p.logf("run: job %s: %d workers here (ranks %d..%d of %d), rendezvous %s%s", cfg.Job, cfg.NProc,
		p.firstRank, p.firstRank+cfg.NProc-1, p.world, p.rdzvAddr, p.devicesNote())
	if note := p.placementNote(); note != "" {
		p.logf("run: placement: %s", note)
	}

	sigMu.Lock()
	supervising = true
	sigMu.Unlock()
	sres, err := supervisor.Run(ctx, p.supervisorConfig(srv, supSigs))
	if sres != nil {
		res.Restarts = sres.Restarts
		res.Failures = sres.Failures
		res.RootCause = sres.RootCause()
		res.Interrupted = sres.Interrupted
		res.Workers = sres.Workers
	}
	res.Blame = p.blame
	if err != nil {
		if p.blame != "" && errors.Is(err, supervisor.ErrWorkerFailed) {
			return res, fmt.Errorf("job %s: %w (the rendezvous had aborted the job: %s)", cfg.Job, err, p.blame)
		}
		return res, fmt.Errorf("job %s: %w", cfg.Job, err)
	}
	return res, nil
}

func (p *plan) logf(format string, args ...any) {
	if p.cfg.Log != nil {
		fmt.Fprintf(p.cfg.Log, format+"\n", args...)
	}
}

func (p *plan) devicesNote() string {
	if len(p.devs) == 0 {
		return ""
	}
	var names []string
	for _, d := range p.devs {
		names = append(names, d.Visible)
	}
	return ", devices " + strings.Join(names, " ")
}

// placementNote says where the ranks run, one clause per placement in
// order of first rank ("ranks 0-3: node 0, CPUs 0-15; ranks 4-7: ..."), ""
// when none is placed.
func (p *plan) placementNote() string {
	var order []string
	ranks := map[string][]int{}
	for i, pl := range p.place {
		if pl.IsNone() {
			continue
		}
		k := pl.String()
		if ranks[k] == nil {
			order = append(order, k)
		}
		ranks[k] = append(ranks[k], p.firstRank+i)
	}
	var parts []string
	for _, k := range order {
		parts = append(parts, fmt.Sprintf("ranks %s: %s", numa.FormatList(ranks[k]), k))
	}
	return strings.Join(parts, "; ")
}

// rendezvousServer is what the launcher uses of *rendezvous.Server.
type rendezvousServer interface {
	Serve(net.Listener) error
	Stop()
	AbortJob(reason string)
}

// hostRendezvous starts the rendezvous server on node 0 (nil elsewhere)
// and sets p.rdzvAddr.
func (p *plan) hostRendezvous(undo *[]func()) (rendezvousServer, error) {
	c := p.cfg
	if c.NodeRank != 0 {
		p.rdzvAddr = c.RdzvEndpoint
		return nil, nil
	}
	var lis net.Listener
	var err error
	switch {
	case c.NNodes > 1:
		_, port, serr := net.SplitHostPort(c.RdzvEndpoint)
		if serr != nil {
			return nil, fmt.Errorf("%w: --rdzv-endpoint %q: want host:port", ErrInvalid, c.RdzvEndpoint)
		}
		// The endpoint's own address when it is this node's; every
		// address when the name is not bound here (NAT, a load balancer).
		lis, err = net.Listen("tcp", c.RdzvEndpoint)
		if errors.Is(err, syscall.EADDRNOTAVAIL) {
			lis, err = net.Listen("tcp", ":"+port)
		}
		p.rdzvAddr = c.RdzvEndpoint
	case c.Listen != "":
		if path, ok := strings.CutPrefix(c.Listen, "unix://"); ok {
			lis, err = net.Listen("unix", path)
			p.rdzvAddr = c.Listen
		} else {
			lis, err = net.Listen("tcp", c.Listen)
			if err == nil {
				p.rdzvAddr = lis.Addr().String()
			}
		}
	default:
		dir, derr := SocketDir("migctl-run-")
		if derr != nil {
			return nil, fmt.Errorf("making a private directory for the rendezvous socket: %w", derr)
		}
		*undo = append(*undo, func() { _ = os.RemoveAll(dir) })
		sock := filepath.Join(dir, "rendezvous.sock")
		lis, err = net.Listen("unix", sock)
		p.rdzvAddr = "unix://" + sock
	}
	if err != nil {
		where := c.Listen
		if c.NNodes > 1 {
			where = c.RdzvEndpoint
		}
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("%w: %s is already taken; pick another port for --rdzv-endpoint (or stop what listens there)", ErrPortInUse, where)
		}
		return nil, fmt.Errorf("listening for the rendezvous at %s: %w", where, err)
	}
	srv, err := rendezvous.NewServer(c.Token, p.world)
	if err != nil {
		lis.Close()
		return nil, err
	}
	lis = countingListener{Listener: lis, n: &p.accepts}
	served := make(chan struct{})
	go func() { _ = srv.Serve(lis); close(served) }()
	*undo = append(*undo, func() {
		srv.Stop()
		lis.Close()
		<-served
		if path, ok := strings.CutPrefix(p.rdzvAddr, "unix://"); ok && c.Listen != "" {
			_ = os.Remove(path)
		}
	})
	return srv, nil
}

// pickMaster sets MASTER_ADDR and MASTER_PORT: for one node, a free port
// on 127.0.0.1 (PyTorch's env:// init hosts its store there on rank 0);
// across nodes, the rendezvous host and the port after the rendezvous's.
func (p *plan) pickMaster() error {
	if p.cfg.NNodes > 1 {
		host, port, err := net.SplitHostPort(p.cfg.RdzvEndpoint)
		if err != nil {
			return fmt.Errorf("%w: --rdzv-endpoint %q: want host:port", ErrInvalid, p.cfg.RdzvEndpoint)
		}
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n >= 65535 {
			return fmt.Errorf("%w: --rdzv-endpoint port %q: want 1..65534", ErrInvalid, port)
		}
		p.masterAddr, p.masterPort = host, n+1
		return nil
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("finding a free port for MASTER_PORT: %w", err)
	}
	defer l.Close()
	p.masterAddr, p.masterPort = "127.0.0.1", l.Addr().(*net.TCPAddr).Port
	return nil
}

// supervisorConfig wires the supervisor to the rendezvous and the devices.
func (p *plan) supervisorConfig(srv rendezvousServer, sigs <-chan os.Signal) supervisor.Config {
	c := p.cfg
	sc := supervisor.Config{
		N: c.NProc, FirstRank: p.firstRank, Command: c.Command, Dir: c.Dir,
		ErrorFileEnv: EnvErrorFile,
		Stdout:       c.Stdout, Stderr: c.Stderr, LogDir: c.LogDir, Tee: c.Tee,
		MaxRestarts: c.MaxRestarts, Settle: c.Settle, Grace: c.Grace, Signals: sigs,
		Env: func(w supervisor.Worker) []string {
			e := workerEnv{rank: w.Rank, local: w.LocalRank, gen: w.Generation, plan: p}
			if len(p.devs) > 0 {
				e.dev = &p.devs[w.LocalRank]
			}
			return e.list()
		},
	}
	if c.OnStart != nil {
		sc.OnStart = func(w supervisor.Worker, pid int) { c.OnStart(w.Rank, pid) }
	}
	if len(p.place) > 0 {
		sc.Placement = func(w supervisor.Worker) numa.Placement {
			if w.LocalRank < len(p.place) {
				return p.place[w.LocalRank]
			}
			return numa.None
		}
		sc.PlacementFailed = func(w supervisor.Worker, err error) {
			if c.Stderr != nil {
				fmt.Fprintf(c.Stderr, "run: warning: rank %d runs where the kernel put it: %v\n", w.Rank, err)
			}
		}
	}
	// The rendezvous's abort, when a rank caused it, names the rank at
	// fault: one whose connection closed (it died) takes its peers down
	// at once, and their exits can reach the supervisor before its own.
	aborted := func() *rendezvous.AbortError {
		var ae *rendezvous.AbortError
		if es, ok := srv.(interface{ Err() error }); ok && errors.As(es.Err(), &ae) {
			return ae
		}
		return nil
	}
	sc.Suspect = func(supervisor.Failure) int {
		if ae := aborted(); ae != nil {
			return ae.Rank
		}
		return -1
	}
	sc.OnFailure = func(f supervisor.Failure) {
		p.logf("run: %s", f)
		p.blame = ""
		if ae := aborted(); ae != nil && ae.Rank != f.Rank {
			p.blame = ae.Reason
		}
		if srv != nil {
			srv.AbortJob(fmt.Sprintf("rank %d failed: %s", f.Rank, f))
		}
	}
	// A rank that ends without failing before every rank joined will not
	// join: its peers, blocked joining, would wait for it until their
	// start-up limit (minutes). The rendezvous fails them, naming it.
	if re, ok := srv.(interface {
		RankEnded(rank int, reason string) bool
	}); ok {
		sc.OnExit = func(e supervisor.Exit) {
			if e.Failed() {
				return // a failure has its own path (OnFailure)
			}
			if re.RankEnded(e.Rank, fmt.Sprintf("rank %d (pid %d) exited with code 0 before every rank joined the group: "+
				"each of the job's ranks must join it (trainer.Init, init_process_group)", e.Rank, e.PID)) {
				p.logf("run: rank %d exited with code 0 before every rank joined the group: the ranks joining it are failed", e.Rank)
			}
		}
	}
	// Still starting up = some worker connected to the rendezvous in this
	// generation and the world has not formed: a Ctrl-C then kills at once
	// (a rank blocked joining cannot act on it). Workers that never connect
	// (a plain PyTorch script) are past start-up as soon as they run.
	if formed, ok := srv.(interface{ Formed() <-chan struct{} }); ok {
		sc.Ready = func(int) bool {
			select {
			case <-formed.Formed():
				return true
			default:
				return p.accepts.Load() == p.genAccepts
			}
		}
	}
	sc.BeforeRestart = func(_ context.Context, gen int) error {
		if c.ShmRoot != "" {
			_, _ = shm.Sweep(c.ShmRoot)
		}
		if g, ok := srv.(interface{ NewGeneration() int }); ok {
			g.NewGeneration()
		}
		p.genAccepts = p.accepts.Load()
		p.logf("run: restarting every worker (restart %d of at most %d)", gen, c.MaxRestarts)
		return nil
	}
	return sc
}
