package benchrank

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/allreduce"
	"github.com/migctl/migctl/comm"
)

// TestMergeRows: each row takes the slowest rank's time and, when checked,
// every rank's wrong elements together; unchecked rows say -1.
func TestMergeRows(t *testing.T) {
	perRank := [][]result{
		{{Seconds: 1e-6, Wrong: 0}, {Seconds: 3e-6, Wrong: 2}},
		{{Seconds: 2e-6, Wrong: 1}, {Seconds: 1e-6, Wrong: 0}},
		{{Seconds: 1.5e-6, Wrong: 0}, {Seconds: 2e-6, Wrong: 5}},
	}
	tests := []struct {
		desc  string
		coll  allreduce.Coll
		dt    comm.DType
		sizes []int64
		check bool
		want  []Row
	}{
		{"all-reduce, checked", allreduce.AllReduce, comm.Float32, []int64{8, 1 << 10}, true, []Row{
			{Bytes: 8, Count: 2, TimeUS: 2, Wrong: 1},
			{Bytes: 1 << 10, Count: 256, TimeUS: 3, Wrong: 7},
		}},
		{"all-reduce, not checked", allreduce.AllReduce, comm.Float32, []int64{8, 1 << 10}, false, []Row{
			{Bytes: 8, Count: 2, TimeUS: 2, Wrong: -1},
			{Bytes: 1 << 10, Count: 256, TimeUS: 3, Wrong: -1},
		}},
		{"reduce-scatter rounds down to np blocks", allreduce.ReduceScatter, comm.Float64, []int64{32, 1 << 10}, true, []Row{
			{Bytes: 24, Count: 3, TimeUS: 2, Wrong: 1},
			{Bytes: 1008, Count: 126, TimeUS: 3, Wrong: 7},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			got := mergeRows(tc.coll, tc.dt, tc.sizes, tc.check, perRank)
			require.Len(t, got, len(tc.want))
			for i, w := range tc.want {
				require.Equal(t, w.Bytes, got[i].Bytes, "row %d", i)
				require.Equal(t, w.Count, got[i].Count, "row %d", i)
				require.InDelta(t, w.TimeUS, got[i].TimeUS, 1e-9, "row %d", i)
				require.Equal(t, w.Wrong, got[i].Wrong, "row %d", i)
			}
		})
	}
}
