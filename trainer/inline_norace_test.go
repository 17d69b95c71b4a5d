//go:build !race

// In place and large, the ranks' copies of one user buffer are ordered by
// flags in a shared-memory segment that each in-process rank maps at its
// own address, which the race detector does not track (as in ipc_test.go):
// `make test` runs this without -race (see the Makefile).

package trainer

import (
	"context"
	"fmt"
	"testing"
)

// Synchronous and asynchronous collectives mixed, three ranks: every result
// right (a synchronous call that overtook a queued one would pair different
// calls across ranks).
func TestSyncAndAsyncMixedKeepOrder(t *testing.T) {
	const n, calls = 3, 40
	requireAll(t, world(t, n, nil, func(g *Group) error {
		ctx := context.Background()
		var works []*Work
		var bufs [][]int32
		var ks []int
		check := func(k int, b []int32) error {
			for i, v := range b {
				if w := int32(k*n*(n+1)/2 + n*(i%7)); v != w {
					return fmt.Errorf("call %d element %d = %d, want %d", k, i, v, w)
				}
			}
			return nil
		}
		for k := range calls {
			size := 1 + (k%5)*20000 // some large enough to be still queued
			buf := make([]int32, size)
			for i := range buf {
				buf[i] = int32(k*(g.Rank()+1) + i%7)
			}
			if k%3 == 2 {
				if err := g.AllReduce(ctx, HostSlice(buf), HostSlice(buf), Sum); err != nil {
					return err
				}
				if err := check(k, buf); err != nil {
					return err
				}
				continue
			}
			works = append(works, g.AllReduceAsync(ctx, HostSlice(buf), HostSlice(buf), Sum))
			bufs, ks = append(bufs, buf), append(ks, k)
		}
		for j, w := range works {
			if err := w.Wait(ctx); err != nil {
				return err
			}
			if err := check(ks[j], bufs[j]); err != nil {
				return err
			}
		}
		return nil
	}))
}
