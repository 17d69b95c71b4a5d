package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/allreduce"
)

// The LIMIT column is computed for the schedule a size really takes: every
// shm all-reduce algorithm hands sizes up to --small-bytes to the small path
// (as allreduce.Communicator does); the IPC ring and the other collectives
// keep theirs.
func TestRowAlgorithm(t *testing.T) {
	const small = 64 << 10
	tests := []struct {
		coll  allreduce.Coll
		name  string
		bytes int64
		want  allreduce.Algorithm
	}{
		{allreduce.AllReduce, "hoststaged", 8 << 10, allreduce.HostStagedSmall},
		{allreduce.AllReduce, "hoststaged", 1 << 20, allreduce.HostStaged},
		{allreduce.AllReduce, "ring", 8 << 10, allreduce.HostStagedSmall},
		{allreduce.AllReduce, "ring", small, allreduce.HostStagedSmall},
		{allreduce.AllReduce, "ring", small + 4, allreduce.Ring},
		{allreduce.AllReduce, "hierarchical", 8 << 10, allreduce.HostStagedSmall},
		{allreduce.AllReduce, "hierarchical", 1 << 20, allreduce.Hierarchical},
		{allreduce.AllReduce, allreduce.RingIPC.String(), 8 << 10, allreduce.RingIPC},
		{allreduce.AllReduce, "ring", 0, allreduce.Ring},
		{allreduce.Broadcast, "ring", 8 << 10, allreduce.HostStaged},
	}
	for _, tc := range tests {
		require.Equal(t, tc.want, rowAlgorithm(tc.coll, tc.name, tc.bytes, small), "%s %s %d", tc.coll, tc.name, tc.bytes)
	}
	require.Equal(t, allreduce.Ring, rowAlgorithm(allreduce.AllReduce, "ring", 8<<10, 0), "--small-bytes 0: never")
}
