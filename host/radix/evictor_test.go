package radix

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kvtier/kvtier/policy"
)

// testLRU is a small, obviously correct least-recently-used evictor for
// the tree's tests (the real policies live in policy/ and are tested
// there): victim = evictable leaf with the lowest (last access, node id).
// Victim scans every evictable node, fine for tests. It can record the
// events it receives, for the scenario files.
type testLRU struct {
	nodes     map[policy.NodeID]policy.NodeInfo
	evictable map[policy.NodeID]bool
	log       []string
	record    bool
}

func newTestLRU() *testLRU {
	return &testLRU{nodes: map[policy.NodeID]policy.NodeInfo{}, evictable: map[policy.NodeID]bool{}}
}

func (l *testLRU) logf(format string, args ...any) {
	if l.record {
		l.log = append(l.log, fmt.Sprintf(format, args...))
	}
}

func infoString(n policy.NodeInfo) string {
	return fmt.Sprintf("id=%d parent=%d t=%d last=%d hits=%d depth=%d pages=%d kids=%d", n.ID, n.Parent, n.Time, n.LastAccess, n.Hits, n.Depth, n.Pages, n.Children)
}

func (l *testLRU) Name() string { return "test-lru" }

func (l *testLRU) Insert(n policy.NodeInfo) {
	if _, ok := l.nodes[n.ID]; ok {
		panic(fmt.Sprintf("test-lru: insert of known node %d", n.ID))
	}
	l.nodes[n.ID] = n
	l.logf("insert %s", infoString(n))
}

func (l *testLRU) Hit(n policy.NodeInfo) {
	l.mustKnow(n.ID, "hit")
	l.nodes[n.ID] = n
	l.logf("hit %s", infoString(n))
}

func (l *testLRU) Update(n policy.NodeInfo) {
	l.mustKnow(n.ID, "update")
	l.nodes[n.ID] = n
	l.logf("update %s", infoString(n))
}

func (l *testLRU) Remove(id policy.NodeID) {
	l.mustKnow(id, "remove")
	delete(l.nodes, id)
	delete(l.evictable, id)
	l.logf("remove id=%d", id)
}

func (l *testLRU) SetEvictable(id policy.NodeID, e bool) {
	l.mustKnow(id, "set-evictable")
	if l.evictable[id] == e {
		panic(fmt.Sprintf("test-lru: node %d already evictable=%t", id, e))
	}
	if e {
		l.evictable[id] = true
	} else {
		delete(l.evictable, id)
	}
	l.logf("evictable id=%d %t", id, e)
}

func (l *testLRU) mustKnow(id policy.NodeID, what string) {
	if _, ok := l.nodes[id]; !ok {
		panic(fmt.Sprintf("test-lru: %s of unknown node %d", what, id))
	}
}

func (l *testLRU) Victim() (policy.NodeID, bool) {
	var best policy.NodeInfo
	found := false
	for id := range l.evictable {
		n := l.nodes[id]
		if !found || n.LastAccess < best.LastAccess || (n.LastAccess == best.LastAccess && n.ID < best.ID) {
			best, found = n, true
		}
	}
	return best.ID, found
}

func (l *testLRU) Evictable() []policy.NodeID {
	out := make([]policy.NodeID, 0, len(l.evictable))
	for id := range l.evictable {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

func (l *testLRU) takeLog() string {
	s := strings.Join(l.log, "\n")
	l.log = l.log[:0]
	return s
}
