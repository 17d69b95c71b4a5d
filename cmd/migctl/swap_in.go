package main

import (
	"github.com/spf13/cobra"

	"github.com/migctl/migctl/context/ctlpb"
)

func newSwapInCmd(s streams, c *swapConn) *cobra.Command {
	return newSwapMoveCmd(s, c, ctlpb.Direction_DIRECTION_IN, &cobra.Command{
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
	})
}
