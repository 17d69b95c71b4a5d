// Package trainer is migctl's public collective API: the one way a process
// joins a group of ranks and runs collectives with them. `migctl run` (the
// launcher), `migctl bench`, the C ABI of libmigctl.so and user programs all
// go through it.
//
// # Joining
//
// Init reads the launcher's environment (torchrun's RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, plus migctl's
// MIGCTL_RDZV_ADDR, MIGCTL_JOB_TOKEN, MIGCTL_JOB, MIGCTL_BACKEND,
// MIGCTL_DEVICE, MIGCTL_TIMEOUT: see the Env* constants), meets the other
// ranks at the rendezvous, learns the topology (which ranks share a physical
// GPU, whether any is a MIG instance, whether all are on one host), maps the
// job's shared-memory segment and picks the transport and the all-reduce
// algorithm from that topology exactly as `migctl bench` does:
//
//   - one rank on each of several non-MIG GPUs of one host: a ring through
//     CUDA IPC;
//   - otherwise, through shared host memory, whichever of host-staged, ring
//     and hierarchical the cost model (allreduce.Machine.Choose) predicts
//     fastest for the ranks' grouping by physical GPU, on the machine
//     figures of the job (WithMachine, or MIGCTL_MACHINE: what `migctl
//     bench limits` measured on this node, handed over by `migctl bench`
//     and single-node `migctl run`), else hw/H200.md's. On a measured H200:
//     2 ranks on one GPU take the ring (its reductions staged in device
//     memory), 3 to 8 host-staged, and so does the host backend.
//
// The executor's knobs come from MIGCTL_TUNING when it is set
// (chunk=2MiB,slots=8,workers=2,...: ParseTuning), else from the defaults
// (allreduce.Staged for device buffers). Functional options (WithTransport,
// WithAlgorithm, WithTuning, ...) override the choice and the environment. A program started without a launcher and
// without WORLD_SIZE is a group of one (every collective is a copy), so the
// same binary runs alone and under `migctl run`.
//
// Every rank must ask for the same settings (world size, transport,
// algorithm, tuning, and whatever WithSettings adds); the rendezvous compares
// them and fails every rank at once, naming the rank and the difference.
//
// # Across nodes
//
// A group whose ranks are on several hosts (`migctl run --nnodes N
// --node-rank i --rdzv-endpoint host:port` on each) runs every collective
// in two stages, Horovod's hierarchical scheme: within a node over the
// node's shared memory (its ranks choose transport and algorithm among
// themselves as above; the IPC ring is not used), and across nodes over
// NCCL, loaded at run time (internal/nccl: libnccl.so.2 from the library
// path, or the file MIGCTL_NCCL_LIB names). Local rank j of every node
// forms the NCCL communicator of shard j (its unique id made by node 0's
// and passed through the rendezvous store), so all of a node's ranks carry
// inter-node traffic at once. An all-reduce reduce-scatters within the
// node (block j to local rank j), all-reduces block j across nodes in
// shard j, and all-gathers within the node; the few elements that do not
// split evenly cross on shard 0 and are broadcast from local rank 0, so
// every rank holds the same bits. Reduce-scatter, all-gather and broadcast
// are sharded the same way (each shard carries its share across nodes);
// barrier meets in every shard, then within the node. Every node must run the
// same number of ranks; nodes are numbered in the order of their lowest
// rank, a node's ranks by rank (LocalRank, LocalSize). The inter-node stage
// needs the gpu backend (NCCL reads device memory) and NCCL 2.x: without
// them (no libnccl.so.2, the host backend, ranks uneven across hosts) Init
// fails on every rank with ErrMultiNode and a message that says why and
// what to do, never a hang. A collective waiting on a node that died ends
// at its deadline, or earlier when NCCL reports the peer gone
// (comm.ErrPeerDead); the NCCL communicator is then aborted and the group
// refuses further collectives. MIGCTL_NCCL_FAKE=1 runs the inter-node
// stage of host-backend ranks on a fake NCCL over loopback TCP: "nodes" on
// one machine for tests.
//
// # Collectives
//
// AllReduce (Sum, Avg, Min, Max), ReduceScatter, AllGather, Broadcast and
// Barrier run on Buffers: HostSlice wraps a Go slice, HostBytes raw bytes of
// any DType (Float16 and BFloat16 too), DeviceBuffer a CUDA device pointer in
// the device's primary context with the stream its contents were produced on.
// A collective on a device buffer first waits for the work queued so far on
// that stream (an event, never a device-wide sync; none when the stream is
// idle); when the call returns the result is in the receive buffer, so work
// the caller queues afterwards sees it. A binding that issues a collective
// later than its caller's call (libmigctl) marks the stream at the call with
// RecordStream and passes the mark with DeviceBufferAfter. Alloc gives a Buffer on the group's device for programs that own no
// CUDA memory; Write and Read copy to and from it.
//
// Every rank must issue the same collectives in the same order with the same
// counts, element types, operators and roots; the ranks compare each call's,
// and a call that differs from a peer's fails on every rank with
// comm.ErrMismatch (the group is then unusable). A Group is safe for concurrent use: calls are queued and run one at
// a time in the order they were issued. The Async variants return a *Work at
// once; its Wait blocks until the collective has finished. Buffers belong to
// the collective until then.
//
// NewGroup forms a group of some of a group's ranks on one node (PyTorch's
// dist.new_group), with its own segment, stream, order of collectives and
// algorithm chosen from its members' topology; it shares the parent's
// device, rendezvous and swap state, and closes with it.
//
// Send and Recv (and their Async variants) move a buffer between two ranks
// of one node (pipeline parallelism). Each direction between two ranks is a
// link of its own, formed at its first transfer and independent of the
// group's collectives and of other links: the k-th Send to a peer meets its
// k-th Recv from this rank, and two ranks may both send before they receive.
//
// Every collective has a deadline (WithTimeout, MIGCTL_TIMEOUT; default 5m):
// a dead or stalled peer becomes an error on every rank, never a hang.
//
// # Preemption
//
// The node daemon can swap a whole job out (every rank, as a gang) to give
// its GPU memory to a higher-priority job, for seconds or minutes. While the
// job is held, collective deadlines do not run, so a long hold does not fail
// the job; new collectives wait until the job is swapped back in. OnSwapOut
// and OnSwapIn register callbacks. A rank on the host backend registers with
// the daemon itself (MIGSWAP_SOCKET, MIGSWAP_JOB, MIGSWAP_PRIORITY) as a
// process holding no GPU memory, so a host-backend job is preempted as a gang
// too.
//
// Errors wrap the sentinels of package comm (comm.ErrPeerDead,
// comm.ErrAborted, comm.ErrInvalid, comm.ErrMismatch) and this package's (ErrTimeout,
// ErrMultiNode, ErrClosed, ErrUnsupported); match them with errors.Is.
package trainer
