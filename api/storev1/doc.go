// Package storev1 is the generated Go code of the kvtier.store.v1
// (protobuf package kvtier.pagestore.v1)
// page-store API (api/kvtier/store/v1/store.proto); regenerate it with
// `make proto`. It must never be edited by hand: the .proto file is the
// public contract, and docs/store-api.md describes the call sequence.
package storev1
