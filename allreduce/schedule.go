package allreduce

import (
	"errors"
	"fmt"
)

// Coll is a collective operation.
type Coll int

// The collectives.
const (
	AllReduce Coll = iota
	ReduceScatter
	AllGather
	Broadcast
	Barrier
)

var collNames = []string{"allreduce", "reducescatter", "allgather", "broadcast", "barrier"}

func (c Coll) String() string {
	if c >= 0 && int(c) < len(collNames) {
		return collNames[c]
	}
	return fmt.Sprintf("coll(%d)", int(c))
}

// ParseColl parses a collective name as String prints it.
func ParseColl(s string) (Coll, error) {
	for i, n := range collNames {
		if n == s {
			return Coll(i), nil
		}
	}
	return 0, fmt.Errorf("collective %q (want one of %v): %w", s, collNames, ErrUnsupported)
}

// Algorithm names a schedule generator.
type Algorithm int

// The algorithms.
const (
	HostStaged Algorithm = iota
	Ring
	// RingIPC is a ring over device buffers that peers opened through CUDA
	// IPC: each step reads the previous rank's buffer directly.
	RingIPC
	// HostStagedSmall is the host-staged all-reduce for small messages: each
	// rank copies its whole buffer to its own arena area, then reduces all n
	// inputs itself on the CPU into a private area and copies the result back.
	// One copy each way, one flag round, no pieces. The Communicator picks it
	// for host-staged all-reduces of at most Options.SmallBytes.
	HostStagedSmall
	// Hierarchical is the all-reduce for several ranks on each of several
	// GPUs (Params.Groups: the ranks sharing one GPU's link). Within a
	// group, rank j of m reduces part j of each chunk on its device from
	// the group peers' staged inputs in host memory (ReduceIn) and copies
	// that group partial out; the CPU threads of every rank reduce the G
	// group partials into the result, which every rank copies back. Per
	// rank S out and (2−1/m)·S in over the link; the host reads G·S
	// instead of n·S. With one group the partials are the result: each
	// rank fetches the other parts straight from the peers' areas.
	Hierarchical
)

func (a Algorithm) String() string {
	switch a {
	case HostStaged:
		return "hoststaged"
	case Ring:
		return "ring"
	case RingIPC:
		return "ring-ipc"
	case HostStagedSmall:
		return "hoststaged-small"
	case Hierarchical:
		return "hierarchical"
	}
	return fmt.Sprintf("algorithm(%d)", int(a))
}

// ErrUnsupported reports a collective/algorithm combination with no schedule.
var ErrUnsupported = errors.New("unsupported")

// Lane is an in-order queue of a rank's steps; lanes run concurrently.
type Lane int

// The lanes.
const (
	LaneOut    Lane = iota // device → host copies
	LaneReduce             // CPU reductions in host memory
	LaneIn                 // host → device copies and device reductions
	NumLanes
)

// Kind is what a step does.
type Kind int

// Step kinds. Spans of user buffers are Buf[Off:Off+Len]; host spans are in
// the transport's arena.
const (
	// Nop only waits and sets flags.
	Nop Kind = iota
	// CopyOut copies Buf[Off:Off+Len] to the host span Host.
	CopyOut
	// CopyIn copies the host span Host to Buf[Off:Off+Len].
	CopyIn
	// ReduceIn sets Buf[Off:] = op(Src[SrcOff:], Hosts...) on the device;
	// with Final and Avg it then divides by the world size. With no Hosts
	// it is a copy on the device.
	ReduceIn
	// HostReduce sets the host span Host = op(Hosts...) on the CPU; with
	// Final and Avg it divides by Div, or by len(Hosts) when Div is 0.
	HostReduce
	// ReducePeer sets Buf[Off:Off+Len] = op(Src[SrcOff:], the previous
	// rank's Peer buffer at Off) on the device; Final and Avg divide.
	ReducePeer
	// CopyPeer copies the previous rank's Peer buffer at Off to Buf[Off:].
	CopyPeer
)

var kindNames = []string{"nop", "copyout", "copyin", "reducein", "hostreduce", "reducepeer", "copypeer"}

func (k Kind) String() string { return kindNames[k] }

// BufID names a user buffer of a collective call.
type BufID int

// The user buffers. For in-place calls they are the same memory (for
// reduce-scatter and all-gather, the receive block sits at rank·block in it).
const (
	Send BufID = iota
	Recv
)

// Span is a range of the host arena in bytes.
type Span struct{ Off, Len int }

// Cond is a flag and a value: as a wait, "until Flag ≥ Value"; as a set,
// "store Value in Flag". Values count from 1 within one call.
type Cond struct {
	Flag  int
	Value uint64
}

// Step is one unit of a rank's schedule.
type Step struct {
	Lane   Lane
	Kind   Kind
	Buf    BufID
	Off    int
	Len    int
	Src    BufID
	SrcOff int
	Host   Span
	Hosts  []Span
	// Peer is the previous rank's buffer a ReducePeer/CopyPeer reads.
	Peer  BufID
	Final bool
	// Div, when not 0, is what a Final HostReduce of an average divides
	// by (the world size, when the step sums partial sums).
	Div int
	// DeviceFlags (on a Nop) asks for its Wait and Set to be carried out by
	// the lane's device stream, in order with the work queued on it (the
	// stream waits for the flag words and writes them), where the device
	// and transport allow it; elsewhere the CPU does, as for any Nop.
	DeviceFlags bool
	// Stage (on a ReduceIn) asks the device to copy the host sources into
	// its memory with the copy engines before reducing, where it can
	// (comm.StagingReducer), instead of its kernel reading them over the
	// link: worth it for large blocks read once (the ring's).
	Stage bool
	Wait  []Cond
	Set   []Cond
}

// Flags per rank: flag index = rank*FlagsPerRank + role.
const (
	FlagsPerRank = 11
	roleA        = 0 // staged / sent
	roleB        = 1 // reduced / consumed (hierarchical: group partial on the host)
	roleC        = 2 // fetched / arrived (hierarchical: result reduced)
	// RoleFin is the executor's end-of-call flag (value = call count).
	RoleFin = 3
	roleD   = 4 // hierarchical: fetched
	// The call's signature (signature.go), published before any other flag
	// of the call: what it is, and its size in two halves; calls of odd
	// number use the next three (two generations are kept).
	roleSig   = 5
	roleSigLo = 6
	roleSigHi = 7
)

// FlagOf is the index of rank r's flag for role.
func FlagOf(r, role int) int { return r*FlagsPerRank + role }

// Params shape a schedule.
type Params struct {
	Coll      Coll
	Algorithm Algorithm
	World     int
	// Bytes is the size of the per-rank send buffer for all-reduce and
	// broadcast, of one rank's block for reduce-scatter and all-gather.
	Bytes int
	// ElemSize is the element size; every split is on element boundaries.
	ElemSize int
	// Avg asks for the average: final reductions divide.
	Avg bool
	// InPlace: Send and Recv are the same memory.
	InPlace bool
	// Root of a broadcast.
	Root int
	// Chunk is the slot size in bytes; Slots the number of slots per FIFO
	// (or per rank in the host-staged arena): the pipeline depth.
	Chunk int
	Slots int
	// Piece is the bytes that each pipeline step of a host-staged
	// all-reduce without a device share moves, each staged at the start of
	// a slot of its own (0: Chunk). Pieces smaller than the slots shorten a
	// call of one or two chunks (its copies out, reductions and copies
	// back overlap); a longer call runs in whole chunks. At most Chunk, a
	// multiple of 64 and at least 64·world·elemsize; like Chunk, the same
	// on every rank (PieceFor derives it from the call's size).
	Piece int
	// Parity picks which of the two input areas a HostStagedSmall call
	// stages into; consecutive small calls must alternate it (the previous
	// call's inputs may still be read by slower ranks). A broadcast's
	// chunks start at slot Parity: consecutive broadcasts alternate it too,
	// so that one of a single chunk stages where the one before did not
	// (needsFenceAfter).
	Parity int
	// Groups maps every rank to its group (Hierarchical): the ranks that
	// share one GPU's host link.
	Groups Grouping
	// SmallOnDevice makes a HostStagedSmall all-reduce reduce on the
	// devices: every rank's stream waits for the peers' staged inputs
	// itself (DeviceFlags) and reduces them from mapped host memory into
	// the receive buffer (ReduceIn), with no CPU step between the copy out
	// and the result. Like Chunk, the same on every rank.
	//
	// On a HostStaged broadcast of at most one chunk it puts the flags on
	// the device the same way (buildBroadcastOnDevice): the root's stream
	// copies out and raises its staged flag, a peer's stream waits for that
	// flag and copies in, so the whole call can be queued at once (stream
	// order, Executor.RunOrdered). Its flags and slot are the CPU
	// schedule's, so ranks may differ in it call by call.
	SmallOnDevice bool
	// GPUShare is the part of every chunk of a HostStaged all-reduce, in
	// thousandths (GPUShareOne: all), that the ranks' devices reduce from
	// the peers' staged inputs in mapped host memory instead of the CPU
	// threads (split.go); 0 is the plain host-staged schedule.
	GPUShare int
}

// Schedule is every rank's steps for one collective call.
type Schedule struct {
	Params Params
	// Steps[r] are rank r's steps in order (each lane keeps this order).
	Steps [][]Step
	// HostBytes is how much of the arena the schedule uses.
	HostBytes int
}

// ArenaBytes is the arena size that every schedule with this world, chunk
// and slot count fits in.
func ArenaBytes(world, chunk, slots int) int { return (world + 1) * slots * chunk }

// Validate checks parameters up front.
func (p Params) Validate() error {
	switch {
	case p.World < 1:
		return fmt.Errorf("world size %d: %w", p.World, ErrUnsupported)
	case p.ElemSize < 1:
		return fmt.Errorf("element size %d: %w", p.ElemSize, ErrUnsupported)
	case p.Bytes < 0 || p.Bytes%p.ElemSize != 0:
		return fmt.Errorf("%d bytes is not a whole number of %d-byte elements: %w", p.Bytes, p.ElemSize, ErrUnsupported)
	case p.Slots < 1:
		return fmt.Errorf("%d slots: %w", p.Slots, ErrUnsupported)
	case p.Chunk < 64*p.World*p.ElemSize || p.Chunk%64 != 0:
		return fmt.Errorf("chunk of %d bytes must be a multiple of 64 and at least 64·world·elemsize: %w", p.Chunk, ErrUnsupported)
	case p.Root < 0 || p.Root >= p.World:
		return fmt.Errorf("root %d of %d ranks: %w", p.Root, p.World, ErrUnsupported)
	case p.GPUShare < 0 || p.GPUShare > GPUShareOne || p.GPUShare > 0 && (p.Algorithm != HostStaged || p.Coll != AllReduce):
		return fmt.Errorf("GPU share %d/%d of a %s %s: want 0..%d, and only for a host-staged all-reduce: %w",
			p.GPUShare, GPUShareOne, p.Algorithm, p.Coll, GPUShareOne, ErrUnsupported)
	case p.Bytes/max(64, p.step()/p.World&^63)*p.World+16 > MaxCondValue:
		// Every schedule counts its pieces (at least chunk/world bytes each)
		// in the flag values, which must stay below MaxCondValue.
		return fmt.Errorf("%d bytes in chunks of %d: too many pieces for one call's flag values (at most %d): use larger chunks: %w",
			p.Bytes, p.Chunk, MaxCondValue, ErrUnsupported)
	case p.Piece != 0 && (p.Piece > p.Chunk || p.Piece < 64*p.World*p.ElemSize || p.Piece%64 != 0):
		return fmt.Errorf("piece of %d bytes must be a multiple of 64, at least 64·world·elemsize and at most the chunk (%d): %w",
			p.Piece, p.Chunk, ErrUnsupported)
	case p.Piece != 0 && (p.Algorithm != HostStaged || p.Coll != AllReduce || p.GPUShare > 0):
		return fmt.Errorf("pieces smaller than the chunk for a %s %s (GPU share %d): only a host-staged all-reduce on the CPU has them: %w",
			p.Algorithm, p.Coll, p.GPUShare, ErrUnsupported)
	case p.Algorithm == Hierarchical && p.Coll == AllReduce && len(p.Groups) != p.World:
		return fmt.Errorf("hierarchical all-reduce of %d ranks with a grouping of %d: %w", p.World, len(p.Groups), ErrUnsupported)
	}
	return nil
}

// Build generates the schedule for p.
func Build(p Params) (Schedule, error) {
	if err := p.Validate(); err != nil {
		return Schedule{}, err
	}
	s := Schedule{Params: p, Steps: make([][]Step, p.World)}
	switch {
	case p.Coll == Barrier:
		buildBarrier(&s)
	case p.Algorithm == HostStaged && p.Coll == AllReduce && p.GPUShare > 0 && p.World > 1:
		buildSplitAllReduce(&s)
	case p.Algorithm == HostStaged && p.Coll == AllReduce:
		buildStagedAllReduce(&s)
	case p.Algorithm == HostStaged && p.Coll == ReduceScatter:
		buildStagedReduceScatter(&s)
	case p.Algorithm == HostStaged && p.Coll == AllGather:
		buildStagedAllGather(&s)
	case p.Algorithm == HostStaged && p.Coll == Broadcast:
		if p.Parity < 0 || p.Parity > 1 {
			return Schedule{}, fmt.Errorf("broadcast of parity %d: want 0 or 1: %w", p.Parity, ErrUnsupported)
		}
		if p.SmallOnDevice {
			if p.Bytes > p.Chunk {
				return Schedule{}, fmt.Errorf("broadcast of %d bytes with its flags on the device: at most one chunk (%d): %w",
					p.Bytes, p.Chunk, ErrUnsupported)
			}
			buildBroadcastOnDevice(&s)
			break
		}
		buildStagedBroadcast(&s)
	case p.Algorithm == Ring && p.Coll == AllReduce:
		buildRingAllReduce(&s)
	case p.Algorithm == RingIPC && p.Coll == AllReduce:
		buildIPCRingAllReduce(&s)
	case p.Algorithm == Hierarchical && p.Coll == AllReduce:
		buildHierarchicalAllReduce(&s)
	case p.Algorithm == HostStagedSmall && p.Coll == AllReduce:
		if p.Bytes > SmallCapacity(p.World, p.Chunk, p.Slots) || p.Parity < 0 || p.Parity > 1 {
			return Schedule{}, fmt.Errorf("%d bytes (parity %d) on the small-message path, which holds %d: %w",
				p.Bytes, p.Parity, SmallCapacity(p.World, p.Chunk, p.Slots), ErrUnsupported)
		}
		buildStagedSmallAllReduce(&s)
	default:
		return Schedule{}, fmt.Errorf("%s with the %s algorithm: %w", p.Coll, p.Algorithm, ErrUnsupported)
	}
	if v := s.maxValue(); v > MaxCondValue {
		return Schedule{}, fmt.Errorf("%d bytes in chunks of %d need flag values up to %d, above %d: use larger chunks: %w",
			p.Bytes, p.Chunk, v, MaxCondValue, ErrUnsupported)
	}
	return s, nil
}

// maxValue is the largest flag value any step waits for or sets.
func (s *Schedule) maxValue() uint64 {
	var v uint64
	for _, steps := range s.Steps {
		for i := range steps {
			for _, c := range steps[i].Wait {
				v = max(v, c.Value)
			}
			for _, c := range steps[i].Set {
				v = max(v, c.Value)
			}
		}
	}
	return v
}

// split returns the start of part i of n of a length in bytes, on element
// boundaries.
func split(length, es, n, i int) int { return (length / es * i / n) * es }

func ceilDiv(a, b int) int { return (a + b - 1) / b }

func allRanks(world, role int, v uint64) []Cond {
	c := make([]Cond, world)
	for q := range c {
		c[q] = Cond{Flag: FlagOf(q, role), Value: v}
	}
	return c
}

func buildBarrier(s *Schedule) {
	n := s.Params.World
	for r := range n {
		s.Steps[r] = []Step{
			{Lane: LaneIn, Kind: Nop, Set: []Cond{{FlagOf(r, roleC), 1}}},
			{Lane: LaneIn, Kind: Nop, Wait: allRanks(n, roleC, 1)},
		}
	}
}

// Host-staged arena: in[q][s] at (q*K+s)*C, out[s] at (n*K+s)*C.
func stagedIn(p Params, q, slot int) int { return (q*p.Slots + slot) * p.Chunk }
func stagedOut(p Params, slot int) int   { return (p.World*p.Slots + slot) * p.Chunk }

// PieceFor is the pipeline step (Params.Piece) of a host-staged all-reduce
// of bytes through world ranks' arena of slots chunks: a quarter of the
// chunk (or a half, where a quarter is not a multiple of 64 or is below
// 64·world·elemsize) for a call of at most slots/4 chunks, which whole
// chunks would cut into one to a few steps, so that its copies out,
// reductions and copies back overlap; else 0 (whole chunks). Measured on
// an H100 host, 7 ranks on one GPU, 2-MiB chunks, 8 slots (two rounds,
// docs/results/shm-2026-12-06.md, "Sixth session"): 2 MiB 0.76-0.82 ms in
// quarters against 0.98-1.11 whole, 4 MiB 1.29-1.34 against 1.49-1.55; from
// 8 MiB on level, and calls in pieces cost DDP's ranks CPU time (ResNet-18
// b8 0.6-0.9 ms a step slower with every call of fewer than 16 chunks in
// pieces).
func PieceFor(bytes, world, elemSize, chunk, slots int) int {
	if ceilDiv(max(bytes, 1), chunk) > max(1, slots/4) {
		return 0
	}
	least := 64 * world * elemSize
	for _, piece := range []int{chunk / 4, chunk / 2} {
		if piece >= least && piece%64 == 0 {
			return piece
		}
	}
	return 0
}

// step is the bytes of one pipeline step of a host-staged all-reduce: the
// piece, or the chunk.
func (p Params) step() int {
	if p.Piece > 0 && p.Piece < p.Chunk {
		return p.Piece
	}
	return p.Chunk
}

func buildStagedAllReduce(s *Schedule) {
	p := s.Params
	n, K, C, es := p.World, p.Slots, p.step(), p.ElemSize
	nc := ceilDiv(p.Bytes, C)
	s.HostBytes = ArenaBytes(n, p.Chunk, K)
	for r := range n {
		var st []Step
		for c := range nc {
			off := c * C
			ln := min(C, p.Bytes-off)
			slot := c % K
			v := uint64(c + 1)
			out := Step{Lane: LaneOut, Kind: CopyOut, Buf: Send, Off: off, Len: ln,
				Host: Span{stagedIn(p, r, slot), ln}, Set: []Cond{{FlagOf(r, roleA), v}}}
			if c >= K {
				out.Wait = allRanks(n, roleC, uint64(c-K+1))
			}
			lo, hi := split(ln, es, n, r), split(ln, es, n, r+1)
			red := Step{Lane: LaneReduce, Kind: HostReduce, Host: Span{stagedOut(p, slot) + lo, hi - lo},
				Final: p.Avg, Wait: allRanks(n, roleA, v), Set: []Cond{{FlagOf(r, roleB), v}}}
			for q := range n {
				red.Hosts = append(red.Hosts, Span{stagedIn(p, q, slot) + lo, hi - lo})
			}
			in := Step{Lane: LaneIn, Kind: CopyIn, Buf: Recv, Off: off, Len: ln,
				Host: Span{stagedOut(p, slot), ln}, Wait: allRanks(n, roleB, v), Set: []Cond{{FlagOf(r, roleC), v}}}
			st = append(st, out, red, in)
		}
		s.Steps[r] = st
	}
}

// Small-message arena: rank q's input area for parity h at
// stagedIn(q, 0) + h·half, with half = K·C/2 (64-byte aligned); rank r's
// result area at stagedOut(0) + r·K·C/n (64-byte aligned).
func smallHalf(slots, chunk int) int { return (slots * chunk / 2) &^ 63 }
func smallOutStride(world, slots, chunk int) int {
	return (slots * chunk / world) &^ 63
}

// SmallCapacity is the largest all-reduce, in bytes, that the
// HostStagedSmall schedule can run in an arena of ArenaBytes(world, chunk,
// slots).
func SmallCapacity(world, chunk, slots int) int {
	return min(smallHalf(slots, chunk), smallOutStride(world, slots, chunk))
}

func buildStagedSmallAllReduce(s *Schedule) {
	p := s.Params
	n, B := p.World, p.Bytes
	s.HostBytes = ArenaBytes(n, p.Chunk, p.Slots)
	if B == 0 {
		return
	}
	in := func(q int) int { return stagedIn(p, q, 0) + p.Parity*smallHalf(p.Slots, p.Chunk) }
	if p.SmallOnDevice {
		buildSmallOnDevice(s, in)
		return
	}
	// One lane: the copy out, the reduction (after every rank staged) and the
	// copy in follow each other on one goroutine, with no hand-offs. Only
	// "staged" is published; nobody else reads this rank's result area, and
	// the next small call stages into the other parity's area.
	for r := range n {
		out := stagedOut(p, 0) + r*smallOutStride(n, p.Slots, p.Chunk)
		red := Step{Lane: LaneIn, Kind: HostReduce, Host: Span{out, B}, Final: p.Avg, Wait: allRanks(n, roleA, 1)}
		for q := range n {
			red.Hosts = append(red.Hosts, Span{in(q), B})
		}
		s.Steps[r] = []Step{
			{Lane: LaneIn, Kind: CopyOut, Buf: Send, Len: B, Host: Span{in(r), B}, Set: []Cond{{FlagOf(r, roleA), 1}}},
			red,
			{Lane: LaneIn, Kind: CopyIn, Buf: Recv, Len: B, Host: Span{out, B}},
		}
	}
}

// buildSmallOnDevice is the small all-reduce reduced on the devices: rank r
// stages its input at in(r) and marks it staged from its stream; its stream
// waits until every peer has staged, then copies in(0) into the receive
// buffer and reduces in(1..n-1) into it from mapped host memory. Every rank
// adds the inputs in rank order, so all get the same bits (those of the
// CPU path, which sums in that order too). Nothing but the flags is
// published, no arena area is written after the inputs, and the parity
// rule of the CPU path holds: a rank's stream stages its next input only
// after its previous reduction, which read the peers' inputs, has run.
func buildSmallOnDevice(s *Schedule, in func(q int) int) {
	p := s.Params
	n, B := p.World, p.Bytes
	for r := range n {
		st := []Step{{Lane: LaneIn, Kind: CopyOut, Buf: Send, Len: B, Host: Span{in(r), B}}}
		if n > 1 {
			var peers []Cond
			for q := range n {
				if q != r {
					peers = append(peers, Cond{FlagOf(q, roleA), 1})
				}
			}
			st = append(st,
				Step{Lane: LaneIn, Kind: Nop, DeviceFlags: true, Set: []Cond{{FlagOf(r, roleA), 1}}},
				Step{Lane: LaneIn, Kind: Nop, DeviceFlags: true, Wait: peers})
		}
		st = append(st, Step{Lane: LaneIn, Kind: CopyIn, Buf: Recv, Len: B, Host: Span{in(0), B}})
		if n > 1 {
			red := Step{Lane: LaneIn, Kind: ReduceIn, Buf: Recv, Src: Recv, Len: B, Final: p.Avg}
			for q := 1; q < n; q++ {
				red.Hosts = append(red.Hosts, Span{in(q), B})
			}
			st = append(st, red)
		}
		s.Steps[r] = st
	}
}

// pieceBytes is the per-destination piece of a slot when a slot holds one
// piece for every rank.
func pieceBytes(p Params) int { return (p.Chunk / p.World) &^ 63 }

func buildStagedReduceScatter(s *Schedule) {
	p := s.Params
	n, K, B := p.World, p.Slots, p.Bytes
	P := pieceBytes(p)
	nc := ceilDiv(B, P)
	s.HostBytes = ArenaBytes(n, p.Chunk, K)
	for r := range n {
		var st []Step
		for c := range nc {
			off := c * P
			ln := min(P, B-off)
			slot := c % K
			v := uint64(c + 1)
			for q := range n {
				out := Step{Lane: LaneOut, Kind: CopyOut, Buf: Send, Off: q*B + off, Len: ln,
					Host: Span{stagedIn(p, r, slot) + q*P, ln}}
				if q == 0 && c >= K {
					out.Wait = allRanks(n, roleB, uint64(c-K+1))
				}
				if q == n-1 {
					out.Set = []Cond{{FlagOf(r, roleA), v}}
				}
				st = append(st, out)
			}
			red := Step{Lane: LaneReduce, Kind: HostReduce, Host: Span{stagedOut(p, slot) + r*P, ln},
				Final: p.Avg, Wait: allRanks(n, roleA, v), Set: []Cond{{FlagOf(r, roleB), v}}}
			if c >= K {
				red.Wait = append(red.Wait, Cond{FlagOf(r, roleC), uint64(c - K + 1)})
			}
			for q := range n {
				red.Hosts = append(red.Hosts, Span{stagedIn(p, q, slot) + r*P, ln})
			}
			in := Step{Lane: LaneIn, Kind: CopyIn, Buf: Recv, Off: off, Len: ln,
				Host: Span{stagedOut(p, slot) + r*P, ln}, Wait: []Cond{{FlagOf(r, roleB), v}},
				Set: []Cond{{FlagOf(r, roleC), v}}}
			st = append(st, red, in)
		}
		s.Steps[r] = st
	}
}

func buildStagedAllGather(s *Schedule) {
	p := s.Params
	n, K, C, B := p.World, p.Slots, p.Chunk, p.Bytes
	nc := ceilDiv(B, C)
	s.HostBytes = ArenaBytes(n, C, K)
	for r := range n {
		var st []Step
		for c := range nc {
			off := c * C
			ln := min(C, B-off)
			slot := c % K
			v := uint64(c + 1)
			out := Step{Lane: LaneOut, Kind: CopyOut, Buf: Send, Off: off, Len: ln,
				Host: Span{stagedIn(p, r, slot), ln}, Set: []Cond{{FlagOf(r, roleA), v}}}
			if c >= K {
				out.Wait = allRanks(n, roleC, uint64(c-K+1))
			}
			st = append(st, out)
			for q := range n {
				in := Step{Lane: LaneIn, Kind: CopyIn, Buf: Recv, Off: q*B + off, Len: ln,
					Host: Span{stagedIn(p, q, slot), ln}}
				if q == r {
					// Its own block on the device from its send buffer
					// (nothing when in place), not back over the link.
					in = Step{Lane: LaneIn, Kind: ReduceIn, Buf: Recv, Off: q*B + off, Len: ln, Src: Send, SrcOff: off}
				}
				if q == 0 {
					in.Wait = allRanks(n, roleA, v)
				}
				if q == n-1 {
					in.Set = []Cond{{FlagOf(r, roleC), v}}
				}
				st = append(st, in)
			}
		}
		s.Steps[r] = st
	}
}

func buildStagedBroadcast(s *Schedule) {
	p := s.Params
	n, K, C, B, root := p.World, p.Slots, p.Chunk, p.Bytes, p.Root
	nc := ceilDiv(B, C)
	s.HostBytes = ArenaBytes(n, C, K)
	for r := range n {
		var st []Step
		for c := range nc {
			off := c * C
			ln := min(C, B-off)
			slot := (c + p.Parity) % K
			v := uint64(c + 1)
			if r == root {
				out := Step{Lane: LaneOut, Kind: CopyOut, Buf: Send, Off: off, Len: ln,
					Host: Span{stagedIn(p, 0, slot), ln}, Set: []Cond{{FlagOf(r, roleA), v}}}
				if c >= K {
					for q := range n {
						if q != root {
							out.Wait = append(out.Wait, Cond{FlagOf(q, roleC), uint64(c - K + 1)})
						}
					}
				}
				st = append(st, out)
				if !p.InPlace {
					// The root's own copy, on the device from its send
					// buffer (a ReduceIn of no host sources), beside the
					// copy out rather than back from the slot after it.
					// Nobody waits for it: the root reads no slot back.
					// One chunk: after the copy out on its lane, so that
					// the root's call runs on one lane (the calling
					// goroutine) and waits for one stream, not two.
					lane := LaneIn
					if nc == 1 {
						lane = LaneOut
					}
					st = append(st, Step{Lane: lane, Kind: ReduceIn, Buf: Recv, Off: off, Len: ln, Src: Send, SrcOff: off})
				}
				continue
			}
			st = append(st, Step{Lane: LaneIn, Kind: CopyIn, Buf: Recv, Off: off, Len: ln,
				Host: Span{stagedIn(p, 0, slot), ln}, Wait: []Cond{{FlagOf(root, roleA), v}},
				Set: []Cond{{FlagOf(r, roleC), v}}})
		}
		s.Steps[r] = st
	}
}

// buildBroadcastOnDevice is buildStagedBroadcast's one chunk with the flags
// on the devices, all on the in lane: the root's stream copies the chunk
// out to the same slot and raises the same staged flag itself (then, out of
// place, copies its own result on the device); a peer's stream waits for
// that flag and copies in. A peer raises no consumed flag: nothing waits
// for it with one chunk (the next call that could reuse the slot fences).
func buildBroadcastOnDevice(s *Schedule) {
	p := s.Params
	n, B, root := p.World, p.Bytes, p.Root
	s.HostBytes = ArenaBytes(n, p.Chunk, p.Slots)
	if B == 0 {
		return
	}
	slot := Span{stagedIn(p, 0, p.Parity%p.Slots), B}
	staged := Cond{FlagOf(root, roleA), 1}
	for r := range n {
		if r == root {
			st := []Step{
				{Lane: LaneIn, Kind: CopyOut, Buf: Send, Len: B, Host: slot},
				{Lane: LaneIn, Kind: Nop, DeviceFlags: true, Set: []Cond{staged}},
			}
			if !p.InPlace {
				st = append(st, Step{Lane: LaneIn, Kind: ReduceIn, Buf: Recv, Len: B, Src: Send})
			}
			s.Steps[r] = st
			continue
		}
		s.Steps[r] = []Step{
			{Lane: LaneIn, Kind: Nop, DeviceFlags: true, Wait: []Cond{staged}},
			{Lane: LaneIn, Kind: CopyIn, Buf: Recv, Len: B, Host: slot},
		}
	}
}

// Ring arena: FIFO r→r+1 has slots at (r*K+s)*C.
func ringSlot(p Params, r, slot int) int { return (r*p.Slots + slot) * p.Chunk }

func buildRingAllReduce(s *Schedule) {
	p := s.Params
	n, K, C, es, S := p.World, p.Slots, p.Chunk, p.ElemSize, p.Bytes
	s.HostBytes = ArenaBytes(n, C, K)
	if n == 1 {
		if !p.InPlace && S > 0 {
			// One rank: the result is the input; move it through the arena.
			for c := range ceilDiv(S, C) {
				off := c * C
				ln := min(C, S-off)
				v := uint64(c + 1)
				st := []Step{
					{Lane: LaneOut, Kind: CopyOut, Buf: Send, Off: off, Len: ln, Host: Span{ringSlot(p, 0, 0), ln},
						Wait: condIf(c > 0, Cond{FlagOf(0, roleB), uint64(c)}), Set: []Cond{{FlagOf(0, roleA), v}}},
					{Lane: LaneIn, Kind: CopyIn, Buf: Recv, Off: off, Len: ln, Host: Span{ringSlot(p, 0, 0), ln},
						Wait: []Cond{{FlagOf(0, roleA), v}}, Set: []Cond{{FlagOf(0, roleB), v}}},
				}
				s.Steps[0] = append(s.Steps[0], st...)
			}
		}
		return
	}
	blockOff := func(b int) int { return split(S, es, n, b) }
	blockLen := func(b int) int { return blockOff(b+1) - blockOff(b) }
	maxBlock := 0
	for b := range n {
		maxBlock = max(maxBlock, blockLen(b))
	}
	nch := max(1, ceilDiv(maxBlock, C))
	chunk := func(b, j int) (int, int) {
		bl := blockLen(b)
		lo, hi := split(bl, es, nch, j), split(bl, es, nch, j+1)
		return blockOff(b) + lo, hi - lo
	}
	mod := func(x int) int { return ((x % n) + n) % n }
	for r := range n {
		next, prev := mod(r+1), mod(r-1)
		var st []Step
		for t := range 2 * (n - 1) {
			sb, rb := mod(r-t), mod(r-t-1)
			for j := range nch {
				g := t*nch + j
				slot := g % K
				off, ln := chunk(sb, j)
				send := Step{Lane: LaneOut, Kind: CopyOut, Buf: Recv, Off: off, Len: ln,
					Host: Span{ringSlot(p, r, slot), ln}, Set: []Cond{{FlagOf(r, roleA), uint64(g + 1)}}}
				if t == 0 {
					send.Buf = Send
				}
				if g >= K {
					send.Wait = append(send.Wait, Cond{FlagOf(next, roleB), uint64(g - K + 1)})
				}
				if t >= 1 {
					send.Wait = append(send.Wait, Cond{FlagOf(r, roleB), uint64((t-1)*nch + j + 1)})
				}
				roff, rln := chunk(rb, j)
				recv := Step{Lane: LaneIn, Kind: CopyIn, Buf: Recv, Off: roff, Len: rln,
					Host:  Span{ringSlot(p, prev, slot), rln},
					Wait:  []Cond{{FlagOf(prev, roleA), uint64(g + 1)}},
					Set:   []Cond{{FlagOf(r, roleB), uint64(g + 1)}},
					Final: false}
				if t < n-1 {
					recv.Kind = ReduceIn
					recv.Src, recv.SrcOff = Send, roff
					recv.Stage = true
					recv.Hosts = []Span{recv.Host}
					recv.Host = Span{}
					recv.Final = p.Avg && t == n-2
				}
				st = append(st, send, recv)
			}
		}
		s.Steps[r] = st
	}
}

func condIf(ok bool, c Cond) []Cond {
	if ok {
		return []Cond{c}
	}
	return nil
}

// buildIPCRingAllReduce: 2(n-1) steps on one lane. Reduce-scatter step t:
// rank r sets Recv[b] = Send[b] op prev's (t == 0 ? Send : Recv)[b] for
// b = r-t-1; all-gather step t: Recv[b] = prev's Recv[b] for b = r-t. Before
// step g a rank waits until both neighbours finished step g-1: the previous
// rank has produced what it reads, and the next rank no longer reads what
// it overwrites.
func buildIPCRingAllReduce(s *Schedule) {
	p := s.Params
	n, es, S := p.World, p.ElemSize, p.Bytes
	if n == 1 {
		// One rank is its own previous rank: copy its send buffer.
		if !p.InPlace && S > 0 {
			s.Steps[0] = []Step{{Lane: LaneIn, Kind: CopyPeer, Buf: Recv, Len: S, Peer: Send}}
		}
		return
	}
	blockOff := func(b int) int { return split(S, es, n, b) }
	mod := func(x int) int { return ((x % n) + n) % n }
	for r := range n {
		next, prev := mod(r+1), mod(r-1)
		var st []Step
		for g := range 2 * (n - 1) {
			var b int
			step := Step{Lane: LaneIn, Buf: Recv, Set: []Cond{{FlagOf(r, roleA), uint64(g + 1)}}}
			if g < n-1 {
				b = mod(r - g - 1)
				step.Kind, step.Src, step.Peer = ReducePeer, Send, Recv
				if g == 0 {
					step.Peer = Send
				}
				step.Final = p.Avg && g == n-2
			} else {
				b = mod(r - (g - (n - 1)))
				step.Kind, step.Peer = CopyPeer, Recv
			}
			step.Off = blockOff(b)
			step.Len = blockOff(b+1) - step.Off
			step.SrcOff = step.Off
			if g > 0 {
				step.Wait = []Cond{{FlagOf(prev, roleA), uint64(g)}, {FlagOf(next, roleA), uint64(g)}}
			}
			st = append(st, step)
		}
		s.Steps[r] = st
	}
}
