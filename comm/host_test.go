package comm

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestHostDeviceStreamRunsInOrder(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dev := NewHostDevice(HostOptions{})
	defer dev.Close()
	s, err := dev.NewStream()
	require.NoError(t, err)
	defer s.Close()
	a, err := dev.Alloc(16)
	require.NoError(t, err)
	b, err := dev.Alloc(16)
	require.NoError(t, err)
	host := []byte{1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 4, 0, 0, 0}
	// a = host; b = a; b += host (int32); b /= 2; read b back.
	require.NoError(t, s.CopyFromHost(a, 0, host))
	require.NoError(t, s.CopyBuffer(b, 0, a, 0, 16))
	require.NoError(t, s.ReduceFromHost(b, 0, [][]byte{host}, Int32, Avg))
	require.NoError(t, s.Scale(b, 0, 16, Int32, 2))
	out := make([]byte, 16)
	require.NoError(t, s.CopyToHost(out, b, 0))
	ev, err := s.Record()
	require.NoError(t, err)
	require.NoError(t, ev.Wait(ctx))
	done, err := ev.Done()
	require.NoError(t, err)
	require.True(t, done)
	require.Equal(t, host, out)

	require.ErrorIs(t, s.CopyToHost(make([]byte, 8), a, 12), ErrInvalid, "out of range")
	require.NoError(t, s.Synchronize(ctx))
	require.NoError(t, s.Close())
	require.ErrorIs(t, s.CopyToHost(out, a, 0), ErrClosed)
	require.NoError(t, dev.Close())
	_, err = dev.Alloc(1)
	require.ErrorIs(t, err, ErrClosed)
}

// Under HoldYields a host stream with nothing queued runs new work on the
// caller's goroutine before enqueue returns; with work queued or running it
// queues behind it, in order; without the hold it always queues.
func TestHostStreamInlineUnderHold(t *testing.T) {
	dev := NewHostDevice(HostOptions{})
	defer dev.Close()
	st, err := dev.NewStream()
	require.NoError(t, err)
	defer st.Close()
	s := st.(*hostStream)

	release := HoldYields()
	ran := false
	require.NoError(t, s.enqueue(func() error { ran = true; return nil }))
	require.True(t, ran, "idle stream under HoldYields: the work runs before enqueue returns")

	// A piece queued before the hold is still running: what comes after it
	// under the hold waits for it.
	release()
	gate, started := make(chan struct{}), make(chan struct{})
	var order []int
	require.NoError(t, s.enqueue(func() error { close(started); <-gate; order = append(order, 1); return nil }))
	<-started
	release = HoldYields()
	defer release()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.enqueue(func() error { order = append(order, 2); return nil })
	}()
	select {
	case <-done: // queued behind the running piece, not run inline
	case <-time.After(5 * time.Second):
		t.Fatal("enqueue under HoldYields blocked behind running work")
	}
	close(gate)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, s.Synchronize(ctx))
	require.Equal(t, []int{1, 2}, order)
}

// A stream whose work failed skips what follows and still closes.
func TestHostStreamCloseAfterFailure(t *testing.T) {
	dev := NewHostDevice(HostOptions{})
	defer dev.Close()
	st, err := dev.NewStream()
	require.NoError(t, err)
	s := st.(*hostStream)
	boom := errors.New("boom")
	skipped := true
	require.NoError(t, s.enqueue(func() error { return boom }))
	_ = s.enqueue(func() error { skipped = false; return nil })
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Close hung after a failed piece of work")
	}
	require.True(t, skipped, "work after a failure ran")
	require.ErrorIs(t, s.enqueue(func() error { return nil }), ErrClosed)
}
