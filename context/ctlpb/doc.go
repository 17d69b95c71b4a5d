// Package ctlpb is the generated gRPC code of the daemon's control API
// (control.proto): what `migctl swap` speaks to `migctl daemon` over the
// owner-only control socket. The server is ctxmgr.ControlServer.
//
// The .pb.go files are generated and committed, so building needs no protoc.
// Regenerate with `make generate` (protoc, protoc-gen-go, protoc-gen-go-grpc
// on PATH).
package ctlpb

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative control.proto
