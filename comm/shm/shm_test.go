package shm

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/migctl/migctl/internal/testutil"
)

func TestSegmentLifecycle(t *testing.T) {
	root := t.TempDir()
	name := SegmentName("job/1", "ctl")
	require.NotContains(t, name[len(Prefix):], "/")
	a, err := Create(root, name, 8192)
	require.NoError(t, err)
	_, err = Create(root, name, 8192)
	require.Error(t, err, "names are exclusive")
	b, err := Open(root, name, 8192)
	require.NoError(t, err)
	_, err = Open(root, name, 4096)
	require.ErrorIs(t, err, ErrBadName, "size mismatch")
	a.Bytes()[100] = 42
	require.Equal(t, byte(42), b.Bytes()[100], "both mappings see the same memory")
	require.NoError(t, a.Unlink())
	require.NoError(t, a.Unlink(), "unlink is idempotent")
	_, err = os.Stat(filepath.Join(root, name))
	require.True(t, os.IsNotExist(err))
	b.Bytes()[101] = 7
	require.Equal(t, byte(7), a.Bytes()[101], "mappings outlive the name")
	require.NoError(t, a.Close())
	require.NoError(t, b.Close())
	_, err = Create(root, "../escape", 10)
	require.ErrorIs(t, err, ErrBadName)
}

func TestSweepRemovesOrphans(t *testing.T) {
	root := t.TempDir()
	// A segment whose creator is a process that has exited.
	cmd := exec.Command("true")
	require.NoError(t, cmd.Run())
	dead := cmd.Process.Pid
	orphan := filepath.Join(root, Prefix+itoa(dead)+"-job-ctl")
	require.NoError(t, os.WriteFile(orphan, []byte("x"), 0o600))
	live := SegmentName("job", "ctl")
	s, err := Create(root, live, 4096)
	require.NoError(t, err)
	defer s.Close()
	other := filepath.Join(root, "not-ours")
	require.NoError(t, os.WriteFile(other, nil, 0o600))
	gone, err := Sweep(root)
	require.NoError(t, err)
	require.Equal(t, []string{filepath.Base(orphan)}, gone)
	_, err = os.Stat(filepath.Join(root, live))
	require.NoError(t, err, "a live creator's segment stays")
	_, err = os.Stat(other)
	require.NoError(t, err, "foreign files stay")
}

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	var b []byte
	for ; i > 0; i /= 10 {
		b = append([]byte{byte('0' + i%10)}, b...)
	}
	return string(b)
}

func TestControlLayoutAndFlags(t *testing.T) {
	l := Layout{World: 3, Flags: 12, DataBytes: 1 << 16}
	seg, err := Anonymous(l.Size())
	require.NoError(t, err)
	defer seg.Close()
	c, err := Init(seg.Bytes(), l)
	require.NoError(t, err)
	_, err = Attach(seg.Bytes(), Layout{World: 4, Flags: 12, DataBytes: 1 << 16})
	require.ErrorIs(t, err, ErrLayout)
	d, err := Attach(seg.Bytes(), l)
	require.NoError(t, err)
	require.Len(t, d.Data(), 1<<16)
	require.Zero(t, uintptrOf(d.Data())%4096, "arena is page aligned")
	// Flags, heartbeats, pids and data never overlap.
	c.Flag(11).Store(5)
	c.Heartbeat(2).Store(6)
	c.PID(2).Store(7)
	c.Abort().Store(8)
	d.Data()[0] = 9
	require.Equal(t, uint64(5), d.Flag(11).Load())
	require.Equal(t, uint64(6), d.Heartbeat(2).Load())
	require.Equal(t, uint64(7), d.PID(2).Load())
	require.Equal(t, uint64(8), d.Abort().Load())
	for i := range 11 {
		require.Zero(t, d.Flag(i).Load())
	}
}

func TestSleepFlagWakes(t *testing.T) {
	l := Layout{World: 2, Flags: 2}
	seg, err := Anonymous(l.Size())
	require.NoError(t, err)
	defer seg.Close()
	c, err := Init(seg.Bytes(), l)
	require.NoError(t, err)
	require.False(t, c.SleepFlag(0, 1, time.Millisecond), "times out below the value")
	var wg sync.WaitGroup
	woke := make(chan time.Duration, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		start := time.Now()
		for !c.SleepFlag(0, 3, 10*time.Second) {
		}
		woke <- time.Since(start)
	}()
	time.Sleep(20 * time.Millisecond)
	c.SetFlag(0, 1) // below the value: the sleeper goes back to sleep
	c.SetFlag(0, 3)
	wg.Wait()
	require.Less(t, <-woke, 5*time.Second, "a store wakes the sleeper long before its timeout")
	require.True(t, c.SleepFlag(0, 3, time.Millisecond))
}

func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

func TestOpenPathChecks(t *testing.T) {
	seg, err := CreateUnnamed(t.TempDir(), 8192)
	require.NoError(t, err)
	defer seg.Close()
	_, err = OpenPath(seg.Path(), seg.Inode()+1, 8192)
	require.ErrorIs(t, err, ErrBadName, "another file behind the path")
	_, err = OpenPath(seg.Path(), seg.Inode(), 4096)
	require.ErrorIs(t, err, ErrBadName, "size mismatch")
	_, err = OpenPath("/etc/passwd", seg.Inode(), 8192)
	require.ErrorIs(t, err, ErrBadName, "only /proc/<pid>/fd/<n>")
	other, err := OpenPath(seg.Path(), seg.Inode(), 8192)
	require.NoError(t, err)
	defer other.Close()
	seg.Bytes()[7] = 9
	require.Equal(t, byte(9), other.Bytes()[7])
	require.NoError(t, seg.CloseFile())
	require.Empty(t, seg.Path())
	other.Bytes()[8] = 3
	require.Equal(t, byte(3), seg.Bytes()[8], "mappings outlive the file")
}

func TestCreateUnnamedFallsBackToMemfd(t *testing.T) {
	// procfs holds no files: the segment becomes a memfd.
	seg, err := CreateUnnamed("/proc", 4096)
	require.NoError(t, err)
	defer seg.Close()
	target, err := os.Readlink(seg.Path())
	require.NoError(t, err)
	require.Contains(t, target, "memfd:")
	other, err := OpenPath(seg.Path(), seg.Inode(), 4096)
	require.NoError(t, err)
	defer other.Close()
	seg.Bytes()[1] = 5
	require.Equal(t, byte(5), other.Bytes()[1])
}

func TestFSOf(t *testing.T) {
	fs, err := FSOf("/proc")
	require.NoError(t, err)
	require.Equal(t, FS{Name: "proc"}, fs)
	if st, err := os.Stat(DefaultRoot); err == nil && st.IsDir() {
		fs, err = FSOf(DefaultRoot)
		require.NoError(t, err)
		// /dev/shm is a tmpfs wherever POSIX shared memory works
		require.Equal(t, FS{Name: "tmpfs", Memory: true}, fs)
	}
	_, err = FSOf(filepath.Join(t.TempDir(), "missing"))
	require.ErrorIs(t, err, unix.ENOENT)
}

// A segment larger than a small tmpfs fails with ENOSPC and says how big
// the file system is and how to give a container more.
func TestCreateUnnamedOnAFullTmpfs(t *testing.T) {
	dir := testutil.MountTmpfs(t, 1<<20)
	_, err := CreateUnnamed(dir, 4<<20)
	require.ErrorIs(t, err, unix.ENOSPC)
	require.ErrorContains(t, err, dir+" holds 1 MiB, 1 MiB free")
	require.ErrorContains(t, err, "--shm-size")
	ents, rerr := os.ReadDir(dir)
	require.NoError(t, rerr)
	require.Empty(t, ents, "the failed segment leaves nothing behind")
	seg, err := CreateUnnamed(dir, 256<<10)
	require.NoError(t, err, "what fits is still created")
	require.NoError(t, seg.Close())
}

// LockRoot is held by one holder at a time: a second waits for the first
// to let go, and gives up when its context ends, naming the holder.
func TestLockRootExcludes(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	unlock, err := LockRoot(ctx, dir)
	require.NoError(t, err)
	got := make(chan func())
	go func() {
		u, err := LockRoot(ctx, dir)
		if err != nil {
			u = func() {}
		}
		got <- u
	}()
	select {
	case u := <-got:
		u()
		t.Fatal("a second holder took the lock while the first held it")
	case <-time.After(150 * time.Millisecond):
	}
	unlock()
	select {
	case u := <-got:
		u()
	case <-time.After(5 * time.Second):
		t.Fatal("the second holder never got the lock")
	}

	unlock, err = LockRoot(ctx, dir)
	require.NoError(t, err)
	defer unlock()
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	_, err = LockRoot(short, dir)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorContains(t, err, "waiting for the creation lock of "+dir)
	if _, statErr := os.Stat("/proc/locks"); statErr == nil {
		require.ErrorContains(t, err, fmt.Sprintf("(pid %d)", os.Getpid()))
	}

	u, err := LockRoot(ctx, filepath.Join(dir, "missing")) // nothing to lock: no wait, no panic
	require.NoError(t, err)
	u()
}
