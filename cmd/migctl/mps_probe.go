package main

import (
	"fmt"
	"runtime"

	"github.com/spf13/cobra"

	"github.com/migctl/migctl/internal/cuda"
)

// newMPSProbeCmd is the hidden client that checks a job's new MPS server
// (jobmps.go): it makes a context on the GPU and allocates from it, which
// starts the server, then leaves.
func newMPSProbeCmd() *cobra.Command {
	var gpu int
	c := &cobra.Command{
		Use:    "mps-probe --gpu ORDINAL",
		Short:  "Check that the MPS server of CUDA_MPS_PIPE_DIRECTORY serves a GPU (used by run and bench)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			api, err := cuda.Open()
			if err != nil {
				return err
			}
			if err := api.Init(0); err != nil {
				return fmt.Errorf("initializing CUDA: %w", err)
			}
			dev, err := api.DeviceGet(gpu)
			if err != nil {
				return fmt.Errorf("GPU %d: %w", gpu, err)
			}
			ctx, err := api.DevicePrimaryCtxRetain(dev)
			if err != nil {
				return fmt.Errorf("a context on GPU %d: %w", gpu, err)
			}
			defer func() { _ = api.DevicePrimaryCtxRelease(dev) }()
			if err := api.CtxSetCurrent(ctx); err != nil {
				return fmt.Errorf("a context on GPU %d: %w", gpu, err)
			}
			p, err := api.MemAlloc(1 << 20)
			if err != nil {
				return fmt.Errorf("allocating on GPU %d: %w", gpu, err)
			}
			return api.MemFree(p)
		},
	}
	c.Flags().IntVar(&gpu, "gpu", 0, "CUDA ordinal")
	return c
}
