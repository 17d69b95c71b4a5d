package comm

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"syscall"

	"github.com/migctl/migctl/comm/shm"
)

// KV is the part of a rendezvous client that joining a job's shared memory
// needs (rendezvous.Client implements it).
type KV interface {
	Put(ctx context.Context, key string, value []byte) error
	Get(ctx context.Context, key string) ([]byte, error)
	Barrier(ctx context.Context, name string) error
}

// ShmJob is a job's shared control segment as mapped by one rank.
type ShmJob struct {
	Segment *shm.Segment
	Control *shm.Control
}

// Close unmaps the segment.
func (j *ShmJob) Close() error { return j.Segment.Close() }

const shmKey = "comm/shm/control"

// joinStep marks the steps of JoinShm; tests kill the process at each.
var joinStep = func(string) {}

// JoinShm maps the job's control segment. Rank 0 sweeps orphans of older
// versions under root, creates an unnamed segment with layout l
// (shm.CreateUnnamed: an O_TMPFILE file in root, or a memfd) and publishes
// where to open it (/proc/<pid>/fd/<n>, the inode and the layout) under a
// key; the other ranks open it from there. Once every rank has mapped it (a
// rendezvous barrier), rank 0 closes its file. The segment never has a
// name, so no crash at any step can leak it: the kernel frees it with the
// last mapping. Ranks other than 0 take the layout from rank 0 (l is ignored
// there). Every rank must run as the same user on the same host (and pid
// namespace) as rank 0. job is unused (kept for callers); no name carries it.
func JoinShm(ctx context.Context, kv KV, rank int, job, root string, l shm.Layout) (*ShmJob, error) {
	_ = job
	var seg *shm.Segment
	var ctl *shm.Control
	if rank == 0 {
		_, _ = shm.Sweep(root)
		joinStep("swept")
		var err error
		if seg, err = shm.CreateUnnamed(root, l.Size()); err != nil {
			return nil, err
		}
		joinStep("created")
		if ctl, err = shm.Init(seg.Bytes(), l); err != nil {
			_ = seg.Close()
			return nil, err
		}
		joinStep("initialised")
		v := fmt.Sprintf("%s %d %d %d %d", seg.Path(), seg.Inode(), l.World, l.Flags, l.DataBytes)
		if err := kv.Put(ctx, shmKey, []byte(v)); err != nil {
			_ = seg.Close()
			return nil, fmt.Errorf("publishing where the shm segment is: %w", err)
		}
		joinStep("published")
	} else {
		v, err := kv.Get(ctx, shmKey)
		if err != nil {
			return nil, fmt.Errorf("learning where the shm segment is: %w", err)
		}
		f := strings.Fields(string(v))
		if len(f) != 5 {
			return nil, fmt.Errorf("shm segment record %q: %w", v, ErrInvalid)
		}
		var nums [4]int
		for i := range nums {
			if nums[i], err = strconv.Atoi(f[i+1]); err != nil || nums[i] < 0 {
				return nil, fmt.Errorf("shm segment record %q: %w", v, ErrInvalid)
			}
		}
		l = shm.Layout{World: nums[1], Flags: nums[2], DataBytes: nums[3]}
		if seg, err = shm.OpenPath(f[0], uint64(nums[0]), l.Size()); err != nil {
			return nil, err
		}
		if ctl, err = shm.Attach(seg.Bytes(), l); err != nil {
			_ = seg.Close()
			return nil, err
		}
	}
	berr := kv.Barrier(ctx, "comm/shm/mapped")
	joinStep("mapped")
	berr = errors.Join(berr, seg.CloseFile())
	if berr != nil {
		_ = seg.Close()
		return nil, fmt.Errorf("waiting for every rank to map the shm segment: %w", berr)
	}
	joinStep("done")
	return &ShmJob{Segment: seg, Control: ctl}, nil
}

// ShmCapacity is the size in bytes of the filesystem of dir (the
// shared-memory root; "" is /dev/shm), or 0 when it cannot be read. Unlike
// what is free while ranks create their segments, every rank of a node sees
// the same.
func ShmCapacity(dir string) int64 {
	if dir == "" {
		dir = "/dev/shm"
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0
	}
	return int64(st.Blocks) * st.Bsize
}
