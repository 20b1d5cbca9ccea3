package storeclient

import (
	"os"
	"path/filepath"
	"testing"

	pb "github.com/kvtier/kvtier/api/storev1"
)

// TestSlabSpans maps real files the way Register's reply names them and
// resolves spans, in range and out.
func TestSlabSpans(t *testing.T) {
	dir := t.TempDir()
	var files []*pb.SlabFile
	for i := range 2 {
		p := filepath.Join(dir, "slab"+string(rune('0'+i)))
		if err := os.WriteFile(p, make([]byte, 8192), 0o644); err != nil {
			t.Fatal(err)
		}
		files = append(files, &pb.SlabFile{Id: uint32(i), Path: p, Size: 8192})
	}
	maps, err := mapSlab(&pb.SlabGeometry{Files: files})
	if err != nil {
		t.Fatal(err)
	}
	defer unmap(maps)
	tests := []struct {
		name string
		sp   *pb.Span
		ok   bool
	}{
		{"whole", &pb.Span{Slab: 1, Offset: 0, Length: 8192}, true},
		{"tail", &pb.Span{Slab: 0, Offset: 4096, Length: 4096}, true},
		{"past end", &pb.Span{Slab: 0, Offset: 4096, Length: 4097}, false},
		{"offset past end", &pb.Span{Slab: 0, Offset: 9000, Length: 0}, false},
		{"wrap", &pb.Span{Slab: 0, Offset: 1, Length: ^uint64(0)}, false},
		{"no such slab", &pb.Span{Slab: 2, Offset: 0, Length: 1}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := span(maps, tc.sp)
			if (err == nil) != tc.ok {
				t.Fatalf("span %v: err %v", tc.sp, err)
			}
			if tc.ok && uint64(len(b)) != tc.sp.GetLength() {
				t.Fatalf("span %v: %d bytes", tc.sp, len(b))
			}
		})
	}
	// A write through one mapping is in the file (MAP_SHARED).
	b, _ := span(maps, &pb.Span{Slab: 1, Offset: 100, Length: 3})
	copy(b, "abc")
	got, _ := os.ReadFile(files[1].Path)
	if string(got[100:103]) != "abc" {
		t.Fatalf("slab file has %q at 100", got[100:103])
	}
}

func TestMapSlabBadGeometry(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "s")
	if err := os.WriteFile(p, make([]byte, 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		files []*pb.SlabFile
	}{
		{"wrong id", []*pb.SlabFile{{Id: 1, Path: p, Size: 4096}}},
		{"zero size", []*pb.SlabFile{{Id: 0, Path: p, Size: 0}}},
		{"missing file", []*pb.SlabFile{{Id: 0, Path: filepath.Join(dir, "nope"), Size: 4096}}},
		{"second bad", []*pb.SlabFile{{Id: 0, Path: p, Size: 4096}, {Id: 0, Path: p, Size: 4096}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if maps, err := mapSlab(&pb.SlabGeometry{Files: tc.files}); err == nil {
				unmap(maps)
				t.Fatal("mapped bad geometry")
			}
		})
	}
}
