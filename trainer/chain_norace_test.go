//go:build !race

// In place and large, the ranks' copies of one user buffer are ordered by
// flags in a shared-memory segment that each in-process rank maps at its
// own address, which the race detector does not track (as in
// inline_norace_test.go).

package trainer

import "testing"

// TestAsyncAllReducesChain in place: the chain of calls on one buffer, each
// reading what the one before wrote, must not overlap.
func TestAsyncAllReducesChainInPlace(t *testing.T) { testAsyncChain(t, true) }
