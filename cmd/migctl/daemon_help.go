package main

// daemonLong is the help of `migctl daemon`: leases, the swap shim, gating,
// MPS, metrics and the scheduling policies.
const daemonLong = `The node context manager. It leases MIG devices to jobs ('migctl lease', 'migctl run'),
creating them when too few are free: it plans a repartition of unleased, idle capacity with
the same planner and journalled apply as 'migctl partition' and never destroys a leased or
busy instance. A lease ends with 'migctl lease release', when the process it was taken for
exits, or (if asked) when the client's connection closes. Leases are kept in a state file
(--state) and re-adopted when the daemon restarts, as long as their processes still run.
On real GPUs it only repartitions GPUs already in MIG mode unless --enable-mig lets it turn
MIG on for an idle GPU (the default with --sim).

It also keeps a registry of the processes that run under the memory-swap shim
(libmigswap.so), decides whose GPU memory is swapped to host when a higher-priority process
needs memory, swaps it back in when memory frees, and serves 'migctl swap'.

Without a GPU, --sim h200x8 runs the daemon on a simulated node (the same one
'migctl partition ... --sim h200x8' shows and changes, state in --sim-state), exactly as on
NVML; its memory budget is then the simulated GPU's unless --gpu-memory says otherwise.

Two Unix sockets, both owner-only (a missing directory is created 0700, the sockets are
0600, and each peer's uid is checked with SO_PEERCRED: only the daemon's uid or root):
  --swap-socket  where shims connect    (default $MIGSWAP_SOCKET, else /run/migctl/migswap.sock
                 for root, $XDG_RUNTIME_DIR/migctl/migswap.sock for other users, or
                 /tmp/migctl-UID/migswap.sock without XDG_RUNTIME_DIR)
  --socket       where 'migctl swap', 'migctl lease' and 'migctl run' connect (default
                 $MIGCTL_SOCKET, else /run/migctl/control.sock for root, control.sock beside
                 the user's swap socket for other users; clients look there too)
Run the daemon and the jobs as the same user (or the daemon as root). A job started while
the daemon is not running simply runs without swapping (the shim passes every call through).

Run a job under the shim (build it with 'make shim'; it lands in bin/):
  LD_PRELOAD=/path/to/libmigswap.so \
  MIGSWAP_JOB=resnet MIGSWAP_PRIORITY=10 \
  MIGSWAP_SOCKET=/run/migctl/migswap.sock \
    python train.py
  MIGSWAP_JOB       job name shown by 'migctl swap status' (default pid-<pid>)
  MIGSWAP_PRIORITY  integer, higher wins (default 0); lower-priority jobs are swapped out
                    (lowest first, then most recently started) when a higher one needs memory
  MIGSWAP_SOCKET    the daemon's --swap-socket, if not the default
  MIGSWAP_CHECKSUM=1 checksum every allocation on swap-out, verify on swap-in
With --gate gate (or budget=N), MIGSWAP_PRIORITY also orders compute: while a process has
launches in flight on a device, the launches of lower-priority processes there wait (or at
most N of theirs stay in flight); 'migctl swap status' shows each one's class and held time.
Separate processes are separate GPU contexts, which the driver time-slices: a high-priority
kernel still waits for the other context's slice (~1.4 ms on an H200) or, at best, a context
switch (~150 us). --mps runs an MPS control daemon for the shimmed processes (pipes in
SWAP-SOCKET.mps; the shim finds it and sets CUDA_MPS_PIPE_DIRECTORY, and
CUDA_MPS_CLIENT_PRIORITY=1, below normal, for processes of priority 0 or less, unless the
process set them; MIGSWAP_MPS=0 opts a process out): their kernels share one context and
the driver dispatches a higher-priority process's blocks first. --mps-low-sm P also caps a
best-effort process at P% of the SMs (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE), so that a
higher-priority process's kernels find SMs free. Whole GPUs only (a MIG instance needs a
control daemon of its own); no GPU setting is changed.
  MIGSWAP_LOG=1     log the shim's decisions to stderr

Free memory comes from NVML (the GPU driver). On a machine without a GPU, or to declare a
smaller budget, give --gpu-memory: then free = that capacity minus what the shimmed
processes on the device report.

Metrics: --metrics-addr 127.0.0.1:9400 serves Prometheus metrics at /metrics (leases,
MIG devices per profile and state, swaps, collective calls the SDK reports); off by
default, and only on a loopback address unless --metrics-allow-remote.

A job that does not run under the shim can still make room: 'migctl swap reserve
--device D --bytes SIZE --priority P' swaps out lower-priority shimmed jobs until SIZE fits.

Scheduling policies (--policy): who is resident when the shimmed processes of a device need
more memory than it has. The others wait swapped out (the swap is the job switch: 16 GiB moved
in ~0.35 s each way on an H200; 10 ms + bytes at --swap-bandwidth in the policy's cost model).
  priority  (default; the behaviour before this flag) a process that needs memory takes it from
            strictly lower priorities, lowest first, then the most recently started; equal
            priorities never preempt each other, and an allocation that cannot fit fails.
  fair      priority between priorities; round robin within one: a process that asks for memory
            gets it from lower priorities, then from those of its own resident longest (never
            from a higher one); then each resident process
            keeps the device for a quantum (at least --quantum, and 20 x the time to swap the
            priority's largest process out and in, so switching stays under ~5%), after which
            the one that has waited longest swaps in. A big process that cannot fit between
            the others makes its priority admit nobody else after one quantum, so waits are
            bounded. Use it for equal-priority jobs that do not all fit: each gets its share.
  srf       priority between priorities; shortest remaining first within one: waiting processes
            swap in by expected time left, and a running one is swapped out for a shorter one
            only when the difference exceeds twice the switch. A process declares its run time
            with MIGSWAP_EXPECTED=90m (or seconds) in its environment; one that does not is
            ranked as a typical one and never preempted by its priority. Lowest average job
            completion time; a long job can wait behind a stream of short ones.
Under fair and srf the policy runs at every event and when a quantum ends. docs/daemon.md has
the simulated job completion times of the three on a recorded 40-job mix (context/sched).`

// daemonExamples are the examples of `migctl daemon --help`.
const daemonExamples = `  # No GPU: a simulated H200 node, sockets in your runtime directory
  migctl daemon --sim h200x8
  migctl lease acquire --job demo --profile 1g.18gb --count 7     # in another shell

  # On a GPU node, as root (sockets in /run/migctl), with metrics:
  sudo migctl daemon --metrics-addr 127.0.0.1:9400

  # As yourself, sockets in your runtime directory, no GPU needed:
  migctl daemon --gpu-memory 80GiB \
    --swap-socket $XDG_RUNTIME_DIR/migctl/migswap.sock \
    --socket $XDG_RUNTIME_DIR/migctl/control.sock

  # Then, in other shells:
  MIGSWAP_SOCKET=$XDG_RUNTIME_DIR/migctl/migswap.sock MIGSWAP_JOB=batch MIGSWAP_PRIORITY=0 \
    LD_PRELOAD=$PWD/bin/libmigswap.so ./my-cuda-program
  migctl swap status --socket $XDG_RUNTIME_DIR/migctl/control.sock

  # Equal-priority jobs that do not fit together take turns of at least a minute:
  migctl daemon --policy fair --quantum 1m
  MIGSWAP_JOB=a LD_PRELOAD=$PWD/bin/libmigswap.so python train_a.py &
  MIGSWAP_JOB=b LD_PRELOAD=$PWD/bin/libmigswap.so python train_b.py &

  # Short jobs first (each declares how long it runs):
  migctl daemon --policy srf
  MIGSWAP_EXPECTED=5m MIGSWAP_JOB=eval LD_PRELOAD=$PWD/bin/libmigswap.so python eval.py`
