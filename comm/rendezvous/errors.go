package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"syscall"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/migctl/migctl/comm/rendezvouspb"
)

// Sentinel errors of the rendezvous; match them with errors.Is. Errors of
// calls also carry their gRPC status (status.Code works on them).
var (
	// ErrInvalid reports a bad argument (world size, token, address).
	ErrInvalid = errors.New("invalid rendezvous argument")
	// ErrAborted reports a job that was aborted: a rank failed or left, the
	// ranks disagreed on settings, or the launcher aborted it. The error is
	// an *AbortError that names the rank at fault.
	ErrAborted = errors.New("job aborted")
	// ErrMismatch reports ranks that joined with different settings or
	// world sizes (the job is aborted: errors.Is(err, ErrAborted) too).
	ErrMismatch = errors.New("ranks disagree on the job's settings")
	// ErrRankTaken reports a Register for a rank another process holds, or
	// when every rank is taken; the running job is not disturbed.
	ErrRankTaken = errors.New("rank taken")
	// ErrStaleGeneration reports a call from a rank of a generation the job
	// has restarted past.
	ErrStaleGeneration = errors.New("stale generation")
	// ErrUnreachable reports a rendezvous server that cannot be reached
	// (no server, or it went away): an *UnreachableError.
	ErrUnreachable = errors.New("rendezvous unreachable")
)

// AbortError says who failed a job and why.
type AbortError struct {
	// Rank is the rank at fault: the one that failed, left, died or joined
	// with other settings; -1 when none is known.
	Rank int
	// Reason says what happened; it names Rank.
	Reason     string
	Generation int
	// Mismatch: the ranks disagreed on settings or world size.
	Mismatch bool
}

func (e *AbortError) Error() string { return "job aborted: " + e.Reason }

// Is matches ErrAborted, and ErrMismatch for a mismatch.
func (e *AbortError) Is(target error) bool {
	return target == ErrAborted || (e.Mismatch && target == ErrMismatch)
}

// GRPCStatus is codes.Aborted.
func (e *AbortError) GRPCStatus() *status.Status { return status.New(codes.Aborted, e.Error()) }

// UnreachableError reports that no rendezvous answered at Addr.
type UnreachableError struct {
	Addr string
	// Err is the last dial error (nil if the connection never failed
	// outright, e.g. it hung).
	Err error
	// Lost: the rendezvous answered earlier and then went away.
	Lost bool
}

func (e *UnreachableError) Error() string {
	cause := "no answer"
	var errno syscall.Errno
	switch {
	case errors.As(e.Err, &errno):
		cause = errno.Error()
	case e.Err != nil:
		cause = e.Err.Error()
	}
	if e.Lost {
		return fmt.Sprintf("lost the rendezvous at %s: %s (did the launcher exit?)", e.Addr, cause)
	}
	return fmt.Sprintf("no rendezvous at %s: %s (is the launcher running?)", e.Addr, cause)
}

// Is matches ErrUnreachable.
func (e *UnreachableError) Is(target error) bool { return target == ErrUnreachable }

// Unwrap is the dial error.
func (e *UnreachableError) Unwrap() error { return e.Err }

// GRPCStatus is codes.Unavailable.
func (e *UnreachableError) GRPCStatus() *status.Status {
	return status.New(codes.Unavailable, e.Error())
}

// callError is a failed call's status as an error with a readable message
// that matches its sentinel.
type callError struct {
	st       *status.Status
	sentinel error
}

func (e *callError) Error() string              { return e.st.Message() }
func (e *callError) Unwrap() error              { return e.sentinel }
func (e *callError) GRPCStatus() *status.Status { return e.st }

// fromStatus turns a call's error into one of the errors above; exists is
// what codes.AlreadyExists means for the call (ErrRankTaken for Register).
func (c *Client) fromStatus(err, exists error) error {
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	switch st.Code() {
	case codes.Aborted:
		for _, d := range st.Details() {
			if ai, ok := d.(*pb.AbortInfo); ok {
				return &AbortError{Rank: int(ai.GetRank()), Reason: ai.GetReason(), Generation: int(ai.GetGeneration()), Mismatch: ai.GetMismatch()}
			}
		}
		return &callError{st: st, sentinel: ErrAborted}
	case codes.Unavailable:
		return c.unreachable(true)
	case codes.AlreadyExists, codes.ResourceExhausted:
		return &callError{st: st, sentinel: exists}
	case codes.FailedPrecondition:
		return &callError{st: st, sentinel: ErrStaleGeneration}
	case codes.InvalidArgument:
		return &callError{st: st, sentinel: ErrInvalid}
	case codes.DeadlineExceeded:
		return &callError{st: st, sentinel: context.DeadlineExceeded}
	case codes.Canceled:
		return &callError{st: st, sentinel: context.Canceled}
	}
	return &callError{st: st}
}
