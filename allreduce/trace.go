package allreduce

import (
	"fmt"
	"io"
	"runtime/metrics"
	"slices"
	"strings"
	"time"
)

// Opt-in timing trace of one rank's collective calls (Options.Trace): per
// call, per step, when the lane reached the step, when its waits were
// satisfied (and on which rank's flag it waited longest), when the step
// was issued and when it completed; per call the fence, the transport's
// futex sleeps and timeouts, and the Go collector's cycles. Close writes a
// summary per (collective, algorithm, size). With Trace nil the executor
// only tests a nil pointer.

// sleepStater is what the trace reads from a transport that counts its
// futex sleeps (comm.ShmTransport).
type sleepStater interface {
	SleepStats() (sleeps, timeouts uint64)
}

type traceKey struct {
	coll  Coll
	alg   Algorithm
	bytes int
}

type stepTrace struct {
	kind                       Kind
	reach, ready, issued, done time.Duration // since the call started
	slowRank                   int           // rank whose flag this step waited longest for (-1: none)
	longWaits                  int           // flag waits of 900µs or more
}

type callTrace struct {
	t0    time.Time
	fence time.Duration
	lanes [NumLanes][]stepTrace
}

type traceAgg struct {
	calls              int
	total, fence, tail []time.Duration
	sleeps, timeouts   uint64
	gcs                uint32
	steps              [NumLanes][]stepAgg
}

type stepAgg struct {
	kind                     Kind
	wait, issue, device, end []time.Duration
	slow                     map[int]int
	longWaits                int
}

type tracer struct {
	w     io.Writer
	rank  int
	order []traceKey
	aggs  map[traceKey]*traceAgg

	cur       *callTrace
	key       traceKey
	sleeps0   uint64
	timeouts0 uint64
	gc0       uint32
	gcSample  []metrics.Sample
}

func newTracer(w io.Writer, rank int) *tracer {
	return &tracer{w: w, rank: rank, aggs: map[traceKey]*traceAgg{},
		gcSample: []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}}}
}

// numGC reads the collector's cycle count (without stopping the world).
func (t *tracer) numGC() uint32 {
	metrics.Read(t.gcSample)
	if t.gcSample[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return uint32(t.gcSample[0].Value.Uint64())
}

// begin starts a call; the lanes' slices are sized so that every lane
// goroutine writes only its own.
func (t *tracer) begin(p Params, steps []Step, tr Transport) {
	t.key = traceKey{p.Coll, p.Algorithm, p.Bytes}
	c := &callTrace{}
	for i := range steps {
		c.lanes[steps[i].Lane] = append(c.lanes[steps[i].Lane], stepTrace{kind: steps[i].Kind, slowRank: -1})
	}
	if s, ok := tr.(sleepStater); ok {
		t.sleeps0, t.timeouts0 = s.SleepStats()
	}
	t.gc0 = t.numGC()
	c.t0 = time.Now()
	t.cur = c
}

func (t *tracer) since() time.Duration { return time.Since(t.cur.t0) }

// end folds the finished call into the summary.
func (t *tracer) end(tr Transport) {
	c := t.cur
	total := time.Since(c.t0)
	a := t.aggs[t.key]
	if a == nil {
		a = &traceAgg{}
		t.aggs[t.key] = a
		t.order = append(t.order, t.key)
	}
	a.calls++
	a.total = append(a.total, total)
	a.fence = append(a.fence, c.fence)
	if s, ok := tr.(sleepStater); ok {
		sl, to := s.SleepStats()
		a.sleeps += sl - t.sleeps0
		a.timeouts += to - t.timeouts0
	}
	a.gcs += t.numGC() - t.gc0
	var last time.Duration
	for l := range c.lanes {
		if len(a.steps[l]) < len(c.lanes[l]) {
			for _, st := range c.lanes[l][len(a.steps[l]):] {
				a.steps[l] = append(a.steps[l], stepAgg{kind: st.kind, slow: map[int]int{}})
			}
		}
		for i, st := range c.lanes[l] {
			g := &a.steps[l][i]
			g.wait = append(g.wait, st.ready-st.reach)
			g.issue = append(g.issue, st.issued-st.ready)
			g.device = append(g.device, st.done-st.issued)
			g.end = append(g.end, st.done)
			if st.slowRank >= 0 {
				g.slow[st.slowRank]++
			}
			g.longWaits += st.longWaits
			last = max(last, st.done)
		}
	}
	a.tail = append(a.tail, total-last)
	t.cur = nil
}

func pct(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

func mean(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return sum / time.Duration(len(ds))
}

func us(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d)/1e3) }

func dist(ds []time.Duration) string {
	return fmt.Sprintf("%s/%s/%s/%s", us(pct(ds, 0.5)), us(pct(ds, 0.9)), us(pct(ds, 0.99)), us(mean(ds)))
}

var laneNames = [NumLanes]string{"out", "reduce", "in"}

// summary writes one block per (collective, algorithm, size).
func (t *tracer) summary() {
	var b strings.Builder
	fmt.Fprintf(&b, "trace rank %d (µs as p50/p90/p99/mean):\n", t.rank)
	for _, k := range t.order {
		a := t.aggs[k]
		fmt.Fprintf(&b, "  %s %s %d B: %d calls; call %s; fence %s; after last step %s; futex sleeps %.2f/call, 1ms timeouts %.3f/call; GC cycles %d\n",
			k.coll, k.alg, k.bytes, a.calls, dist(a.total), dist(a.fence), dist(a.tail),
			float64(a.sleeps)/float64(a.calls), float64(a.timeouts)/float64(a.calls), a.gcs)
		for l := range a.steps {
			for i, g := range a.steps[l] {
				slow := ""
				if len(g.slow) > 0 {
					ranks := make([]int, 0, len(g.slow))
					for r := range g.slow {
						ranks = append(ranks, r)
					}
					slices.Sort(ranks)
					var parts []string
					for _, r := range ranks {
						parts = append(parts, fmt.Sprintf("r%d:%d", r, g.slow[r]))
					}
					slow = " slowest flag " + strings.Join(parts, " ")
				}
				fmt.Fprintf(&b, "    %-6s #%-3d %-10s wait %s  issue %s  device %s  done at %s  waits≥0.9ms %d%s\n",
					laneNames[l], i, g.kind, dist(g.wait), dist(g.issue), dist(g.device), dist(g.end), g.longWaits, slow)
			}
		}
	}
	_, _ = io.WriteString(t.w, b.String())
}
