// Package rendezvouspb is the generated protobuf and gRPC code of the
// rendezvous service (rendezvous.proto). Regenerate with `make generate`
// (needs protoc, protoc-gen-go and protoc-gen-go-grpc on PATH).
package rendezvouspb

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative rendezvous.proto
