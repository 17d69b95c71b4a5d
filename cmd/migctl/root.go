package main

import (
	"github.com/spf13/cobra"
)

func newRootCmd(s streams) *cobra.Command {
	root := &cobra.Command{
		Use:   "migctl",
		Short: "Partition MIG GPUs, run collectives between MIG instances, and preempt GPU memory",
		Long: `migctl makes NVIDIA MIG GPUs useful for distributed training.

  partition  declare, plan and apply MIG layouts (real NVML, or --sim for a simulated node)
  bench      measure collectives (all-reduce, ...) between processes, and check their results
  run        launch and supervise a training job's workers (torchrun's contract, MIG leases)
  daemon     the node context manager: leases MIG instances, drives memory swaps
  lease      list, acquire and release the MIG devices the daemon leases to jobs
  swap       ask the daemon to swap a job's GPU memory out to host or back in`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetIn(s.In)
	root.SetOut(s.Out)
	root.SetErr(s.ErrOut)
	root.AddCommand(
		newPartitionCmd(s),
		newBenchCmd(s),
		newDaemonCmd(s),
		newLeaseCmd(s),
		newSwapCmd(s),
		newRunCmd(s),
		newMPSProbeCmd(),
	)
	return root
}
