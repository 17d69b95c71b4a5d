// Command libmigctl is libmigctl.so, the C ABI of migctl's trainer SDK
// (include/migctl.h), built with -buildmode=c-shared (`make lib`). It is a
// thin export layer: it keeps the one Group of the process, converts C types
// to the trainer's Buffers and maps errors to integer codes plus a
// per-thread text. The Python package migctl_torch (python/) loads it with
// ctypes.
//
// The collectives in flight (the handles of the ABI) live in a ring in C
// (cabi.c): issuing one checks its arguments and fills a slot without
// entering the Go runtime (~2 us); one dispatcher goroutine takes the slots
// in order, runs each through the trainer and marks it done — except a large
// all-reduce the trainer chains (trainer.Group.Chains), which it issues
// asynchronously and hands off (migctl_hand_off_chained, MIGCTL_STAT_CHAINED),
// its Work marking the slot done, so that the next slot's collective starts
// once the all-reduce's copies out are done (docs/collectives.md, "Chained
// host-staged all-reduces"); migctl_wait
// polls the slot's word (20 us, or until the collective's expected end when
// the CPUs allow), then sleeps on its futex. A cgo callback that blocked on a
// channel instead (the first version) cost ~40 us per collective in
// hand-offs of the caller's locked thread. A collective on device memory of
// the gpu backend calls into Go once on the issuing thread, without
// blocking: it marks the caller's stream then (an event, or nothing when the
// stream is idle), and the dispatcher hands the mark to the trainer
// (trainer.DeviceBufferAfter), so the collective waits for the work queued
// before the call only. migctl_stats counts where a collective's time goes
// (queued, run, the waiter's wake).
//
// A synchronous caller (torch 2.x's dist.all_reduce without async_op)
// calls migctl_run: issue and wait in one C call. With nothing else queued
// or running and at most 1 MiB (MIGCTL_LIB_DIRECT_MAX), the collective runs
// on the calling thread itself: no hand-off to the dispatcher, no futex
// wake of a sleeping waiter, and the thread stays on its core. A cgo
// callback's goroutine is locked to the C thread, where each
// runtime.Gosched in the polling loops would hand the thread's P away and
// back (two futex wakes: 83 us against 22 us through the ring, a group of
// one on 2 CPUs, when this was first tried), so the trainer's waits poll
// without yielding meanwhile and the host backend's streams run their work
// on the caller's goroutine when idle (comm.HoldYields); it needs
// GOMAXPROCS >= 2. One H200, 7 ranks on GPU 0, 8 KiB CUDA tensors:
// dist.all_reduce 65-93 us direct against 134-206 through the ring, beside
// migctl bench's 50-54 (2026-12-02); host backend on 2 CPUs, migctl_run of
// 8 KiB: 1, 2, 3 ranks 5.0-5.5, 6.7, 67 us against 15-33, 152, 282. The
// per-collective entry points check the fork flag only, not getpid() (a
// system call, twice per collective).
//
// Across nodes there are two ways. migctl_init in a job whose ranks are on
// several hosts makes the trainer SDK's group across nodes, whose inter-node
// stage runs over NCCL when libnccl.so.2 loads (trainer/doc.go, "Across
// nodes"; not yet exercised through this ABI). Or the caller keeps one group
// per node and runs the inter-node stage itself: migctl_serve hosts a node's
// rendezvous in the process (an abstract Unix socket), migctl_init_group
// joins the node's group by that address under a per-node job name
// (migctl_torch does this, with gloo or NCCL between nodes).
//
// The C entry points (cabi.c) refuse to run in a child forked after the
// library was loaded, without entering the Go runtime; nothing here calls
// signal.Notify. Besides internal/cuda this is the one cgo package.
package main
