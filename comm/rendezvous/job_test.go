package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// serveServer is serve that also returns the server.
func serveServer(t *testing.T, token string, world int) (*Server, string) {
	t.Helper()
	s, err := NewServer(token, world)
	require.NoError(t, err)
	sock := filepath.Join(t.TempDir(), "rdv.sock")
	lis, err := net.Listen("unix", sock)
	require.NoError(t, err)
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	return s, "unix://" + sock
}

func dial(t *testing.T, addr string) *Client {
	t.Helper()
	c, err := Dial(addr, "tok")
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.conn.Close() })
	return c
}

// registerAll registers one client per peer concurrently (peer i asks for
// rank want[i]) and returns their memberships and errors.
func registerAll(ctx context.Context, cs []*Client, want []int, peers []Peer) ([]Membership, []error) {
	ms := make([]Membership, len(cs))
	errs := make([]error, len(cs))
	var wg sync.WaitGroup
	for i := range cs {
		wg.Add(1)
		go func() { defer wg.Done(); ms[i], errs[i] = cs[i].Register(ctx, want[i], peers[i]) }()
	}
	wg.Wait()
	return ms, errs
}

// waitRegistered waits until n ranks are registered in the server's
// current generation.
func waitRegistered(t *testing.T, s *Server, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.cur.nreg == n
	}, 5*time.Second, time.Millisecond)
}

func TestSettingsMismatchFailsEveryRank(t *testing.T) {
	f32 := map[string]string{"dtype": "float32", "op": "sum", "chunk": "1048576"}
	tests := []struct {
		desc    string
		world   int
		odd     Peer // registers last, as rank world-1
		wantMsg string
	}{
		{"different value", 3, Peer{Settings: map[string]string{"dtype": "int32", "op": "sum", "chunk": "1048576"}},
			"rank 2 joined with dtype=int32, but rank 0 has dtype=float32"},
		{"two keys differ", 2, Peer{Settings: map[string]string{"dtype": "int32", "op": "max", "chunk": "1048576"}},
			"rank 1 joined with dtype=int32, op=max, but rank 0 has dtype=float32, op=sum"},
		{"missing key", 2, Peer{Settings: map[string]string{"dtype": "float32", "op": "sum"}},
			"rank 1 joined without chunk, but rank 0 has chunk=1048576"},
		{"extra key", 2, Peer{Settings: map[string]string{"dtype": "float32", "op": "sum", "chunk": "1048576", "slots": "4"}},
			"rank 1 joined with slots=4, but rank 0 has no slots"},
		{"other world size", 2, Peer{World: 3, Settings: f32},
			"rank 1 expects a 3-rank job, but the job has 2 ranks"},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			s, addr := serveServer(t, "tok", tc.world)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			var cs []*Client
			var want []int
			var peers []Peer
			for r := range tc.world - 1 {
				cs = append(cs, dial(t, addr))
				want = append(want, r)
				peers = append(peers, Peer{Host: "h", World: tc.world, Settings: f32})
			}
			done := make(chan []error, 1)
			go func() { _, errs := registerAll(ctx, cs, want, peers); done <- errs }()
			waitRegistered(t, s, tc.world-1)
			odd := dial(t, addr)
			tc.odd.Host = "h"
			start := time.Now()
			_, err := odd.Register(ctx, tc.world-1, tc.odd)
			require.ErrorIs(t, err, ErrMismatch, "the joiner is refused")
			require.ErrorContains(t, err, tc.wantMsg)
			for i, err := range <-done {
				require.ErrorIs(t, err, ErrAborted, "blocked rank %d fails too", i)
				require.ErrorContains(t, err, tc.wantMsg)
				var ae *AbortError
				require.ErrorAs(t, err, &ae)
				require.Equal(t, tc.world-1, ae.Rank, "the abort names the joiner")
			}
			require.Less(t, time.Since(start), 5*time.Second, "at once, not at a deadline")
			_, err = cs[0].Get(ctx, "anything")
			require.ErrorIs(t, err, ErrAborted, "later calls fail too")
			require.ErrorContains(t, err, tc.wantMsg)
			require.ErrorContains(t, s.Err(), tc.wantMsg)
		})
	}
}

func TestSameSettingsRegister(t *testing.T) {
	_, addr := serveServer(t, "tok", 3)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cs := []*Client{dial(t, addr), dial(t, addr), dial(t, addr)}
	set := func() map[string]string { return map[string]string{"dtype": "float32", "op": "sum"} }
	ms, errs := registerAll(ctx, cs, []int{-1, -1, -1}, []Peer{{World: 3, Settings: set()}, {World: 0, Settings: set()}, {World: 3, Settings: set()}})
	for i := range cs {
		require.NoError(t, errs[i])
		require.Equal(t, 3, ms[i].World)
	}
}

func TestDeadJoinerCanRejoin(t *testing.T) {
	tests := []struct {
		desc string
		die  func(c *Client, cancel context.CancelFunc)
	}{
		{"register cancelled", func(_ *Client, cancel context.CancelFunc) { cancel() }},
		{"connection closed (process died)", func(c *Client, _ context.CancelFunc) { _ = c.conn.Close() }},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			s, addr := serveServer(t, "tok", 2)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			dead := dial(t, addr)
			dctx, dcancel := context.WithCancel(ctx)
			defer dcancel()
			failed := make(chan error, 1)
			go func() { _, err := dead.Register(dctx, 1, Peer{Host: "h"}); failed <- err }()
			waitRegistered(t, s, 1)
			tc.die(dead, dcancel)
			require.Error(t, <-failed)
			waitRegistered(t, s, 0)

			again := dial(t, addr)
			zero := dial(t, addr)
			ms, errs := registerAll(ctx, []*Client{again, zero}, []int{1, 0}, []Peer{{Host: "h", PID: 2}, {Host: "h", PID: 1}})
			require.NoError(t, errs[0], "the rank is free again")
			require.NoError(t, errs[1])
			require.Equal(t, 1, ms[0].Rank)
			require.Equal(t, 2, ms[1].Peers[1].PID, "the rejoined rank's peer info, not the dead one's")
			require.NoError(t, s.Err())
		})
	}
}

func TestDuplicateRankRefusedWithoutAbort(t *testing.T) {
	for _, formed := range []bool{false, true} {
		t.Run(fmt.Sprintf("formed=%v", formed), func(t *testing.T) {
			s, addr := serveServer(t, "tok", 2)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			a, b := dial(t, addr), dial(t, addr)
			regA, regB := make(chan error, 1), make(chan error, 1)
			go func() { _, err := a.Register(ctx, 0, Peer{Host: "h"}); regA <- err }()
			waitRegistered(t, s, 1)
			if formed {
				_, err := b.Register(ctx, 1, Peer{Host: "h"})
				require.NoError(t, err)
				require.NoError(t, <-regA)
			}
			dup := dial(t, addr)
			_, err := dup.Register(ctx, 0, Peer{Host: "h", PID: 99})
			require.ErrorIs(t, err, ErrRankTaken)
			require.Equal(t, codes.AlreadyExists, status.Code(err))
			require.ErrorContains(t, err, "rank 0 is already taken")
			// What a failing rank does on its way out (bench's deferred
			// Abort) must not take the running job down.
			require.NoError(t, dup.Abort(ctx, "could not register"))
			if formed {
				extra := dial(t, addr)
				_, err := extra.Register(ctx, -1, Peer{Host: "h"})
				require.ErrorIs(t, err, ErrRankTaken, "no free rank left")
				require.Equal(t, codes.ResourceExhausted, status.Code(err))
				require.NoError(t, extra.Abort(ctx, "could not register"))
				// A late joiner expecting another world size, or with other
				// settings, is refused too: the running job goes on.
				late := dial(t, addr)
				_, err = late.Register(ctx, 1, Peer{Host: "h", World: 3, Settings: map[string]string{"dtype": "int32"}})
				require.ErrorIs(t, err, ErrRankTaken)
				require.NotErrorIs(t, err, ErrAborted)
			}
			if !formed {
				go func() { _, err := b.Register(ctx, 1, Peer{Host: "h"}); regB <- err }()
				require.NoError(t, <-regB)
				require.NoError(t, <-regA)
			}
			require.NoError(t, s.Err())
			require.NoError(t, a.Put(ctx, "k", []byte("v")))
			v, err := b.Get(ctx, "k")
			require.NoError(t, err)
			require.Equal(t, []byte("v"), v)
		})
	}
}

func TestLeaveAfterWorldFormed(t *testing.T) {
	tests := []struct {
		desc      string
		leave     func(ctx context.Context, c *Client) error
		wantAbort string // "" = no abort
	}{
		{"connection gone", func(_ context.Context, c *Client) error { return c.conn.Close() },
			"rank 1 left the job: its connection to the rendezvous closed"},
		{"explicit leave", func(ctx context.Context, c *Client) error { return c.Leave(ctx, "out of memory") },
			"rank 1 left the job: out of memory"},
		{"clean close", func(_ context.Context, c *Client) error { return c.Close() }, ""},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			s, addr := serveServer(t, "tok", 2)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			a, b := dial(t, addr), dial(t, addr)
			_, errs := registerAll(ctx, []*Client{a, b}, []int{0, 1}, []Peer{{Host: "h"}, {Host: "h"}})
			require.NoError(t, errors.Join(errs...))
			got := make(chan error, 1)
			go func() {
				short, cancel := context.WithTimeout(ctx, 3*time.Second)
				defer cancel()
				_, err := a.Get(short, "never")
				got <- err
			}()
			time.Sleep(50 * time.Millisecond)
			require.NoError(t, tc.leave(ctx, b))
			err := <-got
			if tc.wantAbort == "" {
				require.Equal(t, codes.DeadlineExceeded, status.Code(err), "a clean close aborts nothing")
				require.NoError(t, s.Err())
				return
			}
			require.ErrorIs(t, err, ErrAborted)
			require.ErrorContains(t, err, tc.wantAbort)
			var ae *AbortError
			require.ErrorAs(t, err, &ae)
			require.Equal(t, 1, ae.Rank)
			select {
			case <-s.Failed():
			default:
				t.Fatal("Failed() not closed")
			}
		})
	}
}

func TestAbortNamesRank(t *testing.T) {
	s, addr := serveServer(t, "tok", 3)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cs := []*Client{dial(t, addr), dial(t, addr), dial(t, addr)}
	_, errs := registerAll(ctx, cs, []int{0, 1, 2}, make([]Peer, 3))
	require.NoError(t, errors.Join(errs...))
	require.NoError(t, cs[2].Abort(ctx, "rank 2: cannot map the segment"))
	err := cs[0].Barrier(ctx, "x")
	var ae *AbortError
	require.ErrorAs(t, err, &ae)
	require.Equal(t, 2, ae.Rank)
	require.Equal(t, "job aborted: rank 2: cannot map the segment", ae.Error(), "the rank is not said twice")
	require.ErrorIs(t, s.Err(), ErrAborted)

	s2, addr2 := serveServer(t, "tok", 1)
	c := dial(t, addr2)
	_, err = c.Register(ctx, 0, Peer{})
	require.NoError(t, err)
	s2.AbortRank(0, "rank 0 exited with status 3")
	_, err = c.Get(ctx, "k")
	require.ErrorAs(t, err, &ae)
	require.Equal(t, 0, ae.Rank)
	require.ErrorContains(t, err, "rank 0 exited with status 3")

	// A rank that found a peer dead names the peer.
	s4, addr4 := serveServer(t, "tok", 3)
	cs = []*Client{dial(t, addr4), dial(t, addr4), dial(t, addr4)}
	_, errs = registerAll(ctx, cs, []int{0, 1, 2}, make([]Peer, 3))
	require.NoError(t, errors.Join(errs...))
	require.NoError(t, cs[0].AbortWith(ctx, fmt.Errorf("rank 0, 4096 bytes: %w", faultErr{2})))
	require.ErrorAs(t, s4.Err(), &ae)
	require.Equal(t, 2, ae.Rank, "the dead peer, not the rank that reported it")
	require.Equal(t, "job aborted: rank 0, 4096 bytes: rank 2 exited", ae.Error())

	s3, addr3 := serveServer(t, "tok", 2)
	require.NoError(t, dial(t, addr3).Abort(ctx, "cannot open the device"), "a rank that fails before it registers")
	require.ErrorAs(t, s3.Err(), &ae)
	require.Equal(t, -1, ae.Rank)
	require.Equal(t, "job aborted: a process that had not registered: cannot open the device", ae.Error())
}

func TestNewGeneration(t *testing.T) {
	s, addr := serveServer(t, "tok", 2)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.Equal(t, 0, s.Generation())
	var old []*Client
	for gen := range 4 {
		formed := s.Formed()
		select {
		case <-formed:
			t.Fatalf("generation %d formed before anyone registered", gen)
		default:
		}
		a, b := dial(t, addr), dial(t, addr)
		ms, errs := registerAll(ctx, []*Client{a, b}, []int{0, 1},
			[]Peer{{Settings: map[string]string{"gen": fmt.Sprint(gen)}}, {Settings: map[string]string{"gen": fmt.Sprint(gen)}}})
		require.NoError(t, errors.Join(errs...), "generation %d: ranks re-register, settings compared afresh", gen)
		require.Equal(t, gen, ms[0].Generation)
		<-formed
		short, c := context.WithTimeout(ctx, 100*time.Millisecond)
		_, err := a.Get(short, "k")
		c()
		require.Equal(t, codes.DeadlineExceeded, status.Code(err), "generation %d starts with an empty store", gen)
		require.NoError(t, a.Put(ctx, "k", []byte{byte(gen)}), "the same key again")
		for i := range 10 {
			require.NoError(t, b.Put(ctx, fmt.Sprintf("k%d", i), nil))
		}
		bar := make(chan error, 1)
		go func() { bar <- b.Barrier(ctx, "b") }()
		require.NoError(t, a.Barrier(ctx, "b"))
		require.NoError(t, <-bar)
		blocked := make(chan error, 1)
		go func() { _, err := b.Get(ctx, "never"); blocked <- err }()
		require.NoError(t, a.Abort(ctx, "crash"))
		require.ErrorIs(t, <-blocked, ErrAborted)
		for _, o := range old {
			require.ErrorIs(t, o.Put(ctx, "stale", nil), ErrStaleGeneration, "a rank of an earlier generation")
		}
		old = append(old, a)
		// A call blocked across the restart fails.
		go func() { _, err := b.Get(ctx, "x"); blocked <- err }()
		time.Sleep(20 * time.Millisecond)
		require.Equal(t, gen+1, s.NewGeneration())
		require.Error(t, <-blocked)
		require.Equal(t, gen+1, s.Generation())
		require.NoError(t, s.Err(), "the abort state is reset")
		s.mu.Lock()
		require.Empty(t, s.cur.kv)
		require.Empty(t, s.cur.barriers)
		require.Empty(t, s.cur.kvWait)
		s.mu.Unlock()
	}
}

func TestAbsentServerFailsFast(t *testing.T) {
	dir := t.TempDir()
	refused, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	tcpAddr := refused.Addr().String()
	require.NoError(t, refused.Close())
	tests := []struct {
		desc, addr, want string
	}{
		{"unix socket not there", "unix://" + filepath.Join(dir, "none.sock"),
			"no rendezvous at unix://" + filepath.Join(dir, "none.sock") + ": no such file or directory (is the launcher running?)"},
		{"tcp refused", tcpAddr, "no rendezvous at " + tcpAddr + ": connection refused (is the launcher running?)"},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			c, err := Dial(tc.addr, "tok")
			require.NoError(t, err)
			defer c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
			defer cancel()
			start := time.Now()
			_, err = c.Register(ctx, 0, Peer{})
			require.ErrorIs(t, err, ErrUnreachable)
			require.ErrorContains(t, err, tc.want)
			require.Less(t, time.Since(start), 2500*time.Millisecond, "bounded by the deadline")
			require.ErrorIs(t, c.Put(ctx, "k", nil), ErrUnreachable, "every call, not only Register")
		})
	}
	t.Run("connect budget shorter than the deadline", func(t *testing.T) {
		c, err := Dial("unix://"+filepath.Join(dir, "none.sock"), "tok", WithConnectTimeout(200*time.Millisecond))
		require.NoError(t, err)
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		start := time.Now()
		_, err = c.Register(ctx, 0, Peer{})
		require.ErrorIs(t, err, ErrUnreachable)
		require.Less(t, time.Since(start), 2*time.Second)
	})
	t.Run("server comes up late", func(t *testing.T) {
		s, err := NewServer("tok", 1)
		require.NoError(t, err)
		sock := filepath.Join(dir, "late.sock")
		c, err := Dial("unix://"+sock, "tok")
		require.NoError(t, err)
		defer c.Close()
		go func() {
			time.Sleep(300 * time.Millisecond)
			lis, err := net.Listen("unix", sock)
			if err == nil {
				_ = s.Serve(lis)
			}
		}()
		defer s.Stop()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err = c.Register(ctx, 0, Peer{})
		require.NoError(t, err, "retried until the server listened")
	})
}

func TestStopIsNoAbort(t *testing.T) {
	s, addr := serveServer(t, "tok", 2)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, errs := registerAll(ctx, []*Client{dial(t, addr), dial(t, addr)}, []int{0, 1}, make([]Peer, 2))
	require.NoError(t, errors.Join(errs...))
	s.Stop()
	time.Sleep(50 * time.Millisecond) // connection ends are handled asynchronously
	require.NoError(t, s.Err(), "the connections the server closes itself are no rank leaving")
}

type faultErr struct{ rank int }

func (e faultErr) Error() string  { return fmt.Sprintf("rank %d exited", e.rank) }
func (e faultErr) FaultRank() int { return e.rank }

// TestRankEndedBeforeJoining: a rank whose process ended without failing
// before the world formed will never join; the ranks joining fail at once
// naming it — those blocked in Register now, a later one at its
// registration, even when none had registered yet (the ended rank was the
// quickest). A job whose ranks never register sees nothing, and once the
// world has formed an ended rank is a rank that finished.
func TestRankEndedBeforeJoining(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const reason = "rank 2 (pid 7) exited with code 0 before every rank joined the group"
	tests := []struct {
		name      string
		before    int  // ranks registering (and blocked) before rank 2 ends
		after     int  // ranks registering after it ended
		abortsNow bool // RankEnded's answer
	}{
		{"ranks blocked joining", 2, 0, true},
		{"one blocked, one joining later", 1, 1, true},
		{"no rank had registered", 0, 2, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, addr := serveServer(t, "tok", 3)
			errs := make(chan error, 3)
			join := func(rank int) {
				c := dial(t, addr)
				go func() { _, err := c.Register(ctx, rank, Peer{}); errs <- err }()
			}
			for r := range tc.before {
				join(r)
			}
			waitRegistered(t, s, tc.before)
			start := time.Now()
			require.Equal(t, tc.abortsNow, s.RankEnded(2, reason))
			for r := tc.before; r < tc.before+tc.after; r++ {
				join(r)
			}
			for range tc.before + tc.after {
				err := <-errs
				var ae *AbortError
				require.ErrorAs(t, err, &ae)
				require.Equal(t, 2, ae.Rank)
				require.Equal(t, "job aborted: "+reason, ae.Error())
			}
			require.Less(t, time.Since(start), 5*time.Second)
		})
	}

	t.Run("a job that never registers", func(t *testing.T) {
		s, _ := serveServer(t, "tok", 2)
		require.False(t, s.RankEnded(1, reason))
		require.NoError(t, s.Err(), "nothing aborted")
	})
	t.Run("after the world formed", func(t *testing.T) {
		s, addr := serveServer(t, "tok", 2)
		_, errs := registerAll(ctx, []*Client{dial(t, addr), dial(t, addr)}, []int{0, 1}, make([]Peer, 2))
		require.NoError(t, errors.Join(errs...))
		require.False(t, s.RankEnded(1, "rank 1 finished"))
		require.NoError(t, s.Err())
	})
	t.Run("a new generation forgets it", func(t *testing.T) {
		s, addr := serveServer(t, "tok", 2)
		require.False(t, s.RankEnded(1, reason))
		s.NewGeneration()
		_, errs := registerAll(ctx, []*Client{dial(t, addr), dial(t, addr)}, []int{0, 1}, make([]Peer, 2))
		require.NoError(t, errors.Join(errs...))
	})
}
