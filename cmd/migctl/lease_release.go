package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	ctxmgr "github.com/migctl/migctl/context"
	"github.com/migctl/migctl/internal/printer"
)

type leaseReleaseOptions struct {
	conn *leaseConn
	job  string
	uuid string
	outputOption
	s streams
}

func newLeaseReleaseCmd(s streams, c *leaseConn) *cobra.Command {
	o := &leaseReleaseOptions{conn: c, s: s}
	cmd := &cobra.Command{
		Use:   "release (--job JOB | --uuid MIG-UUID)",
		Short: "End a job's leases, or one MIG device's",
		Long: `End every lease of a job (--job), or the lease of one MIG device (--uuid), and print what
was released. The devices stay as they are, free for the next lease.`,
		Example: `  migctl lease release --job train
  migctl lease release --uuid MIG-3284b0b1-8050-20ae-b6b6-956bb3612660`,
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
	cmd.Flags().StringVar(&o.job, "job", "", "release every lease of this job")
	cmd.Flags().StringVar(&o.uuid, "uuid", "", "release the lease of this MIG device")
	o.addOutput(cmd)
	return cmd
}

func (o *leaseReleaseOptions) Validate() error {
	if (o.job == "") == (o.uuid == "") {
		return errors.New("give exactly one of --job and --uuid")
	}
	return nil
}

func (o *leaseReleaseOptions) Run(ctx context.Context) error {
	ctx, cl, done, err := o.conn.connect(ctx)
	if err != nil {
		return err
	}
	defer done()
	var ls []ctxmgr.Lease
	if o.job != "" {
		ls, err = cl.Release(ctx, o.job)
	} else {
		var le ctxmgr.Lease
		le, err = cl.ReleaseUUID(ctx, o.uuid)
		ls = []ctxmgr.Lease{le}
	}
	if errors.Is(err, ctxmgr.ErrNoLease) {
		return fmt.Errorf("%w (see 'migctl lease list')", err)
	}
	if err != nil {
		return err
	}
	return printer.Print(o.s.Out, o.format, newLeaseView(ls))
}
