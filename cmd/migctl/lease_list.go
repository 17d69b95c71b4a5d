package main

import (
	"context"

	"github.com/spf13/cobra"

	ctxmgr "github.com/migctl/migctl/context"
	"github.com/migctl/migctl/internal/printer"
)

type leaseListOptions struct {
	conn *leaseConn
	job  string
	outputOption
	s streams
}

func newLeaseListCmd(s streams, c *leaseConn) *cobra.Command {
	o := &leaseListOptions{conn: c, s: s}
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the leases: job, MIG device UUID, GPU, profile, placement, process",
		Long: `List the MIG devices the daemon leases, by GPU and placement. PLACEMENT is the GPU
instance's START:SIZE in memory units; PID is the process the lease ends with (- for a
lease that lasts until released); CREATED marks a device the daemon made for the lease.`,
		Example: `  migctl lease list
  migctl lease list --job train -o yaml`,
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
	cmd.Flags().StringVar(&o.job, "job", "", "only this job's leases")
	o.addOutput(cmd)
	return cmd
}

func (o *leaseListOptions) Validate() error { return nil }

func (o *leaseListOptions) Run(ctx context.Context) error {
	ctx, cl, done, err := o.conn.connect(ctx)
	if err != nil {
		return err
	}
	defer done()
	ls, err := cl.Leases(ctx)
	if err != nil {
		return err
	}
	var out []ctxmgr.Lease
	for _, le := range ls {
		if o.job == "" || le.Job == o.job {
			out = append(out, le)
		}
	}
	return printer.Print(o.s.Out, o.format, newLeaseView(out))
}
