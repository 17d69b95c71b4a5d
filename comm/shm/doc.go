// Package shm maps POSIX shared-memory segments (files under /dev/shm, or
// any directory given as root for tests) into the process with mmap, and
// lays out on them what the shm transport needs: a control block with one
// heartbeat counter and one pid per rank, an abort flag any rank can raise,
// cache-line-padded sequence flags (single writer, many readers, accessed
// with sync/atomic on the mapped memory), and a data arena that holds the
// slotted FIFOs and the host-staged reduction buffers.
//
// Lifecycle: a job's segment never has a name. One rank creates it with
// CreateUnnamed (an O_TMPFILE file in the shm directory, or a memfd where
// that directory cannot hold one) and publishes its Path,
// /proc/<pid>/fd/<n>, through the rendezvous; the others map it with
// OpenPath (same user, same host), and once every rank has mapped it the
// creator closes its file (CloseFile). The kernel frees the memory with the
// last mapping, so a crash at any moment leaks nothing. Named segments
// (Create, Open, Unlink) remain for tools and tests; Sweep removes those left
// behind by creators that died, and by older versions that named them.
//
// A directory of segments that a GPU will pin must be a memory file system
// (tmpfs, hugetlbfs): FSOf says which file system a directory is on.
//
// Nothing here blocks except Wait helpers, which take a context.
package shm
