// Command libmigctl is libmigctl.so, the C ABI of migctl's trainer SDK
// (include/migctl.h), built with -buildmode=c-shared (`make lib`). It is a
// thin export layer: it converts C types to the trainer's Buffers, keeps the
// one Group of the process and a table of the collectives in flight (the
// handles of the ABI), and maps errors to integer codes plus a per-thread
// text. The Python package migctl_torch (python/) loads it with ctypes.
//
// The C entry points (cabi.c) refuse to run in a child forked after the
// library was loaded, without entering the Go runtime; nothing here calls
// signal.Notify. Besides internal/cuda this is the one cgo package.
package main
