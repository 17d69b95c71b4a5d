// Package allreduce holds the collective algorithms as schedules and the
// executor that runs them.
//
// A Schedule is pure data: for every rank, an ordered list of Steps (copy a
// span of a user buffer out to the host arena, copy it back in, reduce host
// spans into a user buffer on the device, reduce host spans into a host span
// on the CPU, scale, or nothing), each on one of three lanes (out, reduce,
// in), each waiting for sequence flags to reach values and setting its own
// rank's flags once done. Generating a schedule does no I/O and touches no
// memory, so schedules are tested as data (see Simulate).
//
// Algorithms:
//   - Ring: reduce-scatter then all-gather over one FIFO per neighbour pair in
//     the arena (K slots; the flags "sent" and "consumed" are its head and
//     tail). Moves 2(n-1)/n of the buffer per rank each way.
//   - HostStaged: every rank copies its chunk to its slot of the arena, the
//     ranks' CPU threads reduce one part each into a result slot, and every
//     rank copies the result back: about n·S each way over a shared link
//     instead of 2(n-1)·S, the right choice for ranks on one physical GPU.
//     Params.GPUShare (split.go) moves that share of every chunk's
//     reduction to the ranks' devices, which read the peers' staged copies
//     from mapped host memory: the CPU reads less, the link carries more
//     (ReduceOn, Machine.GPUShare).
//   - Hierarchical: for several ranks on each of several GPUs (Params.Groups):
//     each group's ranks reduce one part each on the device from the peers'
//     staged inputs, the CPU threads sum the G group partials, every rank
//     fetches the result. S out and (2−1/m)·S in per rank; the CPU reads G·S.
//   - HostStagedSmall: the host-staged all-reduce for small messages (the
//     Communicator picks it up to Options.SmallBytes): every rank stages its
//     whole buffer, reduces every rank's input itself and copies the result
//     back; one copy each way and one flag round. Consecutive small calls
//     alternate input areas (Params.Parity).
//
// The Executor runs a schedule for one rank over a Transport (shared flags,
// arena, liveness, abort) and a comm.Device: lanes run concurrently, each
// keeping up to Depth asynchronous copies in flight, so copies out, the
// reduction and copies in of different chunks overlap. Every call takes a
// context; any failure on any rank (error, deadline, dead peer) raises the
// job's abort flag so that every rank returns an error rather than hang or
// report a partial result.
//
// Machine.Estimate (costmodel.go) gives each algorithm's floor on a machine
// (link each way and both ways per GPU, CPU reduction, NVLink, round trip)
// and Machine.Choose the one predicted fastest: trainer's --algo auto.
//
// Options.Trace (migctl bench: MIGCTL_TRACE=1) makes the executor time every
// step of every call and write a summary when it closes (trace.go).
package allreduce
