// Package indexv1 is the generated Go code of the kvtier.index.v1 plugin protocol
// (plugins/proto/kvtier/index/v1/index.proto); regenerate it with `make proto`.
// It must never be edited by hand: the .proto file is the public contract.
package indexv1
