package radix

import (
	"crypto/sha256"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/policy"
)

// TestScenarios runs the data-driven scenario files in testdata
// (cockroachdb/datadriven): each block is a command, a "----" line and its
// expected output. Run with -rewrite to regenerate the expected output,
// then review the diff.
func TestScenarios(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scenario files in testdata (err %v)", err)
	}
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) {
			s := &scenario{names: map[pagehash.Hash]string{}}
			datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
				return s.run(d.FullCmd())
			})
		})
	}
}

// scenario is the state of one scenario file: a tree, its recording
// evictor, and the names of the page hashes it made up.
type scenario struct {
	tree  *Tree
	lru   *testLRU
	names map[pagehash.Hash]string
	path  []*Node
}

// nameHash returns the page hash a scenario calls name.
func (s *scenario) nameHash(name string) pagehash.Hash {
	h := pagehash.Hash(sha256.Sum256([]byte("scenario page " + name)))
	s.names[h] = name
	return h
}

func (s *scenario) run(cmd string) string {
	f := strings.Fields(cmd)
	var res string
	var err error
	if f[0] != "new" && s.tree == nil {
		return "error: no tree (start with new)"
	}
	switch f[0] {
	case "new":
		opts := Options{PageTokens: 2, Tiers: 3, Residency: L1}
		for _, a := range f[1:] {
			k, v, _ := strings.Cut(a, "=")
			n, _ := strconv.Atoi(v)
			switch k {
			case "page_tokens":
				opts.PageTokens = n
			case "tiers":
				opts.Tiers = n
			case "residency":
				opts.Residency = Residency(n)
			}
		}
		s.lru = newTestLRU()
		s.lru.record = true
		var ev policy.Evictor = s.lru
		if slices.Contains(f[1:], "tail-ranked") {
			ev = tailRankedLRU{s.lru}
		}
		s.tree, err = New(opts, ev)
		if err == nil {
			res = "options: " + opts.String()
		}
	case "insert":
		last, added := s.tree.InsertHashes(s.hashes(f[1:]))
		res = fmt.Sprintf("last=%d added=%d", last.ID(), added)
	case "extend":
		var last *Node
		var added int
		last, added, err = s.tree.ExtendBorrowed(s.node(f[:2]), s.hashes(f[2:]))
		if err == nil {
			res = fmt.Sprintf("last=%d added=%d", last.ID(), added)
		}
	case "insert-tokens":
		last, added := s.tree.InsertTokens(tokensOf(f[1:]))
		res = fmt.Sprintf("last=%d added=%d", last.ID(), added)
	case "match":
		var pages int
		s.path, pages = s.tree.MatchHashes(s.hashes(f[1:]), s.path)
		res = fmt.Sprintf("pages=%d path=%s", pages, pathString(s.path))
	case "match-tokens":
		var pages int
		s.path, pages = s.tree.MatchTokens(tokensOf(f[1:]), s.path)
		res = fmt.Sprintf("pages=%d path=%s", pages, pathString(s.path))
	case "lock", "unlock", "prune", "backup", "residency":
		n := s.node(f)
		switch f[0] {
		case "lock":
			err = s.tree.Lock(n)
		case "unlock":
			err = s.tree.Unlock(n)
		case "prune":
			var pages int
			pages, err = s.tree.Prune(n)
			res = fmt.Sprintf("pruned %d pages", pages)
		case "backup":
			err = s.tree.SetBackupPending(n, len(f) > 2 && f[2] == "on")
		case "residency":
			var r Residency
			if len(f) > 2 {
				for _, tier := range strings.Split(f[2], "+") {
					k, _ := strconv.Atoi(strings.TrimPrefix(tier, "L"))
					r |= 1 << (k - 1)
				}
			}
			err = s.tree.SetResidency(n, r)
		}
	case "evict":
		need, _ := strconv.Atoi(f[1])
		var victims []Victim
		var freed int
		victims, freed, err = s.tree.EvictPages(need, nil)
		var b strings.Builder
		fmt.Fprintf(&b, "freed=%d", freed)
		for _, v := range victims {
			kind := "trim"
			if v.Whole {
				kind = "whole"
			}
			fmt.Fprintf(&b, "\nvictim id=%d pages=%d %s [%s]", v.ID, v.Pages, kind, s.pageNames(v.Hashes, nil, 0))
		}
		res = b.String()
	case "digest":
		d := s.tree.Digest()
		res = fmt.Sprintf("digest=%x", d[:8])
	case "tree":
	default:
		return "error: unknown command " + f[0]
	}
	var b strings.Builder
	if err != nil {
		fmt.Fprintf(&b, "error: %v\n", err)
	} else if res != "" {
		b.WriteString(res + "\n")
	}
	if ev := s.lru.takeLog(); ev != "" {
		b.WriteString("events:\n")
		for _, l := range strings.Split(ev, "\n") {
			b.WriteString("  " + l + "\n")
		}
	}
	if cerr := s.tree.Check(); cerr != nil {
		fmt.Fprintf(&b, "CHECK FAILED: %v\n", cerr)
	}
	b.WriteString(s.dump())
	return strings.TrimRight(b.String(), "\n")
}

func (s *scenario) hashes(names []string) []pagehash.Hash {
	hs := make([]pagehash.Hash, len(names))
	for i, n := range names {
		hs[i] = s.nameHash(n)
	}
	return hs
}

func tokensOf(f []string) []uint32 {
	out := make([]uint32, len(f))
	for i, s := range f {
		v, _ := strconv.ParseUint(s, 10, 32)
		out[i] = uint32(v)
	}
	return out
}

func (s *scenario) node(f []string) *Node {
	if len(f) < 2 {
		return nil
	}
	id, _ := strconv.ParseUint(f[1], 10, 64)
	if id == 0 {
		return s.tree.Root()
	}
	return s.tree.Node(policy.NodeID(id))
}

func pathString(path []*Node) string {
	parts := make([]string, len(path))
	for i, n := range path {
		parts[i] = fmt.Sprintf("%d:%s", n.ID(), n.Residency())
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// pageNames prints pages by scenario name, or as dot-joined tokens.
func (s *scenario) pageNames(hs []pagehash.Hash, tokens []uint32, pt int) string {
	parts := make([]string, len(hs))
	for i, h := range hs {
		switch {
		case tokens != nil:
			ts := make([]string, pt)
			for j := range pt {
				ts[j] = strconv.FormatUint(uint64(tokens[i*pt+j]), 10)
			}
			parts[i] = strings.Join(ts, ".")
		case s.names[h] != "":
			parts[i] = s.names[h]
		default:
			parts[i] = h.Short()
		}
	}
	return strings.Join(parts, " ")
}

func (s *scenario) dump() string {
	t := s.tree
	var b strings.Builder
	fmt.Fprintf(&b, "tree: clock=%d pages=%d nodes=%d L1=%d L2=%d L3=%d\n", t.Clock(), t.Pages(), t.Nodes(), t.TierPages(1), t.TierPages(2), t.TierPages(3))
	var walk func(n *Node, indent string)
	walk = func(n *Node, indent string) {
		for _, c := range n.sortedChildren() {
			flags := ""
			if c.evictable {
				flags += " evictable"
			}
			if c.backupPending {
				flags += " backup-pending"
			}
			fmt.Fprintf(&b, "%s[%d] %s  hits=%d last=%d locks=%d res=%s%s\n", indent, c.id,
				s.pageNames(c.hashes, c.tokens, t.opts.PageTokens), c.hits, c.lastAccess, c.lockRefs, c.residency, flags)
			walk(c, indent+"  ")
		}
	}
	walk(t.root, "  ")
	return b.String()
}

// tailRankedLRU is the test LRU declaring radix.TailRanker, so EvictPages
// frees its victims page by page.
type tailRankedLRU struct{ *testLRU }

func (tailRankedLRU) TailRanked() bool { return true }
