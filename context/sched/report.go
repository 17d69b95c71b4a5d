package sched

import (
	"fmt"
	"strings"
	"time"
)

// Markdown renders results (one per policy, on the same mix) as a table:
// average and p95 JCT, the average JCT of each kind, makespan, utilisation,
// switches and swap time. kinds names the kinds to show, in order.
func Markdown(results []Result, kinds []string) string {
	var b strings.Builder
	b.WriteString("| policy | avg JCT | p95 JCT |")
	for _, k := range kinds {
		fmt.Fprintf(&b, " avg JCT %s |", k)
	}
	b.WriteString(" makespan | GPU util | switches | swap time |\n|---|---:|---:|")
	for range kinds {
		b.WriteString("---:|")
	}
	b.WriteString("---:|---:|---:|---:|\n")
	for _, r := range results {
		fmt.Fprintf(&b, "| %s | %s | %s |", r.Policy, dur(r.AvgJCT), dur(r.P95JCT))
		for _, k := range kinds {
			fmt.Fprintf(&b, " %s |", dur(r.AvgJCTByKind[k]))
		}
		fmt.Fprintf(&b, " %s | %.1f%% | %d | %s |\n", dur(r.Makespan), 100*r.Utilization, r.Switches, dur(r.SwapTime))
	}
	return b.String()
}

// dur prints d in seconds with one decimal (e.g. "1234.5 s").
func dur(d time.Duration) string { return fmt.Sprintf("%.1f s", d.Seconds()) }
