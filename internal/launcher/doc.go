// Package launcher runs one node's part of a training job: the library
// behind `migctl run` (and the process side of `migctl bench`). cmd/ only
// parses flags into a Config and prints the Result.
//
// Run, in order:
//
//  1. checks the Config, the worker program included (ErrWorkerNotFound
//     before anything is leased or created);
//  2. on node 0, hosts the job's rendezvous (comm/rendezvous): a Unix
//     socket in a private directory (0700) for one node, or TCP on
//     --rdzv-endpoint's port for several (ErrPortInUse when it is taken);
//     the other nodes' workers join node 0's;
//  3. picks MASTER_ADDR/MASTER_PORT: a free port on 127.0.0.1 for one node
//     (PyTorch's env:// init then hosts its own store on rank 0, as under
//     torchrun's static rendezvous); across nodes the rendezvous host and
//     the port after the rendezvous's;
//  4. obtains one Device per local rank through Devices: Leases (MIG
//     devices from the daemon, leased as a whole or not at all, bound to
//     the launcher's pid) or RoundRobin (whole GPUs, several ranks per GPU
//     allowed);
//  5. runs the workers under internal/supervisor with the environment
//     below, aborting the rendezvous when a worker fails (the others fail
//     at once with the reason) and starting a new rendezvous generation
//     before each restart;
//  6. whatever happened (success, failure, signal, panic), releases the
//     devices, stops the rendezvous and removes its socket directory.
//
// # Worker environment
//
// torchrun's: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK
// (the node), GROUP_WORLD_SIZE (the nodes), ROLE_RANK, ROLE_WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT,
// TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_RUN_ID (the job name),
// TORCHELASTIC_ERROR_FILE; CUDA_VISIBLE_DEVICES (the rank's device: a MIG
// UUID under MIG, so every worker sees its instance as device 0).
// migctl's: MIGCTL_RDZV_ADDR, MIGCTL_JOB_TOKEN, MIGCTL_JOB,
// MIGCTL_GENERATION, MIGCTL_BACKEND, MIGCTL_DEVICE, MIGCTL_TIMEOUT,
// MIGCTL_SOCKET (when a daemon is used) and, with Swap, LD_PRELOAD,
// MIGSWAP_JOB (= the job, so the daemon swaps the job as a gang),
// MIGSWAP_PRIORITY, MIGSWAP_SOCKET. The job token is only ever in the
// environment, never on a command line or in a name.
//
// # Time bounds
//
// A stalled rank (SIGSTOP, a deadlock) makes the other ranks fail at the
// collective deadline (MIGCTL_TIMEOUT); from that first failure the
// launcher ends within Settle + Grace (defaults 1 s + 5 s), plus the
// release of the devices (bounded by 10 s, normally milliseconds). See
// internal/supervisor for the sequence.
//
// # Several nodes
//
// Each node runs its own launcher with the same --nnodes, --rdzv-endpoint
// and MIGCTL_JOB_TOKEN. Restarts are not coordinated across nodes yet: a
// node restarts its own workers (node 0 with a new rendezvous generation),
// so a job over several nodes should run with MaxRestarts 0 until an
// elastic rendezvous lands; a failure on any node then fails the job.
package launcher
