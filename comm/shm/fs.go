package shm

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// FS is what kind of file system holds a directory of segments.
type FS struct {
	// Name is the file system's kind ("tmpfs", "ext2/3/4", ...; "magic 0x…"
	// for one this package does not name).
	Name string
	// Memory is whether its files are memory with no backing store
	// (tmpfs, hugetlbfs, ramfs). Only such mappings can be pinned for the
	// GPU (cuMemHostRegister): Linux refuses long-term pins of file pages
	// that a disk file system writes back, and the driver then answers
	// "invalid argument".
	Memory bool
}

var fsNames = map[int64]FS{
	unix.TMPFS_MAGIC:           {"tmpfs", true},
	unix.HUGETLBFS_MAGIC:       {"hugetlbfs", true},
	unix.RAMFS_MAGIC:           {"ramfs", true},
	unix.EXT4_SUPER_MAGIC:      {"ext2/3/4", false}, // one magic for the three
	unix.XFS_SUPER_MAGIC:       {"xfs", false},
	unix.BTRFS_SUPER_MAGIC:     {"btrfs", false},
	unix.OVERLAYFS_SUPER_MAGIC: {"overlayfs", false},
	unix.NFS_SUPER_MAGIC:       {"nfs", false},
	unix.PROC_SUPER_MAGIC:      {"proc", false},
	unix.SYSFS_MAGIC:           {"sysfs", false},
	0x65735546:                 {"fuse", false},
}

// FSOf reports the file system of dir.
func FSOf(dir string) (FS, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return FS{}, fmt.Errorf("statfs %s: %w", dir, err)
	}
	if fs, ok := fsNames[int64(st.Type)]; ok {
		return fs, nil
	}
	return FS{Name: fmt.Sprintf("magic %#x", uint64(st.Type))}, nil
}
