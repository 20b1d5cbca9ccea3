// Package workload reads request traces in the Mooncake FAST'25 format and
// generates realistic synthetic traffic in the same format, for replay tests
// and benchmarks. It never needs a trace file to work: the seeded generator
// is the embedded default workload.
package workload

// BlockTokens is the number of tokens per trace block (one hash id).
const BlockTokens = 512

// Request is one line of a Mooncake FAST'25 trace.
type Request struct {
	// Timestamp is the arrival time in milliseconds from the trace start.
	Timestamp int64 `json:"timestamp"`
	// InputLength is the prompt length in tokens.
	InputLength int `json:"input_length"`
	// OutputLength is the generated length in tokens.
	OutputLength int `json:"output_length"`
	// HashIDs are the prefix-chained ids of the prompt's 512-token blocks:
	// equal ids at equal positions mean equal prefixes. The last block may
	// be partial (InputLength need not be a multiple of 512).
	HashIDs []uint64 `json:"hash_ids"`
}
