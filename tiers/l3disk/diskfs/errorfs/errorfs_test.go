package errorfs

import (
	"bytes"
	"errors"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/tiers/l3disk/diskfs"
)

func openFile(t *testing.T, fs *FS) diskfs.File {
	t.Helper()
	f, err := fs.OpenFile(filepath.Join(t.TempDir(), "f"), diskfs.OpenOptions{Create: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func TestRuleSkipCount(t *testing.T) {
	r := NewRule(OpWrite, Fault{Kind: Fail, Err: unix.ENOSPC}, 1)
	r.Skip, r.Count = 2, 2
	fs := Wrap(diskfs.OS{}, r)
	f := openFile(t, fs)
	var got []bool
	for range 6 {
		_, err := f.WriteAt([]byte("x"), 0)
		if err != nil && !errors.Is(err, unix.ENOSPC) {
			t.Fatalf("error %v does not wrap ENOSPC", err)
		}
		got = append(got, err != nil)
	}
	want := []bool{false, false, true, true, false, false}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("faults %v, want %v", got, want)
		}
	}
	if r.Fired() != 2 {
		t.Fatalf("fired %d", r.Fired())
	}
}

func TestRuleProbabilitySeeded(t *testing.T) {
	run := func() []bool {
		r := NewRule(OpRead, Fault{Kind: Fail}, 42)
		r.Probability = 0.5
		var out []bool
		for range 64 {
			out = append(out, r.Inject(Event{Op: OpRead}) != nil)
		}
		return out
	}
	a, b := run(), run()
	hits := 0
	for i := range a {
		if a[i] != b[i] {
			t.Fatal("same seed, different faults")
		}
		if a[i] {
			hits++
		}
	}
	if hits == 0 || hits == 64 {
		t.Fatalf("probability 0.5 fired %d of 64", hits)
	}
}

func TestTornShortFlip(t *testing.T) {
	data := make([]byte, 3*diskfs.BlockSize)
	for i := range data {
		data[i] = 0xAB
	}
	for _, tc := range []struct {
		name    string
		fault   Fault
		wantErr bool
		wantN   int // bytes that reach the file
	}{
		{"torn", Fault{Kind: TornWrite, Keep: diskfs.BlockSize + 100}, false, diskfs.BlockSize},
		{"short", Fault{Kind: ShortWrite, Keep: 5000}, true, 5000},
		{"flip", Fault{Kind: FlipBit, At: 10, Bit: 0}, false, len(data)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := Wrap(diskfs.OS{}, nil)
			f := openFile(t, fs)
			zero := make([]byte, len(data))
			if _, err := f.WriteAt(zero, 0); err != nil {
				t.Fatal(err)
			}
			r := NewRule(OpWrite, tc.fault, 1)
			r.Count = 1
			fs.SetInjector(r)
			n, err := f.WriteAt(data, 0)
			if (err != nil) != tc.wantErr {
				t.Fatalf("write: n=%d err=%v", n, err)
			}
			fs.SetInjector(nil)
			got := make([]byte, len(data))
			if _, err := f.ReadAt(got, 0); err != nil {
				t.Fatal(err)
			}
			want := bytes.Clone(zero)
			copy(want, data[:tc.wantN])
			if tc.fault.Kind == FlipBit {
				want[10] ^= 1
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("file content differs from expected")
			}
			if data[10] != 0xAB {
				t.Fatal("the caller's buffer was modified")
			}
		})
	}
}

func TestSyncAndReadFaults(t *testing.T) {
	fs := Wrap(diskfs.OS{}, Rules{
		NewRule(OpSync, Fault{Kind: Fail, Err: unix.EIO}, 1),
		NewRule(OpRead, Fault{Kind: FlipBit, At: 0, Bit: 7}, 1),
	})
	f := openFile(t, fs)
	if _, err := f.WriteAt([]byte{1, 2}, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Datasync(); !errors.Is(err, unix.EIO) {
		t.Fatalf("sync: %v, want EIO", err)
	}
	b := make([]byte, 2)
	if _, err := f.ReadAt(b, 0); err != nil || b[0] != 1^0x80 {
		t.Fatalf("flipped read %v, %v", b, err)
	}
	if _, err := fs.OpenFile(filepath.Join(t.TempDir(), "g"), diskfs.OpenOptions{Create: true}); err != nil {
		t.Fatal(err)
	}
}
