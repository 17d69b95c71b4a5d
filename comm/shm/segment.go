package shm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultRoot is where POSIX shared memory lives on Linux.
const DefaultRoot = "/dev/shm"

// Prefix starts the name of every segment this package creates.
const Prefix = "migctl-"

// ErrBadName reports a segment name with a path separator or no prefix.
var ErrBadName = errors.New("bad segment name")

// Segment is one mapped shared-memory file.
type Segment struct {
	root string
	name string
	mem  []byte
	fd   int // an unnamed segment's file, open until CloseFile; -1 otherwise
	ino  uint64
}

// Name is the segment's name (the file name under the root); "" for an
// unnamed segment.
func (s *Segment) Name() string { return s.name }

// Bytes is the mapped memory. It stays valid until Close.
func (s *Segment) Bytes() []byte { return s.mem }

// SegmentName builds a segment name for a job: Prefix, the creator's pid (so
// Sweep can tell orphans), the job and a tag. Never pass a secret as job:
// names are visible to every local user. Jobs use unnamed segments
// (CreateUnnamed); named ones remain for tools and tests.
func SegmentName(job, tag string) string {
	clean := func(s string) string {
		return strings.Map(func(r rune) rune {
			if r == '/' || r == 0 || r == '-' {
				return '_'
			}
			return r
		}, s)
	}
	return fmt.Sprintf("%s%d-%s-%s", Prefix, os.Getpid(), clean(job), clean(tag))
}

func check(name string) error {
	if !strings.HasPrefix(name, Prefix) || strings.ContainsRune(name, '/') || name == "." || name == ".." {
		return fmt.Errorf("segment %q: %w", name, ErrBadName)
	}
	return nil
}

// Create makes a new segment of size bytes (zeroed) and maps it. It fails if
// the name exists.
func Create(root, name string, size int) (*Segment, error) {
	if err := check(name); err != nil {
		return nil, err
	}
	if root == "" {
		root = DefaultRoot
	}
	p := filepath.Join(root, name)
	fd, err := unix.Open(p, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("creating shm segment %s: %w", p, err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		_ = unix.Unlink(p)
		return nil, fmt.Errorf("sizing shm segment %s to %d bytes: %w", p, size, err)
	}
	// Reserve the pages now: on a full tmpfs (a container's 64 MiB /dev/shm)
	// this fails cleanly instead of a SIGBUS on first touch later.
	if size > 0 {
		if err := unix.Fallocate(fd, 0, 0, int64(size)); err != nil && !errors.Is(err, unix.EOPNOTSUPP) {
			_ = unix.Unlink(p)
			return nil, fmt.Errorf("reserving %d bytes for shm segment %s (is %s big enough? see --shm-dir): %w", size, p, root, err)
		}
	}
	mem, err := mmap(fd, size)
	if err != nil {
		_ = unix.Unlink(p)
		return nil, fmt.Errorf("mapping shm segment %s: %w", p, err)
	}
	return &Segment{root: root, name: name, mem: mem, fd: -1}, nil
}

// CreateUnnamed makes a new segment of size bytes (zeroed) that has no name
// at any moment: an O_TMPFILE file in root (default /dev/shm, so that the
// size of that tmpfs applies), or a memfd where root cannot hold one. The
// kernel frees it when the last descriptor and mapping go, so a crash at
// any point leaks nothing. The file stays open until CloseFile; other
// processes of the same user open it, while it is open, through Path.
func CreateUnnamed(root string, size int) (*Segment, error) {
	if root == "" {
		root = DefaultRoot
	}
	fd, err := unix.Open(root, unix.O_RDWR|unix.O_TMPFILE|unix.O_CLOEXEC, 0o600)
	what := "unnamed shm segment in " + root
	if err != nil {
		if !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EINVAL) {
			return nil, fmt.Errorf("creating an %s: %w", what, err)
		}
		if fd, err = unix.MemfdCreate("migctl-shm", unix.MFD_CLOEXEC); err != nil {
			return nil, fmt.Errorf("creating a memfd shm segment (%s cannot hold unnamed files): %w", root, err)
		}
		what = "memfd shm segment"
	}
	fail := func(err error) (*Segment, error) {
		_ = unix.Close(fd)
		return nil, err
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		return fail(fmt.Errorf("sizing the %s to %d bytes: %w", what, size, err))
	}
	if size > 0 {
		if err := unix.Fallocate(fd, 0, 0, int64(size)); err != nil && !errors.Is(err, unix.EOPNOTSUPP) {
			return fail(fmt.Errorf("reserving %d bytes for the %s (%s): %w", size, what, spaceHint(root, err), err))
		}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fail(fmt.Errorf("stat of the %s: %w", what, err))
	}
	mem, err := mmap(fd, size)
	if err != nil {
		return fail(fmt.Errorf("mapping the %s: %w", what, err))
	}
	return &Segment{root: root, mem: mem, fd: fd, ino: st.Ino}, nil
}

// Path is where another process of the same user opens an unnamed segment
// (OpenPath) while its file is open here: /proc/<pid>/fd/<fd>. "" for a
// named segment or after CloseFile.
func (s *Segment) Path() string {
	if s.fd < 0 {
		return ""
	}
	return fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), s.fd)
}

// Inode identifies the segment's file (OpenPath checks it, so that a
// recycled pid or descriptor cannot hand over another file).
func (s *Segment) Inode() uint64 { return s.ino }

// CloseFile closes an unnamed segment's file once every process has opened
// it; the mappings stay valid. Idempotent; a no-op for named segments.
func (s *Segment) CloseFile() error {
	if s.fd < 0 {
		return nil
	}
	err := unix.Close(s.fd)
	s.fd = -1
	if err != nil {
		return fmt.Errorf("closing the shm segment file: %w", err)
	}
	return nil
}

// OpenPath maps the unnamed segment another process created (its Path),
// checking its size and inode.
func OpenPath(path string, ino uint64, size int) (*Segment, error) {
	var pid, n int
	if _, err := fmt.Sscanf(path, "/proc/%d/fd/%d", &pid, &n); err != nil || path != fmt.Sprintf("/proc/%d/fd/%d", pid, n) {
		return nil, fmt.Errorf("shm segment path %q: want /proc/<pid>/fd/<n>: %w", path, ErrBadName)
	}
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening shm segment %s (rank 0's file; same user, same host and pid namespace needed): %w", path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("stat of shm segment %s: %w", path, err)
	}
	if st.Ino != ino || st.Size != int64(size) {
		return nil, fmt.Errorf("shm segment %s is inode %d of %d bytes, want inode %d of %d: %w", path, st.Ino, st.Size, ino, size, ErrBadName)
	}
	mem, err := mmap(fd, size)
	if err != nil {
		return nil, fmt.Errorf("mapping shm segment %s: %w", path, err)
	}
	return &Segment{mem: mem, fd: -1, ino: ino}, nil
}

// Open maps an existing segment; size must match what was created.
func Open(root, name string, size int) (*Segment, error) {
	if err := check(name); err != nil {
		return nil, err
	}
	if root == "" {
		root = DefaultRoot
	}
	p := filepath.Join(root, name)
	fd, err := unix.Open(p, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening shm segment %s: %w", p, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("stat of shm segment %s: %w", p, err)
	}
	if st.Size != int64(size) {
		return nil, fmt.Errorf("shm segment %s has %d bytes, want %d: %w", p, st.Size, size, ErrBadName)
	}
	mem, err := mmap(fd, size)
	if err != nil {
		return nil, fmt.Errorf("mapping shm segment %s: %w", p, err)
	}
	return &Segment{root: root, name: name, mem: mem, fd: -1}, nil
}

func mmap(fd, size int) ([]byte, error) {
	if size == 0 {
		return []byte{}, nil
	}
	return unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
}

// Unlink removes the segment's name; mappings stay valid. Idempotent; a
// no-op for unnamed segments.
func (s *Segment) Unlink() error {
	if s.name == "" || s.name == "anonymous" {
		return nil
	}
	err := unix.Unlink(filepath.Join(s.root, s.name))
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unlinking shm segment %s: %w", s.name, err)
	}
	return nil
}

// Close unmaps the segment (and closes an unnamed segment's file). The
// memory must not be used afterwards.
func (s *Segment) Close() error {
	_ = s.CloseFile()
	if s.mem == nil || len(s.mem) == 0 {
		s.mem = nil
		return nil
	}
	err := unix.Munmap(s.mem)
	s.mem = nil
	if err != nil {
		return fmt.Errorf("unmapping shm segment %s: %w", s.name, err)
	}
	return nil
}

// LockRoot takes the creation lock of root ("" is DefaultRoot): an
// exclusive flock on the directory, held by one process of the host at a
// time, so that what one creator sees free on the file system is not taken
// by another between its look and its allocation. The returned function
// lets it go. Where root cannot be opened there is nothing to lock: the
// creation itself then fails and says why. A holder keeps it only from its
// look to its allocation, but a holder that stopped (a debugger, SIGSTOP)
// would keep it for ever: LockRoot gives up when ctx ends, naming the
// holder's pid where /proc/locks tells it.
func LockRoot(ctx context.Context, root string) (func(), error) {
	if root == "" {
		root = DefaultRoot
	}
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return func() {}, nil
	}
	unlock := func() { _ = unix.Close(fd) } // closing the last descriptor lets the lock go
	wait := 50 * time.Microsecond
	for {
		err = unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		switch {
		case err == nil:
			return unlock, nil
		case errors.Is(err, unix.EINTR):
			continue
		case !errors.Is(err, unix.EWOULDBLOCK):
			// No flock here (some file systems): nothing to exclude with.
			return unlock, nil
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			holder := ""
			if pid := lockHolder(fd); pid > 0 {
				holder = fmt.Sprintf(" (pid %d)", pid)
			}
			unlock()
			return nil, fmt.Errorf("waiting for the creation lock of %s, held by another process%s: %w", root, holder, ctx.Err())
		case <-t.C:
		}
		wait = min(2*wait, 20*time.Millisecond)
	}
}

// lockHolder is the pid that holds a flock on fd's file according to
// /proc/locks, or 0.
func lockHolder(fd int) int {
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil {
		return 0
	}
	b, err := os.ReadFile("/proc/locks")
	if err != nil {
		return 0
	}
	// "1: FLOCK  ADVISORY  WRITE 1234 00:1a:5678 0 EOF": pid, then
	// major:minor:inode with the device numbers in hex.
	want := fmt.Sprintf("%02x:%02x:%d", unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino)
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) >= 6 && f[1] == "FLOCK" && f[5] == want {
			if pid, err := strconv.Atoi(f[4]); err == nil {
				return pid
			}
		}
	}
	return 0
}

// Sweep removes segments under root whose creator process (the pid in the
// name) no longer exists, and returns their names.
func Sweep(root string) ([]string, error) {
	if root == "" {
		root = DefaultRoot
	}
	ents, err := os.ReadDir(root)
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", root, err)
	}
	var gone []string
	for _, e := range ents {
		n := e.Name()
		if !strings.HasPrefix(n, Prefix) {
			continue
		}
		pidStr, _, ok := strings.Cut(strings.TrimPrefix(n, Prefix), "-")
		if !ok {
			continue
		}
		pid, err := strconv.Atoi(pidStr)
		if err != nil || pid <= 0 || Alive(pid) {
			continue
		}
		if err := os.Remove(filepath.Join(root, n)); err == nil {
			gone = append(gone, n)
		}
	}
	return gone, nil
}

// Alive reports whether a process with this pid exists (on this host).
func Alive(pid int) bool {
	err := unix.Kill(pid, 0)
	return err == nil || errors.Is(err, unix.EPERM)
}

// Anonymous maps size bytes of zeroed, page-aligned memory that belongs to no
// file: a Layout for ranks that are goroutines of one process (tests).
// Release it with unix.Munmap via Segment.Close on the returned Segment.
func Anonymous(size int) (*Segment, error) {
	if size == 0 {
		return &Segment{mem: []byte{}, fd: -1}, nil
	}
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mapping %d anonymous bytes: %w", size, err)
	}
	return &Segment{name: "anonymous", mem: mem, fd: -1}, nil
}

// spaceHint says, for a failure to reserve a segment's memory in root, how
// big the file system is and how to give it more.
func spaceHint(root string, err error) string {
	var st unix.Statfs_t
	if !errors.Is(err, unix.ENOSPC) || unix.Statfs(root, &st) != nil {
		return fmt.Sprintf("is %s big enough? see --shm-dir", root)
	}
	mib := func(blocks uint64) uint64 { return blocks * uint64(st.Bsize) >> 20 }
	return fmt.Sprintf("%s holds %d MiB, %d MiB free; a container's /dev/shm is 64 MiB unless given more: "+
		"docker run --shm-size, a Kubernetes emptyDir with medium Memory mounted at /dev/shm, or a larger tmpfs with --shm-dir",
		root, mib(st.Blocks), mib(st.Bavail))
}
