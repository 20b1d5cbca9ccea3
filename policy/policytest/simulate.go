package policytest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/policy"
	"github.com/kvtier/kvtier/workload"
)

// SimResult is the outcome of one Simulate run.
type SimResult struct {
	// HitTokens is the sum over requests of min(512 × hit blocks, input).
	HitTokens int64
	// InputTokens is the sum of the requests' input lengths.
	InputTokens int64
	// Evictions counts blocks evicted.
	Evictions int64
}

// HitRate returns HitTokens / InputTokens.
func (r SimResult) HitRate() float64 {
	if r.InputTokens == 0 {
		return 0
	}
	return float64(r.HitTokens) / float64(r.InputTokens)
}

// simNode is one cached block of the simulator's block-level tree.
type simNode struct {
	info      policy.NodeInfo
	block     uint64
	parent    *simNode
	locked    bool
	evictable bool
}

// Simulator is a block-level, leaf-only prefix cache of capacity blocks: one
// trace block is one node of one page, the hit is the longest run of leading
// blocks present, then the whole input is inserted with the request's own
// blocks locked, evicting the evictor's victims as needed. It is the
// policies' test bench, not the host's replay: it feeds an Evictor exactly
// the events the contract describes, with the logical clock bumped once by
// each match and once by each insert.
type Simulator struct {
	ev       policy.Evictor
	capacity int
	clock    uint64
	nextID   policy.NodeID
	blocks   map[uint64]*simNode
	byID     map[policy.NodeID]*simNode
	path     []*simNode
	res      SimResult
}

// NewSimulator returns an empty simulator feeding ev, holding at most
// capacity blocks (capacity < 0 means unbounded).
func NewSimulator(ev policy.Evictor, capacity int) *Simulator {
	return &Simulator{ev: ev, capacity: capacity, nextID: 1, blocks: make(map[uint64]*simNode), byID: make(map[policy.NodeID]*simNode)}
}

// Clock returns the simulator's logical clock.
func (s *Simulator) Clock() uint64 { return s.clock }

// Result returns the totals so far.
func (s *Simulator) Result() SimResult { return s.res }

func (s *Simulator) sync(n *simNode) {
	want := !n.locked && n.info.Children == 0
	if want != n.evictable {
		n.evictable = want
		s.ev.SetEvictable(n.info.ID, want)
	}
}

func (s *Simulator) evict() error {
	v, ok := s.ev.Victim()
	if !ok {
		return errNoVictim
	}
	n := s.byID[v]
	if n == nil || !n.evictable {
		return fmt.Errorf("policy %s chose victim %d, which is not an evictable leaf", s.ev.Name(), v)
	}
	s.ev.Remove(v)
	delete(s.byID, v)
	delete(s.blocks, n.block)
	s.res.Evictions++
	if p := n.parent; p != nil {
		p.info.Children--
		p.info.Time = s.clock
		s.ev.Update(p.info)
		s.sync(p)
	}
	return nil
}

var errNoVictim = fmt.Errorf("no evictable leaf")

// Request replays one request.
func (s *Simulator) Request(r workload.Request) error {
	s.res.InputTokens += int64(r.InputLength)
	s.clock++
	s.path = s.path[:0]
	hit := 0
	for _, b := range r.HashIDs {
		n := s.blocks[b]
		if n == nil {
			break
		}
		hit++
		n.info.Hits++
		n.info.Time, n.info.LastAccess = s.clock, s.clock
		s.ev.Hit(n.info)
		n.locked = true
		s.sync(n)
		s.path = append(s.path, n)
	}
	s.res.HitTokens += int64(min(hit*workload.BlockTokens, r.InputLength))
	s.clock++
	for i := hit; i < len(r.HashIDs); i++ {
		if s.capacity >= 0 && len(s.blocks) >= s.capacity {
			if err := s.evict(); err == errNoVictim {
				break
			} else if err != nil {
				return err
			}
		}
		n := &simNode{block: r.HashIDs[i]}
		n.info = policy.NodeInfo{ID: s.nextID, Time: s.clock, LastAccess: s.clock, Depth: i, Pages: 1, Tail: TailHash(r.HashIDs[i])}
		s.nextID++
		if i > 0 {
			p := s.path[i-1]
			n.parent = p
			n.info.Parent = p.info.ID
			p.info.Children++
			p.info.Time = s.clock
			s.ev.Update(p.info)
			s.sync(p)
		}
		s.blocks[n.block] = n
		s.byID[n.info.ID] = n
		s.ev.Insert(n.info)
		n.locked = true
		s.path = append(s.path, n)
	}
	for _, n := range slices.Backward(s.path) {
		n.locked = false
		s.sync(n)
	}
	return nil
}

// Simulate replays reqs through a fresh simulator.
func Simulate(ev policy.Evictor, reqs []workload.Request, capacity int) (SimResult, error) {
	s := NewSimulator(ev, capacity)
	for i, r := range reqs {
		if err := s.Request(r); err != nil {
			return s.res, fmt.Errorf("simulate request %d: %w", i, err)
		}
	}
	return s.res, nil
}

// Future is the offline knowledge of a trace for a simulator replay: when
// each block is next requested. The simulator's clock reaches 2i+1 at the
// match of request i.
type Future struct {
	uses map[uint64][]uint64
}

// NewFuture indexes reqs for NextUse.
func NewFuture(reqs []workload.Request) *Future {
	f := &Future{uses: make(map[uint64][]uint64)}
	for i, r := range reqs {
		for _, b := range r.HashIDs {
			f.uses[b] = append(f.uses[b], uint64(2*i+1))
		}
	}
	return f
}

// NextUse returns the match time of the first request after now that asks
// for the block whose TailHash is h.
func (f *Future) NextUse(h pagehash.Hash, now uint64) (uint64, bool) {
	b := uint64(h[0]) | uint64(h[1])<<8 | uint64(h[2])<<16 | uint64(h[3])<<24 | uint64(h[4])<<32 | uint64(h[5])<<40 | uint64(h[6])<<48 | uint64(h[7])<<56
	us := f.uses[b]
	i, _ := slices.BinarySearch(us, now+1)
	if i == len(us) {
		return 0, false
	}
	return us[i], true
}

// SharedTrace loads a trace from ../shared/traces (relative to the module
// root) for tests, skipping t when it is absent.
func SharedTrace(t testing.TB, name string) []workload.Request {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatalf("getwd: %v", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		up := filepath.Dir(dir)
		if up == dir {
			t.Skipf("module root not found above the working directory; skipping trace %s", name)
		}
		dir = up
	}
	path := filepath.Join(dir, "..", "shared", "traces", name)
	f, err := os.Open(path)
	if err != nil {
		t.Skipf("trace %s not available (%v); skipping", path, err)
	}
	defer f.Close()
	var reqs []workload.Request
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	for line := 1; sc.Scan(); line++ {
		var r workload.Request
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("%s:%d: %v", path, line, err)
		}
		reqs = append(reqs, r)
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return reqs
}
