package consensus

import (
	"bytes"
	"encoding/hex"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestReduceEncodedMatchesPython: the Python client's reduce
// (clients/python/kvtier/group.py, what a Python engine all-reduces with)
// returns the bytes ReduceEncoded returns, for groups of 1 to 6 ranks,
// several shapes, with and without digests.
func TestReduceEncodedMatchesPython(t *testing.T) {
	const py = "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		t.Skipf("%s: %v (Debian's python3 and python3-numpy run the client)", py, err)
	}
	if err := exec.Command(py, "-c", "import numpy").Run(); err != nil {
		t.Skipf("%s has no numpy (python3-numpy): %v", py, err)
	}
	_, file, _, _ := runtime.Caller(0)
	clientDir := filepath.Join(filepath.Dir(file), "..", "..", "clients", "python")
	seed := uint64(20261204)
	rng := rand.New(rand.NewPCG(seed, 1))
	var in bytes.Buffer
	var want []string
	cases := 0
	for _, s := range []Shape{
		{Classes: 1},
		{Classes: 2, OKBits: 5, Reloads: 3},
		{Classes: 3, OKBits: 64, Reloads: 1},
		{Classes: 2, OKBits: 130, Reloads: 17, Digest: true, Structures: int(NumStructures)},
	} {
		for size := 1; size <= 6; size++ {
			var d Digest
			for i := range d {
				d[i] = byte(rng.Uint32())
			}
			tick := 1 + rng.Uint64N(1000)
			msgs := make([][]byte, size)
			for r := range size {
				c := RandomContribution(rng, tick, s, d)
				b, err := AppendContribution(nil, Envelope{Group: rng.Uint64() | 1, Stack: 9, Rank: r, Size: size}, c)
				if err != nil {
					t.Fatal(err)
				}
				msgs[r] = b
			}
			// One group id for all (the loop drew one per rank).
			for r := range msgs {
				copy(msgs[r][8:16], msgs[0][8:16])
			}
			rng.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
			f, err := ReduceEncoded(msgs)
			if err != nil {
				t.Fatalf("seed %d: %v", seed, err)
			}
			hs := make([]string, len(msgs))
			for i, m := range msgs {
				hs[i] = hex.EncodeToString(m)
			}
			in.WriteString(strings.Join(hs, " ") + "\n")
			want = append(want, hex.EncodeToString(f))
			cases++
		}
	}
	cmd := exec.Command(py, "-c", `
import sys
from kvtier.group import reduce_contributions
for line in sys.stdin:
    print(reduce_contributions([bytes.fromhex(h) for h in line.split()]).hex())
`)
	cmd.Dir = clientDir
	cmd.Env = append(os.Environ(), "PYTHONPATH="+clientDir)
	cmd.Stdin = &in
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python reduce: %v\n%s", err, out)
	}
	got := strings.Fields(string(out))
	if len(got) != len(want) {
		t.Fatalf("python printed %d frontiers for %d groups:\n%s", len(got), len(want), out)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("seed %d, group %d: python frontier\n%s\nGo\n%s", seed, i, got[i], want[i])
		}
	}
	t.Logf("%d groups: the Python reduce equals ReduceEncoded byte for byte", cases)
}
