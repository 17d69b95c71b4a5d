// Package ctxmgr is the node context manager behind `migctl daemon`: the
// registry of processes running under the memory-swap shim (libmigswap.so),
// the preemption policy that decides whose GPU memory goes to host and back,
// and the servers the shim and the CLI talk to.
//
// The directory is context/ (the design card's name) but the package is named
// ctxmgr: a package called "context" would shadow the standard library's
// context package in every file that imports it, and everything here that
// blocks takes a context.Context first.
//
// Parts:
//   - policy.go: PlanNeed and PlanSwapIn, pure functions over a Snapshot (no
//     I/O, no clock): who is swapped out so a higher-priority process fits, and
//     who comes back in when memory frees.
//   - Manager: the registry (pid, job, priority, device, bytes, state, start
//     time, last progress) fed by shim connections, and the driver of swaps. It
//     serialises policy decisions and the swaps they start.
//   - Serve: the shim server, newline JSON over a Unix socket as specified in
//     shim/PROTOCOL.md (codec in context/swapproto). One goroutine per
//     connection; a closed connection is a process that ended and is forgotten.
//   - ControlServer: the CLI's gRPC API (context/ctlpb) over the Manager.
//   - ListenUnix: owner-only Unix sockets (directory 0700 when created, socket
//     0600) whose peers are checked with SO_PEERCRED (same uid as the daemon,
//     or root).
//   - Leases: MIG devices leased to jobs over the mig package (Discover,
//     journalled Apply): acquire a free instance of a profile, release by job
//     or when the leasing process has exited (Reap), and repartition a GPU
//     unless that would destroy a leased instance (ErrLeased).
//   - MemoryInfo: where free device memory comes from. NewNVMLMemory reads
//     NVML (the nvml.Interface is injected; only cmd/ builds a real one); with
//     no MemoryInfo the Manager uses a declared capacity minus the bytes its
//     registry holds on each device (tests, --gpu-memory).
//
// Processes are keyed by the pid the shim sends in its hello (PROTOCOL.md),
// which is only a label the kernel must confirm: it must be the socket peer's
// pid (SO_PEERCRED, the daemon's pid namespace, what ps and nvidia-smi on the
// host show) or the peer's pid in its own namespace (the last NSpid of
// /proc/<pid>/status: a shim in a container); any other claim is refused. In
// the second case the peer's pid is kept as PeerPID, and a swap by pid
// matches either. (A peer in the daemon's own process, such as fakeshim in
// tests, may claim any pid.) Every field of every shim message is checked
// against the limits of PROTOCOL.md (swapproto.Message.Validate, and byte
// counts at most the device's memory); a shim that breaks them is told why,
// disconnected and logged.
//
// Sentinel errors (ErrNoSuchProcess, ErrNoSuchJob, ErrAlreadyOut, ErrAlreadyIn,
// ErrBusy, ErrDisconnected, ErrDenied; ErrNoFreeInstance, ErrLeased,
// ErrNoLease) are returned wrapped; match them with errors.Is.
//
// Tests: context/fakeshim is a shim in Go that speaks PROTOCOL.md, for tests
// of the daemon and the CLI without libmigswap.so.
package ctxmgr
