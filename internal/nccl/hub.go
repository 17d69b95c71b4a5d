package nccl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"time"
)

// hub is the fake's bootstrap root and data plane of one communicator: it
// gathers every rank's request of a collective, computes every rank's
// result and sends it back.
type hub struct {
	lis     *net.TCPListener
	nonce   [16]byte
	timeout time.Duration
	conns   []net.Conn
}

type arrival struct {
	rank int
	req  request
	err  error
}

func (h *hub) run() {
	defer func() {
		for _, c := range h.conns {
			if c != nil {
				_ = c.Close()
			}
		}
	}()
	if !h.join() {
		return
	}
	n := len(h.conns)
	ch := make(chan arrival, n)
	for r, c := range h.conns {
		go func() {
			for {
				req, err := readRequest(c)
				ch <- arrival{rank: r, req: req, err: err}
				if err != nil {
					return
				}
			}
		}()
	}
	pending := make([][]request, n)
	var broken string // once set, every request fails with ErrRemote
	live := n
	for live > 0 {
		a := <-ch
		if a.err != nil {
			live--
			if broken == "" {
				broken = fmt.Sprintf("rank %d left the communicator", a.rank)
				if !errors.Is(a.err, io.EOF) {
					broken = fmt.Sprintf("rank %d left the communicator (%v)", a.rank, a.err)
				}
			}
			// Fail what the others are waiting for now.
			for r := range pending {
				for range pending[r] {
					_ = writeResponse(h.conns[r], ErrRemote, broken, nil)
				}
				pending[r] = nil
			}
			continue
		}
		if broken != "" {
			_ = writeResponse(h.conns[a.rank], ErrRemote, broken, nil)
			continue
		}
		pending[a.rank] = append(pending[a.rank], a.req)
		ready := true
		for r := range pending {
			ready = ready && len(pending[r]) > 0
		}
		if !ready {
			continue
		}
		reqs := make([]request, n)
		for r := range pending {
			reqs[r], pending[r] = pending[r][0], pending[r][1:]
		}
		outs, status, msg := compute(reqs)
		for r, c := range h.conns {
			var p []byte
			if status == 0 {
				p = outs[r]
			}
			_ = writeResponse(c, status, msg, p)
		}
	}
}

// join accepts every rank's hello, then tells them all to go on.
func (h *hub) join() bool {
	defer h.lis.Close()
	_ = h.lis.SetDeadline(time.Now().Add(h.timeout))
	nranks, joined := 0, 0
	for nranks == 0 || joined < nranks {
		c, err := h.lis.Accept()
		if err != nil {
			for _, c := range h.conns {
				if c != nil {
					_ = writeResponse(c, ErrSystem, fmt.Sprintf("only %d of %d ranks joined within %v", joined, nranks, h.timeout), nil)
				}
			}
			return false
		}
		var hello [24]byte
		_ = c.SetReadDeadline(time.Now().Add(h.timeout))
		if _, err := io.ReadFull(c, hello[:]); err != nil {
			_ = c.Close()
			continue
		}
		_ = c.SetReadDeadline(time.Time{})
		n := int(binary.LittleEndian.Uint32(hello[16:]))
		r := int(binary.LittleEndian.Uint32(hello[20:]))
		reject := ""
		switch {
		case [16]byte(hello[:16]) != h.nonce:
			reject = "unique id does not match this communicator's"
		case nranks != 0 && n != nranks:
			reject = fmt.Sprintf("rank %d asks for %d ranks, the first asked for %d", r, n, nranks)
		case n < 1 || r < 0 || r >= n:
			reject = fmt.Sprintf("rank %d of %d", r, n)
		}
		if reject == "" && nranks == 0 {
			nranks = n
			h.conns = make([]net.Conn, n)
		}
		if reject == "" && h.conns[r] != nil {
			reject = fmt.Sprintf("rank %d joined twice", r)
		}
		if reject != "" {
			_ = writeResponse(c, ErrInvalidArgument, reject, nil)
			_ = c.Close()
			continue
		}
		h.conns[r] = c
		joined++
	}
	for _, c := range h.conns {
		_ = writeResponse(c, 0, "", nil)
	}
	return true
}

// compute runs one collective over every rank's request: each rank's
// result, or a status and message when the ranks disagree.
func compute(reqs []request) ([][]byte, Result, string) {
	n := len(reqs)
	q := reqs[0]
	for r, x := range reqs {
		if x.op != q.op || x.dt != q.dt || x.count != q.count || x.red != q.red || x.root != q.root {
			return nil, ErrInvalidUsage, fmt.Sprintf("rank %d issued %s(count %d, %v, %v, root %d) while rank 0 issued %s(count %d, %v, %v, root %d)",
				r, opNames[x.op], x.count, x.dt, x.red, x.root, opNames[q.op], q.count, q.dt, q.red, q.root)
		}
	}
	es := q.dt.Size()
	b := q.count * es
	outs := make([][]byte, n)
	switch q.op {
	case opAllReduce, opReduceScatter:
		total := b
		if q.op == opReduceScatter {
			total = b * n
		}
		acc := append([]byte(nil), reqs[0].payload[:total]...)
		for r := 1; r < n; r++ {
			reduce(acc, reqs[r].payload[:total], q.dt, q.red)
		}
		if q.red == Avg {
			divide(acc, q.dt, n)
		}
		for r := range outs {
			if q.op == opAllReduce {
				outs[r] = acc
			} else {
				outs[r] = acc[r*b : (r+1)*b]
			}
		}
	case opAllGather:
		all := make([]byte, 0, b*n)
		for r := range reqs {
			all = append(all, reqs[r].payload[:b]...)
		}
		for r := range outs {
			outs[r] = all
		}
	case opBroadcast:
		for r := range outs {
			outs[r] = reqs[q.root].payload[:b]
		}
	default:
		return nil, ErrInvalidUsage, fmt.Sprintf("unknown collective %d", q.op)
	}
	return outs, 0, ""
}

// reduce sets acc = op(acc, x) elementwise.
func reduce(acc, x []byte, dt DataType, op RedOp) {
	le := binary.LittleEndian
	es := dt.Size()
	for i := 0; i+es <= len(acc); i += es {
		switch dt {
		case Int8, Int32, Int64:
			a, b := getInt(acc[i:], es), getInt(x[i:], es)
			putInt(acc[i:], es, apply(a, b, op))
		case Uint8, Uint32, Uint64:
			a, b := getUint(acc[i:], es), getUint(x[i:], es)
			putUint(acc[i:], es, apply(a, b, op))
		case Float64:
			a, b := math.Float64frombits(le.Uint64(acc[i:])), math.Float64frombits(le.Uint64(x[i:]))
			le.PutUint64(acc[i:], math.Float64bits(apply(a, b, op)))
		case Float32:
			a, b := math.Float32frombits(le.Uint32(acc[i:])), math.Float32frombits(le.Uint32(x[i:]))
			le.PutUint32(acc[i:], math.Float32bits(float32(apply(float64(a), float64(b), op))))
		case Float16, BFloat16:
			a, b := half(le.Uint16(acc[i:]), dt), half(le.Uint16(x[i:]), dt)
			le.PutUint16(acc[i:], toHalf(float32(apply(float64(a), float64(b), op)), dt))
		}
	}
}

// divide finishes an Avg: acc /= n (integers truncate).
func divide(acc []byte, dt DataType, n int) {
	le := binary.LittleEndian
	es := dt.Size()
	for i := 0; i+es <= len(acc); i += es {
		switch dt {
		case Int8, Int32, Int64:
			putInt(acc[i:], es, getInt(acc[i:], es)/int64(n))
		case Uint8, Uint32, Uint64:
			putUint(acc[i:], es, getUint(acc[i:], es)/uint64(n))
		case Float64:
			le.PutUint64(acc[i:], math.Float64bits(math.Float64frombits(le.Uint64(acc[i:]))/float64(n)))
		case Float32:
			le.PutUint32(acc[i:], math.Float32bits(math.Float32frombits(le.Uint32(acc[i:]))/float32(n)))
		case Float16, BFloat16:
			le.PutUint16(acc[i:], toHalf(half(le.Uint16(acc[i:]), dt)/float32(n), dt))
		}
	}
}

// apply is op on two elements of one of the fake's number kinds.
func apply[T int64 | uint64 | float64](a, b T, op RedOp) T {
	switch op {
	case Prod:
		return a * b
	case Max:
		return max(a, b)
	case Min:
		return min(a, b)
	}
	return a + b
}

func getInt(b []byte, es int) int64 {
	switch es {
	case 1:
		return int64(int8(b[0]))
	case 4:
		return int64(int32(binary.LittleEndian.Uint32(b)))
	}
	return int64(binary.LittleEndian.Uint64(b))
}

func putInt(b []byte, es int, v int64) { putUint(b, es, uint64(v)) }

func getUint(b []byte, es int) uint64 {
	switch es {
	case 1:
		return uint64(b[0])
	case 4:
		return uint64(binary.LittleEndian.Uint32(b))
	}
	return binary.LittleEndian.Uint64(b)
}

func putUint(b []byte, es int, v uint64) {
	switch es {
	case 1:
		b[0] = byte(v)
	case 4:
		binary.LittleEndian.PutUint32(b, uint32(v))
	default:
		binary.LittleEndian.PutUint64(b, v)
	}
}

// half decodes an IEEE binary16 or a bfloat16.
func half(h uint16, dt DataType) float32 {
	if dt == BFloat16 {
		return math.Float32frombits(uint32(h) << 16)
	}
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	man := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f: // inf, nan
		return math.Float32frombits(sign | 0xff<<23 | man<<13)
	case exp == 0 && man == 0:
		return math.Float32frombits(sign)
	case exp == 0: // subnormal
		f := float32(man) / 1024 / (1 << 14)
		if sign != 0 {
			return -f
		}
		return f
	}
	return math.Float32frombits(sign | (exp+112)<<23 | man<<13)
}

// toHalf encodes f as binary16 or bfloat16, rounding to nearest even.
func toHalf(f float32, dt DataType) uint16 {
	bits := math.Float32bits(f)
	if dt == BFloat16 {
		if f != f {
			return uint16(bits>>16) | 0x40
		}
		return uint16((bits + 0x7fff + (bits>>16)&1) >> 16)
	}
	sign := uint16(bits>>16) & 0x8000
	a := math.Abs(float64(f))
	switch {
	case f != f:
		return sign | 0x7e00
	case a >= 65520:
		return sign | 0x7c00
	case a < 1.0/(1<<24)/2: // below half the smallest subnormal
		return sign
	case a < 1.0/(1<<14): // subnormal: units of 2^-24
		return sign | uint16(math.RoundToEven(a*(1<<24)))
	}
	exp := int((bits>>23)&0xff) - 127 + 15
	man := bits & 0x7fffff
	// Round the 23-bit mantissa to 10 bits, to nearest even.
	r := man >> 13
	rest := man & 0x1fff
	if rest > 0x1000 || rest == 0x1000 && r&1 == 1 {
		r++
		if r == 0x400 {
			r = 0
			exp++
		}
	}
	if exp >= 0x1f {
		return sign | 0x7c00
	}
	return sign | uint16(exp)<<10 | uint16(r)
}
