package ctxmgr

import (
	"errors"
	"time"
)

// State is where a shimmed process's GPU memory is.
type State string

// The states of a shimmed process.
const (
	// Running: its memory is on the GPU and it runs.
	Running State = "running"
	// SwappingOut: a swap_out was sent; the memory is being copied to host.
	SwappingOut State = "swapping-out"
	// Out: its memory is in host memory; the process is blocked at its next
	// GPU call.
	Out State = "out"
	// SwappingIn: a swap_in was sent; the memory is being mapped and copied back.
	SwappingIn State = "swapping-in"
	// Blocked: a swap-in failed (no memory); the process stays blocked until a
	// later swap-in succeeds. Its memory is still in host memory.
	Blocked State = "blocked"
)

// Resident reports whether a process in state s holds its memory on the GPU
// (a swap in flight counts as resident: conservative for the policy).
func (s State) Resident() bool {
	switch s {
	case Running, SwappingOut, SwappingIn:
		return true
	}
	return false
}

// Sentinel errors of the Manager and its control API.
var (
	// ErrNoSuchProcess: no shimmed process has that pid.
	ErrNoSuchProcess = errors.New("no such shimmed process")
	// ErrNoSuchJob: no shimmed process belongs to that job.
	ErrNoSuchJob = errors.New("no such job")
	// ErrAlreadyOut: every targeted process is already out (or going out).
	ErrAlreadyOut = errors.New("already swapped out")
	// ErrAlreadyIn: every targeted process is already in (running).
	ErrAlreadyIn = errors.New("already swapped in")
	// ErrBusy: the targeted process is in the middle of the other swap.
	ErrBusy = errors.New("a swap is in progress")
	// ErrDisconnected: the process's shim connection closed (it exited)
	// before the swap finished.
	ErrDisconnected = errors.New("process exited (shim disconnected)")
	// ErrDenied: the policy cannot free enough memory.
	ErrDenied = errors.New("memory request denied")
)

// Process is one shimmed process as the registry knows it (a copy).
type Process struct {
	PID int `json:"pid" yaml:"pid"`
	// PeerPID is the pid the kernel reports for the socket peer
	// (SO_PEERCRED) when it differs from PID (a shim in a pid namespace).
	PeerPID  int    `json:"peerPID,omitempty" yaml:"peerPID,omitempty"`
	Job      string `json:"job" yaml:"job"`
	Priority int    `json:"priority" yaml:"priority"`
	Device   string `json:"device" yaml:"device"`
	// Bytes is the device memory the process's allocations take (its last
	// usage report), wherever that memory is now.
	Bytes int64 `json:"bytes" yaml:"bytes"`
	State State `json:"state" yaml:"state"`
	// Hold: swapped out by an operator; the policy never swaps it back in on
	// its own (a manual swap in clears it).
	Hold    bool      `json:"hold,omitempty" yaml:"hold,omitempty"`
	Started time.Time `json:"started" yaml:"started"`
	// LastProgress is when the shim last reported swap progress (zero if never).
	LastProgress time.Time `json:"lastProgress,omitempty" yaml:"lastProgress,omitempty"`
	// Done and Total are the last progress of the swap in flight.
	Done  int64 `json:"done,omitempty" yaml:"done,omitempty"`
	Total int64 `json:"total,omitempty" yaml:"total,omitempty"`
	// BlockedEpoch is, for a Blocked process, the Manager's memory epoch when
	// its last swap-in was tried: the policy retries it only after memory has
	// been freed since (Snapshot.Epoch is larger).
	BlockedEpoch uint64 `json:"-" yaml:"-"`
	// Waiting: the process has a need outstanding (blocked in an allocation).
	Waiting bool `json:"waiting,omitempty" yaml:"waiting,omitempty"`
	// Gate is its part in priority launch gating (class, how long it was held).
	Gate GateStatus `json:"gate" yaml:"gate"`
}

// GPUBytes is what the process holds on the GPU now.
func (p Process) GPUBytes() int64 {
	if p.State.Resident() {
		return p.Bytes
	}
	return 0
}
