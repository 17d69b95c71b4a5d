package allreduce

import (
	"fmt"

	"github.com/migctl/migctl/comm"
)

// Call signatures. Every rank must make the same collective calls in the
// same order with the same arguments; a rank that does not (another size,
// element type, operator, root or collective) would otherwise read a
// peer's stale or partial arena data and return a wrong result without a
// word, or wait for a flag its peer never sets until the deadline. So each
// call publishes its signature in three flags of its rank before any other
// flag of the call, and a rank that waited for a peer's flag of the call
// (which the peer set after its signature) compares the peer's signature
// with its own once per call and peer: on a difference it raises the abort
// flag naming the peer (comm.AbortMismatch) and fails with a *MismatchError.
// The three words carry the call's epoch, so a word of an earlier or later
// call is never compared. Calls of even and odd number use separate words,
// and a call publishes after its fence (the wait for every rank to finish
// the previous call, where it needs one): so a rank that finished a call
// waiting for nobody (a broadcast's root) and went on to the next has not
// overwritten its signature of the call before every rank has finished it.
// A rank cannot get two calls ahead of a peer still in one (the call in
// between either fences or waits for every rank), except by queueing small
// all-reduces on the devices (Options.SmallOnDevice, whose calls return
// before they ran): there a pair may go unnoticed.
// Calls whose flags only the devices wait for (the small all-reduce on the
// devices) are compared at the publish only (see publishSignature); the
// abort then releases the devices' waits.

// sigBits is the width of a signature word's value (below the epoch).
const sigBits = EpochShift

// signature is what a call publishes: its kind (collective, algorithm,
// element type, operator, root) and its size in bytes, in two halves.
type signature struct {
	kind, lo, hi uint64
}

// signatureOf is sched's call with call's buffers. The operator counts for
// the reductions only; the root for broadcasts only.
func signatureOf(p Params, call Call) signature {
	op, root := uint64(0), uint64(0)
	if p.Coll == AllReduce || p.Coll == ReduceScatter {
		op = uint64(call.Op) & 3
	}
	if p.Coll == Broadcast {
		root = uint64(p.Root) & 0xffff
	}
	dt := uint64(0)
	if p.Coll != Barrier {
		dt = uint64(call.DType) & 7
	}
	kind := uint64(p.Coll)&7 | uint64(p.Algorithm)&7<<3 | dt<<6 | op<<9 | root<<11
	b := uint64(max(p.Bytes, 0))
	return signature{kind: kind, lo: b & (1<<sigBits - 1), hi: b >> sigBits & (1<<sigBits - 1)}
}

func (s signature) coll() Coll           { return Coll(s.kind & 7) }
func (s signature) algorithm() Algorithm { return Algorithm(s.kind >> 3 & 7) }
func (s signature) dtype() comm.DType    { return comm.DType(s.kind >> 6 & 7) }
func (s signature) op() comm.Op          { return comm.Op(s.kind >> 9 & 3) }
func (s signature) root() int            { return int(s.kind >> 11 & 0xffff) }
func (s signature) bytes() uint64        { return s.hi<<sigBits | s.lo }

// String describes the call as a user made it.
func (s signature) String() string {
	c := s.coll()
	switch c {
	case Barrier:
		return "barrier"
	case AllReduce, ReduceScatter:
		return fmt.Sprintf("%s of %d bytes of %s (%s)", c, s.bytes(), s.dtype(), s.op())
	case Broadcast:
		return fmt.Sprintf("%s of %d bytes of %s from rank %d", c, s.bytes(), s.dtype(), s.root())
	}
	return fmt.Sprintf("%s of %d bytes of %s", c, s.bytes(), s.dtype())
}

// MismatchError is a peer's collective call that differs from this rank's
// (matches comm.ErrMismatch and comm.ErrInvalid).
type MismatchError struct {
	Rank, Peer int
	Call       uint64 // the call's number on this communicator (from 1)
	mine, peer signature
}

func (e *MismatchError) Error() string {
	what := ""
	if e.mine.String() == e.peer.String() {
		// Same call, another schedule: the ranks chose differently (their
		// settings or machine figures differ).
		what = fmt.Sprintf(" (algorithm %s here, %s there: the ranks' settings differ)", e.mine.algorithm(), e.peer.algorithm())
	}
	return fmt.Sprintf("collective call %d: rank %d called %s, rank %d %s%s: %v (%s)",
		e.Call, e.Rank, e.mine, e.Peer, e.peer, what, comm.ErrMismatch, comm.MismatchRule)
}

// Is matches comm.ErrMismatch and comm.ErrInvalid.
func (e *MismatchError) Is(target error) bool {
	return target == comm.ErrMismatch || target == comm.ErrInvalid
}

// mismatchAborter is a Transport that can raise the abort flag for a
// mismatched call (comm.ShmTransport).
type mismatchAborter interface {
	AbortMismatch(peer int)
}

var _ mismatchAborter = (*comm.ShmTransport)(nil)

// publishSignature publishes this rank's signature of the call at epoch
// (before any other flag of the call), then compares those of the peers
// that have published theirs for the call. Of two ranks that both make
// the call, at least one sees the other's signature here (each stores its
// own before it loads the other's, and the flags are sequentially
// consistent atomics), so a mismatched pair is found even where neither
// waits for a flag of the other (a barrier against a small all-reduce,
// broadcasts from different roots): one of the two fails at once, the
// other at its first wait, or at its next call if it had none.
func (e *Executor) publishSignature(epoch uint64, s signature) error {
	r, g := e.tr.Rank(), sigGen(epoch)
	e.sigs[g/3] = s
	e.tr.Set(FlagOf(r, g+roleSigHi), epoch|s.hi)
	e.tr.Set(FlagOf(r, g+roleSigLo), epoch|s.lo)
	e.tr.Set(FlagOf(r, g+roleSig), epoch|s.kind)
	for q := range e.tr.World() {
		if err := e.checkPeer(q, epoch); err != nil {
			return err
		}
	}
	return nil
}

// checkPeer compares the signature of rank q's call at epoch with this
// rank's, once per call (lanes may call it concurrently), after a wait for
// a flag of q reached a value of that call. A peer whose three words are
// not all of this call (it is past it, or its flags were released after a
// failure) is not compared.
func (e *Executor) checkPeer(q int, epoch uint64) error {
	g := sigGen(epoch)
	seen := e.sigSeen[g/3]
	if q == e.tr.Rank() || q < 0 || q >= len(seen) || seen[q].Load() == epoch {
		return nil
	}
	const mask = 1<<sigBits - 1
	mine := e.sigs[g/3]
	k, lo, hi := e.tr.Flag(FlagOf(q, g+roleSig)), e.tr.Flag(FlagOf(q, g+roleSigLo)), e.tr.Flag(FlagOf(q, g+roleSigHi))
	if k&^mask != epoch || lo&^mask != epoch || hi&^mask != epoch {
		return nil
	}
	peer := signature{kind: k & mask, lo: lo & mask, hi: hi & mask}
	if peer == mine {
		seen[q].Store(epoch)
		return nil
	}
	if ma, ok := e.tr.(mismatchAborter); ok {
		ma.AbortMismatch(q)
	}
	return &MismatchError{Rank: e.tr.Rank(), Peer: q, Call: epoch >> EpochShift, mine: mine, peer: peer}
}

// sigGen is the offset of the call's signature words from roleSig: 0 for
// calls of even number, 3 for odd ones.
func sigGen(epoch uint64) int { return int(epoch>>EpochShift&1) * 3 }

// checkPeers is checkPeer for the ranks of conds' flags.
func (e *Executor) checkPeers(conds []Cond, epoch uint64) error {
	for _, c := range conds {
		if err := e.checkPeer(c.Flag/FlagsPerRank, epoch); err != nil {
			return err
		}
	}
	return nil
}
