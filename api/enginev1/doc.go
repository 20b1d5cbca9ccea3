// Package enginev1 is the generated Go code of the kvtier.engine.v1 engine
// API (api/kvtier/engine/v1/engine.proto); regenerate it with `make proto`.
// It must never be edited by hand: the .proto file is the public contract,
// and docs/engine-api.md describes the call sequence.
package enginev1
