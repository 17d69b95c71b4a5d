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

// Four ranks, two groups of two: each pair averages its own gradient
// (data parallel within a pair), while the job's group still spans all four.
// Every member of a group calls NewGroup with the same name and ranks.
func ExampleGroup_NewGroup() {
	ctx := context.Background()
	err := trainer.RunLocal(ctx, 4, func(g *trainer.Group) error {
		first := g.Rank() / 2 * 2
		pair, err := g.NewGroup(ctx, fmt.Sprintf("pair%d", first), []int{first, first + 1})
		if err != nil {
			return err
		}
		defer pair.Close()
		grad := []float32{float32(g.Rank())}
		if err := pair.AllReduce(ctx, trainer.HostSlice(grad), trainer.HostSlice(grad), trainer.Avg); err != nil {
			return err
		}
		total := []float32{1}
		if err := g.AllReduce(ctx, trainer.HostSlice(total), trainer.HostSlice(total), trainer.Sum); err != nil {
			return err
		}
		if g.Rank() == 2 {
			fmt.Printf("rank %d: rank %d of its pair, pair average %v, job of %v\n", g.Rank(), pair.Rank(), grad, total)
		}
		return nil
	})
	if err != nil {
		fmt.Println(err)
	}
	// Output: rank 2: rank 0 of its pair, pair average [2.5], job of [4]
}
