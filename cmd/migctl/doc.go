// Command migctl makes NVIDIA MIG GPUs useful for distributed training.
//
// It is the only place in the repository that builds real hardware handles
// (NVML, the CUDA driver); every library package takes them as interfaces.
// Each cobra command lives in its own file, with an options struct that has
// Complete, Validate and Run methods, and prints through internal/printer.
package main
