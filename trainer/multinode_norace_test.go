//go:build !race

// Large collectives of in-process ranks on the host backend: the race
// detector cannot follow their synchronisation (flags in a shared-memory
// segment each rank maps at its own address; it reports the same for a
// one-node group's in-place all-reduce of 70001 elements, and its in-place
// reduce-scatter and all-gather of any size). `make test` runs this
// without -race (see the Makefile).

package trainer

import "testing"

// TestGroupAcrossNodesMatchesOneNode with a size past the small-message
// path and several shared-memory chunks.
func TestGroupAcrossNodesMatchesOneNodeLarge(t *testing.T) {
	testAcrossNodesMatchesOneNode(t, []int{70001}, []Option{WithTuning(Tuning{Chunk: 64 << 10, Slots: 3})})
}
