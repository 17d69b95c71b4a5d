package ctxmgr

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/migctl/migctl/mig"
	"github.com/migctl/migctl/mig/migsim"
)

// TestLeasesBoundToConnection: leases bound to a connection end with it, and
// an Acquire whose connection closed while it ran leases nothing.
func TestLeasesBoundToConnection(t *testing.T) {
	ctx := context.Background()
	mm := mig.NewManager(migsim.New(migsim.H200, 1))
	l := NewLeases(mm, LeaseOptions{EnableMIG: true})
	req := AcquireRequest{Job: "j", Profile: "1g.18gb", Count: 2, GPU: -1}

	l.connOpened(5)
	l.ReleaseConn(5) // closed before the Acquire finished
	req.conn = 5
	_, err := l.Acquire(ctx, req)
	require.ErrorContains(t, err, "has closed; nothing leased")
	require.Empty(t, l.List())

	l.connOpened(6)
	l.connOpened(7)
	req.conn = 6
	ls, err := l.Acquire(ctx, req)
	require.NoError(t, err)
	require.True(t, ls[0].BoundToConnection)
	req.conn = 7
	_, err = l.Acquire(ctx, req)
	require.NoError(t, err)
	require.Equal(t, ls, l.ReleaseConn(6), "only connection 6's leases end")
	require.Len(t, l.List(), 2)
	require.Empty(t, l.ReleaseConn(0))
}
