package comm

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/migctl/migctl/internal/cuda"
)

// Stream words: a CUDA stream that waits for and writes flag words of
// registered host memory itself (the small all-reduce reduced on the
// devices, allreduce.Params.SmallOnDevice).

var (
	_ WordDevice = (*CUDADevice)(nil)
	_ WordStream = (*cudaStream)(nil)
)

// StreamWords reports whether this device's streams can wait for and write
// words of registered host memory (nil), else why not. The first call
// probes the driver: a stream waits for a word the CPU stores, then writes
// another; drivers without the entry points, or whose wait never sees the
// CPU's store within a second, fail it.
func (d *CUDADevice) StreamWords() error {
	d.wordsOnce.Do(func() {
		if err := d.probeWords(); err != nil {
			d.wordsErr = fmt.Errorf("stream memory operations on this device: %w", err)
		}
	})
	return d.wordsErr
}

func (d *CUDADevice) probeWords() error {
	page, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return fmt.Errorf("mapping a probe page: %w", err)
	}
	// A stream that never drains keeps its page, registration and handle:
	// closing it would block, and freeing what it may still touch is worse.
	stuck := false
	defer func() {
		if !stuck {
			_ = unix.Munmap(page)
		}
	}()
	if err := d.Register(page); err != nil {
		return err
	}
	defer func() {
		if !stuck {
			_ = d.Unregister(page)
		}
	}()
	st, err := d.NewStream()
	if err != nil {
		return err
	}
	defer func() {
		if !stuck {
			_ = st.Close()
		}
	}()
	s := st.(*cudaStream)
	// The stream waits as for call 3 of a collective; the CPU releases it
	// the way a failed rank does (the latest epoch plus 2^62: the device's
	// >= wraps), which must pass.
	gate, out := page[0:8], page[64:72]
	if err := s.WaitWord(gate, 3<<32|1); err != nil {
		return err
	}
	werr := s.WriteWord(out, 7)
	(*atomic.Uint64)(unsafe.Pointer(&gate[0])).Store(3<<32 + 1<<62)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := s.Synchronize(ctx); err != nil {
		stuck = errors.Is(err, context.DeadlineExceeded)
		return fmt.Errorf("a stream waiting for a word the CPU stored: %w", err)
	}
	if werr != nil {
		return werr
	}
	if got := (*atomic.Uint64)(unsafe.Pointer(&out[0])).Load(); got != 7 {
		return fmt.Errorf("a stream wrote 7 to a host word, read back %d", got)
	}
	return nil
}

// wordOp queues op (a stream memory operation of the driver) on the
// device address of word w, an 8-byte aligned word of registered memory.
func (s *cudaStream) wordOp(w []byte, what string, op func(p cuda.DevicePtr) error) error {
	if len(w) != 8 || hostAddr(w)%8 != 0 {
		return fmt.Errorf("a stream word is 8 bytes at an 8-byte boundary, not %d at %#x: %w", len(w), hostAddr(w), ErrInvalid)
	}
	if err := s.check(); err != nil {
		return err
	}
	p, err := s.d.mapped(w)
	if err != nil {
		return err
	}
	if err := s.d.bind(); err != nil {
		return err
	}
	defer s.d.unbind()
	if err := op(p); err != nil {
		return fmt.Errorf("queueing a flag %s: %w", what, err)
	}
	return nil
}

// WriteWord queues word = v (cuStreamWriteValue64 with its default memory
// barrier: the store follows the writes of the work before it).
func (s *cudaStream) WriteWord(w []byte, v uint64) error {
	return s.wordOp(w, "write", func(p cuda.DevicePtr) error {
		return s.d.api.StreamWriteValue64(s.s, p, v, cuda.StreamWriteValueDefault)
	})
}

// WaitWord queues a wait until word ≥ v (cuStreamWaitValue64, GEQ).
func (s *cudaStream) WaitWord(w []byte, v uint64) error {
	return s.wordOp(w, "wait", func(p cuda.DevicePtr) error {
		return s.d.api.StreamWaitValue64(s.s, p, v, cuda.StreamWaitValueGEQ)
	})
}
