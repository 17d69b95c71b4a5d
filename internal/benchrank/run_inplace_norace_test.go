//go:build !race

// The race detector cannot follow the synchronisation of in-process ranks'
// in-place collectives on the host backend (flags in a shared-memory
// segment each rank maps at its own address; trainer/multinode_norace_test.go
// says the same). Run without -race: go test ./internal/benchrank.

package benchrank

import "testing"

// TestRunChecksInPlace: every collective in place.
func TestRunChecksInPlace(t *testing.T) {
	tests := []sweepCase{
		{"all-reduce", "allreduce", "bfloat16", "max", 8, true, 6},
		{"reduce-scatter", "reducescatter", "int32", "min", 12, true, 5},
		{"all-gather", "allgather", "int64", "sum", 24, true, 5},
		{"broadcast from rank 2", "broadcast", "float", "sum", 8, true, 6},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) { checkSweep(t, tc) })
	}
}
