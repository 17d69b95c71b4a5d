package comm

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

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

// JoinShm maps the job's control segment: rank 0 sweeps orphans under root,
// creates the segment with layout l and publishes its name and layout under a
// key; the other ranks open it. Once every rank has mapped it (a rendezvous
// barrier), rank 0 unlinks the name, so no crash can leak it. Ranks other
// than 0 take the layout from rank 0 (l is ignored there).
func JoinShm(ctx context.Context, kv KV, rank int, job, root string, l shm.Layout) (*ShmJob, error) {
	var seg *shm.Segment
	var ctl *shm.Control
	if rank == 0 {
		_, _ = shm.Sweep(root)
		name := shm.SegmentName(job, "ctl")
		var err error
		if seg, err = shm.Create(root, name, l.Size()); err != nil {
			return nil, err
		}
		if ctl, err = shm.Init(seg.Bytes(), l); err != nil {
			_ = seg.Unlink()
			_ = seg.Close()
			return nil, err
		}
		v := fmt.Sprintf("%s %d %d %d", name, l.World, l.Flags, l.DataBytes)
		if err := kv.Put(ctx, shmKey, []byte(v)); err != nil {
			_ = seg.Unlink()
			_ = seg.Close()
			return nil, fmt.Errorf("publishing the shm segment name: %w", err)
		}
	} else {
		v, err := kv.Get(ctx, shmKey)
		if err != nil {
			return nil, fmt.Errorf("learning the shm segment name: %w", err)
		}
		f := strings.Fields(string(v))
		if len(f) != 4 {
			return nil, fmt.Errorf("shm segment record %q: %w", v, ErrInvalid)
		}
		var nums [3]int
		for i := range nums {
			if nums[i], err = strconv.Atoi(f[i+1]); err != nil {
				return nil, fmt.Errorf("shm segment record %q: %w", v, ErrInvalid)
			}
		}
		l = shm.Layout{World: nums[0], Flags: nums[1], DataBytes: nums[2]}
		if seg, err = shm.Open(root, f[0], l.Size()); err != nil {
			return nil, err
		}
		if ctl, err = shm.Attach(seg.Bytes(), l); err != nil {
			_ = seg.Close()
			return nil, err
		}
	}
	berr := kv.Barrier(ctx, "comm/shm/mapped")
	if rank == 0 {
		berr = errors.Join(berr, seg.Unlink())
	}
	if berr != nil {
		_ = seg.Close()
		return nil, fmt.Errorf("waiting for every rank to map the shm segment: %w", berr)
	}
	return &ShmJob{Segment: seg, Control: ctl}, nil
}
