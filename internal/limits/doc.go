// Package limits measures what bounds a collective on this machine — the
// pinned host↔device bandwidth of each GPU (each way, both ways at once, and
// a small round trip) and the CPU's reduction bandwidth (one thread, all
// cores) — and caches the figures per host and GPU UUID, so that `migctl
// bench` measures once and states, per row, the floor of the chosen
// algorithm (allreduce.Machine.Estimate) and the fraction of it reached.
package limits
