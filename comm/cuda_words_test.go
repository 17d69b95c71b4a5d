package comm_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/comm"
)

// checkStreamWords: a stream of d waits for a word of registered host
// memory that the CPU stores, then copies a device buffer out and writes a
// second word, which the CPU sees only with the copy done; misaligned or
// unregistered words are refused when queued.
func checkStreamWords(t *testing.T, d *comm.CUDADevice) {
	t.Helper()
	require.NoError(t, d.StreamWords())
	host := mmapArena(t, 8192)
	require.NoError(t, d.Register(host))
	defer func() { require.NoError(t, d.Unregister(host)) }()
	st, err := d.NewStream()
	require.NoError(t, err)
	defer func() { require.NoError(t, st.Close()) }()
	ws, ok := st.(comm.WordStream)
	require.True(t, ok)
	buf, err := d.Alloc(4096)
	require.NoError(t, err)
	defer func() { require.NoError(t, d.Free(buf)) }()
	src := host[4096:]
	for i := range src {
		src[i] = byte(i * 7)
	}
	require.NoError(t, st.CopyFromHost(buf, 0, src))
	ev := mustRecord(t, st)
	require.NoError(t, ev.Wait(context.Background()))
	clear(src)

	gate, done := host[0:8], host[64:72]
	word := func(b []byte) *atomic.Uint64 { return (*atomic.Uint64)(unsafe.Pointer(&b[0])) }
	require.NoError(t, ws.WaitWord(gate, 5))
	require.NoError(t, st.CopyToHost(src, buf, 0))
	require.NoError(t, ws.WriteWord(done, 9))
	time.Sleep(20 * time.Millisecond)
	require.Zero(t, word(done).Load(), "the stream waits for the gate")
	word(gate).Store(4)
	time.Sleep(5 * time.Millisecond)
	require.Zero(t, word(done).Load(), "4 < 5")
	word(gate).Store(6)
	deadline := time.Now().Add(10 * time.Second)
	for word(done).Load() != 9 {
		require.True(t, time.Now().Before(deadline), "the stream never wrote its word")
	}
	for i := range src {
		require.Equal(t, byte(i*7), src[i], "byte %d: the word came before the copy's data", i)
	}
	require.ErrorIs(t, ws.WriteWord(host[4:12], 1), comm.ErrInvalid, "misaligned")
	require.ErrorIs(t, ws.WaitWord(host[0:4], 1), comm.ErrInvalid, "not 8 bytes")
	other := make([]byte, 64)
	require.ErrorIs(t, ws.WaitWord(other[0:8], 1), comm.ErrInvalid, "not registered")
}

func TestCUDADeviceFakeStreamWords(t *testing.T) {
	_, d := newFakeCUDA(t, nil)
	checkStreamWords(t, d)
}

func TestCUDADeviceGPUStreamWords(t *testing.T) {
	checkStreamWords(t, gpuDevice(t))
}
