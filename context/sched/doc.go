// Package sched holds the node daemon's job-switching policies and a
// discrete-event simulator to compare them. It is pure: no I/O, no clock, no
// goroutines (the simulator reads a job mix only through LoadMix).
//
// The model: jobs share one device (a GPU or a MIG instance) whose memory
// cannot hold all of them. A job whose memory is on the device is resident and
// runs; the others wait with their memory in host memory. Switching a job is
// the memory swap of libmigswap.so (swap-out, swap-in), whose cost the Cost
// model gives: bytes over the host link bandwidth plus a fixed cost per swap.
//
// A Policy is asked, at every event (an arrival, an exit, a finished switch,
// the time its last Plan asked to be called again), which jobs should be
// resident now; it answers with a Plan: the jobs to swap out (Evict), those to
// bring in (Admit), and when to ask again (Recheck). Three policies:
//
//   - priority (today's daemon): a higher priority takes memory from strictly
//     lower ones (lowest priority first, then most recently submitted); equal
//     priorities are first come, first served and never preempt each other; a
//     waiting job that does not fit does not stop a smaller one behind it.
//   - fair: priority between classes; within one priority class, round robin
//     over the jobs that do not all fit: a resident job keeps the device for a
//     quantum, then gives way to the job that has waited longest. The quantum
//     is at least QuantumFactor (default 20) times the cost of switching the
//     class's largest job out and back in, so switching stays a small fraction
//     of the time. A waiting job that does not fit even when its class rotates
//     (a big job behind small ones) is starving after one quantum: its class
//     then admits nobody else until it fits, which bounds every wait.
//   - srf: priority between classes; within one, shortest remaining first:
//     waiting jobs are admitted in order of remaining work (expected duration
//     less the GPU time already had); a resident job is swapped out for a
//     shorter waiting one only when the difference in remaining time exceeds
//     Margin (default 2) times the cost of the switch (out, the other in, and
//     back in later). A job that declares no duration is ranked as a typical
//     one (the median declared duration of its class on the device, less what
//     it has run) and neither preempts nor is preempted within its class; with
//     no durations at all, srf is first come, first served, like priority.
//
// A job marked Pinned must be resident after the plan (the daemon pins a
// process blocked in an allocation that asked for memory): it is admitted
// first, taking memory from any job of its priority or lower.
//
// Simulate runs a Mix (jobs with arrival, duration, memory, priority and how
// much of the GPU's compute each uses alone) under a policy and reports job
// completion times (average, p95), makespan, GPU utilisation and switches.
// Resident jobs share the GPU's compute (processor sharing: each runs at
// 1/max(1, sum of their compute shares) of its own speed); a job being swapped
// neither runs nor lets the policy decide again until the switch ends, as the
// daemon serialises its decisions and the swaps they start. testdata/jobmix.json
// is the recorded mix the tests and docs/daemon.md use.
package sched
