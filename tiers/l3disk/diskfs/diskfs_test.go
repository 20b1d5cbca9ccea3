package diskfs

import (
	"bytes"
	"errors"
	"path/filepath"
	"testing"
	"unsafe"
)

func TestAlignedBuffer(t *testing.T) {
	for _, n := range []int{1, 4096, 4097, 3 << 20} {
		b, err := NewAlignedBuffer(n)
		if err != nil {
			t.Fatal(err)
		}
		if len(b.Bytes())%BlockSize != 0 || len(b.Bytes()) < n || uintptr(unsafe.Pointer(&b.Bytes()[0]))%BlockSize != 0 {
			t.Fatalf("buffer of %d: len %d, misaligned or short", n, len(b.Bytes()))
		}
		if err := b.Free(); err != nil || b.Free() != nil {
			t.Fatalf("free: %v", err)
		}
	}
	if _, err := NewAlignedBuffer(0); err == nil {
		t.Fatal("zero-size buffer accepted")
	}
}

func TestOSFileRoundTripAndLock(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	f, err := OS{}.OpenFile(p, OpenOptions{Create: true, Direct: true})
	if errors.Is(err, ErrDirectRefused) {
		f, err = OS{}.OpenFile(p, OpenOptions{Create: true})
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Lock(); err != nil {
		t.Fatalf("lock: %v", err)
	}
	buf, _ := NewAlignedBuffer(2 * BlockSize)
	defer buf.Free()
	for i := range buf.Bytes() {
		buf.Bytes()[i] = byte(i * 7)
	}
	if _, err := f.WriteAt(buf.Bytes(), BlockSize); err != nil {
		t.Fatal(err)
	}
	if err := f.Datasync(); err != nil {
		t.Fatal(err)
	}
	got, _ := NewAlignedBuffer(2 * BlockSize)
	defer got.Free()
	if _, err := f.ReadAt(got.Bytes(), BlockSize); err != nil || !bytes.Equal(got.Bytes(), buf.Bytes()) {
		t.Fatalf("read back: %v", err)
	}
	if _, err := f.ReadAt(got.Bytes(), 2*BlockSize); err == nil {
		t.Fatal("short read at end of file reported no error")
	}
	if sz, err := f.Size(); err != nil || sz != 3*BlockSize {
		t.Fatalf("size %d, %v", sz, err)
	}
	g, err := OS{}.OpenFile(p, OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := g.Lock(); !errors.Is(err, ErrLocked) {
		t.Fatalf("second lock: %v, want ErrLocked", err)
	}
	if err := (OS{}).SyncDir(dir); err != nil {
		t.Fatal(err)
	}
}
