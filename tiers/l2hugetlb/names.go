// Slab file names and sizes: NAME-<i>.slab files beside one
// NAME.stack-TAG.lock per stack, and how a size splits into files. Creator,
// joiners and attachers derive the same paths and sizes from the same
// config, which is how they find each other without talking.

package l2hugetlb

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// slabFileRE matches slab file names: NAME-<i>.slab.
var slabFileRE = regexp.MustCompile(`^(.+)-([0-9]+)\.slab$`)

func slabPath(dir, name string, i int) string {
	return filepath.Join(dir, fmt.Sprintf("%s-%d.slab", name, i))
}

// stackTag turns a stack id into a file-name-safe tag: the id itself when it
// is safe, else "h" and the first 16 hex digits of its SHA-256.
func stackTag(stackID string) string {
	if nameRE.MatchString(stackID) {
		return stackID
	}
	sum := sha256.Sum256([]byte(stackID))
	return "h" + hex.EncodeToString(sum[:8])
}

func lockPath(dir, name, stackID string) string {
	return filepath.Join(dir, name+".stack-"+stackTag(stackID)+".lock")
}

// lockOwner returns the stack tag of a lock file path.
func lockOwner(path string) string {
	b := filepath.Base(path)
	_, tag, _ := strings.Cut(b, ".stack-")
	return strings.TrimSuffix(tag, ".lock")
}

// existingSlabs lists NAME-<i>.slab files in dir by index.
func existingSlabs(dir, name string) (map[int]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", dir, err)
	}
	out := map[int]string{}
	for _, e := range entries {
		m := slabFileRE.FindStringSubmatch(e.Name())
		if m == nil || m[1] != name {
			continue
		}
		i, err := strconv.Atoi(m[2])
		if err != nil {
			continue
		}
		out[i] = filepath.Join(dir, e.Name())
	}
	return out, nil
}

// otherLocks lists the lock files of name in dir other than own.
func otherLocks(dir, name, own string) ([]string, error) {
	locks, err := filepath.Glob(filepath.Join(dir, name+".stack-*.lock"))
	if err != nil {
		return nil, fmt.Errorf("list locks in %s: %w", dir, err)
	}
	return slices.DeleteFunc(locks, func(p string) bool { return p == own }), nil
}

// planSizes splits size bytes, rounded up to whole pages, into files of at
// most maxSlab bytes (rounded down to whole pages), as evenly as whole pages
// allow; earlier files get the extra pages.
func planSizes(size, maxSlab, pageSize int64) []int64 {
	pages := (size + pageSize - 1) / pageSize
	perFile := max(1, maxSlab/pageSize)
	n := (pages + perFile - 1) / perFile
	out := make([]int64, n)
	for i := range out {
		p := pages / n
		if int64(i) < pages%n {
			p++
		}
		out[i] = p * pageSize
	}
	return out
}

func sum(xs []int64) int64 {
	var s int64
	for _, x := range xs {
		s += x
	}
	return s
}
