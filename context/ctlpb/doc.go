// Package ctlpb is the generated gRPC code of the daemon's control API
// (control.proto): swaps, MIG leases, events and collective reports, what
// `migctl swap`, `migctl lease`, `migctl run` and the SDK speak to
// `migctl daemon` over the owner-only control socket. The server is
// ctxmgr.ControlServer; the client is ctxmgr.Client (ctxmgr.Dial).
//
// The .pb.go files are generated and committed, so building needs no protoc.
// Regenerate with `make generate` (protoc, protoc-gen-go, protoc-gen-go-grpc
// on PATH).
package ctlpb

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative control.proto
