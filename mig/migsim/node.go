package migsim

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// Node is a simulated node: an nvml.Interface over a set of simulated GPUs.
type Node struct {
	mock.Interface // method set only: unmodelled calls panic

	mu    sync.Mutex
	model Model
	st    state
	path  string   // "" for an in-memory node
	lock  *os.File // flock holder for a file-backed node
}

var _ nvml.Interface = (*Node)(nil)

// New returns an in-memory node of n fresh GPUs of model m.
func New(m Model, n int) *Node {
	return &Node{model: m, st: freshState(m, n)}
}

// Open returns a node backed by the state file at path, creating a fresh
// node of n GPUs of model m when the file does not exist. It takes an
// exclusive lock on path+".lock", blocking until another process holding it
// calls Close (or exits). A file made for another model or GPU count is an
// error rather than silently reused.
func Open(path string, m Model, n int) (*Node, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("creating simulator state directory: %w", err)
	}
	lf, err := os.OpenFile(path+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening simulator lock: %w", err)
	}
	st, err := lockAndLoad(lf, path, m, n)
	if err != nil {
		lf.Close()
		return nil, err
	}
	return &Node{model: m, st: st, path: path, lock: lf}, nil
}

// lockAndLoad takes the exclusive lock on lf, then loads the state at path,
// or saves a fresh one of n GPUs of m when there is none.
func lockAndLoad(lf *os.File, path string, m Model, n int) (state, error) {
	if err := syscall.Flock(int(lf.Fd()), syscall.LOCK_EX); err != nil {
		return state{}, fmt.Errorf("locking simulator state: %w", err)
	}
	st, ok, err := load(path)
	if err != nil {
		return state{}, err
	}
	if ok {
		if st.Model != m.Key || len(st.GPUs) != n {
			return state{}, fmt.Errorf("simulator state %s holds %d x %s, not %d x %s (use another --sim-state)", path, len(st.GPUs), st.Model, n, m.Key)
		}
		return st, nil
	}
	st = freshState(m, n)
	if err := save(path, &st); err != nil {
		return state{}, err
	}
	return st, nil
}

// Close releases the state lock. The state itself is already on disk.
func (n *Node) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.lock == nil {
		return nil
	}
	err := n.lock.Close() // closing drops the flock
	n.lock = nil
	return err
}

// Model is the simulated product.
func (n *Node) Model() Model { return n.model }

// ErrNoInstance: AttachProcess named a MIG device that does not exist.
var ErrNoInstance = errors.New("no such MIG device")

// ErrNoProcess: DetachProcess named a process not on the GPU.
var ErrNoProcess = errors.New("no such process")

// AttachProcess records a fake process using usedBytes on GPU gpu: on the
// compute instance (giID, ciID) when MIG is enabled, on the whole GPU when
// giID < 0. As a CUDA context would, it fails when usedBytes is more than
// the memory left there (a GPU instance's compute instances share its
// memory), and a process is attached to one place once.
func (n *Node) AttachProcess(gpu, giID, ciID int, pid uint32, usedBytes uint64) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if gpu < 0 || gpu >= len(n.st.GPUs) {
		return fmt.Errorf("GPU %d: %w", gpu, ErrNoInstance)
	}
	g := &n.st.GPUs[gpu]
	p := procState{PID: pid, Used: usedBytes}
	procs, where, total := &g.Procs, fmt.Sprintf("GPU %d", gpu), n.model.MemoryBytes
	var shared [][]procState // what else uses the same memory
	if giID < 0 {
		shared = [][]procState{g.Procs}
	} else {
		ci := n.findCI(g, giID, ciID)
		if ci == nil {
			return fmt.Errorf("GPU %d GI %d CI %d: %w", gpu, giID, ciID, ErrNoInstance)
		}
		gi := n.findGI(g, giID)
		procs, where, total = &ci.Procs, fmt.Sprintf("GPU %d GI %d CI %d", gpu, giID, ciID), n.profileByEnum(gi.Enum).MemoryMB<<20
		for _, c := range gi.CIs {
			shared = append(shared, c.Procs)
		}
	}
	var used uint64
	for _, ps := range shared {
		for _, q := range ps {
			used += q.Used
		}
	}
	for _, q := range *procs {
		if q.PID == pid {
			return fmt.Errorf("%s: process %d is attached already", where, pid)
		}
	}
	if usedBytes > total-used {
		gib := func(b uint64) float64 { return float64(b) / (1 << 30) }
		return fmt.Errorf("%s: %.2f GiB asked, %.2f of its %.2f GiB free", where, gib(usedBytes), gib(total-used), gib(total))
	}
	*procs = append(*procs, p)
	return n.persist()
}

// DetachProcess removes process pid from wherever it runs on GPU gpu;
// ErrNoProcess when it runs nowhere there.
func (n *Node) DetachProcess(gpu int, pid uint32) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if gpu < 0 || gpu >= len(n.st.GPUs) {
		return fmt.Errorf("GPU %d: %w", gpu, ErrNoInstance)
	}
	g := &n.st.GPUs[gpu]
	dropped := dropPID(&g.Procs, pid)
	for i := range g.GIs {
		for j := range g.GIs[i].CIs {
			dropped = dropPID(&g.GIs[i].CIs[j].Procs, pid) || dropped
		}
	}
	if !dropped {
		return fmt.Errorf("GPU %d: process %d: %w", gpu, pid, ErrNoProcess)
	}
	return n.persist()
}

// dropPID removes pid from *ps and reports whether it was there.
func dropPID(ps *[]procState, pid uint32) bool {
	out := (*ps)[:0]
	for _, p := range *ps {
		if p.PID != pid {
			out = append(out, p)
		}
	}
	dropped := len(out) < len(*ps)
	*ps = out
	return dropped
}

// Reset stands for the admin resetting GPU gpu: a pending MIG mode takes
// effect. It refuses (ERROR_IN_USE) while processes run on the GPU.
func (n *Node) Reset(gpu int) nvml.Return {
	n.mu.Lock()
	defer n.mu.Unlock()
	if gpu < 0 || gpu >= len(n.st.GPUs) {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	g := &n.st.GPUs[gpu]
	if gpuBusy(g) {
		return nvml.ERROR_IN_USE
	}
	g.MIGCurrent = g.MIGPending
	if g.MIGCurrent == nvml.DEVICE_MIG_DISABLE {
		g.GIs = nil
	}
	if err := n.persist(); err != nil {
		return nvml.ERROR_UNKNOWN
	}
	return nvml.SUCCESS
}

func gpuBusy(g *gpuState) bool {
	if len(g.Procs) > 0 {
		return true
	}
	for _, gi := range g.GIs {
		for _, ci := range gi.CIs {
			if len(ci.Procs) > 0 {
				return true
			}
		}
	}
	return false
}

// persist writes the state when the node is file-backed. Callers hold mu.
func (n *Node) persist() error {
	if n.path == "" {
		return nil
	}
	return save(n.path, &n.st)
}

// mutate runs f and persists the state if it succeeded. Callers hold mu.
func (n *Node) mutate(f func() nvml.Return) nvml.Return {
	r := f()
	if r == nvml.SUCCESS {
		if err := n.persist(); err != nil {
			return nvml.ERROR_UNKNOWN
		}
	}
	return r
}

func (n *Node) findGI(g *gpuState, id int) *giState {
	for i := range g.GIs {
		if g.GIs[i].ID == id {
			return &g.GIs[i]
		}
	}
	return nil
}

func (n *Node) findCI(g *gpuState, giID, ciID int) *ciState {
	gi := n.findGI(g, giID)
	if gi == nil {
		return nil
	}
	for i := range gi.CIs {
		if gi.CIs[i].ID == ciID {
			return &gi.CIs[i]
		}
	}
	return nil
}

func (n *Node) nextSerial() uint64 {
	n.st.Seq++
	return n.st.Seq
}
