package main

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	ctxmgr "github.com/migctl/migctl/context"
	"github.com/migctl/migctl/internal/printer"
)

type swapStatusOptions struct {
	conn *swapConn
	outputOption
	s streams
}

func newSwapStatusCmd(s streams, c *swapConn) *cobra.Command {
	o := &swapStatusOptions{conn: c, s: s}
	cmd := &cobra.Command{
		Use:   "status",
		Short: "List the shimmed processes: job, priority, device, bytes, where their memory is",
		Long: `List the processes that run under the shim as the daemon knows them, and the free memory
of their devices (JSON/YAML). STATE is one of:
  running       memory on the GPU
  swapping-out  being copied to host (PROGRESS shows how far)
  out           in host memory; the process waits at its next GPU call
  swapping-in   being copied back
  blocked       a swap-in found no memory; the process waits until one succeeds
HOLD marks a manual 'swap out' that the daemon will not undo on its own.

With priority launch gating on ('migctl daemon --gate gate|budget=N'), CLASS is the
process's place among the processes of its device by priority: high (its work in flight
holds lower ones), low (held while a higher one is busy), mid (both), alone; HELD is how
long its launches waited in total and how many waited (e.g. 1.2s/340); BUSY is how long a
high or mid process had work in flight. JSON/YAML carry the same under "gate".`,
		Example: `  migctl swap status
  migctl swap status -o json | jq '.processes[] | select(.state=="out")'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.Complete(); err != nil {
				return err
			}
			if err := o.Validate(); err != nil {
				return err
			}
			return o.Run(cmd.Context())
		},
	}
	o.addOutput(cmd)
	return cmd
}

func (o *swapStatusOptions) Validate() error { return nil }

// statusView is what 'swap status' prints.
type statusView struct {
	Processes []processView `json:"processes" yaml:"processes"`
	Devices   []deviceView  `json:"devices" yaml:"devices"`
}

type processView struct {
	PID          int       `json:"pid" yaml:"pid"`
	PeerPID      int       `json:"peerPID,omitempty" yaml:"peerPID,omitempty"`
	Job          string    `json:"job" yaml:"job"`
	Priority     int       `json:"priority" yaml:"priority"`
	Device       string    `json:"device" yaml:"device"`
	State        string    `json:"state" yaml:"state"`
	Hold         bool      `json:"hold" yaml:"hold"`
	Bytes        int64     `json:"bytes" yaml:"bytes"`
	GPUBytes     int64     `json:"gpuBytes" yaml:"gpuBytes"`
	Started      time.Time `json:"started" yaml:"started"`
	LastProgress time.Time `json:"lastProgress,omitzero" yaml:"lastProgress,omitempty"`
	Done         int64     `json:"done,omitempty" yaml:"done,omitempty"`
	Total        int64     `json:"total,omitempty" yaml:"total,omitempty"`
	Waiting      bool      `json:"waiting,omitempty" yaml:"waiting,omitempty"`
	// Gate: priority launch gating (class, policy, how long it was held).
	Gate ctxmgr.GateStatus `json:"gate" yaml:"gate"`
}

type deviceView struct {
	Device string `json:"device" yaml:"device"`
	Free   int64  `json:"free" yaml:"free"`
}

func (v statusView) Header() []string {
	return []string{"pid", "job", "priority", "class", "device", "state", "hold", "bytes", "on-gpu", "progress", "held", "busy",
		"started", "last-progress"}
}

func (v statusView) Rows() [][]string {
	var rows [][]string
	for _, p := range v.Processes {
		prog := "-"
		if p.Total > 0 && (p.State == string(ctxmgr.SwappingOut) || p.State == string(ctxmgr.SwappingIn)) {
			prog = strconv.Itoa(int(100*p.Done/p.Total)) + "%"
		}
		last := "-"
		if !p.LastProgress.IsZero() {
			last = p.LastProgress.Local().Format(time.TimeOnly)
		}
		hold := ""
		if p.Hold {
			hold = "hold"
		}
		class, held, busy := "-", "-", "-"
		if p.Gate.Class != "" {
			class = p.Gate.Class
			held = formatSeconds(p.Gate.HeldSeconds) + "/" + strconv.FormatInt(p.Gate.Holds, 10)
			if p.Gate.BusyPeriods > 0 {
				busy = formatSeconds(p.Gate.BusySeconds)
			}
		}
		rows = append(rows, []string{strconv.Itoa(p.PID), p.Job, strconv.Itoa(p.Priority), class, p.Device, p.State, hold,
			ctxmgr.FormatBytes(p.Bytes), ctxmgr.FormatBytes(p.GPUBytes), prog, held, busy,
			p.Started.Local().Format(time.DateTime), last})
	}
	return rows
}

// formatSeconds prints a duration in seconds with two significant decimals.
func formatSeconds(s float64) string {
	return (time.Duration(s * float64(time.Second))).Round(time.Millisecond).String()
}

func (o *swapStatusOptions) Run(ctx context.Context) error {
	ctx, cl, done, err := o.conn.connect(ctx)
	if err != nil {
		return err
	}
	defer done()
	procs, free, err := cl.Status(ctx)
	if err != nil {
		return o.conn.explain(err)
	}
	v := statusView{Processes: []processView{}, Devices: []deviceView{}}
	for _, p := range procs {
		v.Processes = append(v.Processes, processView{PID: p.PID, PeerPID: p.PeerPID, Job: p.Job,
			Priority: p.Priority, Device: p.Device, State: string(p.State), Hold: p.Hold,
			Bytes: p.Bytes, GPUBytes: p.GPUBytes(), Started: p.Started,
			LastProgress: p.LastProgress, Done: p.Done, Total: p.Total, Waiting: p.Waiting, Gate: p.Gate})
	}
	for _, d := range slices.Sorted(maps.Keys(free)) {
		v.Devices = append(v.Devices, deviceView{Device: d, Free: free[d]})
	}
	return printer.Print(o.s.Out, o.format, v)
}
