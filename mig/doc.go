// Package mig is the MIG model of migctl: GPU-instance and compute-instance
// profiles and their nvidia-smi names, node discovery over go-nvml's
// nvml.Interface, layouts (mig-parted v1 YAML and the --layout shorthand), a
// placement planner on the 8-unit memory axis, reconfiguration by diff, and a
// journalled, crash-consistent apply.
//
// Contract:
//   - The package never builds an NVML handle itself; callers pass an
//     nvml.Interface (real NVML from cmd/, or mig/migsim in tests and on
//     machines without a GPU). Init/Shutdown are the caller's business.
//   - Planning ([PlanGPU], [PlaceInstances]) is pure: no I/O, deterministic
//     for the same inputs, safe for concurrent use.
//   - A [Manager] serialises its own calls and is safe for concurrent use; with
//     a journal ([WithJournal]) it also holds the journal's flock while it
//     changes GPUs, so separate migctl processes queue instead of interleaving.
//   - Apply never destroys an instance that has processes unless forced, never
//     resets a GPU, destroys compute instances before their GPU instance and
//     creates GPU instances with explicit placements. Each GPU is changed in a
//     transaction recorded in a [Journal]: a failed step rolls that GPU back to
//     its previous layout; after a crash, [Manager.Recover] (also run at the
//     start of every Apply) converges it.
//
// Errors are wrapped with %w; the sentinels below are matched with errors.Is.
package mig
