// Package storev1 is the generated Go code of the kvtier.store.v1 plugin protocol
// (plugins/proto/kvtier/store/v1/store.proto); regenerate it with `make proto`.
// It must never be edited by hand: the .proto file is the public contract.
package storev1
