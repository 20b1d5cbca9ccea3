package loadgen

import (
	"testing"

	pb "github.com/kvtier/kvtier/api/enginev1"
)

func TestCopyRunExtends(t *testing.T) {
	const pg = 16 << 10
	run := copyRun{kind: 1, page: 10, slab: 2, offset: 5 * pg, length: 2 * pg, items: 2}
	item := func(kind, page, slab uint32, offset uint64) *pb.CopyItem {
		return &pb.CopyItem{Kind: kind, L1Page: page, Slab: slab, Offset: offset, Length: pg}
	}
	for _, tc := range []struct {
		name string
		run  copyRun
		it   *pb.CopyItem
		want bool
	}{
		{"next page, next span", run, item(1, 12, 2, 7*pg), true},
		{"empty run", copyRun{}, item(1, 12, 2, 7*pg), false},
		{"other kind", run, item(0, 12, 2, 7*pg), false},
		{"L1 gap", run, item(1, 13, 2, 7*pg), false},
		{"L1 repeat", run, item(1, 11, 2, 7*pg), false},
		{"other slab file", run, item(1, 12, 3, 7*pg), false},
		{"slab gap", run, item(1, 12, 2, 8*pg), false},
		{"slab backwards", run, item(1, 12, 2, 4*pg), false},
	} {
		if got := tc.run.extends(tc.it); got != tc.want {
			t.Errorf("%s: extends = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestMemcpyLimit: the limit copies exactly the runs' bytes, a run longer
// than half its buffer in pieces, and wraps around its buffers.
func TestMemcpyLimit(t *testing.T) {
	l := newMemcpyLimit(64, 1<<20) // 1 MiB buffers: 4 pages of 256 KiB
	if len(l.src) != 4<<20 || len(l.dst) != 4<<20 {
		t.Fatalf("buffers of %d and %d bytes, want 4 MiB", len(l.src), len(l.dst))
	}
	for i := range l.src {
		l.src[i] = byte(i % 251)
	}
	runs := []int64{1 << 20, 3 << 20, 5 << 20, 7}
	total := int64(0)
	for _, n := range runs {
		total += n
	}
	for round := range 3 {
		l.copy(runs)
		if l.bytes != int64(round+1)*total || l.ns <= 0 {
			t.Fatalf("round %d: %d bytes in %d ns, want %d bytes", round, l.bytes, l.ns, int64(round+1)*total)
		}
		if l.at < 0 || l.at > len(l.dst) {
			t.Fatalf("round %d: cursor %d outside the %d-byte buffer", round, l.at, len(l.dst))
		}
	}
	var none memcpyLimit
	none.copy(runs) // no buffers (copies not run): nothing, no panic
	if none.bytes != 0 || none.ns != 0 {
		t.Fatalf("a limit without buffers counted %d bytes", none.bytes)
	}
}
