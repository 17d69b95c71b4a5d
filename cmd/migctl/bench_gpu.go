package main

import (
	"fmt"

	"github.com/migctl/migctl/allreduce/kernels"
	"github.com/migctl/migctl/comm"
	"github.com/migctl/migctl/internal/cuda"
)

// openGPUDevice opens the CUDA device a bench rank runs on (ordinal as CUDA
// numbers the devices visible to this process): the real driver through
// dlopen, with the embedded reduction kernels. The result also implements
// comm.IPCDevice and comm.TopologyDevice.
func openGPUDevice(ordinal int) (comm.Device, error) {
	api, err := cuda.Open()
	if err != nil {
		return nil, fmt.Errorf("opening the CUDA driver: %w", err)
	}
	dev, err := comm.NewCUDADevice(api, comm.CUDAConfig{Ordinal: ordinal, PTX: kernels.PTX})
	if err != nil {
		return nil, err
	}
	return dev, nil
}
