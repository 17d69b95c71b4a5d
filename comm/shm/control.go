package shm

import (
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"
)

// Line is the stride of every shared counter: one cache line each, so that
// writers on different cores never share a line.
const Line = 64

// dataAlign aligns the data arena to a page.
const dataAlign = 4096

const magic = 0x6d6967636f6d6d31 // "migcomm1"

// ErrLayout reports a segment whose header does not match the expected layout.
var ErrLayout = errors.New("shm layout mismatch")

// Layout is the shape of a job's segment: a header line, one line per rank
// (heartbeat and pid), Flags sequence flags, then DataBytes of arena.
type Layout struct {
	World     int
	Flags     int
	DataBytes int
}

func (l Layout) ranksOff() int { return Line }
func (l Layout) flagsOff() int { return l.ranksOff() + l.World*Line }
func (l Layout) dataOff() int {
	return (l.flagsOff() + l.Flags*Line + dataAlign - 1) &^ (dataAlign - 1)
}

// Size is the segment size the layout needs.
func (l Layout) Size() int { return l.dataOff() + l.DataBytes }

// Control is a Layout laid over a mapped segment.
type Control struct {
	mem []byte
	l   Layout
}

// Init writes the header of a freshly created segment.
func Init(mem []byte, l Layout) (*Control, error) {
	c, err := view(mem, l)
	if err != nil {
		return nil, err
	}
	c.u64(16).Store(uint64(l.World))
	c.u64(24).Store(uint64(l.Flags))
	c.u64(32).Store(uint64(l.DataBytes))
	c.u64(0).Store(magic)
	return c, nil
}

// Attach checks the header of a segment another rank initialised.
func Attach(mem []byte, l Layout) (*Control, error) {
	c, err := view(mem, l)
	if err != nil {
		return nil, err
	}
	if c.u64(0).Load() != magic || c.u64(16).Load() != uint64(l.World) ||
		c.u64(24).Load() != uint64(l.Flags) || c.u64(32).Load() != uint64(l.DataBytes) {
		return nil, fmt.Errorf("segment header does not match world %d, %d flags, %d data bytes: %w",
			l.World, l.Flags, l.DataBytes, ErrLayout)
	}
	return c, nil
}

func view(mem []byte, l Layout) (*Control, error) {
	if l.World <= 0 || l.Flags < 0 || l.DataBytes < 0 {
		return nil, fmt.Errorf("layout %+v: %w", l, ErrLayout)
	}
	if len(mem) < l.Size() {
		return nil, fmt.Errorf("segment of %d bytes is smaller than layout's %d: %w", len(mem), l.Size(), ErrLayout)
	}
	if uintptr(unsafe.Pointer(unsafe.SliceData(mem)))%Line != 0 {
		return nil, fmt.Errorf("segment memory not aligned to %d bytes: %w", Line, ErrLayout)
	}
	return &Control{mem: mem, l: l}, nil
}

func (c *Control) u64(off int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&c.mem[off]))
}

// Layout is the layout the control block was built with.
func (c *Control) Layout() Layout { return c.l }

// Abort is the job's abort word: 0 while healthy; the first rank to fail
// stores a nonzero word with CompareAndSwap(0, w) (package comm encodes in
// it the rank at fault, the raising rank and the cause).
func (c *Control) Abort() *atomic.Uint64 { return c.u64(8) }

// Heartbeat is rank r's liveness counter, bumped periodically by its owner.
func (c *Control) Heartbeat(r int) *atomic.Uint64 { return c.u64(c.l.ranksOff() + r*Line) }

// PID is rank r's process id, written by the rank when it attaches.
func (c *Control) PID(r int) *atomic.Uint64 { return c.u64(c.l.ranksOff() + r*Line + 8) }

// Flag is sequence flag i. Each flag has exactly one writing rank and only
// grows; readers wait for it to reach a value.
func (c *Control) Flag(i int) *atomic.Uint64 { return c.u64(c.l.flagsOff() + i*Line) }

// FlagMemory is the segment's head up to the arena, page-aligned at both
// ends: the header, every rank's line and every flag. A device registers it
// (apart from the arena) to wait for and write flags itself.
func (c *Control) FlagMemory() []byte { return c.mem[:c.l.dataOff()] }

// FlagBytes is flag i's 8-byte word within FlagMemory.
func (c *Control) FlagBytes(i int) []byte {
	off := c.l.flagsOff() + i*Line
	return c.mem[off : off+8 : off+8]
}

// Data is the arena: slots of FIFOs and host-staged buffers.
func (c *Control) Data() []byte { return c.mem[c.l.dataOff():c.l.Size()] }
