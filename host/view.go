package host

import (
	"github.com/kvtier/kvtier/host/consensus"
	"github.com/kvtier/kvtier/host/control"
)

// This file is what a driver reads of the Node's Machine between calls:
// the tick, the contribution and digest a reply carries, a request's
// state and the gauges of the metrics. Every answer is the Machine's;
// the Node only passes it on, so a driver holds the Node alone.

// Ticks returns the number of ticks the Machine applied.
func (n *Node) Ticks() uint64 { return n.m.Ticks() }

// AppendContribution appends to dst, in the wire encoding
// (consensus.AppendContribution, sent as env), the contribution the
// Machine would offer the group at its next tick, shaped as
// ConsensusGroup shapes it: with the digests on a tick that is a
// multiple of Options.DigestEvery.
func (n *Node) AppendContribution(dst []byte, env consensus.Envelope) ([]byte, error) {
	every := n.m.Options().DigestEvery
	digest := every > 0 && n.m.Ticks()%uint64(every) == 0
	c, err := EncodeContribution(n.m.Contribution(), n.m.PipelineOps(), digest, n.m)
	if err != nil {
		return dst, err
	}
	return consensus.AppendContribution(dst, env, c)
}

// DueDigest returns the Machine's digest when its tick is one at which
// the group compares digests (a multiple of Options.DigestEvery), else
// false.
func (n *Node) DueDigest() ([32]byte, bool) {
	every := n.m.Options().DigestEvery
	if every <= 0 || n.m.Ticks()%uint64(every) != 0 {
		return [32]byte{}, false
	}
	return n.m.Digest(), true
}

// Loading reports whether a load-back into L1 is in flight on the path
// of request req (control.Machine.Loading).
func (n *Node) Loading(req control.ReqID) bool { return n.m.Loading(req) }

// MatchedL1 appends the L1 pages of request req's matched prefix that are
// readable now to dst (control.Machine.MatchedL1).
func (n *Node) MatchedL1(req control.ReqID, dst []control.PageRef) []control.PageRef {
	return n.m.MatchedL1(req, dst)
}

// Free returns the free pages of L1 and of L2 (its first kind).
func (n *Node) Free() (l1, l2 int64) { return n.m.Free() }

// SpillQueueLen returns the number of spills queued.
func (n *Node) SpillQueueLen() int { return len(n.m.SpillQueue()) }
