package comm

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/migctl/migctl/comm/shm"
	"github.com/migctl/migctl/internal/numa"
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
	// Node is the NUMA node this rank allocated the segment's memory
	// preferring (rank 0, JoinShmSized's node), -1 for none.
	Node int
}

// Close unmaps the segment.
func (j *ShmJob) Close() error { return j.Segment.Close() }

const shmKey = "comm/shm/control"

// shmFailed starts the record rank 0 publishes instead of the segment's
// when it could not create it.
const shmFailed = "failed: "

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
	return JoinShmSized(ctx, kv, rank, job, root, -1, func(int64, int64) shm.Layout { return l })
}

// JoinShmSized is JoinShm with the layout chosen by rank 0 from the size of
// the file system under root and what is free on it, while it holds the
// root's creation lock (shm.LockRoot) until its segment has its memory: the
// groups a job forms at once on a small /dev/shm (a pipeline's links) each
// see what the ones before took. size runs on rank 0 only. node, when 0 or
// more, is the NUMA node the segment's memory is preferred on (rank 0
// allocates it from a thread whose memory policy says so: numa.Start);
// ShmJob.Node says whether that was done.
func JoinShmSized(ctx context.Context, kv KV, rank int, job, root string, node int, size func(capacity, free int64) shm.Layout) (*ShmJob, error) {
	_ = job
	var seg *shm.Segment
	var ctl *shm.Control
	var l shm.Layout
	placed := -1
	if rank == 0 {
		_, _ = shm.Sweep(root)
		joinStep("swept")
		// A failure here is published, so that the other ranks stop
		// waiting for the segment and say why rather than time out.
		// Published even when ctx has ended (a lock wait that timed out).
		fail := func(err error) (*ShmJob, error) {
			pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_ = kv.Put(pctx, shmKey, []byte(shmFailed+err.Error()))
			return nil, err
		}
		unlock, err := shm.LockRoot(ctx, root)
		if err != nil {
			return fail(err)
		}
		l = size(ShmSpace(root))
		placeErr, err := numa.Start(numa.Placement{Node: node}, func() (err error) {
			seg, err = shm.CreateUnnamed(root, l.Size())
			return err
		})
		unlock()
		if err != nil {
			return fail(err)
		}
		if node >= 0 && placeErr == nil {
			placed = node
		}
		joinStep("created")
		if ctl, err = shm.Init(seg.Bytes(), l); err != nil {
			_ = seg.Close()
			return fail(err)
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
		if msg, ok := strings.CutPrefix(string(v), shmFailed); ok {
			return nil, fmt.Errorf("rank 0 could not create the shm segment: %s: %w", msg, ErrAborted)
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
	return &ShmJob{Segment: seg, Control: ctl, Node: placed}, nil
}

// ShmSpace is the size in bytes of the filesystem of dir (the shared-memory
// root; "" is /dev/shm) and what is free on it now, or zeros when it cannot
// be read.
func ShmSpace(dir string) (capacity, free int64) {
	if dir == "" {
		dir = "/dev/shm"
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, 0
	}
	return int64(st.Blocks) * st.Bsize, int64(st.Bavail) * st.Bsize
}

// ShmCapacity is the size in bytes of the filesystem of dir (the
// shared-memory root; "" is /dev/shm), or 0 when it cannot be read. Unlike
// what is free while ranks create their segments, every rank of a node sees
// the same.
func ShmCapacity(dir string) int64 {
	c, _ := ShmSpace(dir)
	return c
}
