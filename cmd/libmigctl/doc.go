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
// in order, runs each through the trainer and marks it done; migctl_wait
// polls the slot's word for 20 us, then sleeps on its futex. A cgo callback
// that blocked on a channel instead (the first version) cost ~40 us per
// collective in hand-offs of the caller's locked thread.
//
// A group spans one node. For jobs across nodes, migctl_serve hosts a node's
// rendezvous in the process (an abstract Unix socket) and migctl_init_group
// joins the node's group by that address under a per-node job name; the
// caller runs the inter-node stage (migctl_torch does, over gloo).
//
// The C entry points (cabi.c) refuse to run in a child forked after the
// library was loaded, without entering the Go runtime; nothing here calls
// signal.Notify. Besides internal/cuda this is the one cgo package.
package main
