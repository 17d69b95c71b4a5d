package shm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

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
}

// Name is the segment's name (the file name under the root).
func (s *Segment) Name() string { return s.name }

// Bytes is the mapped memory. It stays valid until Close.
func (s *Segment) Bytes() []byte { return s.mem }

// SegmentName builds a segment name for a job: Prefix, the creator's pid (so
// Sweep can tell orphans), the job and a tag.
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
	return &Segment{root: root, name: name, mem: mem}, nil
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
	return &Segment{root: root, name: name, mem: mem}, nil
}

func mmap(fd, size int) ([]byte, error) {
	if size == 0 {
		return []byte{}, nil
	}
	return unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
}

// Unlink removes the segment's name; mappings stay valid. Idempotent.
func (s *Segment) Unlink() error {
	err := unix.Unlink(filepath.Join(s.root, s.name))
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unlinking shm segment %s: %w", s.name, err)
	}
	return nil
}

// Close unmaps the segment. The memory must not be used afterwards.
func (s *Segment) Close() error {
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
		return &Segment{mem: []byte{}}, nil
	}
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mapping %d anonymous bytes: %w", size, err)
	}
	return &Segment{name: "anonymous", mem: mem}, nil
}
