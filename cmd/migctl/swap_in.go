package main

import (
	"github.com/spf13/cobra"

	"github.com/migctl/migctl/context/ctlpb"
)

func newSwapInCmd(s streams, c *swapConn) *cobra.Command {
	o := &swapMoveOptions{conn: c, dir: ctlpb.Direction_DIRECTION_IN, s: s}
	cmd := &cobra.Command{
		Use:   "in (--pid PID | --job JOB)",
		Short: "Swap a process's or a job's GPU memory back in from host memory",
		Long: `Ask the daemon to swap back in the GPU memory of a swapped-out process (--pid) or of
every swapped-out process of a job (--job): GPU memory is created and mapped at the same
virtual addresses, the data is copied back, and the process resumes. Clears the hold of a
manual 'swap out'.

If the GPU memory is not free, the swap-in fails, the process stays blocked (it never runs
on missing memory) and the command exits non-zero; free memory (or swap out another job)
and try again. The daemon also retries blocked processes when memory frees.`,
		Example: `  migctl swap in --job batch-train
  migctl swap in --pid 12345 --timeout 2m -o yaml`,
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
	cmd.Flags().BoolVarP(&o.quiet, "quiet", "q", false, "no progress bar")
	o.output = outputFlag(cmd)
	return cmd
}
