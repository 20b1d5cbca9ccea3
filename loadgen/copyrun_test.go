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
