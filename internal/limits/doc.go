// Package limits measures what bounds a collective on this machine — the
// pinned host↔device bandwidth of each GPU (each way, both ways at once, and
// a small round trip), the CPU's reduction bandwidth (one thread, all
// cores), host memory's bandwidth for the CPU alone, and host memory's
// bandwidth while a GPU's copies and CPU reductions use it at once — and
// caches the figures per host and GPU UUID, so that `migctl bench`
// measures once and states, per row, the floor of the chosen algorithm
// (allreduce.Machine.Estimate) and the fraction of it reached.
package limits
