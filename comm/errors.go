package comm

import "errors"

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
)
