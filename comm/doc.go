// Package comm is what one rank of a collective job runs on: the devices
// that hold and reduce its buffers, and the transport through which the
// ranks of one host synchronise. It does not schedule collectives (package
// allreduce turns a collective into per-rank steps and runs them over a
// Device and a ShmTransport) and it does not find the other ranks (package
// comm/rendezvous does; comm only needs its KV).
//
// What lives where:
//
//   - device.go: the contract every backend meets. DType and Op; Device
//     (Alloc, NewStream, Register for host memory), Buffer, Stream (copies,
//     ReduceFromHost, Scale, Record) and Event. Optional abilities are small
//     interfaces found by type assertion: StagingReducer (device.go),
//     IPCDevice, BufferReducer, EventStream, TopologyDevice (cuda_ipc.go), ExternalDevice
//     (external.go: collectives on memory the caller allocated).
//   - host.go: the host backend, a Device over Go memory whose streams run
//     on goroutines (migctl's --backend host, CI, and ranks without a GPU).
//   - cuda_*.go: the CUDA backend over internal/cuda (the one cgo package):
//     CUDADevice, its streams, the reduction kernels (cuda_kernels.go; the
//     PTX comes from allreduce/kernels), IPC handles (cuda_ipc.go).
//     cuda_fake.go gives a cuda.Fake CPU versions of those kernels so that a
//     CUDADevice runs end to end without a GPU (tests, and MIGCTL_CUDA_FAKE
//     in the trainer and bench); it stays here because production code
//     selects it.
//   - reduce.go: the reduction math on host memory (ReduceHost, ScaleHost,
//     fp16/bf16 conversions), shared by the host backend and host-staged
//     collectives of the CUDA backend.
//   - transport.go: ShmTransport, one rank's view of the job's shared
//     control block (comm/shm): sequence flags with futex waits, the data
//     arena, heartbeats and the abort flag. A rank that fails, or finds a
//     peer exited or stalled, or whose deadline passes, raises the abort
//     flag naming the rank at fault; every rank's waits then fail with an
//     *AbortError (errors.Is ErrAborted, and ErrPeerDead for a dead peer).
//   - job.go: JoinShm, joining the job's control segment through the
//     rendezvous KV. The segment never has a name in /dev/shm (rank 0
//     creates it unnamed and the others open it through /proc), so no crash
//     leaks it and no name carries the job or its token.
//   - ipc_exchange.go: ExchangeIPC, swapping CUDA IPC handles of buffers
//     through the KV for the IPC ring.
//   - errors.go: the sentinels (ErrInvalid, ErrClosed, ErrAborted,
//     ErrPeerDead) and the error types that carry a rank (AbortError,
//     PeerError).
//
// Subpackages: comm/shm (the shared-memory segment and its layout),
// comm/rendezvous (registration, small KV, barriers over gRPC; the launcher
// hosts it) and comm/rendezvouspb (its generated code).
//
// Concurrency: Devices and ShmTransport are safe for concurrent use; a
// Stream is used by one goroutine at a time. Everything that blocks takes a
// context and fails when it ends.
package comm
