// Package rendezvous brings the ranks of a job together over gRPC. The
// launching process (migctl bench, later migctl run) hosts a Server on a Unix
// socket or loopback TCP; each rank uses a Client to register (learning its
// rank, the world size, every peer and the topology: same host, same physical
// GPU, MIG), to exchange small values such as shm segment names and IPC
// handles, and to barrier. Requests without the job's token are refused
// (codes.PermissionDenied). Every blocking call takes a context.
package rendezvous
