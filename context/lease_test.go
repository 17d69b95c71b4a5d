package ctxmgr_test

import (
	"context"
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"

	ctxmgr "github.com/migctl/migctl/context"
	"github.com/migctl/migctl/mig"
	"github.com/migctl/migctl/mig/migsim"
)

// simLeases returns a lease registry over a simulated H200 node of n GPUs,
// each partitioned as req.
func simLeases(t *testing.T, n int, req mig.Request) (*ctxmgr.Leases, *mig.Manager) {
	t.Helper()
	mm := mig.NewManager(migsim.New(migsim.H200, n))
	reqs := map[int]mig.Request{}
	for i := 0; i < n; i++ {
		reqs[i] = req
	}
	_, err := mm.Apply(context.Background(), reqs, mig.ApplyOptions{})
	require.NoError(t, err)
	return ctxmgr.NewLeases(mm), mm
}

func TestLeaseAcquireRelease(t *testing.T) {
	ctx := context.Background()
	l, _ := simLeases(t, 2, mig.Request{MIGEnabled: true, Devices: []mig.DeviceRequest{{Profile: "3g.71gb", Count: 2}}})

	var got []ctxmgr.Lease
	for _, job := range []string{"a", "b", "c", "d"} {
		le, err := l.Acquire(ctx, job, 0, "3g.71gb", -1)
		require.NoError(t, err)
		require.Regexp(t, `^MIG-`, le.UUID)
		got = append(got, le)
	}
	// lowest GPU first, then lowest placement
	require.Equal(t, []int{0, 0, 1, 1}, []int{got[0].GPU, got[1].GPU, got[2].GPU, got[3].GPU})
	require.Equal(t, []int{0, 4, 0, 4}, []int{got[0].Placement.Start, got[1].Placement.Start, got[2].Placement.Start, got[3].Placement.Start})
	uuids := map[string]bool{}
	for _, le := range got {
		uuids[le.UUID] = true
	}
	require.Len(t, uuids, 4, "every lease is a different MIG device")

	_, err := l.Acquire(ctx, "e", 0, "3g.71gb", -1)
	require.ErrorIs(t, err, ctxmgr.ErrNoFreeInstance)
	require.ErrorContains(t, err, "4 such instances exist")
	_, err = l.Acquire(ctx, "e", 0, "1g.18gb", -1)
	require.ErrorIs(t, err, ctxmgr.ErrNoFreeInstance)

	rel := l.Release("b")
	require.Len(t, rel, 1)
	require.Equal(t, got[1].UUID, rel[0].UUID)
	le, err := l.Acquire(ctx, "e", 0, "3g.71gb", 0)
	require.NoError(t, err)
	require.Equal(t, got[1].UUID, le.UUID, "the released instance is leased again")
	require.Len(t, l.List(), 4)

	_, err = l.ReleaseUUID("MIG-nope")
	require.ErrorIs(t, err, ctxmgr.ErrNoLease)
	_, err = l.ReleaseUUID(le.UUID)
	require.NoError(t, err)
	require.Len(t, l.List(), 3)
}

func TestLeaseReapOnExit(t *testing.T) {
	ctx := context.Background()
	l, _ := simLeases(t, 1, mig.Request{MIGEnabled: true, Devices: []mig.DeviceRequest{{Profile: "1g.18gb", Count: 3}}})
	_, err := l.Acquire(ctx, "w", 100, "1g.18gb", 0)
	require.NoError(t, err)
	_, err = l.Acquire(ctx, "w", 101, "1g.18gb", 0)
	require.NoError(t, err)
	_, err = l.Acquire(ctx, "svc", 0, "1g.18gb", 0)
	require.NoError(t, err)
	reaped := l.Reap(func(pid int) bool { return pid == 101 })
	require.Len(t, reaped, 1)
	require.Equal(t, 100, reaped[0].PID)
	require.Len(t, l.List(), 2)
	reaped = l.Reap(func(int) bool { return false })
	require.Len(t, reaped, 1, "job-level leases are not reaped")
	require.Equal(t, 101, reaped[0].PID)
	require.Len(t, l.List(), 1)
	require.Equal(t, "svc", l.List()[0].Job)
}

func TestRepartitionRespectsLeases(t *testing.T) {
	ctx := context.Background()
	l, mm := simLeases(t, 1, mig.Request{MIGEnabled: true, Devices: []mig.DeviceRequest{{Profile: "3g.71gb", Count: 2}}})
	le, err := l.Acquire(ctx, "train", 0, "3g.71gb", 0)
	require.NoError(t, err)
	require.Equal(t, 0, le.Placement.Start)

	tests := []struct {
		desc    string
		req     mig.Request
		wantErr error
		layout  string
	}{
		{"replacing the leased instance is refused", mig.Request{MIGEnabled: true, Devices: []mig.DeviceRequest{{Profile: "7g.141gb", Count: 1}}}, ctxmgr.ErrLeased, "3g.71gb@0:4, 3g.71gb@4:4"},
		{"MIG off under a lease is refused", mig.Request{MIGEnabled: false}, ctxmgr.ErrLeased, "3g.71gb@0:4, 3g.71gb@4:4"},
		{"changing only the unleased half works", mig.Request{MIGEnabled: true, Devices: []mig.DeviceRequest{{Profile: "3g.71gb", Count: 1}, {Profile: "1g.18gb", Count: 2}}}, nil, "3g.71gb@0:4, 1g.18gb@4:1, 1g.18gb@5:1"},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			_, err := l.Repartition(ctx, 0, tc.req)
			if tc.wantErr != nil {
				require.ErrorIs(t, err, tc.wantErr)
				require.ErrorContains(t, err, le.UUID)
			} else {
				require.NoError(t, err)
			}
			node, err := mm.Discover(ctx)
			require.NoError(t, err)
			require.Equal(t, tc.layout, node.GPUs[0].Layout().String())
		})
	}
	require.Equal(t, []ctxmgr.Lease{le}, l.List(), "the kept instance is still leased")
	le2, err := l.Acquire(ctx, "small", 0, "1g.18gb", 0)
	require.NoError(t, err)
	require.Equal(t, 4, le2.Placement.Start)
}

func TestPIDAlive(t *testing.T) {
	require.True(t, ctxmgr.PIDAlive(os.Getpid()))
	cmd := exec.Command("true")
	require.NoError(t, cmd.Run())
	require.False(t, ctxmgr.PIDAlive(cmd.Process.Pid), "an exited and reaped child")
	require.False(t, ctxmgr.PIDAlive(0))
}
