package allreduce_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/allreduce"
)

// The default geometry of device collectives: 16 MiB of chunks across the
// node's ranks within 1..8 MiB, 8 slots, and an arena that never takes more
// than half a small shared-memory filesystem.
func TestStaged(t *testing.T) {
	for _, tc := range []struct {
		ranks     int
		shm       int64
		wantChunk int
	}{
		{1, 0, 8 << 20},
		{2, 0, 8 << 20},
		{3, 0, 4 << 20},
		{4, 0, 4 << 20},
		{7, 0, 2 << 20},
		{8, 0, 2 << 20},
		{16, 0, 1 << 20},
		{64, 0, 1 << 20},
		{7, 64 << 30, 2 << 20},   // a roomy /dev/shm changes nothing
		{7, 64 << 20, 512 << 10}, // a container's 64 MiB: 8·8·512 KiB = 32 MiB
		{2, 64 << 20, 1 << 20},   // 3·8·1 MiB = 24 MiB
		{64, 1 << 20, 256 << 10}, // never below 256 KiB
	} {
		chunk, slots := allreduce.Staged(tc.ranks, tc.shm)
		require.Equal(t, tc.wantChunk, chunk, "%d ranks, shm %d", tc.ranks, tc.shm)
		require.Equal(t, 8, slots)
		if tc.shm > 0 && chunk > 256<<10 {
			require.LessOrEqual(t, int64(allreduce.ArenaBytes(tc.ranks, chunk, slots)), tc.shm/2)
		}
	}
}

// FitShm, what the host backend's geometry goes through too: a 7-rank job
// runs in a container's 64 MiB /dev/shm (its default arena, 8·4·2 MiB,
// would take all of it).
func TestFitShm(t *testing.T) {
	for _, tc := range []struct {
		ranks, chunk, slots int
		shm                 int64
		want                int
	}{
		{7, 2 << 20, 4, 0, 2 << 20},          // unknown size: as it is
		{7, 2 << 20, 4, 16 << 30, 2 << 20},   // roomy
		{7, 2 << 20, 4, 64 << 20, 1 << 20},   // 8·4·1 MiB = 32 MiB
		{7, 4 << 20, 8, 64 << 20, 512 << 10}, // migctl bench's host default
		{2, 2 << 20, 4, 64 << 20, 2 << 20},   // 3·4·2 MiB = 24 MiB fits
		{32, 2 << 20, 4, 64 << 20, 256 << 10},
		{7, 128 << 10, 4, 1 << 20, 128 << 10}, // below 256 KiB already: left alone
	} {
		got := allreduce.FitShm(tc.ranks, tc.chunk, tc.slots, tc.shm)
		require.Equal(t, tc.want, got, "%+v", tc)
		if tc.shm > 0 && got > 256<<10 {
			require.LessOrEqual(t, int64(allreduce.ArenaBytes(tc.ranks, got, tc.slots)), tc.shm/2, "%+v", tc)
		}
	}
}

func TestFitArena(t *testing.T) {
	for _, tc := range []struct {
		ranks, chunk, slots int
		budget              int64
		wantChunk, wantSlot int
	}{
		{2, 8 << 20, 8, 0, 8 << 20, 8},                 // no limit
		{2, 8 << 20, 8, 1 << 30, 8 << 20, 8},           // 192 MiB fits
		{2, 8 << 20, 8, 8 << 20, 256 << 10, 8},         // the chunk first: 3·8·256 KiB = 6 MiB
		{2, 8 << 20, 8, 4 << 20, 256 << 10, 4},         // then the slots: 3 MiB
		{2, 8 << 20, 8, 1 << 20, 128 << 10, 2},         // then the chunk again: 768 KiB
		{2, 8 << 20, 8, 1, 64 << 10, 2},                // never below 64 KiB or 2 slots
		{7, 2 << 20, 8, 32 << 20, 512 << 10, 8},        // the job's group on a 64-MiB /dev/shm
		{256, 1 << 20, 8, 1 << 20, 128 << 10, 2},       // 64·8·256 bytes is the schedule's least chunk
		{2, 96 << 10, 8, 1, 96 << 10, 2},               // an odd chunk is not split below a multiple of 64
		{1, 8 << 20, 8, 64 << 20, 4 << 20, 8},          // one rank: 2·8·4 MiB = 64 MiB
		{4, 2 << 20, 4, 5 * 4 * (2 << 20), 2 << 20, 4}, // exactly the budget fits
	} {
		chunk, slots := allreduce.FitArena(tc.ranks, tc.chunk, tc.slots, tc.budget)
		require.Equal(t, tc.wantChunk, chunk, "%+v", tc)
		require.Equal(t, tc.wantSlot, slots, "%+v", tc)
		require.Zero(t, chunk%64, "%+v", tc)
		least := max(64<<10, 64*8*tc.ranks)
		if tc.budget > 0 && chunk > least && slots > 2 {
			require.LessOrEqual(t, int64(allreduce.ArenaBytes(tc.ranks, chunk, slots)), tc.budget, "%+v", tc)
		}
	}
}
