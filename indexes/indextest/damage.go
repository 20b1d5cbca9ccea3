package indextest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/pagehash"
)

// Environment of a damage victim (the test binary re-executed).
const (
	damageEnvDir  = "KVTIER_INDEX_DAMAGE_DIR"
	damageEnvSeed = "KVTIER_INDEX_DAMAGE_SEED"
	damageEnvN    = "KVTIER_INDEX_DAMAGE_N"
)

// DamageOptions configures Damage.
type DamageOptions struct {
	// Open opens (creating if needed) the index kept in dir; it must not
	// call t.Fatal on an error, only return it.
	Open func(ctx context.Context, dir string) (indexes.Index, error)
	// Files are glob patterns, relative to the index directory, of the
	// files to damage (e.g. "data.mdb", "*.sst", "MANIFEST").
	Files []string
	// Cases is the number of damage cases (each one subprocess).
	Cases int
	// Entries is how many entries the pristine index holds (default 3000).
	Entries int
	// ChildTest is the name of the test function that calls DamageChild
	// (it is re-run in a subprocess as the victim).
	ChildTest string
}

// damageEntries returns the pristine index's entries for seed.
func damageEntries(seed uint64, n int) []indexes.Entry {
	rng := rand.New(rand.NewPCG(seed, 0x64616d61))
	out := make([]indexes.Entry, n)
	for i := range out {
		var h pagehash.Hash
		for j := 0; j < len(h); j += 8 {
			binary.LittleEndian.PutUint64(h[j:], rng.Uint64())
		}
		out[i] = indexes.Entry{Key: indexes.Key{Hash: h, Kind: uint8(i % 3)},
			Record: indexes.Record{Disk: uint16(i % 2), Kind: uint8(i % 3), Slot: uint64(i), Epoch: 1<<16 | 7, LastAccess: uint64(i * 3)}}
	}
	return out
}

// Damage builds an index, then for each case copies it, damages one of
// its files (truncation, zeroed 4 KiB blocks, bit flips, in data and meta
// regions) and re-executes the test binary as a victim that opens, reads
// and writes the damaged copy. It fails if a victim dies of a signal, a
// panic or an abort, or returns a wrong record; refusals and set-aside
// opens are fine. It logs the outcome counts.
func Damage(t *testing.T, opts DamageOptions) {
	t.Helper()
	if opts.Entries == 0 {
		opts.Entries = 3000
	}
	ctx := context.Background()
	pristine := filepath.Join(t.TempDir(), "pristine")
	ix, err := opts.Open(ctx, pristine)
	if err != nil {
		t.Fatalf("open pristine index: %v", err)
	}
	entries := damageEntries(Seed, opts.Entries)
	for len(entries) > 0 {
		part := entries[:min(500, len(entries))]
		entries = entries[len(part):]
		if err := ix.Put(ctx, part); err != nil {
			t.Fatalf("put: %v", err)
		}
	}
	// A few deletes leave freed pages and tombstones behind.
	del := damageEntries(Seed, opts.Entries)[:opts.Entries/10]
	keys := make([]indexes.Key, len(del))
	for i, e := range del {
		keys[i] = e.Key
	}
	if err := ix.Delete(ctx, keys); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if err := ix.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	var files []string
	for _, pat := range opts.Files {
		m, _ := filepath.Glob(filepath.Join(pristine, pat))
		for _, p := range m {
			if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Size() > 0 {
				files = append(files, filepath.Base(p))
			}
		}
	}
	if len(files) == 0 {
		t.Fatalf("no files matching %q in %s", opts.Files, pristine)
	}
	outcomes := map[string]int{}
	for c := range opts.Cases {
		seed := Seed + uint64(c)
		rng := rand.New(rand.NewPCG(seed, 0x76696374))
		dir := filepath.Join(t.TempDir(), "case")
		if err := CopyDir(pristine, dir); err != nil {
			t.Fatal(err)
		}
		file := files[rng.IntN(len(files))]
		what, err := DamageFile(filepath.Join(dir, file), rng)
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(os.Args[0], "-test.run=^"+opts.ChildTest+"$", "-test.v")
		cmd.Env = append(os.Environ(), damageEnvDir+"="+dir, damageEnvSeed+"="+strconv.FormatUint(Seed, 10), damageEnvN+"="+strconv.Itoa(opts.Entries))
		out, err := cmd.CombinedOutput()
		if err != nil || !bytes.Contains(out, []byte("--- PASS: "+opts.ChildTest)) {
			t.Fatalf("case %d (seed %d): %s %s: victim did not exit normally: %v\n%s", c, seed, file, what, err, tail(out))
		}
		o := "?"
		if i := bytes.Index(out, []byte("outcome: ")); i >= 0 {
			line := out[i+len("outcome: "):]
			if j := bytes.IndexByte(line, '\n'); j >= 0 {
				line = line[:j]
			}
			o = string(line)
		}
		outcomes[o]++
		if testing.Verbose() {
			t.Logf("case %d: %s %s: %s", c, file, what, o)
		}
	}
	names := make([]string, 0, len(outcomes))
	for o := range outcomes {
		names = append(names, o)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, o := range names {
		fmt.Fprintf(&b, "\n  %4d  %s", outcomes[o], o)
	}
	t.Logf("%d damage cases over %v, 0 crashes, 0 wrong records; outcomes:%s", opts.Cases, files, b.String())
}

func tail(b []byte) []byte {
	if len(b) > 4000 {
		return b[len(b)-4000:]
	}
	return b
}

// DamageFile applies one random damage to path (truncation, zeroed 4 KiB
// blocks or bit flips, biased toward the head of the file) and says what
// it did.
func DamageFile(path string, rng *rand.Rand) (string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	size := st.Size()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return "", err
	}
	defer f.Close()
	// Bias offsets toward the head of the file: meta pages, manifests'
	// and tables' headers live there.
	off := func() int64 {
		if rng.IntN(3) == 0 {
			return rng.Int64N(min(size, 8192))
		}
		return rng.Int64N(size)
	}
	switch rng.IntN(3) {
	case 0:
		n := rng.Int64N(size)
		return fmt.Sprintf("truncated from %d to %d bytes", size, n), f.Truncate(n)
	case 1:
		blocks := (size + 4095) / 4096
		k := 1 + rng.IntN(3)
		var at []int64
		for range k {
			b := rng.Int64N(blocks)
			at = append(at, b)
			n := min(int64(4096), size-b*4096)
			if _, err := f.WriteAt(make([]byte, n), b*4096); err != nil {
				return "", err
			}
		}
		return fmt.Sprintf("zeroed 4 KiB blocks %v", at), nil
	default:
		k := 1 + rng.IntN(16)
		var at []int64
		for range k {
			o := off()
			at = append(at, o)
			b := []byte{0}
			if _, err := f.ReadAt(b, o); err != nil {
				return "", err
			}
			b[0] ^= 1 << rng.IntN(8)
			if _, err := f.WriteAt(b, o); err != nil {
				return "", err
			}
		}
		return fmt.Sprintf("flipped %d bits at %v", k, at), nil
	}
}

// CopyDir copies the regular files of src into dst (created).
func CopyDir(src, dst string) error {
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	ents, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		in, err := os.Open(filepath.Join(src, e.Name()))
		if err != nil {
			return err
		}
		out, err := os.Create(filepath.Join(dst, e.Name()))
		if err != nil {
			in.Close()
			return err
		}
		_, err = io.Copy(out, in)
		in.Close()
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// DamageChild is the victim side of Damage: it does nothing unless the
// test binary was re-executed by Damage. It opens the damaged index, reads
// every pristine key, iterates, writes and reads back, and prints one
// "outcome:" line; a wrong record fails it.
func DamageChild(t *testing.T, open func(ctx context.Context, dir string) (indexes.Index, error)) {
	dir := os.Getenv(damageEnvDir)
	if dir == "" {
		t.Skip("victim of the index damage test; runs only re-executed by it")
	}
	seed, _ := strconv.ParseUint(os.Getenv(damageEnvSeed), 10, 64)
	n, _ := strconv.Atoi(os.Getenv(damageEnvN))
	ctx := context.Background()
	ix, err := open(ctx, dir)
	if err != nil {
		if !errors.Is(err, indexes.ErrCorrupt) {
			fmt.Printf("outcome: refused (not ErrCorrupt): %.80s\n", err)
			return
		}
		fmt.Printf("outcome: refused: ErrCorrupt\n")
		return
	}
	defer func() {
		if err := ix.Close(); err != nil {
			t.Logf("close: %v", err)
		}
	}()
	outcome := "opened"
	if r, ok := ix.(indexes.Recoverer); ok && r.OpenDamage() != nil {
		outcome = "set aside at open, started empty"
	}
	want := damageEntries(seed, n)
	wantBy := make(map[indexes.Key]indexes.Record, len(want))
	keys := make([]indexes.Key, len(want))
	for i, e := range want {
		keys[i] = e.Key
		wantBy[e.Key] = e.Record
	}
	recs, found := make([]indexes.Record, len(keys)), make([]bool, len(keys))
	getErr := ix.Get(ctx, keys, recs, found)
	hits := 0
	for i := range keys {
		if found[i] {
			hits++
			if recs[i] != want[i].Record {
				t.Fatalf("WRONG RECORD for %s: %+v, want %+v", keys[i], recs[i], want[i].Record)
			}
		}
	}
	iterated := 0
	iterErr := ix.Iterate(ctx, func(e indexes.Entry) error {
		if w, ok := wantBy[e.Key]; ok && w != e.Record {
			t.Fatalf("WRONG RECORD from Iterate for %s: %+v, want %+v", e.Key, e.Record, w)
		}
		iterated++
		return nil
	})
	corrupt := errors.Is(getErr, indexes.ErrCorrupt) || errors.Is(iterErr, indexes.ErrCorrupt)
	switch {
	case corrupt:
		outcome += ", reads report ErrCorrupt"
		if r, ok := ix.(indexes.Resetter); ok {
			if err := r.Reset(ctx); err != nil {
				fmt.Printf("outcome: %s, reset failed: %.80s\n", outcome, err)
				return
			}
			outcome += ", reset"
		}
	case getErr != nil || iterErr != nil:
		outcome += fmt.Sprintf(", read error: %.60v", errors.Join(getErr, iterErr))
	case hits < n-n/10:
		outcome += ", some entries lost"
	default:
		outcome += ", all entries intact"
	}
	e := indexes.Entry{Key: indexes.Key{Kind: 9}, Record: indexes.Record{Disk: 1, Kind: 9, Slot: 42, Epoch: 3 << 16}}
	if err := ix.Put(ctx, []indexes.Entry{e}); err != nil {
		fmt.Printf("outcome: %s, write refused: %v\n", outcome, errors.Is(err, indexes.ErrCorrupt))
		return
	}
	r, f := make([]indexes.Record, 1), make([]bool, 1)
	if err := ix.Get(ctx, []indexes.Key{e.Key}, r, f); err != nil || !f[0] || r[0] != e.Record {
		fmt.Printf("outcome: %s, read-back after write failed\n", outcome)
		return
	}
	fmt.Printf("outcome: %s, writable\n", outcome)
}
