// Package ctxmgr is the node context manager behind `migctl daemon`: the
// lease registry that hands MIG devices to jobs (creating them on demand),
// the registry of processes running under the memory-swap shim
// (libmigswap.so), the preemption policy that decides whose GPU memory goes
// to host and back, the servers the shim and the CLI talk to, and the client
// the CLI, the launcher and the SDK use.
//
// The directory is context/ (the design card's name) but the package is named
// ctxmgr: a package called "context" would shadow the standard library's
// context package in every file that imports it, and everything here that
// blocks takes a context.Context first.
//
// Parts:
//   - StartDaemon (daemon.go): the whole daemon as a library — shim server,
//     control gRPC, leases over a MIGSource with their reaper and state file,
//     events, metrics — so `migctl daemon` and `migctl run --sim` (a daemon
//     embedded in the launcher, sockets in a private directory) share it.
//     Daemon.Close stops it; ControlSocket/SwapSocket say where it listens.
//   - Dial and Client (client.go): the control API's client: Acquire,
//     Release, Leases, Watch, Swap, Status, Reserve, ReportCollectives. A dead
//     daemon is ErrDaemonNotRunning (the message says how to start one), a
//     refused user ErrPermissionDenied; the daemon's own sentinels (e.g.
//     ErrNoFreeInstance with its explanation) come back matchable with
//     errors.Is. DaemonSockets/DefaultControlSocket are the default paths
//     (root: /run/migctl; others: $XDG_RUNTIME_DIR/migctl; $MIGCTL_SOCKET and
//     $MIGSWAP_SOCKET override).
//   - Leases (lease.go, lease_plan.go, lease_state.go): MIG devices leased to
//     jobs. Acquire is all or nothing: free instances first; for the rest it
//     plans new ones with the mig planner (mig.PlanGPU) per GPU — keeping
//     every instance, then turning MIG on for an idle GPU (EnableMIG), then
//     reshaping only unleased idle instances — and applies the plans with the
//     journalled apply; a failed apply converges the GPUs it touched back.
//     Nothing here destroys a leased or busy instance. A request that cannot
//     fit is a *RefusalError (ErrNoFreeInstance) naming free and creatable
//     counts, the leases and busy devices in the way, by job, and the most
//     the GPUs could ever hold. Leases end with Release, when their process
//     exits (pid + start time, so a reused pid does not keep them: Reap), when
//     the client connection that asked for it closes (ReleaseConn), or when
//     their device disappears (Prune). Every change is written atomically to
//     a state file; Restore re-adopts leases whose device and process still
//     exist after a restart. Repartition converges a GPU unless that would
//     destroy a leased instance (ErrLeased).
//   - ReopeningSource: a MIGSource that opens the node per call, so a daemon
//     on a simulated node (mig/migsim holds a file lock while open) shares it
//     with `migctl partition --sim` as it would NVML.
//   - EventHub (events.go): lease and swap events for Watch; a watcher that
//     falls behind is dropped rather than slowing the daemon.
//   - Metrics (metrics.go): Prometheus metrics on their own registry: leases,
//     MIG devices per profile and state, lease events, swaps (count, bytes,
//     seconds), collective calls reported by the SDK.
//   - policy.go: PlanNeed and PlanSwapIn, pure functions over a Snapshot (no
//     I/O, no clock): who is swapped out so a higher-priority process fits, and
//     who comes back in when memory frees (the priority policy, the default).
//   - Scheduler (sched_wire.go): runs a policy of context/sched instead (fair:
//     round robin among equal priorities with a quantum of at least 20 swap
//     costs; srf: shortest remaining first, MIGSWAP_EXPECTED): a need pins
//     the requester, a rebalance applies the plan's swap-outs then swap-ins,
//     and a timer rebalances when a quantum ends (Options.Sched; `migctl
//     daemon --policy`).
//   - Manager: the registry (pid, job, priority, device, bytes, state, start
//     time, last progress) fed by shim connections, and the driver of swaps. It
//     serialises policy decisions and the swaps they start; OnSwapStart and
//     OnSwapDone report them (events, metrics).
//   - Priority launch gating (gate.go; Options.Gate, `migctl daemon --gate`,
//     SetGate/`migctl swap gate`): a shared page per device (a memfd passed
//     to each shim over its connection), a slot per process, the masks of
//     higher-priority slots and the classes (high, mid, low, alone); a
//     departed process's busy bit is cleared; the shims' gate_stats (held
//     time, count) show in Status as Process.Gate.
//   - Serve: the shim server, newline JSON over a Unix socket as specified in
//     shim/PROTOCOL.md (codec in context/swapproto). One goroutine per
//     connection; a closed connection is a process that ended and is forgotten.
//   - ControlServer: the gRPC control API (context/ctlpb) over the Manager and,
//     with WithLeases/WithEvents/WithMetrics, the leases, events and metrics.
//     Create its grpc.Server with ServerOptions (connection-bound leases).
//   - ListenUnix: owner-only Unix sockets (directory 0700 when created, socket
//     0600) whose peers are checked with SO_PEERCRED (same uid as the daemon,
//     or root).
//   - MemoryInfo: where free device memory comes from. NewNVMLMemory reads
//     NVML (the nvml.Interface is injected; only cmd/ builds a real one); with
//     no MemoryInfo the Manager uses a declared capacity minus the bytes its
//     registry holds on each device (tests, --gpu-memory, --sim).
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
// disconnected and logged. A peer whose uid the socket policy refuses is
// logged and told so in its protocol (gRPC PermissionDenied for the CLI).
//
// Sentinel errors (ErrNoSuchProcess, ErrNoSuchJob, ErrAlreadyOut, ErrAlreadyIn,
// ErrBusy, ErrDisconnected, ErrDenied; ErrNoFreeInstance, ErrLeased,
// ErrNoLease, ErrBadRequest, ErrNoMIG; ErrDaemonNotRunning,
// ErrPermissionDenied) are returned wrapped; match them with errors.Is.
//
// Tests: context/fakeshim is a shim in Go that speaks PROTOCOL.md, for tests
// of the daemon and the CLI without libmigswap.so; mig/migsim (and its Faulty
// fault injector) stands in for NVML.
package ctxmgr
