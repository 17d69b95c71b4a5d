// Package mps runs a private NVIDIA MPS (Multi-Process Service) control
// daemon: its pipes live in a directory of the caller's choosing, and only
// processes told that directory (CUDA_MPS_PIPE_DIRECTORY) become its
// clients. Their kernels and copies then run in the one GPU context of the
// MPS server instead of separate contexts that the driver time-slices.
//
// Two users in migctl: `migctl daemon --mps` (compute priority between
// jobs: clients of different CUDA_MPS_CLIENT_PRIORITY, joined through the
// swap shim) and `migctl run` / `migctl bench` when several ranks of one job
// share a whole GPU (docs/collectives.md "Ranks sharing a GPU"). Nothing on
// the GPU is reconfigured: MPS runs in the default compute mode and stops
// with its owner. MIG instances would need one control daemon each.
package mps
