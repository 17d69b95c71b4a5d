package allreduce

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/comm"
)

// BenchmarkAllReduce runs the executor with ranks as goroutines of this
// process: go test -bench AllReduce -benchtime 20x ./allreduce
func BenchmarkAllReduce(b *testing.B) {
	for _, world := range []int{2, 4} {
		for _, size := range []int{8 << 10, 64 << 20} {
			for _, alg := range []Algorithm{HostStaged, Ring} {
				b.Run(fmt.Sprintf("n%d/%dB/%s", world, size, alg), func(b *testing.B) {
					// the benchmark's own b: newGroup's failures stop
					// it and its cleanups (executors, transports) run
					g := newGroup(b, world, alg, Options{})
					bufs := make([][2]comm.Buffer, world)
					for r := range world {
						s, err := g.devs[r].Alloc(size)
						require.NoError(b, err)
						d, err := g.devs[r].Alloc(size)
						require.NoError(b, err)
						bufs[r] = [2]comm.Buffer{s, d}
					}
					b.SetBytes(int64(size))
					b.ResetTimer()
					for range b.N {
						errs := g.run(func(r int, c *Communicator) error {
							ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
							defer cancel()
							return c.AllReduce(ctx, bufs[r][0], bufs[r][1], size/4, comm.Float32, comm.Sum)
						})
						for _, err := range errs {
							if err != nil {
								b.Fatal(err)
							}
						}
					}
				})
			}
		}
	}
}
