package allreduce

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// garbage marks bytes nobody wrote.
const garbage = uint64(1) << 63

// simulate runs a schedule as data: every byte of every buffer and of the
// arena holds its position in the send buffer (bits 16 and up) and the set
// of ranks whose input it contains (a bit mask in the low 16 bits). Steps
// run in a random order that respects lanes and flags; copies move masks,
// reductions merge them and fail on a contribution counted twice or on
// garbage. It returns every rank's receive buffer.
func simulate(s Schedule, rng *rand.Rand) ([][]uint64, error) {
	p := s.Params
	n := p.World
	sendLen, recvLen := p.Bytes, p.Bytes
	switch p.Coll {
	case ReduceScatter:
		sendLen = n * p.Bytes
	case AllGather:
		recvLen = n * p.Bytes
	}
	type rankMem struct {
		send, recv []uint64
		sendBase   int
		recvBase   int
	}
	mem := make([]rankMem, n)
	for r := range n {
		m := &mem[r]
		m.send = make([]uint64, sendLen)
		for i := range m.send {
			m.send[i] = uint64(i)<<16 | 1<<r
		}
		if p.InPlace {
			switch p.Coll {
			case ReduceScatter:
				m.recv, m.recvBase = m.send, r*p.Bytes
			case AllGather:
				m.recv = make([]uint64, recvLen)
				for i := range m.recv {
					m.recv[i] = garbage
				}
				copy(m.recv[r*p.Bytes:], m.send)
				m.send, m.sendBase = m.recv, r*p.Bytes
			default:
				m.recv = m.send
			}
		} else {
			m.recv = make([]uint64, recvLen)
			for i := range m.recv {
				m.recv[i] = garbage
			}
		}
	}
	arena := make([]uint64, ArenaBytes(n, p.Chunk, p.Slots))
	for i := range arena {
		arena[i] = garbage
	}
	flags := map[int]uint64{}
	head := make([][NumLanes]int, n)
	lanes := make([][NumLanes][]Step, n)
	for r := range n {
		for _, st := range s.Steps[r] {
			lanes[r][st.Lane] = append(lanes[r][st.Lane], st)
		}
	}
	user := func(r int, id BufID, off, ln int) ([]uint64, error) {
		b, base := mem[r].send, mem[r].sendBase
		if id == Recv {
			b, base = mem[r].recv, mem[r].recvBase
		}
		if off < 0 || base+off+ln > len(b) {
			return nil, fmt.Errorf("rank %d: user span [%d,+%d) outside %d", r, base+off, ln, len(b))
		}
		return b[base+off : base+off+ln], nil
	}
	host := func(sp Span) ([]uint64, error) {
		if sp.Off < 0 || sp.Off+sp.Len > len(arena) || sp.Off+sp.Len > s.HostBytes {
			return nil, fmt.Errorf("host span %+v outside the arena", sp)
		}
		return arena[sp.Off : sp.Off+sp.Len], nil
	}
	merge := func(dst []uint64, srcs ...[]uint64) error {
		out := make([]uint64, len(dst))
		for i := range out {
			for _, s := range srcs {
				if s[i]&garbage != 0 {
					return fmt.Errorf("reduction reads garbage")
				}
				if out[i] != 0 && out[i]>>16 != s[i]>>16 {
					return fmt.Errorf("reduction mixes byte %d with byte %d", out[i]>>16, s[i]>>16)
				}
				if out[i]&s[i]&0xffff != 0 {
					return fmt.Errorf("contribution %#x counted twice", out[i]&s[i]&0xffff)
				}
				out[i] |= s[i]
			}
		}
		copy(dst, out)
		return nil
	}
	exec := func(r int, st Step) error {
		if st.Off%p.ElemSize != 0 || st.Len%p.ElemSize != 0 || st.Host.Off%p.ElemSize != 0 {
			return fmt.Errorf("rank %d: %s step not on element boundaries", r, st.Kind)
		}
		switch st.Kind {
		case CopyOut:
			u, err := user(r, st.Buf, st.Off, st.Len)
			if err != nil {
				return err
			}
			h, err := host(st.Host)
			if err != nil {
				return err
			}
			copy(h, u)
		case CopyIn:
			u, err := user(r, st.Buf, st.Off, st.Len)
			if err != nil {
				return err
			}
			h, err := host(st.Host)
			if err != nil {
				return err
			}
			copy(u, h)
		case ReduceIn:
			d, err := user(r, st.Buf, st.Off, st.Len)
			if err != nil {
				return err
			}
			src, err := user(r, st.Src, st.SrcOff, st.Len)
			if err != nil {
				return err
			}
			srcs := [][]uint64{append([]uint64(nil), src...)}
			for _, sp := range st.Hosts {
				h, err := host(Span{sp.Off, st.Len})
				if err != nil {
					return err
				}
				srcs = append(srcs, h)
			}
			return merge(d, srcs...)
		case ReducePeer, CopyPeer:
			prev := (r + n - 1) % n
			d, err := user(r, st.Buf, st.Off, st.Len)
			if err != nil {
				return err
			}
			peer, err := user(prev, st.Peer, st.Off, st.Len)
			if err != nil {
				return err
			}
			if st.Kind == CopyPeer {
				copy(d, peer)
				return nil
			}
			src, err := user(r, st.Src, st.SrcOff, st.Len)
			if err != nil {
				return err
			}
			return merge(d, append([]uint64(nil), src...), append([]uint64(nil), peer...))
		case HostReduce:
			d, err := host(st.Host)
			if err != nil {
				return err
			}
			var srcs [][]uint64
			for _, sp := range st.Hosts {
				h, err := host(sp)
				if err != nil {
					return err
				}
				srcs = append(srcs, h)
			}
			return merge(d, srcs...)
		}
		return nil
	}
	for {
		type ready struct{ r, l int }
		var cand []ready
		left := false
		for r := range n {
			for l := range NumLanes {
				if head[r][l] >= len(lanes[r][l]) {
					continue
				}
				left = true
				st := lanes[r][l][head[r][l]]
				ok := true
				for _, c := range st.Wait {
					if flags[c.Flag] < c.Value {
						ok = false
					}
				}
				if ok {
					cand = append(cand, ready{r, int(l)})
				}
			}
		}
		if !left {
			break
		}
		if len(cand) == 0 {
			return nil, fmt.Errorf("deadlock: no step can run (heads %v)", head)
		}
		c := cand[rng.IntN(len(cand))]
		st := lanes[c.r][c.l][head[c.r][c.l]]
		head[c.r][c.l]++
		if err := exec(c.r, st); err != nil {
			return nil, err
		}
		for _, set := range st.Set {
			if set.Flag/FlagsPerRank != c.r {
				return nil, fmt.Errorf("rank %d sets rank %d's flag", c.r, set.Flag/FlagsPerRank)
			}
			if set.Value <= flags[set.Flag] {
				return nil, fmt.Errorf("flag %d set to %d after %d: flags must grow", set.Flag, set.Value, flags[set.Flag])
			}
			flags[set.Flag] = set.Value
		}
	}
	out := make([][]uint64, n)
	for r := range n {
		out[r] = mem[r].recv[mem[r].recvBase : mem[r].recvBase+map[bool]int{true: p.Bytes, false: recvLen}[p.Coll == ReduceScatter]]
	}
	return out, nil
}

func TestSchedulesAsData(t *testing.T) {
	type build struct {
		coll Coll
		alg  Algorithm
	}
	builds := []build{{AllReduce, HostStaged}, {AllReduce, Ring}, {AllReduce, RingIPC}, {ReduceScatter, HostStaged},
		{AllGather, HostStaged}, {Broadcast, HostStaged}, {Barrier, HostStaged}}
	rng := rand.New(rand.NewPCG(3, 4))
	for _, b := range builds {
		for world := 1; world <= 6; world++ {
			for _, es := range []int{1, 2, 8} {
				for _, slots := range []int{1, 3} {
					chunk := 64 * world * es * (1 + rng.IntN(2))
					chunk = (chunk + 63) &^ 63
					for _, elems := range []int{0, 1, world - 1, world + 1, 3*chunk/es + 7, rng.IntN(5 * chunk / es)} {
						for _, inPlace := range []bool{false, true} {
							p := Params{Coll: b.coll, Algorithm: b.alg, World: world, Bytes: elems * es, ElemSize: es,
								InPlace: inPlace, Root: rng.IntN(world), Chunk: chunk, Slots: slots}
							name := fmt.Sprintf("%s/%s/n%d/es%d/k%d/c%d/b%d/inplace=%v", b.coll, b.alg, world, es, slots, chunk, p.Bytes, inPlace)
							s, err := Build(p)
							require.NoError(t, err, name)
							require.LessOrEqual(t, s.HostBytes, ArenaBytes(world, chunk, slots), name)
							for trial := range 2 {
								got, err := simulate(s, rand.New(rand.NewPCG(uint64(trial), uint64(elems))))
								require.NoError(t, err, name)
								for r := range world {
									for i, m := range got[r] {
										want := uint64(i)<<16 | (1<<world - 1)
										switch b.coll {
										case AllGather:
											want = uint64(i%p.Bytes)<<16 | 1<<(i/p.Bytes)
										case Broadcast:
											want = uint64(i)<<16 | 1<<p.Root
										case ReduceScatter:
											want = uint64(r*p.Bytes+i)<<16 | (1<<world - 1)
										case Barrier:
											continue
										}
										if m != want {
											require.Failf(t, "wrong result", "%s trial %d: rank %d byte %d holds %#x, want %#x", name, trial, r, i, m, want)
										}
									}
								}
							}
						}
					}
				}
			}
		}
	}
}

func TestBuildRejects(t *testing.T) {
	ok := Params{Coll: AllReduce, World: 2, Bytes: 64, ElemSize: 4, Chunk: 4096, Slots: 2}
	tests := []struct {
		desc string
		edit func(*Params)
	}{
		{"no ranks", func(p *Params) { p.World = 0 }},
		{"partial element", func(p *Params) { p.Bytes = 6 }},
		{"no slots", func(p *Params) { p.Slots = 0 }},
		{"chunk too small for the world", func(p *Params) { p.World = 64; p.Chunk = 4096 }},
		{"chunk not a multiple of 64", func(p *Params) { p.Chunk = 4100 }},
		{"root outside the world", func(p *Params) { p.Root = 2 }},
		{"ring reduce-scatter", func(p *Params) { p.Coll = ReduceScatter; p.Algorithm = Ring }},
	}
	_, err := Build(ok)
	require.NoError(t, err)
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			p := ok
			tc.edit(&p)
			_, err := Build(p)
			require.ErrorIs(t, err, ErrUnsupported)
		})
	}
}

func TestRingMovesLessThanItShould(t *testing.T) {
	// The ring moves 2(n-1)/n of the buffer out and in per rank; host-staged
	// moves the whole buffer once each way. Counted from the schedules.
	for _, n := range []int{2, 4, 7} {
		const S = 7 * 64 * 1024
		for _, alg := range []Algorithm{Ring, HostStaged} {
			s, err := Build(Params{Coll: AllReduce, Algorithm: alg, World: n, Bytes: S, ElemSize: 4, Chunk: 64 << 10, Slots: 4})
			require.NoError(t, err)
			out, in := 0, 0
			for _, st := range s.Steps[0] {
				switch st.Kind {
				case CopyOut:
					out += st.Len
				case CopyIn, ReduceIn:
					in += st.Len
				}
			}
			if alg == Ring {
				require.InDelta(t, float64(2*(n-1))*S/float64(n), float64(out), float64(n*4), "ring out, n=%d", n)
				require.InDelta(t, float64(2*(n-1))*S/float64(n), float64(in), float64(n*4), "ring in, n=%d", n)
			} else {
				require.Equal(t, S, out, "host-staged out, n=%d", n)
				require.Equal(t, S, in, "host-staged in, n=%d", n)
			}
		}
	}
}
