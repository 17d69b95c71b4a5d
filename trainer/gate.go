package trainer

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/migctl/migctl/comm"
)

// A Gate is a word of host memory that callers' CUDA streams wait for on
// the device: Order makes the work queued on a stream from then on wait
// until the word reaches a value, Raise stores a value. It lets a
// collective that the host sees finish (a host-staged one: its copies back
// are queued as its reduction proceeds) complete in stream order, as
// NCCL's do: a caller orders its stream after the collective's number at
// the issue and goes on; whoever finishes collectives raises the word to
// the number of the last one finished (failed ones too: a stream must never
// wait for a collective that will not come).
//
// The word's page stays mapped and registered for the life of the process:
// a stream may still wait for it after the group is closed, and the device
// would have to be idle to unregister it.
type Gate struct {
	word []byte
	dev  comm.WordOrderer
}

// NewGate returns a gate on the group's device. It is ErrUnsupported on the
// host backend, for a device whose streams cannot wait for host words, and
// in a swap job (the swap daemon idles a held rank's device, which a stream
// waiting for a peer's collective would never be).
func (g *Group) NewGate() (*Gate, error) {
	wo, ok := g.dev.(comm.WordOrderer)
	switch {
	case g.cfg.backend != BackendGPU || !ok:
		return nil, fmt.Errorf("stream-ordered completion needs the gpu backend (this group runs on %s): %w", g.cfg.backend, ErrUnsupported)
	case g.cfg.swapSocket != "":
		return nil, fmt.Errorf("stream-ordered completion in a swap job: %w", ErrUnsupported)
	}
	if err := wo.StreamWords(); err != nil {
		return nil, fmt.Errorf("%w: %w", err, ErrUnsupported)
	}
	page, err := unix.Mmap(-1, 0, unix.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("mapping a gate page: %w", err)
	}
	if err := g.dev.Register(page); err != nil {
		_ = unix.Munmap(page)
		return nil, fmt.Errorf("registering a gate page: %w", err)
	}
	return &Gate{word: page[:8], dev: wo}, nil
}

// Word is the gate's word, for code outside Go (a C ABI) to raise.
func (gt *Gate) Word() *uint64 { return (*uint64)(unsafe.Pointer(&gt.word[0])) }

// Raise stores v in the word: streams waiting for v or less go on.
func (gt *Gate) Raise(v uint64) { (*atomic.Uint64)(unsafe.Pointer(&gt.word[0])).Store(v) }

// Order makes the work queued on the caller's stream from now on wait
// until the word is at least v (a wrapping comparison: within 2^63 below
// the word passes). It returns at once.
func (gt *Gate) Order(stream uintptr, v uint64) error {
	if err := gt.dev.OrderStreamOnWord(stream, gt.word, v); err != nil {
		return fmt.Errorf("ordering the caller's stream after collective %d: %w", v, err)
	}
	return nil
}
