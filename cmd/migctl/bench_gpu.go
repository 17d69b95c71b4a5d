package main

import (
	"errors"

	"github.com/migctl/migctl/comm"
)

// openGPUDevice opens the CUDA device a bench rank runs on (ordinal as CUDA
// numbers the devices visible to this process). Replaced by the CUDA backend.
func openGPUDevice(ordinal int) (comm.Device, error) {
	return nil, errors.New("the GPU backend is not built into this migctl yet")
}
