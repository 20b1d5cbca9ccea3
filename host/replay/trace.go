package replay

import (
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/workload"
)

// Trace is a request trace compiled for replay: every block's page key
// computed once, and the offline knowledge (first sightings, next uses)
// that the miss breakdown and the Belady bound need. A Trace is read-only
// after Compile and safe to share between concurrent replays.
type Trace struct {
	// Name says where the trace came from (a path, or "generated").
	Name string
	// keys holds every request's page keys back to back; request i is
	// keys[offs[i]:offs[i+1]].
	keys []pagehash.Hash
	offs []int
	// input is each request's input length in tokens.
	input []int
	// output is each request's output length in tokens.
	output []int
	// firstSeen marks, per block position in keys, the first time the
	// trace asks for that block.
	firstSeen []bool
	// uses lists, per unique block (dense index), the requests that ask
	// for it, in order.
	uses [][]uint32
	// ids is each unique block's trace id, by dense index.
	ids    []uint64
	unique int
	total  int64
}

// BlockKey returns the page key replay gives trace block id, whose dense
// index in its trace is dense. Trace ids are already prefix-chained (equal
// id = equal prefix), so the key is not a SHA-256 of tokens: it carries
// the id (little-endian, bytes 0-7), its complement (bytes 8-15) and the
// dense index (bytes 16-19), so replay maps a key back to per-block state
// without a map lookup. Engines never see these keys.
func BlockKey(id uint64, dense uint32) pagehash.Hash {
	var h pagehash.Hash
	binary.LittleEndian.PutUint64(h[0:8], id)
	binary.LittleEndian.PutUint64(h[8:16], ^id)
	binary.LittleEndian.PutUint32(h[16:20], dense)
	return h
}

// denseOf returns the dense index carried by a key from BlockKey.
func denseOf(h *pagehash.Hash) uint32 { return binary.LittleEndian.Uint32(h[16:20]) }

// Compile checks reqs and builds a Trace named name. A request whose
// hash_ids do not match its input length is an error naming the request's
// line (1-based, one request per line).
func Compile(name string, reqs []workload.Request) (*Trace, error) {
	t := &Trace{Name: name, offs: make([]int, 1, len(reqs)+1), input: make([]int, 0, len(reqs))}
	n := 0
	for _, r := range reqs {
		n += len(r.HashIDs)
	}
	t.keys = make([]pagehash.Hash, 0, n)
	t.firstSeen = make([]bool, 0, n)
	dense := make(map[uint64]uint32, n/2)
	for i, r := range reqs {
		if err := r.Validate(); err != nil {
			return nil, fmt.Errorf("trace %s: line %d: %w", name, i+1, err)
		}
		for _, id := range r.HashIDs {
			d, seen := dense[id]
			if !seen {
				d = uint32(len(t.uses))
				dense[id] = d
				t.uses = append(t.uses, nil)
				t.ids = append(t.ids, id)
			}
			t.uses[d] = append(t.uses[d], uint32(i))
			t.keys = append(t.keys, BlockKey(id, d))
			t.firstSeen = append(t.firstSeen, !seen)
		}
		t.offs = append(t.offs, len(t.keys))
		t.input = append(t.input, r.InputLength)
		t.output = append(t.output, r.OutputLength)
		t.total += int64(r.InputLength)
	}
	// Compact the use lists (one request may ask for a block once only:
	// ids are prefix-chained, so a repeat inside a request cannot happen,
	// but a malformed trace could; keep the lists strictly increasing).
	for d, us := range t.uses {
		t.uses[d] = slices.Compact(us)
	}
	t.unique = len(t.uses)
	return t, nil
}

// Requests returns the number of requests.
func (t *Trace) Requests() int { return len(t.input) }

// Blocks returns the number of blocks over all requests: the block-ops of
// one replay.
func (t *Trace) Blocks() int { return len(t.keys) }

// UniqueBlocks returns the number of distinct blocks.
func (t *Trace) UniqueBlocks() int { return t.unique }

// InputTokens returns the sum of the requests' input lengths.
func (t *Trace) InputTokens() int64 { return t.total }

// request returns request i's keys and input length.
// Request returns request i's page keys, input tokens and output tokens;
// the keys are the trace's own slice and must not be modified.
func (t *Trace) Request(i int) ([]pagehash.Hash, int, int) { return t.request(i) }

func (t *Trace) request(i int) ([]pagehash.Hash, int, int) {
	return t.keys[t.offs[i]:t.offs[i+1]], t.input[i], t.offs[i]
}

// NextUse implements policy.Future for a replay of this trace. Replay
// bumps the tree's clock twice per request (match, then insert), so the
// match of request i happens at logical time 2i+1; NextUse returns the
// match time of the first request after now that asks for h's block.
func (t *Trace) NextUse(h pagehash.Hash, now uint64) (uint64, bool) {
	d := denseOf(&h)
	if int(d) >= len(t.uses) || BlockKey(t.ids[d], d) != h {
		return 0, false
	}
	us := t.uses[d]
	// First request j with 2j+1 > now.
	jmin := (now + 1) / 2
	if jmin > uint64(^uint32(0)) {
		return 0, false
	}
	i, _ := slices.BinarySearch(us, uint32(jmin))
	if i == len(us) {
		return 0, false
	}
	return 2*uint64(us[i]) + 1, true
}
