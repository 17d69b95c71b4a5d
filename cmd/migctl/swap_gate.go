package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	ctxmgr "github.com/migctl/migctl/context"
	"github.com/migctl/migctl/context/swapproto"
	"github.com/migctl/migctl/internal/printer"
)

type swapGateOptions struct {
	conn   *swapConn
	pid    int
	job    string
	policy string
	outputOption
	s streams
}

func newSwapGateCmd(s streams, c *swapConn) *cobra.Command {
	o := &swapGateOptions{conn: c, s: s}
	cmd := &cobra.Command{
		Use:   "gate (--pid PID | --job JOB) --policy POLICY",
		Short: "Set how a process's or a job's launches are gated while a higher-priority one is busy",
		Long: `Priority launch gating (see 'migctl daemon --gate'): while a process has launches in flight on
a device, the launches of lower-priority shimmed processes there wait (gate), keep at most N
in flight (budget=N), or go on (off). This sets the policy of one process (--pid) or of every
process of a job (--job) instead of the daemon's --gate; "default" returns them to it.

POLICY is off, gate, budget=N (1..64), each optionally followed by ,depth=M (0..64: at most M
of the process's launches in flight even while it is not held), or default. The policy is
about the process's own launches: set it on the lower-priority job. 'migctl swap status'
shows each process's class and how long it was held.`,
		Example: `  migctl swap gate --job train --policy budget=2
  migctl swap gate --job train --policy gate,depth=8
  migctl swap gate --pid 12345 --policy default`,
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
	cmd.Flags().IntVar(&o.pid, "pid", 0, "process id of a shimmed process")
	cmd.Flags().StringVar(&o.job, "job", "", "job name (MIGSWAP_JOB) of shimmed processes")
	cmd.Flags().StringVar(&o.policy, "policy", "", "off, gate, budget=N (optionally ,depth=M), or default (the daemon's --gate)")
	o.addOutput(cmd)
	return cmd
}

func (o *swapGateOptions) Validate() error {
	switch {
	case (o.pid == 0) == (o.job == ""):
		return errors.New("give exactly one of --pid and --job")
	case o.pid < 0:
		return errors.New("--pid must be positive")
	case o.pid > swapproto.MaxPID:
		// the request carries an int32: a larger pid would wrap to another process
		return fmt.Errorf("--pid %d is above the largest pid, %d", o.pid, swapproto.MaxPID)
	case o.policy == "":
		return errors.New("--policy is required: off, gate, budget=N[,depth=M] or default")
	case o.policy != "default":
		if _, err := ctxmgr.ParseGatePolicy(o.policy); err != nil {
			return err
		}
	}
	return nil
}

type gateSetView struct {
	PIDs   []int  `json:"pids" yaml:"pids"`
	Policy string `json:"policy" yaml:"policy"`
}

func (v gateSetView) Header() []string { return []string{"pids", "policy"} }

func (v gateSetView) Rows() [][]string {
	pids := make([]string, len(v.PIDs))
	for i, p := range v.PIDs {
		pids[i] = strconv.Itoa(p)
	}
	return [][]string{{strings.Join(pids, ","), v.Policy}}
}

func (o *swapGateOptions) Run(ctx context.Context) error {
	ctx, cl, done, err := o.conn.connect(ctx)
	if err != nil {
		return err
	}
	defer done()
	pids, err := cl.SetGate(ctx, ctxmgr.Target{PID: o.pid, Job: o.job}, o.policy)
	if err != nil {
		return o.conn.explain(err)
	}
	return printer.Print(o.s.Out, o.format, gateSetView{PIDs: pids, Policy: o.policy})
}
