// Package workload reads request traces in the Mooncake FAST'25 format and
// generates realistic synthetic traffic in the same format, for replay tests
// and benchmarks. It never needs a trace file to work: the seeded generator
// is the embedded default workload.
package workload

import "fmt"

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

// Blocks returns the number of trace blocks a prompt of inputLength tokens
// occupies: ceil(inputLength / BlockTokens). The last block may be partial.
func Blocks(inputLength int) int {
	if inputLength <= 0 {
		return 0
	}
	return (inputLength + BlockTokens - 1) / BlockTokens
}

// Validate checks the rules every trace line obeys: lengths are not
// negative and there is exactly one hash id per (possibly partial) block of
// the input, ceil(InputLength / 512). The reader enforces the same rules;
// Write refuses a request that breaks them.
func (r Request) Validate() error {
	switch {
	case r.Timestamp < 0:
		return fmt.Errorf("timestamp: %d is negative: %w", r.Timestamp, ErrMalformed)
	case r.InputLength < 0:
		return fmt.Errorf("input_length: %d is negative: %w", r.InputLength, ErrMalformed)
	case r.OutputLength < 0:
		return fmt.Errorf("output_length: %d is negative: %w", r.OutputLength, ErrMalformed)
	}
	if want := Blocks(r.InputLength); len(r.HashIDs) != want {
		return fmt.Errorf("hash_ids: %d ids for input_length %d, want ceil(%d/%d) = %d: %w",
			len(r.HashIDs), r.InputLength, r.InputLength, BlockTokens, want, ErrMalformed)
	}
	return nil
}
