package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	ctxmgr "github.com/migctl/migctl/context"
	"github.com/migctl/migctl/internal/printer"
)

type leaseAcquireOptions struct {
	conn    *leaseConn
	job     string
	profile string
	count   int
	gpu     int
	pid     int
	outputOption
	s streams
}

func newLeaseAcquireCmd(s streams, c *leaseConn) *cobra.Command {
	o := &leaseAcquireOptions{conn: c, s: s}
	cmd := &cobra.Command{
		Use:   "acquire --job JOB --profile PROFILE [--count N] [--gpu G] [--pid PID]",
		Short: "Lease MIG devices of a profile to a job, creating them if too few are free",
		Long: `Lease --count MIG devices of --profile to --job, all or nothing, and print them (the
UUID column is what CUDA_VISIBLE_DEVICES takes). Free devices are leased first; for the rest
the daemon creates devices by repartitioning capacity that nobody leases or uses (GPUs
already in MIG mode first, then idle GPUs with MIG off if the daemon runs with
--enable-mig, the default with --sim, then reshaping unleased idle devices). It never destroys a leased or
busy device; when the request cannot fit, nothing is leased or created and the error names
what is leased, by which job, and what would have to go.

PROFILE is the MIG device's name as nvidia-smi prints it: 1g.18gb, 2g.35gb, 3g.71gb,
7g.141gb on an H200, or 1c.2g.35gb for a compute instance of a 2g.35gb GPU instance
('migctl partition profiles' lists them).

The leases last until 'migctl lease release --job JOB'; with --pid, they also end when that
process exits.`,
		Example: `  migctl lease acquire --job train --profile 1g.18gb --count 7
  migctl lease acquire --job eval --profile 3g.71gb --gpu 1 --pid $$ -o json`,
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
	f := cmd.Flags()
	f.StringVar(&o.job, "job", "", "job the devices are leased to (required)")
	f.StringVar(&o.profile, "profile", "", "MIG device profile, e.g. 1g.18gb (required)")
	f.IntVar(&o.count, "count", 1, "how many devices, all or nothing")
	f.IntVar(&o.gpu, "gpu", -1, "only on this GPU index (-1: any)")
	f.IntVar(&o.pid, "pid", 0, "end the leases when this process exits (0: only on release)")
	o.addOutput(cmd)
	return cmd
}

func (o *leaseAcquireOptions) Validate() error {
	switch {
	case o.job == "":
		return errors.New("give the job the devices are for: --job NAME")
	case o.profile == "":
		return errors.New("give a MIG device profile: --profile 1g.18gb ('migctl partition profiles' lists them)")
	case o.count < 1:
		return fmt.Errorf("--count %d: ask for at least 1 device", o.count)
	case o.gpu < -1:
		return fmt.Errorf("--gpu %d: give a GPU index, or -1 for any", o.gpu)
	case o.pid < 0:
		return fmt.Errorf("--pid %d: give a process id", o.pid)
	}
	return nil
}

func (o *leaseAcquireOptions) Run(ctx context.Context) error {
	ctx, cl, done, err := o.conn.connect(ctx)
	if err != nil {
		return err
	}
	defer done()
	ls, err := cl.Acquire(ctx, ctxmgr.AcquireRequest{Job: o.job, Profile: o.profile, Count: o.count, GPU: o.gpu, PID: o.pid})
	if err != nil {
		return err
	}
	return printer.Print(o.s.Out, o.format, newLeaseView(ls))
}
