// Package kernels holds migctl's CUDA reduction kernels: the CUDA C source
// (reduce.cu), the PTX generated from it by scripts/gen-ptx.sh (committed,
// "DO NOT EDIT"), and that PTX embedded as PTX for loading with
// cuModuleLoadData. It has no code of its own and imports nothing, so any
// layer may depend on it; the kernel ABI (names and parameters) is described
// in reduce.cu and implemented by comm's CUDA device.
package kernels
