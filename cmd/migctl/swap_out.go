package main

import (
	"github.com/spf13/cobra"

	"github.com/migctl/migctl/context/ctlpb"
)

func newSwapOutCmd(s streams, c *swapConn) *cobra.Command {
	o := &swapMoveOptions{conn: c, dir: ctlpb.Direction_DIRECTION_OUT, s: s}
	cmd := &cobra.Command{
		Use:   "out (--pid PID | --job JOB)",
		Short: "Swap a process's or a job's GPU memory out to host memory",
		Long: `Ask the daemon to swap out the GPU memory of one shimmed process (--pid) or of every
process of a job (--job): each process stops at its next GPU call, its allocations are
copied to pinned host memory and their GPU memory is released. The command waits for the
swap, shows its progress on stderr, and prints one line per process: bytes moved, seconds,
GiB/s. The process stays out (held) until 'migctl swap in'.

A process can refuse a swap it cannot do safely (IPC-exported or managed memory): that
row says why, and the command exits non-zero.`,
		Example: `  migctl swap out --job batch-train
  migctl swap out --pid 12345 -o json
  migctl swap out --job batch-train --timeout 30s --quiet`,
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
