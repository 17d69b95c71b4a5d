package main

import (
	"github.com/spf13/cobra"

	"github.com/migctl/migctl/context/ctlpb"
)

func newSwapOutCmd(s streams, c *swapConn) *cobra.Command {
	return newSwapMoveCmd(s, c, ctlpb.Direction_DIRECTION_OUT, &cobra.Command{
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
	})
}
