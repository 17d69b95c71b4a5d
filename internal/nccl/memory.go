package nccl

import (
	"fmt"
	"sync"
	"unsafe"
)

// Memory gives the fake's collectives the bytes behind an address: the n
// bytes at addr, or an error wrapping ErrInvalidArgument when they are not
// all in memory it knows.
type Memory interface {
	Bytes(addr uintptr, n int) ([]byte, error)
}

var _ Memory = (*HostMemory)(nil)

// HostMemory maps the addresses the fake's collectives take to host memory:
// a test registers a slice, passes its address (Register's answer, plus an
// offset) as a buffer, and unregisters it when the collective is done. Safe
// for concurrent use.
type HostMemory struct {
	mu   sync.Mutex
	bufs map[uintptr][]byte
}

// NewHostMemory returns an empty registry.
func NewHostMemory() *HostMemory { return &HostMemory{bufs: map[uintptr][]byte{}} }

// Register makes b reachable at the address it returns (b's first byte);
// an empty b has no address (0). b must stay valid until Unregister.
func (m *HostMemory) Register(b []byte) uintptr {
	if len(b) == 0 {
		return 0
	}
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	m.mu.Lock()
	defer m.mu.Unlock()
	if old, ok := m.bufs[p]; !ok || len(old) < len(b) {
		m.bufs[p] = b
	}
	return p
}

// Unregister forgets b.
func (m *HostMemory) Unregister(b []byte) {
	if len(b) == 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.bufs, uintptr(unsafe.Pointer(unsafe.SliceData(b))))
}

// Bytes implements Memory: the n bytes at p, which must lie in one
// registered slice.
func (m *HostMemory) Bytes(p uintptr, n int) ([]byte, error) {
	if n == 0 {
		return nil, nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for base, b := range m.bufs {
		if p >= base && p-base+uintptr(n) <= uintptr(len(b)) {
			off := int(p - base)
			return b[off : off+n], nil
		}
	}
	return nil, fmt.Errorf("address %#x (%d bytes) is not in registered memory: %w", p, n, ErrInvalidArgument)
}
