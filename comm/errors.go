package comm

import (
	"errors"
	"fmt"
	"time"
)

// Sentinel errors of the comm package; match them with errors.Is.
var (
	// ErrInvalid reports an argument that can never work (bad size, dtype, op).
	ErrInvalid = errors.New("invalid argument")
	// ErrClosed reports use of a Device, Stream or transport after Close.
	ErrClosed = errors.New("closed")
	// ErrAborted reports that a collective was aborted: a rank raised the
	// job's abort flag (it failed, or its deadline passed).
	ErrAborted = errors.New("collective aborted")
	// ErrPeerDead reports a peer process that exited or stopped heartbeating.
	ErrPeerDead = errors.New("peer dead")
	// ErrNotDrained reports a stream closed while its work had not finished
	// (a device wait for a flag nobody writes, after a failure): it was
	// destroyed all the same, and the memory that work may still touch is
	// kept (registrations, scratch buffers, the kernels' module): the
	// caller must not unregister or unmap what it handed to it.
	ErrNotDrained = errors.New("stream did not drain")
	// ErrMismatch reports ranks whose collective calls differ (another
	// collective, size, element type, operator or root at the same place in
	// the sequence of calls): every rank must issue the same collectives in
	// the same order with the same arguments. It also matches ErrInvalid.
	ErrMismatch = errors.New("collective calls differ between ranks")
)

// MismatchRule is the rule that calls which differ between ranks break, for
// the errors that report them.
const MismatchRule = "every rank must issue the same collectives in the same order, with the same sizes, " +
	"element types, operators and roots"

// AbortCause says why a rank raised the job's abort flag.
type AbortCause uint8

const (
	// AbortFailed: the raising rank itself failed (an error of its own).
	AbortFailed AbortCause = iota
	// AbortExited: the raising rank saw Rank's process gone.
	AbortExited
	// AbortStalled: the raising rank saw Rank's heartbeat stand still
	// longer than the peer timeout (a stopped or hung process).
	AbortStalled
	// AbortDeadline: the raising rank's collective deadline passed; Rank is
	// the peer whose heartbeat was stalest then (a suspect), or the raising
	// rank when every peer was alive.
	AbortDeadline
	// AbortMismatch: the raising rank found that Rank's collective call
	// differs from its own (ErrMismatch).
	AbortMismatch
)

// AbortError is what every rank's collectives fail with once the job's
// abort flag is up: it names the rank at fault (Rank) and the rank that
// raised the flag (By). errors.Is matches ErrAborted, and ErrPeerDead when
// a peer exited or stalled.
type AbortError struct {
	Rank  int // the rank at fault
	By    int // the rank that raised the abort flag
	Cause AbortCause
	// Age is, for AbortStalled and AbortDeadline, how long Rank's heartbeat
	// had stood still (millisecond resolution).
	Age time.Duration
}

func (e *AbortError) Error() string {
	switch e.Cause {
	case AbortExited:
		return fmt.Sprintf("rank %d exited (rank %d noticed and aborted the job)", e.Rank, e.By)
	case AbortStalled:
		return fmt.Sprintf("rank %d stalled (rank %d noticed and aborted the job): no heartbeat for %v (stopped or hung?)", e.Rank, e.By, e.Age)
	case AbortDeadline:
		if e.Rank != e.By {
			return fmt.Sprintf("rank %d timed out waiting; rank %d had not heartbeaten for %v (stopped or hung?)", e.By, e.Rank, e.Age)
		}
		return fmt.Sprintf("rank %d timed out waiting and aborted the job", e.By)
	case AbortMismatch:
		return fmt.Sprintf("rank %d found that rank %d's collective call differs from its own and aborted the job: %v (%s)",
			e.By, e.Rank, ErrMismatch, MismatchRule)
	}
	return fmt.Sprintf("rank %d failed and aborted the job", e.Rank)
}

// Is matches ErrAborted, ErrPeerDead for a peer that exited or stalled, and
// ErrMismatch (with ErrInvalid) for calls that differ between ranks.
func (e *AbortError) Is(target error) bool {
	switch target {
	case ErrAborted:
		return true
	case ErrPeerDead:
		return e.Cause == AbortExited || e.Cause == AbortStalled
	case ErrMismatch, ErrInvalid:
		return e.Cause == AbortMismatch
	}
	return false
}

// FaultRank is the rank at fault (rendezvous.Client.AbortWith reports it).
func (e *AbortError) FaultRank() int { return e.Rank }

// PeerError reports a peer found dead by this rank's liveness check.
type PeerError struct {
	Rank int
	PID  int           // set when the process is gone
	Idle time.Duration // set when its heartbeat stood still
}

func (e *PeerError) Error() string {
	if e.Idle > 0 {
		return fmt.Sprintf("rank %d has not heartbeaten for %v (stopped or hung?): %v", e.Rank, e.Idle, ErrPeerDead)
	}
	return fmt.Sprintf("rank %d (pid %d) exited: %v", e.Rank, e.PID, ErrPeerDead)
}

// Is matches ErrPeerDead.
func (e *PeerError) Is(target error) bool { return target == ErrPeerDead }

// FaultRank is the dead peer (rendezvous.Client.AbortWith reports it).
func (e *PeerError) FaultRank() int { return e.Rank }
