package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	ctxmgr "github.com/migctl/migctl/context"
	"github.com/migctl/migctl/context/ctlpb"
	"github.com/migctl/migctl/context/swapproto"
	"github.com/migctl/migctl/internal/printer"
)

// swapMoveOptions are the options of 'swap out' and 'swap in'.
type swapMoveOptions struct {
	conn  *swapConn
	dir   ctlpb.Direction
	pid   int
	job   string
	quiet bool
	outputOption
	s streams
}

// newSwapMoveCmd completes cmd (its texts set by the caller) as 'swap out'
// or 'swap in' (dir): arguments, flags and the run.
func newSwapMoveCmd(s streams, c *swapConn, dir ctlpb.Direction, cmd *cobra.Command) *cobra.Command {
	o := &swapMoveOptions{conn: c, dir: dir, s: s}
	cmd.Args = cobra.NoArgs
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := o.Complete(); err != nil {
			return err
		}
		if err := o.Validate(); err != nil {
			return err
		}
		return o.Run(cmd.Context())
	}
	cmd.Flags().IntVar(&o.pid, "pid", 0, "process id of a shimmed process")
	cmd.Flags().StringVar(&o.job, "job", "", "job name (MIGSWAP_JOB) of shimmed processes")
	cmd.Flags().BoolVarP(&o.quiet, "quiet", "q", false, "no progress bar")
	o.addOutput(cmd)
	return cmd
}

func (o *swapMoveOptions) Validate() error {
	if (o.pid == 0) == (o.job == "") {
		return errors.New("give exactly one of --pid and --job")
	}
	if o.pid < 0 {
		return errors.New("--pid must be positive")
	}
	if o.pid > swapproto.MaxPID {
		// the request carries an int32: a larger pid would wrap to another process
		return fmt.Errorf("--pid %d is above the largest pid, %d", o.pid, swapproto.MaxPID)
	}
	if o.conn.timeout <= 0 {
		return errors.New("--timeout must be positive")
	}
	return nil
}

// swapResults prints as a table of one row per process.
type swapResults struct {
	Results []ctxmgr.Result `json:"results" yaml:"results"`
}

func (r swapResults) Header() []string {
	return []string{"pid", "job", "swap", "ok", "bytes", "seconds", "GiB/s", "error"}
}

func (r swapResults) Rows() [][]string {
	var rows [][]string
	for _, x := range r.Results {
		rate := "-"
		if x.OK && x.Seconds > 0 {
			rate = fmt.Sprintf("%.1f", float64(x.Bytes)/x.Seconds/(1<<30))
		}
		rows = append(rows, []string{strconv.Itoa(x.PID), x.Job, x.Direction, strconv.FormatBool(x.OK),
			ctxmgr.FormatBytes(x.Bytes), fmt.Sprintf("%.3f", x.Seconds), rate, x.Error})
	}
	return rows
}

func (o *swapMoveOptions) Run(ctx context.Context) error {
	ctx, cl, done, err := o.conn.client(ctx)
	if err != nil {
		return err
	}
	defer done()
	stream, err := cl.Swap(ctx, &ctlpb.SwapRequest{Direction: o.dir, Pid: int32(o.pid), Job: o.job})
	if err != nil {
		return o.conn.explain(err)
	}
	word := "swapping out"
	if o.dir == ctlpb.Direction_DIRECTION_IN {
		word = "swapping in"
	}
	bar := newSwapBar(o.s.ErrOut, word, o.quiet)
	var results []ctxmgr.Result
	for {
		ev, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			bar.abort()
			return o.conn.explain(err)
		}
		if p := ev.GetProgress(); p != nil {
			bar.update(int(p.GetPid()), p.GetDone(), p.GetTotal())
		}
		if r := ev.GetResult(); r != nil {
			dir := ctxmgr.SwapOut.String()
			if r.GetDirection() == ctlpb.Direction_DIRECTION_IN {
				dir = ctxmgr.SwapIn.String()
			}
			results = append(results, ctxmgr.Result{PID: int(r.GetPid()), Job: r.GetJob(), Direction: dir,
				OK: r.GetOk(), Bytes: r.GetBytes(), Seconds: r.GetSeconds(), Error: r.GetError()})
		}
	}
	bar.finish()
	if err := printer.Print(o.s.Out, o.format, swapResults{Results: results}); err != nil {
		return err
	}
	var failed []error
	for _, r := range results {
		if !r.OK {
			failed = append(failed, fmt.Errorf("%s of pid %d (job %s) failed: %s", r.Direction, r.PID, r.Job, r.Error))
		}
	}
	return errors.Join(failed...)
}

// swapBar is one progress bar over every process of a swap (bytes done of
// bytes total, summed over pids), on stderr.
type swapBar struct {
	w     io.Writer
	desc  string
	quiet bool
	bar   *progressbar.ProgressBar
	start time.Time
	done  map[int]int64
	total map[int]int64
}

func newSwapBar(w io.Writer, desc string, quiet bool) *swapBar {
	return &swapBar{w: w, desc: desc, quiet: quiet, start: time.Now(), done: map[int]int64{}, total: map[int]int64{}}
}

func (b *swapBar) update(pid int, done, total int64) {
	if b.quiet {
		return
	}
	b.done[pid], b.total[pid] = done, total
	var d, t int64
	for p := range b.total {
		d += b.done[p]
		t += b.total[p]
	}
	// The bar's own rate assumes it saw every byte; the shim reports in
	// bursts, so the description carries bytes and rate since the request.
	desc := fmt.Sprintf("%s %s / %s", b.desc, ctxmgr.FormatBytes(d), ctxmgr.FormatBytes(t))
	if el := time.Since(b.start).Seconds(); el > 0 {
		desc += fmt.Sprintf(" (%.2f GiB/s)", float64(d)/el/(1<<30))
	}
	if b.bar == nil {
		b.bar = progressbar.NewOptions64(t, progressbar.OptionSetWriter(b.w), progressbar.OptionSetDescription(desc),
			progressbar.OptionSetWidth(30), progressbar.OptionSetPredictTime(true),
			progressbar.OptionOnCompletion(func() { fmt.Fprintln(b.w) }))
	} else {
		if t != b.bar.GetMax64() {
			b.bar.ChangeMax64(t)
		}
		b.bar.Describe(desc)
	}
	_ = b.bar.Set64(d)
}

func (b *swapBar) finish() {
	if b.bar != nil && !b.bar.IsFinished() {
		_ = b.bar.Finish()
	}
}

func (b *swapBar) abort() {
	if b.bar != nil {
		_ = b.bar.Exit()
		fmt.Fprintln(b.w)
	}
}
