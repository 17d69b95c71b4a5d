package trainer

import (
	"context"
	"os"
	"sync"
	"time"

	ctxmgr "github.com/migctl/migctl/context"
)

// daemonLink is a rank's connection to the node daemon's control socket
// (MIGCTL_SOCKET): it follows the job's swaps (a gpu-backend rank under the
// shim learns there that its job is held) and reports collective counts for
// the daemon's metrics.
type daemonLink struct {
	client *ctxmgr.Client
	job    string
	cancel context.CancelFunc
	done   chan struct{}

	mu    sync.Mutex
	stats map[string]*ctxmgr.CollectiveReport
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
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	client, err := ctxmgr.Dial(dctx, c.socket)
	if err != nil {
		return nil
	}
	wctx, wcancel := context.WithCancel(context.Background())
	l := &daemonLink{client: client, job: job, cancel: wcancel, done: make(chan struct{}),
		stats: map[string]*ctxmgr.CollectiveReport{}}
	// Ranks under the shim learn of their job's swaps from the daemon's
	// events; host-backend ranks are told directly (swapMember).
	var events <-chan ctxmgr.Event
	if g.swap == nil && job != "" {
		if events, err = client.Watch(wctx, job); err != nil {
			events = nil
		}
	}
	go l.run(wctx, events, g.hold)
	return l
}

// run follows swap events and reports counts until stopped.
func (l *daemonLink) run(ctx context.Context, events <-chan ctxmgr.Event, h *holdState) {
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
			if ev.Swap == nil {
				continue
			}
			pid := ev.Swap.PID
			switch {
			case ev.Type == ctxmgr.EventSwapStarted && ev.Swap.Direction == ctxmgr.SwapOut.String() && !out[pid]:
				out[pid] = true
				h.out()
			case ev.Type == ctxmgr.EventSwapDone && out[pid] &&
				(ev.Swap.Direction == ctxmgr.SwapIn.String() && ev.Swap.OK || ev.Swap.Direction == ctxmgr.SwapOut.String() && !ev.Swap.OK):
				// Back in, or the swap-out failed and the process kept its memory.
				delete(out, pid)
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
		r = &ctxmgr.CollectiveReport{Job: l.job, Op: op}
		l.stats[op] = r
	}
	r.Calls++
	r.Bytes += int64(bytes)
	r.Seconds += d.Seconds()
}

func (l *daemonLink) report() {
	l.mu.Lock()
	stats := l.stats
	l.stats = map[string]*ctxmgr.CollectiveReport{}
	l.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, r := range stats {
		if r.Job == "" {
			r.Job = "pid-" + itoa(os.Getpid())
		}
		_ = l.client.ReportCollectives(ctx, *r)
	}
}

// Close reports the last counts and disconnects.
func (l *daemonLink) Close() error {
	l.cancel()
	<-l.done
	return l.client.Close()
}
