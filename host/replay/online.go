package replay

import (
	"fmt"

	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/policy"
	"github.com/kvtier/kvtier/workload"
)

// Online is a replay fed one request at a time instead of from a compiled
// Trace: serve's shadow policies run one per (policy, capacity) over the
// live lookups. It follows Run's semantics exactly, so a recording of the
// same requests replayed by Run at the same capacity gives the same
// result. It is not safe for concurrent use.
type Online struct {
	r *runner
}

// NewOnline returns an online replay of a fresh tree fed to ev (which must
// be fresh, and must not need a policy.Future) at capacityTokens (0 =
// infinite), named name in errors.
func NewOnline(name string, ev policy.Evictor, capacityTokens int64) (*Online, error) {
	r, err := newRunner(nil, ev, capacityTokens, false)
	if err != nil {
		return nil, err
	}
	r.name = name
	return &Online{r: r}, nil
}

// Request replays one request of keys (one page a key, each
// workload.BlockTokens tokens) whose input is input tokens, and returns
// its hit tokens. The tree keeps sub-slices of keys (read-only, so several
// Onlines may share one slice): the caller must not modify it afterwards.
func (o *Online) Request(keys []pagehash.Hash, input, output int) (int64, error) {
	if input < 0 || output < 0 || len(keys) == 0 {
		return 0, fmt.Errorf("replay %s: request %d: %d keys, input %d, output %d", o.r.name, o.r.res.Requests+1, len(keys), input, output)
	}
	before := o.r.res.HitTokens
	if err := o.r.requestKeys(o.r.res.Requests, keys, input, output, 0); err != nil {
		return 0, err
	}
	o.r.res.Requests++
	o.r.res.InputTokens += int64(input)
	o.r.res.Blocks += int64(len(keys))
	return o.r.res.HitTokens - before, nil
}

// Result returns the replay's result so far.
func (o *Online) Result() Result { return o.r.finish() }

// BlockTokens is the tokens of one key of an online request.
const BlockTokens = workload.BlockTokens
