package nccl

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// FakeVersion is the version code the fake reports (NCCL 2.21.5).
const FakeVersion = 22105

// DefaultFakeInitTimeout bounds how long the fake's CommInitRank waits for
// the other ranks of its communicator.
const DefaultFakeInitTimeout = time.Minute

var fakeMagic = [8]byte{'m', 'i', 'g', 'f', 'a', 'k', 'e', '1'}

// Fake is an Interface written in Go that behaves like NCCL over sockets,
// for tests without NCCL or a GPU (see the package documentation). Buffers
// are addresses in the Memory it was made with (a HostMemory, or a fake
// driver's device memory). Collectives run before they return (the stream
// is not used).
// GroupStart and GroupEnd only count: calls inside a group run as they are
// issued, so a group must not hold calls that wait on each other.
//
// GetUniqueID starts the communicator's hub in this process: a loopback TCP
// listener that every rank's CommInitRank connects to (ranks of other
// processes of this host too) and that runs each collective once every rank
// has issued it. A rank that goes away (CommAbort, a closed process) fails
// the collectives of all the others with ErrRemote.
type Fake struct {
	mem         Memory
	initTimeout time.Duration

	mu    sync.Mutex
	next  Comm
	comms map[Comm]*fakeComm
	depth atomic.Int32
}

var _ Interface = (*Fake)(nil)

// NewFake returns a fake NCCL whose buffers are addresses in mem.
func NewFake(mem Memory) *Fake {
	return &Fake{mem: mem, initTimeout: DefaultFakeInitTimeout, comms: map[Comm]*fakeComm{}, next: 0x1000}
}

// SetInitTimeout changes how long CommInitRank (and the hub) wait for every
// rank to join.
func (f *Fake) SetInitTimeout(d time.Duration) { f.initTimeout = d }

type fakeComm struct {
	mu           sync.Mutex // one collective at a time
	conn         net.Conn
	rank, nranks int
	aborted      atomic.Bool
	errMu        sync.Mutex
	async        error
	last         string
}

func (c *fakeComm) setErr(err error, msg string) {
	c.errMu.Lock()
	defer c.errMu.Unlock()
	c.last = msg
	if errors.Is(err, ErrRemote) && c.async == nil {
		c.async = err
	}
}

// GetVersion implements Interface.
func (f *Fake) GetVersion() (int, error) { return FakeVersion, nil }

// GetUniqueID implements Interface: it starts the communicator's hub.
func (f *Fake) GetUniqueID() (UniqueID, error) {
	var id UniqueID
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return id, fmt.Errorf("fake ncclGetUniqueId: listening: %v: %w", err, ErrSystem)
	}
	addr := lis.Addr().String()
	copy(id[:8], fakeMagic[:])
	binary.LittleEndian.PutUint16(id[8:10], uint16(len(addr)))
	copy(id[10:], addr)
	var nonce [16]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		_ = lis.Close()
		return id, fmt.Errorf("fake ncclGetUniqueId: %v: %w", err, ErrSystem)
	}
	copy(id[UniqueIDBytes-16:], nonce[:])
	h := &hub{lis: lis.(*net.TCPListener), nonce: nonce, timeout: f.initTimeout}
	go h.run()
	return id, nil
}

func parseID(id UniqueID) (addr string, nonce [16]byte, err error) {
	if [8]byte(id[:8]) != fakeMagic {
		return "", nonce, fmt.Errorf("unique id was not made by the fake's GetUniqueID: %w", ErrInvalidArgument)
	}
	n := int(binary.LittleEndian.Uint16(id[8:10]))
	if n == 0 || 10+n > UniqueIDBytes-16 {
		return "", nonce, fmt.Errorf("unique id holds a bad address length %d: %w", n, ErrInvalidArgument)
	}
	copy(nonce[:], id[UniqueIDBytes-16:])
	return string(id[10 : 10+n]), nonce, nil
}

// CommInitRank implements Interface: it joins the hub named by id and
// waits until all nranks ranks have.
func (f *Fake) CommInitRank(nranks int, id UniqueID, rank int) (Comm, error) {
	if nranks < 1 || rank < 0 || rank >= nranks {
		return 0, fmt.Errorf("ncclCommInitRank: rank %d of %d: %w", rank, nranks, ErrInvalidArgument)
	}
	addr, nonce, err := parseID(id)
	if err != nil {
		return 0, fmt.Errorf("ncclCommInitRank: %w", err)
	}
	conn, err := net.DialTimeout("tcp", addr, f.initTimeout)
	if err != nil {
		return 0, fmt.Errorf("ncclCommInitRank: reaching the bootstrap root at %s: %v: %w", addr, err, ErrSystem)
	}
	hello := make([]byte, 24)
	copy(hello, nonce[:])
	binary.LittleEndian.PutUint32(hello[16:], uint32(nranks))
	binary.LittleEndian.PutUint32(hello[20:], uint32(rank))
	_ = conn.SetDeadline(time.Now().Add(f.initTimeout + 5*time.Second))
	if _, err := conn.Write(hello); err != nil {
		_ = conn.Close()
		return 0, fmt.Errorf("ncclCommInitRank: %v: %w", err, ErrSystem)
	}
	if status, msg, _, err := readResponse(conn); err != nil {
		_ = conn.Close()
		return 0, fmt.Errorf("ncclCommInitRank: waiting for the other ranks: %v: %w", err, ErrRemote)
	} else if status != 0 {
		_ = conn.Close()
		return 0, fmt.Errorf("ncclCommInitRank: %s: %w", msg, Result(status))
	}
	_ = conn.SetDeadline(time.Time{})
	f.mu.Lock()
	defer f.mu.Unlock()
	f.next++
	c := f.next
	f.comms[c] = &fakeComm{conn: conn, rank: rank, nranks: nranks}
	return c, nil
}

func (f *Fake) comm(c Comm) (*fakeComm, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fc, ok := f.comms[c]
	if !ok {
		return nil, fmt.Errorf("communicator %#x: %w", uintptr(c), ErrInvalidArgument)
	}
	return fc, nil
}

// CommDestroy implements Interface: it waits for the collective in flight.
func (f *Fake) CommDestroy(c Comm) error {
	fc, err := f.comm(c)
	if err != nil {
		return fmt.Errorf("ncclCommDestroy: %w", err)
	}
	fc.mu.Lock()
	defer fc.mu.Unlock()
	f.mu.Lock()
	delete(f.comms, c)
	f.mu.Unlock()
	_ = fc.conn.Close()
	return nil
}

// CommAbort implements Interface: it closes the communicator at once; a
// collective in flight on it fails, and so do the other ranks'.
func (f *Fake) CommAbort(c Comm) error {
	fc, err := f.comm(c)
	if err != nil {
		return fmt.Errorf("ncclCommAbort: %w", err)
	}
	fc.aborted.Store(true)
	_ = fc.conn.Close()
	f.mu.Lock()
	delete(f.comms, c)
	f.mu.Unlock()
	return nil
}

// CommGetAsyncError implements Interface: ErrRemote once a peer has gone.
func (f *Fake) CommGetAsyncError(c Comm) error {
	fc, err := f.comm(c)
	if err != nil {
		return fmt.Errorf("ncclCommGetAsyncError: %w", err)
	}
	fc.errMu.Lock()
	defer fc.errMu.Unlock()
	return fc.async
}

// GetErrorString implements Interface.
func (f *Fake) GetErrorString(r Result) string {
	if n, ok := resultNames[r]; ok {
		return n.text
	}
	return "unknown result code"
}

// GetLastError implements Interface.
func (f *Fake) GetLastError(c Comm) string {
	fc, err := f.comm(c)
	if err != nil {
		return ""
	}
	fc.errMu.Lock()
	defer fc.errMu.Unlock()
	return fc.last
}

// GroupStart implements Interface.
func (f *Fake) GroupStart() error { f.depth.Add(1); return nil }

// GroupEnd implements Interface.
func (f *Fake) GroupEnd() error {
	if f.depth.Add(-1) < 0 {
		f.depth.Add(1)
		return fmt.Errorf("ncclGroupEnd without ncclGroupStart: %w", ErrInvalidUsage)
	}
	return nil
}

// Collective kinds on the wire.
const (
	opAllReduce byte = iota + 1
	opAllGather
	opReduceScatter
	opBroadcast
)

var opNames = map[byte]string{opAllReduce: "ncclAllReduce", opAllGather: "ncclAllGather",
	opReduceScatter: "ncclReduceScatter", opBroadcast: "ncclBroadcast"}

// AllReduce implements Interface.
func (f *Fake) AllReduce(send, recv uintptr, count int, dt DataType, op RedOp, c Comm, _ Stream) error {
	return f.collective(c, request{op: opAllReduce, dt: dt, red: op, count: count}, send, recv)
}

// AllGather implements Interface.
func (f *Fake) AllGather(send, recv uintptr, sendCount int, dt DataType, c Comm, _ Stream) error {
	return f.collective(c, request{op: opAllGather, dt: dt, count: sendCount}, send, recv)
}

// ReduceScatter implements Interface.
func (f *Fake) ReduceScatter(send, recv uintptr, recvCount int, dt DataType, op RedOp, c Comm, _ Stream) error {
	return f.collective(c, request{op: opReduceScatter, dt: dt, red: op, count: recvCount}, send, recv)
}

// Broadcast implements Interface.
func (f *Fake) Broadcast(send, recv uintptr, count int, dt DataType, root int, c Comm, _ Stream) error {
	return f.collective(c, request{op: opBroadcast, dt: dt, count: count, root: root}, send, recv)
}

type request struct {
	op      byte
	dt      DataType
	red     RedOp
	root    int
	count   int
	payload []byte
}

// sizes are the elements rank sends and receives in req.
func (r request) sizes(rank, nranks int) (send, recv int) {
	switch r.op {
	case opAllReduce:
		return r.count, r.count
	case opAllGather:
		return r.count, r.count * nranks
	case opReduceScatter:
		return r.count * nranks, r.count
	default: // broadcast
		if rank == r.root {
			return r.count, r.count
		}
		return 0, r.count
	}
}

func (f *Fake) collective(c Comm, req request, send, recv uintptr) error {
	name := opNames[req.op]
	fc, err := f.comm(c)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	fc.mu.Lock()
	defer fc.mu.Unlock()
	if fc.aborted.Load() {
		return fmt.Errorf("%s: communicator aborted: %w", name, ErrInvalidUsage)
	}
	if err := f.CommGetAsyncError(c); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	es := req.dt.Size()
	switch {
	case es == 0:
		return fmt.Errorf("%s: data type %d: %w", name, int(req.dt), ErrInvalidArgument)
	case req.count < 0:
		return fmt.Errorf("%s: count %d: %w", name, req.count, ErrInvalidArgument)
	case req.op == opBroadcast && (req.root < 0 || req.root >= fc.nranks):
		return fmt.Errorf("%s: root %d of %d ranks: %w", name, req.root, fc.nranks, ErrInvalidArgument)
	case (req.op == opAllReduce || req.op == opReduceScatter) && (req.red < Sum || req.red > Avg):
		return fmt.Errorf("%s: op %d: %w", name, int(req.red), ErrInvalidArgument)
	}
	sn, rn := req.sizes(fc.rank, fc.nranks)
	in, err := f.mem.Bytes(send, sn*es)
	if err != nil {
		return fmt.Errorf("%s: send buffer: %w", name, err)
	}
	out, err := f.mem.Bytes(recv, rn*es)
	if err != nil {
		return fmt.Errorf("%s: receive buffer: %w", name, err)
	}
	req.payload = in // written out before anything is read back: in place is safe
	if err := writeRequest(fc.conn, req); err != nil {
		err = fmt.Errorf("%s: sending to the peers: %v: %w", name, err, ErrRemote)
		fc.setErr(err, err.Error())
		return err
	}
	status, msg, payload, err := readResponse(fc.conn)
	if err != nil {
		err = fmt.Errorf("%s: waiting for the peers: %v: %w", name, err, ErrRemote)
		fc.setErr(err, err.Error())
		return err
	}
	if status != 0 {
		err := fmt.Errorf("%s: %s: %w", name, msg, Result(status))
		fc.setErr(err, msg)
		return err
	}
	if len(payload) != len(out) {
		return fmt.Errorf("%s: %d bytes back for a %d-byte receive buffer: %w", name, len(payload), len(out), ErrInternal)
	}
	copy(out, payload)
	return nil
}

// Wire format, little-endian. Request: op u8, dtype u8, redop u8, 0 u8,
// root i32, count u64, payload length u64, payload. Response: status i32,
// message length u32, message, payload length u64, payload.

func writeRequest(w io.Writer, r request) error {
	h := make([]byte, 24, 24+len(r.payload))
	h[0], h[1], h[2] = r.op, byte(r.dt), byte(r.red)
	binary.LittleEndian.PutUint32(h[4:], uint32(int32(r.root)))
	binary.LittleEndian.PutUint64(h[8:], uint64(r.count))
	binary.LittleEndian.PutUint64(h[16:], uint64(len(r.payload)))
	_, err := w.Write(append(h, r.payload...))
	return err
}

func readRequest(rd io.Reader) (request, error) {
	var h [24]byte
	if _, err := io.ReadFull(rd, h[:]); err != nil {
		return request{}, err
	}
	r := request{op: h[0], dt: DataType(h[1]), red: RedOp(h[2]), root: int(int32(binary.LittleEndian.Uint32(h[4:]))),
		count: int(binary.LittleEndian.Uint64(h[8:]))}
	n := binary.LittleEndian.Uint64(h[16:])
	if n > 1<<40 {
		return request{}, fmt.Errorf("request of %d bytes", n)
	}
	r.payload = make([]byte, n)
	_, err := io.ReadFull(rd, r.payload)
	return r, err
}

func writeResponse(w io.Writer, status Result, msg string, payload []byte) error {
	b := make([]byte, 8, 16+len(msg)+len(payload))
	binary.LittleEndian.PutUint32(b[0:], uint32(int32(status)))
	binary.LittleEndian.PutUint32(b[4:], uint32(len(msg)))
	b = append(b, msg...)
	b = binary.LittleEndian.AppendUint64(b, uint64(len(payload)))
	_, err := w.Write(append(b, payload...))
	return err
}

func readResponse(rd io.Reader) (status int, msg string, payload []byte, err error) {
	var h [8]byte
	if _, err = io.ReadFull(rd, h[:]); err != nil {
		return
	}
	status = int(int32(binary.LittleEndian.Uint32(h[0:])))
	m := make([]byte, binary.LittleEndian.Uint32(h[4:]))
	if _, err = io.ReadFull(rd, m); err != nil {
		return
	}
	var l [8]byte
	if _, err = io.ReadFull(rd, l[:]); err != nil {
		return
	}
	n := binary.LittleEndian.Uint64(l[:])
	if n > 1<<40 {
		err = fmt.Errorf("response of %d bytes", n)
		return
	}
	payload = make([]byte, n)
	_, err = io.ReadFull(rd, payload)
	return status, string(m), payload, err
}
