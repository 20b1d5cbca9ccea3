package consensus

import (
	"encoding/binary"
	"fmt"
)

// ReduceEncoded is an engine's all-reduce of one tick in the wire
// encoding: msgs are the contributions of every rank of one group (one
// each, in any order), as its ranks' serves returned them. It checks that
// they name one group, stack, size and tick and every rank once, reduces
// them (Reduce: element-wise MIN, AND of the ok bits, digests compared)
// and returns the encoded frontier to hand back to every rank. An engine
// that all-reduces with its own collective computes the same thing.
func ReduceEncoded(msgs [][]byte) ([]byte, error) {
	if len(msgs) == 0 {
		return nil, fmt.Errorf("consensus: reduce: no contributions: %w", ErrShape)
	}
	if len(msgs[0]) < headerLen {
		_, _, err := DecodeContribution(msgs[0], Expect{})
		return nil, err
	}
	le := binary.LittleEndian
	exp := Expect{Group: le.Uint64(msgs[0][8:]), Stack: le.Uint64(msgs[0][16:]), Size: int(le.Uint32(msgs[0][36:]))}
	if exp.Size != len(msgs) {
		return nil, fmt.Errorf("consensus: reduce: %d contributions for a group of %d: %w", len(msgs), exp.Size, ErrShape)
	}
	cs := make([]Contribution, len(msgs))
	seen := make([]bool, len(msgs))
	var env Envelope
	for i, b := range msgs {
		e, c, err := DecodeContribution(b, exp)
		if err != nil {
			return nil, fmt.Errorf("consensus: reduce: contribution %d: %w", i, err)
		}
		if seen[e.Rank] {
			return nil, &PeerError{Peer: RankName(e.Rank), Tick: c.Tick, TickKnown: true, Err: fmt.Errorf("two contributions from one rank: %w", ErrShape)}
		}
		seen[e.Rank], cs[e.Rank], env = true, c, e
	}
	f, err := Reduce(cs[0].Tick, cs)
	if err != nil {
		return nil, fmt.Errorf("consensus: reduce: %w", err)
	}
	return AppendFrontier(nil, env, f)
}
