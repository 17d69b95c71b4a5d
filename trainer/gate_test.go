package trainer

import (
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/internal/cuda"
)

// A gate on the gpu backend holds the work a caller queues on its stream
// after Order(stream, v) until Raise(v) or more; the host backend and swap
// jobs have none.
func TestGateOrdersTheCallersStream(t *testing.T) {
	fakes := make([]*cuda.Fake, 1)
	err := world(t, 1, blockingFakes(fakes, nil), func(g *Group) error {
		f := fakes[0]
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		_, _, release, err := fakePrimaryModule(f)
		if err != nil {
			return err
		}
		defer release()
		stream, err := f.StreamCreate(cuda.StreamNonBlocking)
		if err != nil {
			return err
		}
		gt, err := g.NewGate()
		if err != nil {
			return err
		}
		page := gt.word[:cap(gt.word)] // registered: the caller's stream writes a word of it
		after := (*atomic.Uint64)(unsafe.Pointer(&page[64]))
		dp, err := f.MemHostGetDevicePointer(unsafe.Pointer(&page[64]), 0)
		if err != nil {
			return err
		}
		gt.Raise(4)
		if err := gt.Order(uintptr(stream), 5); err != nil {
			return err
		}
		if err := f.StreamWriteValue64(stream, dp, 1, cuda.StreamWriteValueDefault); err != nil {
			return err
		}
		time.Sleep(20 * time.Millisecond)
		if after.Load() != 0 {
			return fmt.Errorf("work queued after Order(5) ran with the word at 4")
		}
		gt.Raise(5)
		for deadline := time.Now().Add(10 * time.Second); after.Load() != 1; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				return fmt.Errorf("the stream never went on after Raise(5)")
			}
		}
		if *gt.Word() != 5 {
			return fmt.Errorf("Word reads %d, want 5", *gt.Word())
		}
		return nil
	})
	require.NoError(t, err)

	err = world(t, 1, func(int) []Option { return []Option{WithBackend(BackendHost)} }, func(g *Group) error {
		if _, err := g.NewGate(); !errors.Is(err, ErrUnsupported) {
			return fmt.Errorf("NewGate on the host backend: %v, want ErrUnsupported", err)
		}
		return nil
	})
	require.NoError(t, err)
}
