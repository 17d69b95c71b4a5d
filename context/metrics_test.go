package ctxmgr_test

import (
	"context"
	"errors"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	ctxmgr "github.com/migctl/migctl/context"
)

// The priority gating counters of the shimmed processes are read when
// scraped: one series per process with gating on, labelled by job, pid and
// class; none for a process with gating off, none when the source fails.
func TestGateMetrics(t *testing.T) {
	m := ctxmgr.NewMetrics(nil, nil)
	procs := []ctxmgr.Process{
		{PID: 11, Job: "infer", Gate: ctxmgr.GateStatus{Class: "high", BusyPeriods: 4, BusySeconds: 1.5}},
		{PID: 12, Job: "train", Gate: ctxmgr.GateStatus{Class: "low", Holds: 300, HeldSeconds: 2.25}},
		{PID: 13, Job: "other"}, // gating off
	}
	var fail error
	m.SetProcesses(func(context.Context) ([]ctxmgr.Process, error) { return procs, fail })

	got := gather(t, m)
	require.Equal(t, map[string]float64{
		"migctl_gate_holds_total/infer/11/high": 0, "migctl_gate_held_seconds_total/infer/11/high": 0,
		"migctl_gate_busy_seconds_total/infer/11/high": 1.5,
		"migctl_gate_holds_total/train/12/low":         300, "migctl_gate_held_seconds_total/train/12/low": 2.25,
		"migctl_gate_busy_seconds_total/train/12/low": 0,
	}, got)

	fail = errors.New("manager closed")
	require.Empty(t, gather(t, m))
}

// gather returns the gate series as "name/job/pid/class" -> value.
func gather(t *testing.T, m *ctxmgr.Metrics) map[string]float64 {
	t.Helper()
	mfs, err := m.Registry().Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, mt := range mf.GetMetric() {
			l := map[string]string{}
			for _, lp := range mt.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			if _, ok := l["class"]; !ok {
				continue
			}
			out[mf.GetName()+"/"+l["job"]+"/"+l["pid"]+"/"+l["class"]] = counter(mt)
		}
	}
	return out
}

func counter(m *dto.Metric) float64 { return m.GetCounter().GetValue() }
