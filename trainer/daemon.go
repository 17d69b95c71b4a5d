package trainer

import (
	"context"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/migctl/migctl/context/ctlpb"
)

// daemonLink is a rank's connection to the node daemon's control socket
// (MIGCTL_SOCKET): it follows the job's swaps (a gpu-backend rank under the
// shim learns there that its job is held) and reports collective counts for
// the daemon's metrics. It speaks the control API (context/ctlpb) itself
// rather than through package ctxmgr, whose MIG layer would bring NVML into
// every training process (and into libmigctl.so).
type daemonLink struct {
	conn   *grpc.ClientConn
	ctl    ctlpb.ControlClient
	job    string
	cancel context.CancelFunc
	done   chan struct{}

	mu    sync.Mutex
	stats map[string]*ctlpb.CollectiveReport
}

// swapEvent is what the link needs of a daemon event.
type swapEvent struct {
	started, done, out, ok bool
	pid                    int
}

// reportEvery is how often collective counts go to the daemon.
const reportEvery = 10 * time.Second

// linkDaemon connects to the daemon if the environment names one. A missing
// or unreachable daemon is not an error: the rank runs without it.
func linkDaemon(ctx context.Context, g *Group) *daemonLink {
	c := g.cfg
	if c.socket == "" {
		return nil
	}
	job := c.swapJob
	if job == "" {
		job = c.job
	}
	if _, err := os.Stat(c.socket); err != nil {
		return nil
	}
	var d net.Dialer
	conn, err := grpc.NewClient("passthrough:///migctl-daemon",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return d.DialContext(ctx, "unix", c.socket)
		}))
	if err != nil {
		return nil
	}
	wctx, wcancel := context.WithCancel(context.Background())
	l := &daemonLink{conn: conn, ctl: ctlpb.NewControlClient(conn), job: job, cancel: wcancel, done: make(chan struct{}),
		stats: map[string]*ctlpb.CollectiveReport{}}
	// Ranks under the shim learn of their job's swaps from the daemon's
	// events; host-backend ranks are told directly (swapMember).
	var events <-chan swapEvent
	if g.swap == nil && job != "" {
		events = l.watch(ctx, wctx, job)
	}
	go l.run(wctx, events, g.hold)
	return l
}

// watch opens the daemon's event stream for job (nil if the daemon does
// not answer within 5 s) and turns its swap events into swapEvents.
func (l *daemonLink) watch(setup, ctx context.Context, job string) <-chan swapEvent {
	stream, err := l.ctl.Watch(ctx, &ctlpb.WatchRequest{Job: job})
	if err != nil {
		return nil
	}
	hdr := make(chan error, 1)
	go func() { _, err := stream.Header(); hdr <- err }()
	sctx, cancel := context.WithTimeout(setup, 5*time.Second)
	defer cancel()
	select {
	case err := <-hdr:
		if err != nil {
			return nil
		}
	case <-sctx.Done():
		return nil
	}
	ch := make(chan swapEvent, 64)
	go func() {
		defer close(ch)
		for {
			ev, err := stream.Recv()
			if err != nil {
				return
			}
			sw := ev.GetSwap()
			if sw == nil {
				continue
			}
			e := swapEvent{started: ev.GetType() == "swap-started", done: ev.GetType() == "swap-done",
				out: sw.GetDirection() == ctlpb.Direction_DIRECTION_OUT, ok: sw.GetOk(), pid: int(sw.GetPid())}
			select {
			case ch <- e:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch
}

// run follows swap events and reports counts until stopped.
func (l *daemonLink) run(ctx context.Context, events <-chan swapEvent, h *holdState) {
	defer close(l.done)
	out := map[int]bool{} // pids of the job swapped out (or going)
	defer func() {
		for range out {
			h.in()
		}
	}()
	tick := time.NewTicker(reportEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			l.report()
			return
		case <-tick.C:
			l.report()
		case ev, ok := <-events:
			if !ok {
				events = nil
				for pid := range out {
					delete(out, pid)
					h.in()
				}
				continue
			}
			switch {
			case ev.started && ev.out && !out[ev.pid]:
				out[ev.pid] = true
				h.out()
			case ev.done && out[ev.pid] && (!ev.out && ev.ok || ev.out && !ev.ok):
				// Back in, or the swap-out failed and the process kept its memory.
				delete(out, ev.pid)
				h.in()
			}
		}
	}
}

// count records one collective for the next report.
func (l *daemonLink) count(op string, bytes int, d time.Duration) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.stats[op]
	if r == nil {
		r = &ctlpb.CollectiveReport{Job: l.job, Op: op}
		l.stats[op] = r
	}
	r.Calls++
	r.Bytes += int64(bytes)
	r.Seconds += d.Seconds()
}

func (l *daemonLink) report() {
	l.mu.Lock()
	stats := l.stats
	l.stats = map[string]*ctlpb.CollectiveReport{}
	l.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, r := range stats {
		if r.Job == "" {
			r.Job = "pid-" + strconv.Itoa(os.Getpid())
		}
		_, _ = l.ctl.ReportCollectives(ctx, r)
	}
}

// Close reports the last counts and disconnects.
func (l *daemonLink) Close() error {
	l.cancel()
	<-l.done
	return l.conn.Close()
}
