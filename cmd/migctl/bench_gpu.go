package main

import (
	"fmt"
	"os"

	"github.com/migctl/migctl/allreduce/kernels"
	"github.com/migctl/migctl/comm"
	"github.com/migctl/migctl/internal/cuda"
)

// fakeCUDAEnv, set to 1, makes the gpu backend run on cuda.Fake (host
// memory, CPU kernels with the GPU kernels' ABI) instead of the driver: the
// whole GPU code path (registration, streams, events, kernel launches)
// across real processes on a machine without a GPU. Ranks inherit it.
const fakeCUDAEnv = "MIGCTL_CUDA_FAKE"

// smallH2DEnv picks how small host-to-device copies are queued
// (comm.H2DMode: plain, 2d, 2drows, dtod, pad). Ranks inherit it.
const smallH2DEnv = "MIGCTL_H2D"

// openGPUDevice opens the CUDA device a bench rank runs on (ordinal as CUDA
// numbers the devices visible to this process): the real driver through
// dlopen, with the embedded reduction kernels. The result also implements
// comm.IPCDevice and comm.TopologyDevice.
func openGPUDevice(ordinal int) (comm.Device, error) {
	var api cuda.Interface
	if os.Getenv(fakeCUDAEnv) == "1" {
		f := cuda.NewFake()
		comm.InstallFakeCUDAKernels(f)
		api = f
	} else {
		var err error
		if api, err = cuda.Open(); err != nil {
			return nil, fmt.Errorf("opening the CUDA driver: %w", err)
		}
	}
	mode, err := comm.ParseH2DMode(os.Getenv(smallH2DEnv))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", smallH2DEnv, err)
	}
	dev, err := comm.NewCUDADevice(api, comm.CUDAConfig{Ordinal: ordinal, PTX: kernels.PTX, SmallH2D: mode})
	if err != nil {
		return nil, err
	}
	return dev, nil
}
