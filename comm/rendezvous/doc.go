// Package rendezvous brings the ranks of a job together over gRPC. The
// launching process (migctl run, migctl bench) hosts a Server on a Unix
// socket or TCP; each rank uses a Client to register (learning its rank, the
// world size, every peer and the topology: same host, same physical GPU,
// MIG), to exchange small values such as where the shm segment is and IPC
// handles, and to barrier. Requests without the job's token are refused
// (codes.PermissionDenied). Every blocking call takes a context.
//
// Agreement. Each rank registers with the world size it expects and the
// settings every rank must share (Peer.World, Peer.Settings). A rank that
// differs from the ranks already registered aborts the whole job at once:
// every blocked and later call fails with an *AbortError that names the rank
// and the keys ("rank 2 joined with dtype=int32, but rank 0 has
// dtype=float32"; errors.Is ErrMismatch and ErrAborted).
//
// Joining and leaving. Until every rank has registered, a rank whose
// Register gives up (its ctx ends, its process dies, its connection closes)
// is unregistered and its rank is free again; asking for a rank that is
// taken, or joining a job whose world has formed (whatever the joiner's
// settings), fails with ErrRankTaken without touching the job. Once the world
// has formed, a rank that leaves (Client.Leave, or its connection closing
// without Client.Close) aborts the job naming it; Client.Close is the clean
// way out. Client.Abort and Server.AbortRank abort naming a rank; the first
// abort of a generation sticks (Server.Failed, Server.Err).
//
// Generations. A job that restarts calls Server.NewGeneration: registrations,
// keys, barriers and the abort state start empty (nothing grows across
// restarts), calls still blocked in the old generation fail, and ranks of
// the old generation get ErrStaleGeneration.
//
// No server. Dial does not connect; each call waits for the server, retrying
// with backoff for up to the connect timeout (WithConnectTimeout, default
// 10 s) within the call's ctx, then fails with an *UnreachableError: "no
// rendezvous at <addr>: connection refused (is the launcher running?)".
package rendezvous
