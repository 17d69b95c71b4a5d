// Package fakeshim is a shim written in Go that speaks the migswap control
// protocol (shim/PROTOCOL.md) to a daemon, for tests of the daemon and the CLI
// without libmigswap.so or a GPU. It plays a process: it says hello, reports
// usage, asks for memory with need, and answers swap_out/swap_in with progress
// and a result, as its Behavior says (delays, refusals, a disconnect mid-swap).
//
// A Shim is safe for concurrent use. Close ends it, like a process exiting.
package fakeshim
