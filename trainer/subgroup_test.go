package trainer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/comm"
)

// allReduceOf all-reduces (sum) one float32 per rank of g, v, and returns
// the result.
func allReduceOf(g *Group, v float32) (float32, error) {
	x := []float32{v}
	if err := g.AllReduce(context.Background(), HostSlice(x), HostSlice(x), Sum); err != nil {
		return 0, err
	}
	return x[0], nil
}

// Subgroups run collectives among their members only, with ranks in the
// order the members were listed, beside the parent group and each other.
func TestNewGroupCollectives(t *testing.T) {
	err := world(t, 4, nil, func(g *Group) error {
		ctx := context.Background()
		r := g.Rank()
		// pairs {0,1} and {2,3}; and evens/odds listed high rank first
		pair, err := g.NewGroup(ctx, fmt.Sprintf("pair%d", r/2), []int{r / 2 * 2, r/2*2 + 1})
		if err != nil {
			return err
		}
		par := [][]int{{2, 0}, {3, 1}}[r%2]
		parity, err := g.NewGroup(ctx, fmt.Sprintf("parity-%d", r%2), par)
		if err != nil {
			return err
		}
		if pair.Rank() != r%2 || pair.Size() != 2 {
			return fmt.Errorf("rank %d: pair rank %d of %d, want %d of 2", r, pair.Rank(), pair.Size(), r%2)
		}
		if want := 1 - r/2; parity.Rank() != want || parity.Size() != 2 {
			return fmt.Errorf("rank %d: parity rank %d of %d, want %d of 2", r, parity.Rank(), parity.Size(), want)
		}
		for round := range 3 { // interleaved with the parent's collectives
			v := float32(int(1) << r)
			got, err := allReduceOf(pair, v)
			if err != nil {
				return err
			}
			if want := float32(int(1)<<(r/2*2) + int(1)<<(r/2*2+1)); got != want {
				return fmt.Errorf("rank %d round %d: pair sum %v, want %v", r, round, got, want)
			}
			if got, err = allReduceOf(g, v); err != nil {
				return err
			}
			if got != 15 {
				return fmt.Errorf("rank %d round %d: world sum %v, want 15", r, round, got)
			}
			if got, err = allReduceOf(parity, v); err != nil {
				return err
			}
			if want := float32(int(1)<<(r%2) + int(1)<<(r%2+2)); got != want {
				return fmt.Errorf("rank %d round %d: parity sum %v, want %v", r, round, got, want)
			}
		}
		// all-gather in the subgroup's rank order, broadcast from its rank 1
		all := make([]float32, 2)
		if err := parity.AllGather(ctx, HostSlice([]float32{float32(r)}), HostSlice(all)); err != nil {
			return err
		}
		if want := []float32{float32(par[0]), float32(par[1])}; all[0] != want[0] || all[1] != want[1] {
			return fmt.Errorf("rank %d: parity all-gather %v, want %v", r, all, want)
		}
		b := []float32{float32(10 + r)}
		if err := parity.Broadcast(ctx, HostSlice(b), HostSlice(b), 1); err != nil {
			return err
		}
		if want := float32(10 + par[1]); b[0] != want {
			return fmt.Errorf("rank %d: parity broadcast %v, want %v", r, b[0], want)
		}
		if err := errors.Join(pair.Barrier(ctx), parity.Close(), pair.Close()); err != nil {
			return err
		}
		g.mu.Lock()
		open := len(g.subs)
		g.mu.Unlock()
		if open != 0 {
			return fmt.Errorf("rank %d: %d closed groups still listed by their parent", r, open)
		}
		// the parent goes on after its subgroups closed
		if got, err := allReduceOf(g, 1); err != nil || got != 4 {
			return fmt.Errorf("rank %d: world sum after closing the subgroups %v (%v), want 4", r, got, err)
		}
		return nil
	})
	require.NoError(t, err)
}

// A subgroup of a subgroup numbers its ranks from its parent's.
func TestNewGroupNested(t *testing.T) {
	err := world(t, 4, nil, func(g *Group) error {
		ctx := context.Background()
		if g.Rank() == 0 {
			return nil
		}
		three, err := g.NewGroup(ctx, "three", []int{1, 2, 3})
		if err != nil {
			return err
		}
		defer three.Close()
		if three.Rank() == 2 { // world rank 3
			return nil
		}
		two, err := three.NewGroup(ctx, "two", []int{1, 0}) // world ranks 2 and 1
		if err != nil {
			return err
		}
		got, err := allReduceOf(two, float32(g.Rank()))
		if err != nil {
			return err
		}
		if got != 3 || two.Rank() != 2-g.Rank() {
			return fmt.Errorf("rank %d: nested sum %v rank %d, want 3 and %d", g.Rank(), got, two.Rank(), 2-g.Rank())
		}
		return nil
	})
	require.NoError(t, err)
}

func TestNewGroupRefusesBadArguments(t *testing.T) {
	tests := []struct {
		desc  string
		name  string
		ranks []int
		want  string
	}{
		{desc: "empty name", name: "", ranks: []int{0, 1}, want: "name"},
		{desc: "name with a slash", name: "a/b", ranks: []int{0, 1}, want: "name"},
		{desc: "rank out of range", name: "x", ranks: []int{0, 2}, want: "rank 2 is not in this group of 2"},
		{desc: "negative rank", name: "x", ranks: []int{-1, 0}, want: "rank -1 is not in"},
		{desc: "rank twice", name: "x", ranks: []int{0, 0}, want: "listed twice"},
		{desc: "caller not a member", name: "x", ranks: []int{1}, want: "rank 0 is not one of them"},
		{desc: "no ranks", name: "x", ranks: nil, want: "rank 0 is not one of them"},
	}
	err := world(t, 2, nil, func(g *Group) error {
		if g.Rank() != 0 {
			return nil
		}
		for _, tc := range tests {
			_, err := g.NewGroup(context.Background(), tc.name, tc.ranks)
			if !errors.Is(err, comm.ErrInvalid) {
				return fmt.Errorf("%s: got %v, want comm.ErrInvalid", tc.desc, err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				return fmt.Errorf("%s: %q does not say %q", tc.desc, err, tc.want)
			}
		}
		return nil
	})
	require.NoError(t, err)
}

// Members that list different ranks, a name used twice and a member that
// never comes all fail, each with a message that says so.
func TestNewGroupFailures(t *testing.T) {
	t.Run("members disagree", func(t *testing.T) {
		err := world(t, 3, nil, func(g *Group) error {
			ranks := map[int][]int{0: {0, 1}, 1: {1, 0}}[g.Rank()]
			if ranks == nil {
				return nil
			}
			_, err := g.NewGroup(context.Background(), "g", ranks)
			// the first listed records the list (the other finds another there),
			// or the lists under the members' ranks differ
			if !errors.Is(err, comm.ErrInvalid) || !strings.Contains(err.Error(), "its members the same list") &&
				!strings.Contains(err.Error(), "formed it of ranks") {
				return fmt.Errorf("rank %d: got %v, want the members' lists named", g.Rank(), err)
			}
			return nil
		})
		require.NoError(t, err)
	})
	t.Run("two groups of one name", func(t *testing.T) {
		var formed, refused atomic.Int32
		err := world(t, 4, nil, func(g *Group) error {
			first := g.Rank() / 2 * 2
			s, err := g.NewGroup(context.Background(), "pair", []int{first, first + 1})
			switch {
			case err == nil:
				formed.Add(1)
				return s.Close()
			case errors.Is(err, comm.ErrInvalid) && strings.Contains(err.Error(), "a name of its own"):
				refused.Add(1)
				return nil
			}
			return fmt.Errorf("rank %d: %v", g.Rank(), err)
		})
		require.NoError(t, err)
		require.Equal(t, int32(2), formed.Load(), "one pair forms the group")
		require.Equal(t, int32(2), refused.Load(), "the other pair is told to pick another name")
	})
	t.Run("name reused", func(t *testing.T) {
		err := world(t, 2, nil, func(g *Group) error {
			s, err := g.NewGroup(context.Background(), "g", []int{0, 1})
			if err != nil {
				return err
			}
			if err := s.Close(); err != nil {
				return err
			}
			_, err = g.NewGroup(context.Background(), "g", []int{0, 1})
			if !errors.Is(err, comm.ErrInvalid) || !strings.Contains(err.Error(), `named "g" before`) {
				return fmt.Errorf("rank %d: got %v, want the name refused", g.Rank(), err)
			}
			return nil
		})
		require.NoError(t, err)
	})
	t.Run("member never comes", func(t *testing.T) {
		err := world(t, 2, nil, func(g *Group) error {
			if g.Rank() == 1 {
				return nil
			}
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			_, err := g.NewGroup(ctx, "g", []int{0, 1})
			if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "waiting for member 1 (rank 1)") {
				return fmt.Errorf("got %v, want the missing member named at the deadline", err)
			}
			return nil
		})
		require.NoError(t, err)
	})
}

// Closing the parent closes its subgroups: their collectives fail with
// ErrClosed rather than touch released memory.
func TestNewGroupClosedWithParent(t *testing.T) {
	err := world(t, 2, nil, func(g *Group) error {
		s, err := g.NewGroup(context.Background(), "g", []int{1, 0})
		if err != nil {
			return err
		}
		if err := g.Close(); err != nil {
			return err
		}
		if _, err := allReduceOf(s, 1); !errors.Is(err, ErrClosed) {
			return fmt.Errorf("rank %d: subgroup collective after the parent's Close: %v, want ErrClosed", g.Rank(), err)
		}
		if _, err := g.NewGroup(context.Background(), "h", []int{0, 1}); !errors.Is(err, ErrClosed) {
			return fmt.Errorf("rank %d: NewGroup after Close: %v, want ErrClosed", g.Rank(), err)
		}
		return s.Close()
	})
	require.NoError(t, err)
}

// In a job across nodes a subgroup of one node's ranks works (through that
// node's memory); one across nodes is refused.
func TestNewGroupAcrossNodes(t *testing.T) {
	host := func(r int) string { return fmt.Sprintf("node%d", r/2) }
	err := world(t, 4, func(r int) []Option { return []Option{withHost(host(r)), withFakeNCCL()} }, func(g *Group) error {
		ctx := context.Background()
		r := g.Rank()
		node, err := g.NewGroup(ctx, fmt.Sprintf("node%d", r/2), []int{r / 2 * 2, r/2*2 + 1})
		if err != nil {
			return err
		}
		defer node.Close()
		got, err := allReduceOf(node, float32(r))
		if err != nil {
			return err
		}
		if want := float32(r/2*4 + 1); got != want {
			return fmt.Errorf("rank %d: node sum %v, want %v", r, got, want)
		}
		_, err = g.NewGroup(ctx, fmt.Sprintf("across%d", r%2), []int{r % 2, r%2 + 2})
		if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "several hosts") {
			return fmt.Errorf("rank %d: a group across nodes: %v, want ErrUnsupported", r, err)
		}
		return nil
	})
	require.NoError(t, err)
}

// A group of one formed from a group of one (no rendezvous) works.
func TestNewGroupOfOne(t *testing.T) {
	g, err := Init(context.Background(), WithRank(0, 1), WithBackend(BackendHost), WithShmRoot(t.TempDir()))
	require.NoError(t, err)
	defer g.Close()
	s, err := g.NewGroup(context.Background(), "me", []int{0})
	require.NoError(t, err)
	got, err := allReduceOf(s, 7)
	require.NoError(t, err)
	require.Equal(t, float32(7), got)
	require.NoError(t, s.Close())
}
