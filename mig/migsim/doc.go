// Package migsim is a simulated MIG node: an nvml.Interface whose GPUs behave
// like real NVIDIA H200 141GB, H100 80GB and A100 40GB/80GB boards do under
// NVML, built from readings of real hardware (see ../../../shared/hw/H200.md)
// and NVIDIA's MIG user guide.
//
// What it enforces, like the hardware:
//   - MIG calls (listing, creating GPU instances, MIG device handles) answer
//     ERROR_NOT_SUPPORTED while MIG mode is disabled; profile infos and
//     possible placements answer regardless, as on the real H200.
//   - GPU instances occupy [start, start+size) of 8 memory units; creating over
//     an occupied range, or past the 7 compute slices, answers
//     ERROR_INSUFFICIENT_RESOURCES; a placement the profile does not allow
//     answers ERROR_INVALID_ARGUMENT; more instances than a profile's maximum
//     answer ERROR_INSUFFICIENT_RESOURCES.
//   - Compute instances live inside a GPU instance's compute slices with the
//     same rules; destroying a GPU instance that still has compute instances or
//     processes, or a compute instance with processes, answers ERROR_IN_USE.
//   - Every compute instance is a MIG device with its own "MIG-..." UUID;
//     handles to destroyed instances answer ERROR_NOT_FOUND.
//   - SetMigMode takes effect at once on Hopper when the GPU is idle; with
//     processes on it (Hopper) or always on Ampere the change stays pending
//     until [Node.Reset], which stands for the admin's GPU reset.
//
// A Node created with [Open] keeps its state in a JSON file, written
// atomically after every change, and holds an exclusive flock on "<file>.lock"
// until [Node.Close], so consecutive CLI invocations see one node and
// concurrent ones queue. A fresh node starts as a real one does: MIG disabled,
// no instances.
//
// Methods of nvml.Interface, nvml.Device and friends that the simulator does
// not model come from go-nvml's mock types and panic when called; only their
// method sets are used, never their data or behaviour. [Faulty] wraps any
// nvml.Interface (this one or real NVML) to inject an error into mutating
// calls, before or after they take effect, for fault-injection tests.
//
// A Node is safe for concurrent use.
package migsim
