package comm

import (
	"context"
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
