// Package shm maps POSIX shared-memory segments (files under /dev/shm, or
// any directory given as root for tests) into the process with mmap, and
// lays out on them what the shm transport needs: a control block with one
// heartbeat counter and one pid per rank, an abort flag any rank can raise,
// cache-line-padded sequence flags (single writer, many readers, accessed
// with sync/atomic on the mapped memory), and a data arena that holds the
// slotted FIFOs and the host-staged reduction buffers.
//
// Lifecycle: one rank Creates the segment (O_EXCL, named per job), the
// others Open it by name; once every rank has mapped it the creator Unlinks
// the name, so a crash of any process can no longer leak it: the kernel frees
// the memory when the last mapping goes. Sweep removes segments left behind by
// creators that died before the unlink.
//
// Nothing here blocks except Wait helpers, which take a context.
package shm
