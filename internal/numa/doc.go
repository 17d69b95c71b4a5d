// Package numa places worker processes near their GPU on hosts of several
// NUMA nodes: it reads where a PCI device sits (its node and the CPUs local
// to it, from sysfs) and starts a process bound to those CPUs with its
// memory preferred on that node, as numactl --physcpubind --preferred
// would, without a wrapper. A process inherits both from the thread that
// forks it, so Start sets them on a locked OS thread, starts the process
// from there and gives the thread back what it had: nothing else of the
// caller runs with them.
//
// Why (docs/collectives.md, "NUMA"): a worker's shared-memory arena is
// written by its GPU's copy engines and read by its reduce threads; on a
// host of two sockets, memory and threads on the other socket than the GPU
// cross the socket link for every byte. NCCL keeps its host buffers and
// proxy threads on the GPU's node for the same reason.
package numa
