package trainer_test

import (
	"context"
	"fmt"

	"github.com/migctl/migctl/trainer"
)

// Three ranks average a gradient with one all-reduce. Under `migctl run`
// each rank is its own process and calls trainer.Init(ctx); RunLocal runs
// them as goroutines here so the example runs anywhere.
func Example() {
	ctx := context.Background()
	err := trainer.RunLocal(ctx, 3, func(g *trainer.Group) error {
		grad := []float32{float32(g.Rank()), 1, 2}
		if err := g.AllReduce(ctx, trainer.HostSlice(grad), trainer.HostSlice(grad), trainer.Avg); err != nil {
			return err
		}
		all := make([]float32, 3*g.Size())
		if err := g.AllGather(ctx, trainer.HostSlice(grad), trainer.HostSlice(all)); err != nil {
			return err
		}
		if g.Rank() == 0 {
			fmt.Printf("rank %d of %d: averaged %v, gathered %v\n", g.Rank(), g.Size(), grad, all)
		}
		return nil
	})
	if err != nil {
		fmt.Println(err)
	}
	// Output: rank 0 of 3: averaged [1 1 2], gathered [1 1 2 1 1 2 1 1 2]
}

// A program that runs alone (no launcher, no WORLD_SIZE) is a group of one.
func ExampleInit() {
	ctx := context.Background()
	g, err := trainer.Init(ctx, trainer.WithBackend(trainer.BackendHost))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer g.Close()
	x := []float64{1.5, 2.5}
	if err := g.AllReduce(ctx, trainer.HostSlice(x), trainer.HostSlice(x), trainer.Sum); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(g.Rank(), g.Size(), x)
	// Output: 0 1 [1.5 2.5]
}
