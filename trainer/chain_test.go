package trainer

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
)

// Asynchronous all-reduces issued back to back, mixed with a chain of calls
// that each read what the one before wrote, a broadcast and a barrier: every
// result is right, the Works finish in call order, and with the default
// tuning host-staged all-reduces overlapped the one before (chain=off: none
// did). Out of place here (the race detector follows it); in place in
// chain_norace_test.go.
func TestAsyncAllReducesChain(t *testing.T) { testAsyncChain(t, false) }

func testAsyncChain(t *testing.T, inPlace bool) {
	const n, calls = 3, 24
	for _, tc := range []struct {
		name    string
		noChain bool
	}{{"chained", false}, {"chain=off", true}} {
		t.Run(tc.name, func(t *testing.T) {
			tuning := Tuning{Chunk: 16 << 10, Slots: 2, SmallBytes: 1 << 10, NoChain: tc.noChain}
			opts := func(int) []Option { return []Option{WithTuning(tuning), WithAlgorithm(AlgorithmHostStaged)} }
			errs := world(t, n, opts, func(g *Group) error {
				return asyncChain(g, n, calls, inPlace, tc.noChain)
			})
			requireAll(t, errs)
		})
	}
}

func asyncChain(g *Group, n, calls int, inPlace, noChain bool) error {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(7, 11)) // the same sizes on every rank
	sends, recvs := make([][]int32, calls), make([][]int32, calls)
	works := make([]*Work, 0, calls+8)
	var mu sync.Mutex
	var order []int
	add := func(w *Work) {
		k := len(works)
		w.OnDone(func(error) { mu.Lock(); order = append(order, k); mu.Unlock() })
		works = append(works, w)
	}
	// The chain: each call's input is what the one before wrote (a sum: a
	// call that read its input early would sum stale values); out of place,
	// two buffers in turn.
	ping, pong := make([]int32, 9000), make([]int32, 9000)
	for i := range ping {
		ping[i] = int32(g.Rank()*1000 + i%1000)
	}
	chainIn, chainOut := ping, pong
	if inPlace {
		chainOut = ping
	}
	var bcast []float32
	for k := range calls {
		size := 1 + rng.IntN(20000) // up to 80 KB: 1 to 5 chunks of 16 KiB
		sends[k] = make([]int32, size)
		for i := range sends[k] {
			sends[k][i] = int32(k*7 + i*(g.Rank()+1))
		}
		recvs[k] = sends[k]
		if !inPlace {
			recvs[k] = make([]int32, size)
		}
		add(g.AllReduceAsync(ctx, HostSlice(sends[k]), HostSlice(recvs[k]), Sum))
		switch k {
		case 5, 6, 7:
			add(g.AllReduceAsync(ctx, HostSlice(chainIn), HostSlice(chainOut), Sum))
			if !inPlace {
				chainIn, chainOut = chainOut, chainIn
			}
		case 10:
			bcast = make([]float32, 5000)
			for i := range bcast {
				bcast[i] = float32(g.Rank()*1000 + i)
			}
			add(g.BroadcastAsync(ctx, HostSlice(bcast), HostSlice(bcast), 1))
		case 15:
			add(g.BarrierAsync(ctx))
		}
	}
	for i, w := range works {
		if err := w.Wait(ctx); err != nil {
			return fmt.Errorf("call %d: %w", i, err)
		}
	}
	for k := range calls {
		for i, v := range recvs[k] {
			if want := int32(n*k*7 + i*n*(n+1)/2); v != want {
				return fmt.Errorf("rank %d call %d element %d = %d, want %d", g.Rank(), k, i, v, want)
			}
		}
	}
	for i, v := range chainIn { // the last call's output: n² times the first call's
		if want := int32(n * n * (1000*n*(n-1)/2 + n*(i%1000))); v != want {
			return fmt.Errorf("chain element %d = %d, want %d", i, v, want)
		}
	}
	for i, v := range bcast {
		if want := float32(1000 + i); v != want {
			return fmt.Errorf("broadcast element %d = %v, want %v", i, v, want)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for i, k := range order {
		if i != k {
			return fmt.Errorf("finish order %v, want the calls' order", order)
		}
	}
	if len(order) != len(works) {
		return fmt.Errorf("%d of %d OnDone callbacks ran", len(order), len(works))
	}
	if o := g.exec.Overlaps(); noChain && o != 0 || !noChain && o == 0 {
		return fmt.Errorf("rank %d: %d calls overlapped the one before (chain=off: %v)", g.Rank(), o, noChain)
	}
	return nil
}
