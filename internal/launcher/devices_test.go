package launcher

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// fakeLeaser is a daemon's lease table by MIG UUID (→ job).
type fakeLeaser struct {
	mu    sync.Mutex
	next  int
	table map[string]string
}

func (f *fakeLeaser) Acquire(_ context.Context, job, profile string, count, _, _ int) ([]Lease, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.table == nil {
		f.table = map[string]string{}
	}
	out := make([]Lease, count)
	for i := range out {
		u := fmt.Sprintf("MIG-%d", f.next)
		f.next++
		f.table[u] = job
		out[i] = Lease{UUID: u, Profile: profile}
	}
	return out, nil
}

func (f *fakeLeaser) Release(_ context.Context, job string, uuids []string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, u := range uuids {
		if f.table[u] == job {
			delete(f.table, u)
		}
	}
	return nil
}

func (f *fakeLeaser) held(job string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for u, j := range f.table {
		if j == job {
			out = append(out, u)
		}
	}
	slices.Sort(out)
	return out
}

// Two runs under one job name (--job) on one daemon: the one that ends
// first gives back its own devices only; the other keeps its leases.
func TestLeasesReleaseOnlyTheirOwn(t *testing.T) {
	ctx := context.Background()
	daemon := &fakeLeaser{}
	a := &Leases{Client: daemon, Profile: "1g.18gb", GPU: -1}
	b := &Leases{Client: daemon, Profile: "1g.18gb", GPU: -1}
	tests := []struct {
		desc string
		do   func() error
		want []string // job x's leases afterwards
	}{
		{"b leases two", func() error { _, err := b.Acquire(ctx, "x", 2); return err }, []string{"MIG-0", "MIG-1"}},
		{"a leases one", func() error { _, err := a.Acquire(ctx, "x", 1); return err }, []string{"MIG-0", "MIG-1", "MIG-2"}},
		{"a ends: b's stay", func() error { return a.Release(ctx, "x") }, []string{"MIG-0", "MIG-1"}},
		{"a again: nothing more", func() error { return a.Release(ctx, "x") }, []string{"MIG-0", "MIG-1"}},
		{"b ends", func() error { return b.Release(ctx, "x") }, nil},
	}
	for _, tt := range tests {
		t.Run(tt.desc, func(t *testing.T) {
			require.NoError(t, tt.do())
			require.Equal(t, tt.want, daemon.held("x"))
		})
	}
}
