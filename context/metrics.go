package ctxmgr

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/migctl/migctl/mig"
)

// Metrics are the daemon's Prometheus metrics, on a registry of their own:
//
//	migctl_leases{job,profile}                 gauge: leased MIG devices
//	migctl_mig_instances{gpu,profile,state}    gauge: MIG devices by state (leased, busy, free)
//	migctl_lease_events_total{type}            counter: acquired, released, expired
//	migctl_swaps_total{direction,outcome}      counter: swaps by direction and ok|failed
//	migctl_swap_bytes_total{direction}         counter: bytes moved by swaps that succeeded
//	migctl_swap_seconds{direction}             histogram: duration of swaps that succeeded
//	migctl_collective_calls_total{job,op}      counter: collective calls the SDK reported
//	migctl_collective_bytes_total{job,op}      counter: their bytes
//	migctl_collective_seconds_total{job,op}    counter: their time
//	migctl_gate_holds_total{job,pid,class}          counter: a shimmed process's launches held by priority gating
//	migctl_gate_held_seconds_total{job,pid,class}   counter: how long they waited
//	migctl_gate_busy_seconds_total{job,pid,class}   counter: how long it had work in flight while it held others
//
// Leases, instances and processes are read when scraped. Safe for
// concurrent use.
type Metrics struct {
	reg         *prometheus.Registry
	leaseEvents *prometheus.CounterVec
	swaps       *prometheus.CounterVec
	swapBytes   *prometheus.CounterVec
	swapSeconds *prometheus.HistogramVec
	collCalls   *prometheus.CounterVec
	collBytes   *prometheus.CounterVec
	collSeconds *prometheus.CounterVec
	procs       *processCollector
}

// NewMetrics returns the metrics; leases (nil: none) are read at scrape time,
// and so is the node through discover (nil: no instance metrics).
func NewMetrics(leases *Leases, discover func(context.Context) (*mig.Node, error)) *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		leaseEvents: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "migctl_lease_events_total",
			Help: "Lease events: acquired, released, expired (process exited, connection closed, device gone)."}, []string{"type"}),
		swaps: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "migctl_swaps_total",
			Help: "Swaps of one process's GPU memory, by direction (swap-out, swap-in) and outcome (ok, failed)."}, []string{"direction", "outcome"}),
		swapBytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "migctl_swap_bytes_total",
			Help: "Bytes moved by successful swaps."}, []string{"direction"}),
		swapSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "migctl_swap_seconds",
			Help:    "Duration of successful swaps.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 14)}, []string{"direction"}),
		collCalls: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "migctl_collective_calls_total",
			Help: "Collective calls reported by the SDK, by job and operation."}, []string{"job", "op"}),
		collBytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "migctl_collective_bytes_total",
			Help: "Bytes of the collective calls reported by the SDK."}, []string{"job", "op"}),
		collSeconds: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "migctl_collective_seconds_total",
			Help: "Time spent in the collective calls reported by the SDK."}, []string{"job", "op"}),
		procs: &processCollector{},
	}
	m.reg.MustRegister(m.leaseEvents, m.swaps, m.swapBytes, m.swapSeconds, m.collCalls, m.collBytes, m.collSeconds,
		&stateCollector{leases: leases, discover: discover}, m.procs)
	return m
}

// SetProcesses makes a scrape read the shimmed processes (their priority
// launch gating counters) from f, e.g. the Manager's Status.
func (m *Metrics) SetProcesses(f func(context.Context) ([]Process, error)) { m.procs.f.Store(&f) }

// processCollector reads the shimmed processes when scraped.
type processCollector struct {
	f atomic.Pointer[func(context.Context) ([]Process, error)]
}

var (
	gateLabels    = []string{"job", "pid", "class"}
	gateHoldsDesc = prometheus.NewDesc("migctl_gate_holds_total",
		"Launches, copies and memsets of a shimmed process that waited at the priority gate.", gateLabels, nil)
	gateHeldDesc = prometheus.NewDesc("migctl_gate_held_seconds_total",
		"Time a shimmed process's launches waited at the priority gate.", gateLabels, nil)
	gateBusyDesc = prometheus.NewDesc("migctl_gate_busy_seconds_total",
		"Time a shimmed process had work in flight while it held lower-priority ones.", gateLabels, nil)
)

func (c *processCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- gateHoldsDesc
	ch <- gateHeldDesc
	ch <- gateBusyDesc
}

func (c *processCollector) Collect(ch chan<- prometheus.Metric) {
	f := c.f.Load()
	if f == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	procs, err := (*f)(ctx)
	if err != nil {
		return
	}
	for _, p := range procs {
		g := p.Gate
		if g.Class == "" { // gating off for it
			continue
		}
		l := []string{p.Job, strconv.Itoa(p.PID), g.Class}
		ch <- prometheus.MustNewConstMetric(gateHoldsDesc, prometheus.CounterValue, float64(g.Holds), l...)
		ch <- prometheus.MustNewConstMetric(gateHeldDesc, prometheus.CounterValue, g.HeldSeconds, l...)
		ch <- prometheus.MustNewConstMetric(gateBusyDesc, prometheus.CounterValue, g.BusySeconds, l...)
	}
}

// Registry is where the metrics live (tests gather from it).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// ObserveEvent counts a lease event and a finished swap.
func (m *Metrics) ObserveEvent(e Event) {
	switch e.Type {
	case EventAcquired, EventReleased, EventExpired:
		m.leaseEvents.WithLabelValues(string(e.Type)).Add(float64(len(e.Leases)))
	case EventSwapDone:
		if e.Swap == nil {
			return
		}
		outcome := "failed"
		if e.Swap.OK {
			outcome = "ok"
			m.swapBytes.WithLabelValues(e.Swap.Direction).Add(float64(e.Swap.Bytes))
			m.swapSeconds.WithLabelValues(e.Swap.Direction).Observe(e.Swap.Seconds)
		}
		m.swaps.WithLabelValues(e.Swap.Direction, outcome).Inc()
	}
}

// CollectiveOps are the operations ReportCollectives accepts.
var CollectiveOps = []string{"all_reduce", "reduce_scatter", "all_gather", "broadcast", "barrier"}

// ReportCollectives adds calls collective calls of op by job (bytes moved,
// seconds spent) to the counters.
func (m *Metrics) ReportCollectives(job, op string, calls, bytes int64, seconds float64) error {
	known := false
	for _, o := range CollectiveOps {
		known = known || o == op
	}
	switch {
	case job == "":
		return fmt.Errorf("%w: collective report without a job", ErrBadRequest)
	case !known:
		return fmt.Errorf("%w: collective op %q (want one of %v)", ErrBadRequest, op, CollectiveOps)
	case calls < 0 || bytes < 0 || seconds < 0 || seconds != seconds:
		return fmt.Errorf("%w: negative collective counts", ErrBadRequest)
	}
	m.collCalls.WithLabelValues(job, op).Add(float64(calls))
	m.collBytes.WithLabelValues(job, op).Add(float64(bytes))
	m.collSeconds.WithLabelValues(job, op).Add(seconds)
	return nil
}

// stateCollector reads leases and MIG instances when scraped.
type stateCollector struct {
	leases   *Leases
	discover func(context.Context) (*mig.Node, error)
}

var (
	leasesDesc = prometheus.NewDesc("migctl_leases", "MIG devices leased, by job and profile.", []string{"job", "profile"}, nil)
	instDesc   = prometheus.NewDesc("migctl_mig_instances", "MIG devices (compute instances) by GPU, profile and state: leased, busy (processes, not leased) or free.",
		[]string{"gpu", "profile", "state"}, nil)
)

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- leasesDesc
	ch <- instDesc
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	leased := map[string]bool{}
	if c.leases != nil {
		type key struct{ job, profile string }
		n := map[key]int{}
		for _, le := range c.leases.List() {
			n[key{le.Job, le.Profile}]++
			leased[le.UUID] = true
		}
		for k, v := range n {
			ch <- prometheus.MustNewConstMetric(leasesDesc, prometheus.GaugeValue, float64(v), k.job, k.profile)
		}
	}
	if c.discover == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	node, err := c.discover(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(instDesc, err)
		return
	}
	type key struct{ gpu, profile, state string }
	n := map[key]int{}
	for _, d := range node.MIGDevices() {
		state := "free"
		switch {
		case leased[d.UUID]:
			state = "leased"
		case len(d.Processes) > 0:
			state = "busy"
		}
		n[key{strconv.Itoa(d.GPU), d.Profile, state}]++
	}
	for k, v := range n {
		ch <- prometheus.MustNewConstMetric(instDesc, prometheus.GaugeValue, float64(v), k.gpu, k.profile, k.state)
	}
}
