package rendezvous

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func serve(t *testing.T, token string, world int) string {
	t.Helper()
	s, err := NewServer(token, world)
	require.NoError(t, err)
	sock := filepath.Join(t.TempDir(), "rdv.sock")
	lis, err := net.Listen("unix", sock)
	require.NoError(t, err)
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	return "unix://" + sock
}

func TestRegisterTopologyKVBarrier(t *testing.T) {
	tests := []struct {
		desc     string
		explicit bool
		peers    []Peer
		wantTop  Topology
	}{
		{"host backend, one virtual GPU", true, []Peer{{Host: "a", GPUUUID: "host-0"}, {Host: "a", GPUUUID: "host-0"}, {Host: "a", GPUUUID: "host-0"}},
			Topology{SameHost: true, SameGPU: true}},
		{"MIG instances of one GPU", false, []Peer{{Host: "a", GPUUUID: "MIG-1", ParentGPUUUID: "GPU-x", MIG: true}, {Host: "a", GPUUUID: "MIG-2", ParentGPUUUID: "GPU-x", MIG: true}},
			Topology{SameHost: true, SameGPU: true, AnyMIG: true}},
		{"two GPUs", true, []Peer{{Host: "a", GPUUUID: "GPU-x"}, {Host: "a", GPUUUID: "GPU-y"}},
			Topology{SameHost: true}},
		{"two hosts", false, []Peer{{Host: "a", GPUUUID: "GPU-x"}, {Host: "b", GPUUUID: "GPU-x"}},
			Topology{}},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			addr := serve(t, "tok", len(tc.peers))
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			ms := make([]Membership, len(tc.peers))
			errs := make([]error, len(tc.peers))
			var wg sync.WaitGroup
			for i, p := range tc.peers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					c, err := Dial(addr, "tok")
					if err != nil {
						errs[i] = err
						return
					}
					defer c.Close()
					p.PID = 100 + i
					// Peers ask for a rank in reverse order, or take any.
					want := -1
					if tc.explicit {
						want = len(tc.peers) - 1 - i
					}
					if ms[i], errs[i] = c.Register(ctx, want, p); errs[i] != nil {
						return
					}
					key := "k" + string(rune('0'+ms[i].Rank))
					if errs[i] = c.Put(ctx, key, []byte{byte(ms[i].Rank)}); errs[i] != nil {
						return
					}
					other := "k" + string(rune('0'+(ms[i].Rank+1)%len(tc.peers)))
					v, err := c.Get(ctx, other)
					if err != nil {
						errs[i] = err
						return
					}
					if want := []byte{byte((ms[i].Rank + 1) % len(tc.peers))}; string(v) != string(want) {
						errs[i] = fmt.Errorf("got %v under %s, want %v", v, other, want)
						return
					}
					errs[i] = c.Barrier(ctx, "end")
				}()
			}
			wg.Wait()
			var ranks []int
			for i := range tc.peers {
				require.NoError(t, errs[i])
				require.Equal(t, len(tc.peers), ms[i].World)
				require.Equal(t, tc.wantTop, ms[i].Topology)
				require.Len(t, ms[i].Peers, len(tc.peers))
				require.Equal(t, 100+i, ms[i].Peers[ms[i].Rank].PID)
				if tc.explicit {
					require.Equal(t, len(tc.peers)-1-i, ms[i].Rank)
				}
				ranks = append(ranks, ms[i].Rank)
			}
			sort.Ints(ranks)
			for i, r := range ranks {
				require.Equal(t, i, r)
			}
		})
	}
}

func TestWrongTokenAndDeadline(t *testing.T) {
	addr := serve(t, "right", 2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(addr, "wrong")
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Register(ctx, -1, Peer{Host: "a"})
	require.Equal(t, codes.PermissionDenied, status.Code((err)))

	good, err := Dial(addr, "right")
	require.NoError(t, err)
	defer good.Close()
	short, cancel2 := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel2()
	start := time.Now()
	_, err = good.Register(short, -1, Peer{Host: "a"}) // the second rank never comes
	require.Error(t, err)
	require.Equal(t, codes.DeadlineExceeded, status.Code((err)))
	require.Less(t, time.Since(start), 5*time.Second)
}

func TestAbortReleasesBlockedCalls(t *testing.T) {
	addr := serve(t, "tok", 2)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	a, err := Dial(addr, "tok")
	require.NoError(t, err)
	defer a.Close()
	b, err := Dial(addr, "tok")
	require.NoError(t, err)
	defer b.Close()
	var wg sync.WaitGroup
	wg.Add(1)
	var getErr error
	go func() {
		defer wg.Done()
		_, err := a.Register(ctx, 0, Peer{Host: "h"})
		if err != nil {
			getErr = err
			return
		}
		_, getErr = a.Get(ctx, "never") // blocks until the abort
	}()
	_, err = b.Register(ctx, 1, Peer{Host: "h"})
	require.NoError(t, err)
	time.Sleep(100 * time.Millisecond)
	start := time.Now()
	require.NoError(t, b.Abort(ctx, "cannot create the segment"))
	wg.Wait()
	require.Equal(t, codes.Aborted, status.Code((getErr)))
	require.Contains(t, getErr.Error(), "cannot create the segment")
	require.Less(t, time.Since(start), 5*time.Second)
	require.Equal(t, codes.Aborted, status.Code((b.Put(ctx, "k", nil))), "later calls fail too")
}
