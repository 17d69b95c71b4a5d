package main

// `migctl run --help`: the long description and the examples.

const runLong = `Start --np worker processes of a training program on this node and supervise them:
torchrun's contract, so a PyTorch script that runs under torchrun runs unchanged, plus what
migctl's trainer SDK needs.

Devices, one of:
  --profile P   lease one MIG device of profile P per worker from the daemon ('migctl daemon'),
                which creates instances when too few are free; released when the run ends.
  --gpus 0,1    whole GPUs without MIG: workers spread round-robin, several per GPU allowed.
  --backend host  no device at all (CPU collectives; what CI and --sim use).
Under MIG every worker sees its own instance as CUDA device 0 (CUDA_VISIBLE_DEVICES is the
instance's MIG UUID): use device 0 (cuda:0) in the program, not LOCAL_RANK. With --gpus each
worker likewise sees only its GPU, as device 0. Workers that share a whole GPU are separate
CUDA contexts, which the driver time-slices (~150 us a switch on an H200, and a copy waits for
the others' slices): with --mps auto (the default) they run under a private MPS server that
migctl starts for the run (nvidia-cuda-mps-control, pipes in a temporary directory,
CUDA_MPS_PIPE_DIRECTORY in the workers' environment) and stops at the end, so their copies and
kernels run side by side as MIG instances' do. Auto falls back to time-slicing, with a line
saying why, when the control program is missing or its server cannot serve the GPU; --mps on
makes that an error, --mps off never starts one. Not with --profile (MIG), --swap (the
daemon's --mps decides), a CUDA_MPS_PIPE_DIRECTORY already set or a node-wide MPS control
daemon in /tmp/nvidia-mps (the workers join that one).

On a host of several NUMA nodes (two sockets), --numa places each GPU worker near its GPU, as
NCCL keeps its own buffers and threads: with auto (the default) its memory (pinned buffers,
everything it allocates) is preferred on the GPU's node, and when the job's GPUs sit on more than
one node each worker is also bound to the CPUs local to its GPU (sysfs local_cpulist; ranks all
near one node keep every CPU); --numa on binds CPUs always; --numa off places nothing and sets
MIGCTL_NUMA=off, which also keeps the trainer SDK from allocating its shared arena on its GPU's
node (as it does by default, however it was launched). Where each rank went is in the summary
(devices[].numa) and a "placement" line; what the kernel refuses is warned of and the worker
runs anyway. A host of one node is left alone under auto.

--sim h200x8 runs on a simulated node (no GPU): unless --socket or MIGCTL_SOCKET names a
running daemon, a daemon is started inside this process for the run (its sockets in a private
directory, removed at exit), and the workers get the host backend. One daemon leases a simulated
node at a time: a second run --sim on the same node, or one beside 'migctl daemon --sim', is
refused, naming the holder (run it with --socket, or give it its own node with --sim-state).

Every worker gets: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK (node),
GROUP_WORLD_SIZE (nodes), ROLE_RANK, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (a free port:
PyTorch's env:// init hosts its store on rank 0), TORCHELASTIC_RESTART_COUNT,
TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_RUN_ID (the job), TORCHELASTIC_ERROR_FILE,
CUDA_VISIBLE_DEVICES, and for the SDK MIGCTL_RDZV_ADDR, MIGCTL_JOB_TOKEN (only ever in the
environment), MIGCTL_JOB, MIGCTL_GENERATION, MIGCTL_BACKEND, MIGCTL_DEVICE, MIGCTL_TIMEOUT,
MIGCTL_SOCKET, and on one node MIGCTL_MACHINE (this host's figures from ` + "`migctl bench limits`" + `,
when cached: the collectives choose their algorithm on them); with --swap also
LD_PRELOAD=libmigswap.so, MIGSWAP_JOB (the job: the daemon swaps it as a gang),
MIGSWAP_PRIORITY and MIGSWAP_SOCKET. With several workers and no
OMP_NUM_THREADS in migctl's environment, OMP_NUM_THREADS=1 (as torchrun does: 7 workers each
starting one OpenMP thread per core starve each other and the collectives); set it yourself
(OMP_NUM_THREADS=4 migctl run ...) to choose another value. The rest of migctl's environment
reaches every worker too, among it the collectives' knobs: MIGCTL_TUNING=key=value,... with
chunk and small (sizes), slots, depth, workers, spin, smallon (cpu|device), chain (on|off) and
piece (auto|chunk) — what ` + "`migctl bench`" + `'s --chunk, --small-bytes, --slots, --depth,
--reduce-workers, --spin, --small-on, --chain and --piece set there — and bcast (device|cpu),
recv (staged|direct) and complete (cpu|device|queued); the workers must agree on chunk, slots, small, smallon and piece (the
rendezvous refuses a worker that does not).

Workers run in their own process groups and never outlive migctl. When one fails, the others
get SIGTERM, then SIGKILL after --grace, and all are restarted, up to --max-restarts times.
SIGINT, SIGTERM, SIGHUP and SIGQUIT are forwarded and end the run (at once during start-up);
SIGUSR1 and SIGUSR2 are forwarded. A stalled worker makes the others fail at the collective
deadline (--timeout), or sooner where their liveness checks see it stopped (trainer SDK,
migctl_torch: they then report it, and the summary blames it); the run then ends within
1 s + --grace. Output lines are prefixed with
the rank ("[3]: ..."); --log-dir keeps one directory per attempt and rank (stdout.log,
stderr.log, error.json), --tee picks what still reaches the terminal. At the end a summary
names the root cause: the first rank to fail, its exit code or signal, and its error file
(torchrun's JSON, as written by torch.distributed.elastic's @record). A rank whose death
aborted the rendezvous (its peers then fail at once, and one of their exits may be seen
first) is the root cause when it fails within the 1 s the others get to exit. A rank on this
node that exits 0 before every rank joined the group (trainer.Init, init_process_group) will
never join: the ranks joining fail at once, and the summary's blame names it.

Several nodes: run migctl on each with the same --nnodes, --rdzv-endpoint host:port (node 0
hosts the rendezvous there; MASTER_PORT is the next port) and MIGCTL_JOB_TOKEN exported,
and --node-rank 0..N-1.`

const runExamples = `  # 7 workers on 1g.18gb MIG instances (leased, created if needed, released at the end)
  migctl run --np 7 --profile 1g.18gb -- python train.py --epochs 3

  # no GPU: a simulated H200 node and the host backend
  migctl run --sim h200x8 --np 7 --profile 1g.18gb -- ./trainer-example

  # whole GPUs without MIG: 7 workers sharing GPU 0 (under a private MPS server when possible)
  migctl run --np 7 --gpus 0 -- python train.py

  # the same, time-sliced by the driver (no MPS)
  migctl run --np 7 --gpus 0 --mps off -- python train.py

  # restarts, logs, JSON summary
  migctl run --np 4 --gpus 0,1 --max-restarts 3 --log-dir ./logs --tee stderr -o json -- ./train

  # two nodes
  export MIGCTL_JOB_TOKEN=$(openssl rand -hex 16)
  migctl run --nnodes 2 --node-rank 0 --rdzv-endpoint node0:29400 --np 7 --profile 1g.18gb -- python train.py
  migctl run --nnodes 2 --node-rank 1 --rdzv-endpoint node0:29400 --np 7 --profile 1g.18gb -- python train.py`
