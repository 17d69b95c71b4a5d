package trainer

import (
	"context"
	"fmt"

	"github.com/migctl/migctl/allreduce"
	"github.com/migctl/migctl/comm"
	"github.com/migctl/migctl/internal/numa"
)

// geometryKey is where a group's node rank 0 publishes the arena geometry
// (chunk and slots) the node's ranks of the group use.
const geometryKey = "trainer/arena-geometry"

// Link arenas: a point-to-point link (two ranks, broadcasts from one side)
// moves messages as fast through 4 slots of 2 MiB (24 MiB of pinned host
// memory) as through the job group's 8 of 8 MiB (192 MiB), measured one way
// with torch send/recv on an H100 (docs/results/shm-2026-12-06.md, "Link
// arenas"); 2 slots of 1 MiB were 20-30% slower. A pipeline of 7 stages
// has 12 links.
const linkChunk, linkSlots = 2 << 20, 4

// arenaGeometry is the chunk and slot count of the shared arena of a group
// of size ranks on a node whose shared-memory file system holds capacity
// bytes, free of them free now (zeros: unknown). Forced by the tuning, it
// is that. Otherwise the measured defaults (allreduce.Staged for device
// buffers staged through host memory, 4 slots of 2 MiB for the host
// backend and for point-to-point links), shrunk (allreduce.FitArena) to
// shmBudget: on a container's 64-MiB /dev/shm the job's group, every link
// of a pipeline and a few groups of some ranks all fit, where each sized
// against the whole file system overran it. Only the node's rank 0 chooses, while it holds the
// file system's creation lock (comm.JoinShmSized), and publishes its choice
// (agreeOnGeometry): what is free changes while groups form, so the other
// ranks could not compute the same.
func (g *Group) arenaGeometry(size int, capacity, free int64) (chunk, slots int) {
	t := g.cfg.tuning
	if t.Chunk > 0 && t.Slots > 0 {
		return t.Chunk, t.Slots
	}
	switch {
	case g.link:
		chunk, slots = allreduce.FitShm(size, linkChunk, linkSlots, capacity), linkSlots
	case g.cfg.backend == BackendGPU:
		chunk, slots = allreduce.Staged(size, capacity)
	default:
		chunk, slots = allreduce.FitShm(size, 2<<20, 4, capacity), 4
	}
	if t.Chunk > 0 {
		return t.Chunk, slots
	}
	if t.Slots > 0 {
		return chunk, t.Slots
	}
	return allreduce.FitArena(size, chunk, slots, shmBudget(capacity, free, g.parent == nil))
}

// agreeOnGeometry gives every rank of the node the geometry its rank 0
// chose (chunk and slots there; the others learn them from the store).
func (g *Group) agreeOnGeometry(ctx context.Context, rank, size int, kv comm.KV, chunk, slots int) (int, int, error) {
	t := g.cfg.tuning
	switch {
	case t.Chunk > 0 && t.Slots > 0:
		return t.Chunk, t.Slots, nil
	case size == 1:
		return chunk, slots, nil
	case rank == 0:
		if err := kv.Put(ctx, geometryKey, fmt.Appendf(nil, "%d %d", chunk, slots)); err != nil {
			return 0, 0, fmt.Errorf("publishing the shared arena's geometry: %w", err)
		}
		return chunk, slots, nil
	}
	v, err := kv.Get(ctx, geometryKey)
	if err != nil {
		return 0, 0, fmt.Errorf("learning the shared arena's geometry from rank 0: %w", err)
	}
	if _, err := fmt.Sscanf(string(v), "%d %d", &chunk, &slots); err != nil || chunk <= 0 || slots <= 0 {
		return 0, 0, fmt.Errorf("arena geometry %q from rank 0: %w", v, comm.ErrInvalid)
	}
	return chunk, slots, nil
}

// shmBudget is the most bytes a group's arena may take of a shared-memory
// file system of capacity bytes with free bytes free (0: unknown, no
// limit): half of what is free, and of the file system half for the job's
// own group, an eighth for any other.
func shmBudget(capacity, free int64, jobGroup bool) int64 {
	if capacity <= 0 {
		return 0
	}
	share := capacity / 8
	if jobGroup {
		share = capacity / 2
	}
	return max(1, min(share, free/2)) // 1: full, as small as it goes
}

// arenaNode is the NUMA node the shared arena this rank creates (node rank
// 0) is preferred on: its GPU's, on a host of several nodes, so that the
// copy engines write and the reduce threads of the ranks near it read
// memory of their own socket; -1 for none (one node, the host backend,
// MIGCTL_NUMA=off). docs/collectives.md, "NUMA".
func (g *Group) arenaNode() int {
	td, ok := g.dev.(comm.TopologyDevice)
	if !ok {
		return -1
	}
	return numa.HostSysfs().NodeOf(td.Topology().PCIBusID)
}
