package l2hugetlb

import (
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvtier/kvtier/tiers"
)

func TestPlanSizes(t *testing.T) {
	const mib = 1 << 20
	tests := []struct {
		size, maxSlab, page int64
		want                []int64
	}{
		{1, 480 << 30, 2 * mib, []int64{2 * mib}},
		{4 * mib, 480 << 30, 2 * mib, []int64{4 * mib}},
		{5 * mib, 480 << 30, 2 * mib, []int64{6 * mib}},
		{6 * mib, 2 * mib, 2 * mib, []int64{2 * mib, 2 * mib, 2 * mib}},
		{10 * mib, 4 * mib, 2 * mib, []int64{4 * mib, 4 * mib, 2 * mib}},
		{10 * mib, 5 * mib, 2 * mib, []int64{4 * mib, 4 * mib, 2 * mib}}, // max_slab rounds down to pages
		{7 * 4096, 3 * 4096, 4096, []int64{3 * 4096, 2 * 4096, 2 * 4096}},
		{1600 << 30, 480 << 30, 2 * mib, []int64{400 << 30, 400 << 30, 400 << 30, 400 << 30}},
	}
	for _, tt := range tests {
		got := planSizes(tt.size, tt.maxSlab, tt.page)
		if !slices.Equal(got, tt.want) {
			t.Errorf("planSizes(%d, %d, %d) = %v, want %v", tt.size, tt.maxSlab, tt.page, got, tt.want)
		}
		for _, s := range got {
			if s > max(tt.maxSlab/tt.page, 1)*tt.page || s%tt.page != 0 {
				t.Errorf("planSizes(%d, %d, %d): file of %d bytes breaks the cap or page alignment", tt.size, tt.maxSlab, tt.page, s)
			}
		}
	}
}

func TestCheckCapacityMessage(t *testing.T) {
	const mib = 1 << 20
	tests := []struct {
		name string
		info backingInfo
		need int64
		want []string // substrings; nil means it fits
	}{
		{"fits", backingInfo{kind: BackingHugetlbfs, pageSize: 2 * mib, freePages: 4}, 8 * mib, nil},
		{"pool short", backingInfo{kind: BackingHugetlbfs, pageSize: 2 * mib, freePages: 1, poolPages: 10}, 8 * mib,
			[]string{"need 8MiB (4 x 2MiB pages) on /mnt/huge but only 2MiB free", "echo 13 > /proc/sys/vm/nr_hugepages", "or reduce size"}},
		{"big", backingInfo{kind: BackingHugetlbfs, pageSize: 2 * mib, freePages: 512, poolPages: 512}, 2 << 30,
			[]string{"need 2GiB (1024 x 2MiB pages)", "only 1GiB free", "echo 1024 >"}},
		{"mount limit", backingInfo{kind: BackingHugetlbfs, pageSize: 2 * mib, freePages: 2, limited: true, poolPages: 2}, 6 * mib,
			[]string{"raise the mount's size= limit", "echo 3 >"}},
		{"shm", backingInfo{kind: BackingShm, pageSize: 4096, freePages: 256}, 2 * mib,
			[]string{"need 2MiB on /mnt/huge but only 1MiB free"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkCapacity("/mnt/huge", tt.info, tt.need)
			if tt.want == nil {
				if err != nil {
					t.Fatalf("checkCapacity: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrCapacity) {
				t.Fatalf("checkCapacity = %v, want ErrCapacity", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestStackTag(t *testing.T) {
	for _, tt := range []struct{ id, want string }{
		{"prod-a", "prod-a"},
		{"node7.stack_2", "node7.stack_2"},
		{"has/slash", "h"},
		{"", "h"},
		{strings.Repeat("x", 80), "h"},
	} {
		got := stackTag(tt.id)
		if tt.want == "h" {
			if len(got) != 17 || got[0] != 'h' || !nameRE.MatchString(got) {
				t.Errorf("stackTag(%q) = %q, want a hashed tag", tt.id, got)
			}
			continue
		}
		if got != tt.want {
			t.Errorf("stackTag(%q) = %q, want %q", tt.id, got, tt.want)
		}
	}
}

// FuzzCheckGeometry feeds Attach's geometry check arbitrary paths, sizes and
// page sizes: it must never panic, and what it accepts must be what Attach
// relies on (a NAME-<i>.slab path, a positive multiple of the page size).
func FuzzCheckGeometry(f *testing.F) {
	f.Add("/dev/hugepages/kvtier-l2-0.slab", int64(2<<20), int64(2<<20), uint32(0), "hugetlbfs", "stack")
	f.Add("/dev/shm/a-b-0.slab", int64(8192), int64(4096), uint32(0), "shm", "s")
	f.Add("-0.slab", int64(0), int64(-1), uint32(1), "heap", "")
	f.Add("/x/y-1.slab", int64(4096), int64(4096), uint32(0), "shm", "s")
	f.Fuzz(func(t *testing.T, path string, size, pageSize int64, id uint32, backing, stack string) {
		g := tiers.SlabGeometry{
			Slabs:    []tiers.SlabFile{{ID: tiers.SlabID(id), Path: path, Size: size}},
			PageSize: pageSize, Backing: backing, StackID: stack,
		}
		if err := checkGeometry(g); err != nil {
			return
		}
		m := slabFileRE.FindStringSubmatch(filepath.Base(path))
		if m == nil || m[2] != "0" || id != 0 || size <= 0 || pageSize <= 0 || size%pageSize != 0 || stack == "" {
			t.Fatalf("accepted a bad geometry: %+v", g)
		}
	})
}
