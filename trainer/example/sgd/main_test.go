package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/trainer"
)

// trainOn runs c on n in-process ranks and returns every rank's weights.
func trainOn(t *testing.T, n int, c config) [][]float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out := make([][]float64, n)
	var mu sync.Mutex
	err := trainer.RunLocal(ctx, n, func(g *trainer.Group) error {
		res, err := train(ctx, g, c, io.Discard)
		if err != nil {
			return err
		}
		mu.Lock()
		out[g.Rank()] = append([]float64(nil), res.Weights...)
		mu.Unlock()
		return nil
	})
	require.NoError(t, err)
	return out
}

// maxRelDiff is the largest |a-b| / max(|a|, |b|, 1e-12) over the elements.
func maxRelDiff(a, b []float64) float64 {
	var m float64
	for i := range a {
		d := math.Abs(a[i]-b[i]) / math.Max(math.Max(math.Abs(a[i]), math.Abs(b[i])), 1e-12)
		m = math.Max(m, d)
	}
	return m
}

// N ranks with batch B/N end with the weights of one rank with batch B
// (within 1e-6 relative), and every rank holds bit-identical weights.
func TestDataParallelEqualsOneRank(t *testing.T) {
	c := config{Steps: 60, Batch: 84, LR: 0.05, Seed: 7, In: 8, Hidden: 16}
	one := trainOn(t, 1, c)[0]
	init := newModel(c.In, c.Hidden)
	init.init(c.Seed)
	require.Greater(t, maxRelDiff(one, init.w), 1e-3, "training did not move the weights")
	for _, n := range []int{2, 3, 7} {
		t.Run(fmt.Sprintf("%d ranks", n), func(t *testing.T) {
			ws := trainOn(t, n, c)
			for r := 1; r < n; r++ {
				require.Equal(t, ws[0], ws[r], "rank %d's weights differ from rank 0's", r)
			}
			require.Less(t, maxRelDiff(ws[0], one), 1e-6)
		})
	}
}

func TestDeviceBuffersOnTheHostBackendEqual(t *testing.T) {
	c := config{Steps: 10, Batch: 12, LR: 0.05, Seed: 3, In: 4, Hidden: 8}
	plain := trainOn(t, 3, c)
	c.DeviceBuf = true
	dev := trainOn(t, 3, c)
	require.Equal(t, plain, dev)
}
