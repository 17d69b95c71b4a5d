package trainer

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// BenchmarkSmallAllReduce is the SDK's cost per call around the executor:
// 8-byte all-reduces of host slices on in-process ranks of the host
// backend, back to back (go test -bench SmallAllReduce -benchmem ./trainer).
// On the 2-core dev VM, 1 rank: 10.3 µs and 43 allocations per call before
// the executor reused its lane splits and queues and the collective's
// context stopped setting a second timer, 5.0-5.9 µs and 23 after, 4.9-5.2
// µs and 15 once the worker kept one context and timer for call after call
// (callClock).
func BenchmarkSmallAllReduce(b *testing.B) {
	for _, n := range []int{1, 2} {
		b.Run(fmt.Sprintf("ranks%d", n), func(b *testing.B) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			err := runLocal(ctx, n, func(int) []Option { return []Option{WithTimeout(time.Minute)} }, func(g *Group) error {
				send, recv := make([]float32, 2), make([]float32, 2)
				if g.Rank() == 0 {
					b.ResetTimer()
				}
				for range b.N {
					if err := g.AllReduce(context.Background(), HostSlice(send), HostSlice(recv), Sum); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
		})
	}
}

// BenchmarkPingPong is a round trip of one message between ranks 0 and 1
// of the host backend (in-process ranks) through Send and Recv, beside the
// same message as two broadcasts of a 2-rank group (the link's floor):
// go test -run - -bench PingPong ./trainer. ns/op is one round trip.
func BenchmarkPingPong(b *testing.B) {
	for _, size := range []int{8 << 10, 256 << 10} {
		for _, how := range []string{"sendrecv", "broadcast"} {
			b.Run(fmt.Sprintf("%s/%dKiB", how, size>>10), func(b *testing.B) {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
				defer cancel()
				err := runLocal(ctx, 2, func(int) []Option { return []Option{WithTimeout(time.Minute)} }, func(g *Group) error {
					buf := HostSlice(make([]float32, size/4))
					peer := 1 - g.Rank()
					step := func(turn int) error { // turn: the rank that sends
						if how == "broadcast" {
							return g.Broadcast(ctx, buf, buf, turn)
						}
						if turn == g.Rank() {
							return g.Send(ctx, buf, peer)
						}
						return g.Recv(ctx, buf, peer)
					}
					for i := range b.N + 1 {
						if i == 1 && g.Rank() == 0 {
							b.ResetTimer() // the first round trip forms the links
						}
						if err := step(0); err != nil {
							return err
						}
						if err := step(1); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
			})
		}
	}
}
