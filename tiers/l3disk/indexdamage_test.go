package l3disk

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/kvtier/kvtier/indexes/indextest"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/tiertest"
)

// Environment of an index-damage victim.
const (
	ixDamageEnvDir = "KVTIER_L3_IXDAMAGE_DIR"
	ixDamageEnvIx  = "KVTIER_L3_IXDAMAGE_INDEX"
)

// ixDamagePages is how many pages of each kind the pristine store holds.
const ixDamagePages = 60

// indexFiles are the files of each index that damage targets (repeats
// weight the choice).
var indexFiles = map[string][]string{
	"lmdb":   {"data.mdb", "data.mdb", "data.mdb", "lock.mdb"},
	"badger": {"*.sst", "*.sst", "*.vlog", "MANIFEST", "KEYREGISTRY"},
}

// TestIndexDamageLoad damages the store's index files (truncation, zeroed
// blocks, bit flips) and re-executes the test binary as a victim that
// opens the index and the store with cold start load: it must exit
// normally, and every page (all slots are intact) must read back
// byte-exact. 8 cases per index by default, 200 with KVTIER_SOAK=1.
func TestIndexDamageLoad(t *testing.T) {
	cases := 8
	if soak() {
		cases = 200
	}
	// KVTIER_SOAK_CASES sets the count (the 2x1300-case soaks of the LMDB
	// damage checks: KVTIER_SOAK_CASES=1300).
	if n, err := strconv.Atoi(os.Getenv("KVTIER_SOAK_CASES")); err == nil && n > 0 {
		cases = n
	}
	for _, ixo := range testIndexes() {
		t.Run(ixo.name, func(t *testing.T) {
			r := newRig(t, ixo, 128)
			pristine := filepath.Dir(r.dir)
			r.open(tiers.ColdStartClear)
			pages := append(makePages(41, ixDamagePages, 0, r.geom), makePages(42, ixDamagePages, 1, r.geom)...)
			r.putAll(pages)
			r.close()
			outcomes := map[string]int{}
			for c := range cases {
				seed := uint64(c) + 1
				rng := rand.New(rand.NewPCG(seed, 0x6c33))
				base := t.TempDir()
				for _, d := range []string{"disk0", "index"} {
					if err := indextest.CopyDir(filepath.Join(pristine, d), filepath.Join(base, d)); err != nil {
						t.Fatal(err)
					}
				}
				var files []string
				for _, pat := range indexFiles[ixo.name] {
					m, _ := filepath.Glob(filepath.Join(base, "index", pat))
					files = append(files, m...)
				}
				file := files[rng.IntN(len(files))]
				what, err := indextest.DamageFile(file, rng)
				if err != nil {
					t.Fatal(err)
				}
				cmd := exec.Command(os.Args[0], "-test.run=^TestIndexDamageChild$", "-test.v", "-test.count=1")
				cmd.Env = append(os.Environ(), ixDamageEnvDir+"="+base, ixDamageEnvIx+"="+ixo.name)
				out, err := cmd.CombinedOutput()
				if err != nil || !bytes.Contains(out, []byte("--- PASS: TestIndexDamageChild")) {
					t.Fatalf("case %d (seed %d): %s %s: victim failed: %v\n%s", c, seed, filepath.Base(file), what, err, headTail(out, 4000))
				}
				o := "?"
				if i := bytes.Index(out, []byte("outcome: ")); i >= 0 {
					o = string(bytes.SplitN(out[i+len("outcome: "):], []byte("\n"), 2)[0])
				}
				outcomes[o]++
			}
			t.Logf("%d index damage cases, 0 crashes, every page back byte-exact; outcomes: %v", cases, outcomes)
		})
	}
}

// TestIndexDamageChild is TestIndexDamageLoad's victim.
func TestIndexDamageChild(t *testing.T) {
	base := os.Getenv(ixDamageEnvDir)
	if base == "" {
		t.Skip("victim of the index damage test; runs only re-executed by it")
	}
	ixo := indexByName(t, os.Getenv(ixDamageEnvIx))
	r := &rig{t: t, dir: filepath.Join(base, "disk0"), ixDir: filepath.Join(base, "index"), ixOpen: ixo, geom: testGeometry, fs: osFS(), slabCap: 256}
	r.cfg = testConfig(r.dir, 128)
	r.slab = tiertest.NewHeapSlab(r.slabCap * r.pageSlot())
	st := r.open(tiers.ColdStartLoad)
	pages := append(makePages(41, ixDamagePages, 0, r.geom), makePages(42, ixDamagePages, 1, r.geom)...)
	if hits := countHits(r.get(pages, 0)); hits != len(pages) {
		t.Fatalf("%d of %d pages back after index damage (rebuilt: %+v, load: %+v)", hits, len(pages), st.Rebuilt(), st.LoadCounts())
	}
	r.checkConsistent()
	outcome := "loaded as it was"
	if rb := st.Rebuilt(); rb.Kept > 0 {
		outcome = "rebuilt from the slabs"
	}
	fmt.Printf("outcome: %s\n", outcome)
}

// headTail returns out, or its first and last n bytes when it is longer
// (a crash's signal and first frames are at the head, the test's verdict
// at the tail).
func headTail(out []byte, n int) []byte {
	if len(out) <= 2*n {
		return out
	}
	return slices.Concat(out[:n], []byte("\n[...]\n"), out[len(out)-n:])
}
