package ctxmgr_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	ctxmgr "github.com/migctl/migctl/context"
	"github.com/migctl/migctl/context/ctlpb"
	"github.com/migctl/migctl/context/fakeshim"
	"github.com/migctl/migctl/mig"
)

// shortDir is a temporary directory with a short path (Unix socket paths
// are limited to 108 bytes), removed at the end of the test.
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "mcx")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// runDaemon starts a daemon over src with sockets and state in dir, and
// stops it at the end of the test.
func runDaemon(t *testing.T, dir string, src ctxmgr.MIGSource, metrics string) *ctxmgr.Daemon {
	t.Helper()
	d, err := ctxmgr.StartDaemon(context.Background(), ctxmgr.DaemonConfig{
		ControlSocket: filepath.Join(dir, "run", "ctl.sock"),
		SwapSocket:    filepath.Join(dir, "run", "swap.sock"),
		MIG:           src,
		Leases:        ctxmgr.LeaseOptions{StatePath: filepath.Join(dir, "leases.json"), EnableMIG: true},
		ReapEvery:     20 * time.Millisecond,
		Swap:          ctxmgr.Options{GPUMemory: 80 << 30, RebalanceEvery: -1},
		MetricsAddr:   metrics,
	})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, d.Close()) })
	return d
}

func dial(t *testing.T, socket string) *ctxmgr.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := ctxmgr.Dial(ctx, socket)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// next returns the next event, failing after 5 s.
func next(t *testing.T, ch <-chan ctxmgr.Event) ctxmgr.Event {
	t.Helper()
	select {
	case e, ok := <-ch:
		require.True(t, ok, "the watch ended")
		return e
	case <-time.After(5 * time.Second):
		t.Fatal("no event within 5 s")
		return ctxmgr.Event{}
	}
}

func TestDaemonLeasesOverGRPC(t *testing.T) {
	_, mm := simNode(t, 1, nil)
	d := runDaemon(t, shortDir(t), mm, "")
	c := dial(t, d.ControlSocket())
	ctx := ctx5s(t)

	all, err := c.Watch(ctx, "")
	require.NoError(t, err)
	onlyB, err := c.Watch(ctx, "b")
	require.NoError(t, err)

	ls, err := c.Acquire(ctx, ctxmgr.AcquireRequest{Job: "a", Profile: "1g.18gb", Count: 7, GPU: -1})
	require.NoError(t, err)
	require.Len(t, ls, 7)
	for _, le := range ls {
		require.True(t, le.Created, "made on the empty GPU")
		require.Equal(t, "a", le.Job)
	}
	e := next(t, all)
	require.Equal(t, ctxmgr.EventAcquired, e.Type)
	require.Equal(t, ls, e.Leases)

	got, err := c.Leases(ctx)
	require.NoError(t, err)
	require.Equal(t, ls, got)

	_, err = c.Acquire(ctx, ctxmgr.AcquireRequest{Job: "b", Profile: "1g.18gb", GPU: -1})
	require.ErrorIs(t, err, ctxmgr.ErrNoFreeInstance, "the error keeps its meaning over the wire")
	require.ErrorContains(t, err, "leased by job a")
	var re *ctxmgr.RemoteError
	require.ErrorAs(t, err, &re)
	require.Equal(t, codes.ResourceExhausted, re.Code)

	_, err = c.Acquire(ctx, ctxmgr.AcquireRequest{Job: "b", Profile: "9g.1gb", GPU: -1})
	require.ErrorIs(t, err, mig.ErrUnknownProfile)
	require.ErrorContains(t, err, "'migctl partition profiles' lists them")
	_, err = c.Acquire(ctx, ctxmgr.AcquireRequest{Job: "", Profile: "1g.18gb", GPU: -1})
	require.ErrorIs(t, err, ctxmgr.ErrBadRequest)

	rel, err := c.Release(ctx, "a")
	require.NoError(t, err)
	require.Equal(t, ls, rel)
	e = next(t, all)
	require.Equal(t, ctxmgr.EventReleased, e.Type)
	require.Equal(t, "a", e.Job)
	_, err = c.Release(ctx, "a")
	require.ErrorIs(t, err, ctxmgr.ErrNoLease)

	lb, err := c.Acquire(ctx, ctxmgr.AcquireRequest{Job: "b", Profile: "3g.71gb", GPU: 0})
	require.NoError(t, err)
	e = next(t, onlyB)
	require.Equal(t, ctxmgr.EventAcquired, e.Type, "the job's watcher saw none of job a's events")
	require.Equal(t, lb, e.Leases)
	one, err := c.ReleaseUUID(ctx, lb[0].UUID)
	require.NoError(t, err)
	require.Equal(t, lb[0].UUID, one.UUID)
}

func TestDaemonLeasesEndWithProcessAndConnection(t *testing.T) {
	_, mm := simNode(t, 1, nil)
	d := runDaemon(t, shortDir(t), mm, "")
	watcher := dial(t, d.ControlSocket())
	ctx := ctx5s(t)
	events, err := watcher.Watch(ctx, "")
	require.NoError(t, err)

	worker := exec.Command("sleep", "60")
	require.NoError(t, worker.Start())
	t.Cleanup(func() { worker.Process.Kill(); worker.Wait() })
	_, err = watcher.Acquire(ctx, ctxmgr.AcquireRequest{Job: "pid", Profile: "1g.18gb", Count: 2, GPU: -1, PID: worker.Process.Pid})
	require.NoError(t, err)
	require.Equal(t, ctxmgr.EventAcquired, next(t, events).Type)

	conn := dial(t, d.ControlSocket())
	bound, err := conn.Acquire(ctx, ctxmgr.AcquireRequest{Job: "conn", Profile: "1g.18gb", Count: 3, GPU: -1, BindToConnection: true})
	require.NoError(t, err)
	require.True(t, bound[0].BoundToConnection)
	require.Equal(t, ctxmgr.EventAcquired, next(t, events).Type)
	ls, err := watcher.Leases(ctx)
	require.NoError(t, err)
	require.Len(t, ls, 5)

	require.NoError(t, conn.Close())
	e := next(t, events)
	require.Equal(t, ctxmgr.EventExpired, e.Type)
	require.Equal(t, "conn", e.Job)
	require.Equal(t, "the client's connection closed", e.Reason)
	require.Len(t, e.Leases, 3)

	require.NoError(t, worker.Process.Kill())
	_, _ = worker.Process.Wait()
	e = next(t, events)
	require.Equal(t, ctxmgr.EventExpired, e.Type)
	require.Equal(t, "pid", e.Job)
	require.Equal(t, "its process exited", e.Reason)
	ls, err = watcher.Leases(ctx)
	require.NoError(t, err)
	require.Empty(t, ls)
}

func TestDaemonRestartKeepsLeases(t *testing.T) {
	_, mm := simNode(t, 1, nil)
	dir := shortDir(t)
	live := exec.Command("sleep", "60")
	require.NoError(t, live.Start())
	t.Cleanup(func() { live.Process.Kill(); live.Wait() })
	dying := exec.Command("sleep", "60")
	require.NoError(t, dying.Start())

	d1, err := ctxmgr.StartDaemon(context.Background(), ctxmgr.DaemonConfig{ControlSocket: filepath.Join(dir, "c.sock"), SwapSocket: filepath.Join(dir, "s.sock"),
		MIG: mm, Leases: ctxmgr.LeaseOptions{StatePath: filepath.Join(dir, "leases.json"), EnableMIG: true}})
	require.NoError(t, err)
	c := dial(t, d1.ControlSocket())
	ctx := ctx5s(t)
	keep, err := c.Acquire(ctx, ctxmgr.AcquireRequest{Job: "train", Profile: "1g.18gb", Count: 3, GPU: -1, PID: live.Process.Pid})
	require.NoError(t, err)
	_, err = c.Acquire(ctx, ctxmgr.AcquireRequest{Job: "dies", Profile: "1g.18gb", Count: 2, GPU: -1, PID: dying.Process.Pid})
	require.NoError(t, err)
	bound, err := c.Acquire(ctx, ctxmgr.AcquireRequest{Job: "train", Profile: "1g.18gb", GPU: -1, PID: live.Process.Pid, BindToConnection: true})
	require.NoError(t, err)
	_, err = c.Acquire(ctx, ctxmgr.AcquireRequest{Job: "onlyconn", Profile: "1g.18gb", GPU: -1, BindToConnection: true})
	require.NoError(t, err)
	events, err := c.Watch(ctx, "")
	require.NoError(t, err)
	closed := time.Now()
	require.NoError(t, d1.Close(), "the daemon stops under a connected client")
	require.Less(t, time.Since(closed), time.Second, "a watch does not hold up the stop")
	e := next(t, events)
	require.Equal(t, ctxmgr.EventWatchEnded, e.Type)
	require.Contains(t, e.Reason, "the daemon is stopping")
	require.NoError(t, c.Close())
	_, err = os.Stat(d1.ControlSocket())
	require.ErrorIs(t, err, os.ErrNotExist, "the daemon removes its sockets")

	require.NoError(t, dying.Process.Kill())
	_, _ = dying.Process.Wait()

	d2 := runDaemon(t, dir, mm, "")
	c2 := dial(t, d2.ControlSocket())
	got, err := c2.Leases(ctx)
	require.NoError(t, err)
	bound[0].BoundToConnection = false // no connection outlives the restart; the pid keeps it
	keep = append(keep, bound...)
	require.Equal(t, keep, got, "the live job's leases survive the restart (also one bound to the old connection); the dead one's, and one bound only to the connection, are gone")
	_, err = ctxmgr.StartDaemon(context.Background(), ctxmgr.DaemonConfig{ControlSocket: d2.ControlSocket(), SwapSocket: d2.SwapSocket(), MIG: mm,
		Leases: ctxmgr.LeaseOptions{StatePath: filepath.Join(dir, "leases.json")}})
	require.ErrorContains(t, err, "another daemon is listening")
	_, err = c2.Acquire(ctx, ctxmgr.AcquireRequest{Job: "next", Profile: "1g.18gb", Count: 3, GPU: -1})
	require.NoError(t, err, "the dead job's instances are free again")
	require.Equal(t, []string{"1g.18gb×7"}, counts(t, mm))
}

func TestDaemonWatchSeesSwaps(t *testing.T) {
	d := runDaemon(t, shortDir(t), nil, "")
	c := dial(t, d.ControlSocket())
	ctx := ctx5s(t)
	events, err := c.Watch(ctx, "bert")
	require.NoError(t, err)
	s, err := fakeshim.Dial(ctx, d.SwapSocket(), fakeshim.Hello{PID: 901, Job: "bert", Device: "GPU-x", Bytes: 1 << 30},
		fakeshim.Behavior{Chunks: 2})
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	require.Eventually(t, func() bool {
		ps, _, err := c.Status(ctx)
		return err == nil && len(ps) == 1
	}, 5*time.Second, 10*time.Millisecond)

	var progress int
	res, err := c.Swap(ctx, ctxmgr.SwapOut, ctxmgr.Target{Job: "bert"}, func(ctxmgr.Progress) { progress++ })
	require.NoError(t, err)
	require.Len(t, res, 1)
	require.True(t, res[0].OK)
	require.Equal(t, 2, progress)

	e := next(t, events)
	require.Equal(t, ctxmgr.EventSwapStarted, e.Type)
	require.Equal(t, "swap-out", e.Swap.Direction)
	require.Equal(t, 901, e.Swap.PID)
	e = next(t, events)
	require.Equal(t, ctxmgr.EventSwapDone, e.Type)
	require.True(t, e.Swap.OK)
	require.Equal(t, int64(1<<30), e.Swap.Bytes)

	rec := httptest.NewRecorder()
	d.Metrics().Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	for _, want := range []string{
		`migctl_swaps_total{direction="swap-out",outcome="ok"} 1`,
		`migctl_swap_bytes_total{direction="swap-out"} 1.073741824e+09`,
		`migctl_swap_seconds_count{direction="swap-out"} 1`,
	} {
		require.Contains(t, rec.Body.String(), want)
	}

	_, err = c.Acquire(ctx, ctxmgr.AcquireRequest{Job: "x", Profile: "1g.18gb", GPU: -1})
	require.ErrorIs(t, err, ctxmgr.ErrNoMIG, "a daemon without a MIG source says so")
}

func TestDaemonMetrics(t *testing.T) {
	_, mm := simNode(t, 1, nil)
	d := runDaemon(t, shortDir(t), mm, "127.0.0.1:0")
	c := dial(t, d.ControlSocket())
	ctx := ctx5s(t)
	_, err := c.Acquire(ctx, ctxmgr.AcquireRequest{Job: "a", Profile: "1g.18gb", Count: 3, GPU: -1})
	require.NoError(t, err)
	require.NoError(t, c.ReportCollectives(ctx, ctxmgr.CollectiveReport{Job: "a", Op: "all_reduce", Calls: 5, Bytes: 1 << 20, Seconds: 0.5}))
	err = c.ReportCollectives(ctx, ctxmgr.CollectiveReport{Job: "a", Op: "all_reduce", Calls: -1})
	require.ErrorIs(t, err, ctxmgr.ErrBadRequest)

	resp, err := http.Get("http://" + d.MetricsAddr() + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	for _, want := range []string{
		`migctl_leases{job="a",profile="1g.18gb"} 3`,
		`migctl_mig_instances{gpu="0",profile="1g.18gb",state="leased"} 3`,
		`migctl_lease_events_total{type="acquired"} 3`,
		`migctl_collective_calls_total{job="a",op="all_reduce"} 5`,
		`migctl_collective_bytes_total{job="a",op="all_reduce"} 1.048576e+06`,
	} {
		require.Contains(t, string(body), want)
	}

	for _, addr := range []string{":0", "0.0.0.0:0", "192.0.2.1:9400"} {
		_, err := ctxmgr.StartDaemon(context.Background(), ctxmgr.DaemonConfig{ControlSocket: filepath.Join(shortDir(t), "c"),
			SwapSocket: filepath.Join(shortDir(t), "s"), MetricsAddr: addr})
		require.ErrorContains(t, err, "not a loopback address", addr)
	}
}

func TestDialErrors(t *testing.T) {
	dir := shortDir(t)
	ctx := ctx5s(t)

	stale := filepath.Join(dir, "stale.sock")
	ln, err := net.Listen("unix", stale)
	require.NoError(t, err)
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()

	denied := filepath.Join(dir, "denied.sock")
	dl, err := net.Listen("unix", denied)
	require.NoError(t, err)
	srv := grpc.NewServer(grpc.UnaryInterceptor(func(context.Context, any, *grpc.UnaryServerInfo, grpc.UnaryHandler) (any, error) {
		return nil, status.Error(codes.PermissionDenied, "permission denied by the daemon (uid 1234 is not allowed; run as uid 0 or root)")
	}))
	ctlpb.RegisterControlServer(srv, ctlpb.UnimplementedControlServer{})
	go srv.Serve(dl)
	t.Cleanup(srv.Stop)

	tests := []struct {
		desc   string
		socket string
		is     error
		want   string
	}{
		{"no socket", filepath.Join(dir, "none.sock"), ctxmgr.ErrDaemonNotRunning, "not running at " + filepath.Join(dir, "none.sock") + " (no socket there): start it with 'sudo migctl daemon'"},
		{"stale socket", stale, ctxmgr.ErrDaemonNotRunning, "a stale socket"},
		{"refused uid", denied, ctxmgr.ErrPermissionDenied, "permission denied by the daemon (uid 1234 is not allowed"},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			_, err := ctxmgr.Dial(ctx, tc.socket)
			require.ErrorIs(t, err, tc.is)
			require.ErrorContains(t, err, tc.want)
			require.NotContains(t, err.Error(), "\n", "one line")
			require.Equal(t, 1, strings.Count(err.Error(), "permission denied by the daemon")+boolInt(!errors.Is(err, ctxmgr.ErrPermissionDenied)))
		})
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
