package lmdb

import (
	"encoding/binary"
	"fmt"
	"os"

	mdb "github.com/PowerDNS/lmdb-go/lmdb"

	"github.com/kvtier/kvtier/indexes"
)

// LMDB is copy-on-write: a delete dirties a copy of every page on the path
// to each key it removes, and the pages it frees become reusable only after
// it commits. On a map filled to its last page every delete is therefore
// refused with MDB_MAP_FULL, and a cache whose index is full could never
// free room again. So puts stop short of the map's end: they are refused
// with indexes.ErrFull while the pages in use plus a bound on what the
// batch may dirty would reach into a reserve kept for deletes, DeleteIf and
// Touch, which may use it.
//
// The reserve is an eighth of the map, at least 16 and at most 2048 pages
// (8 MiB of 4 KiB pages): a delete batch dirties at most one leaf per key
// plus the branches above them and a few freelist pages, so a batch of
// about 1900 keys (the store deletes at most 1024 at once) always fits a
// full 1 GiB map, and single-key deletes fit the smallest map. Pages freed
// freed by the last commit are not yet reusable (LMDB keeps the snapshot
// they belong to while its other meta page names it), so back-to-back
// deletes need twice their own footprint; the reserve allows for it.

// reservePages returns the pages of a map of mapPages pages kept for
// deletes.
func reservePages(mapPages int64) int64 { return min(max(mapPages/8, 16), 2048) }

// entryBytes bounds the bytes one entry takes in a leaf: node header,
// key, record and its slot in the page's pointer array.
const entryBytes = 8 + indexes.KeySize + indexes.RecordSize + 2

// treeShape is what bounds the pages a write dirties: the entries' tree.
type treeShape struct{ depth, branches, leaves int64 }

// maxShape is the bound used before the tree is read: any tree of a map
// under 1<<44 bytes is shallower.
func maxShape(n int) treeShape {
	return treeShape{depth: 8, branches: int64(n) * 8, leaves: int64(n)}
}

// putPages bounds the pages a put of n entries may dirty: a copy of one
// leaf per entry (at most every leaf), of the branches above them (at most
// every branch), a new leaf and branch for each half page of new entries,
// and freelist records.
func putPages(n int, t treeShape, psize int64) int64 {
	splits := (int64(n)*entryBytes*2 + psize - 1) / psize
	return min(int64(n), t.leaves) + min(int64(n)*t.depth, t.branches) + splits*(1+t.depth) + 4
}

// room checks, before a put of n entries, that the batch cannot reach into
// the delete reserve. It reads the committed state (LMDB's meta page and
// freelist), so it is exact for this process and within a batch of other
// writer processes, whose own checks leave the same reserve. It costs one
// env info call unless the map's high-water mark is near the limit; then
// it also sums the freelist in one read transaction.
//
// Two conditions: the pages the batch may dirty fit what it can use now
// (the untouched end of the map and the free pages older than the last
// commit), and after it the next transaction still finds the reserve
// (then the last commit's frees are reusable too, the batch's own are not).
//
// A refusal only because the last commit's frees are not reusable yet is
// not final: room commits a settling transaction (settle) and looks
// again. Without it an index whose last commit was a delete batch could
// refuse every put from then on: a refused put commits nothing, so the
// frees would never become reusable (the L3 store's puts all failed from
// one point on in TestServeIndexFull, 1 run in 6).
func (ix *Index) room(n int) error {
	return ix.roomSettled(n, true)
}

func (ix *Index) roomSettled(n int, settle bool) error {
	info, err := ix.env.Info()
	if err != nil {
		return fmt.Errorf("lmdb index %s: put: env info: %w", ix.dir, err)
	}
	mapPages := info.MapSize / ix.psize
	limit := mapPages - reservePages(mapPages)
	highWater := info.LastPNO + 1
	need := putPages(n, maxShape(n), ix.psize)
	if highWater+need <= limit {
		return nil
	}
	free, shape, err := ix.freePages(info.LastTxnID)
	if err != nil {
		return err
	}
	need = putPages(n, shape, ix.psize)
	used := highWater - free.total
	if used+need <= limit && need <= mapPages-highWater+free.reusable {
		return nil
	}
	if settle && used+need <= limit && need <= mapPages-highWater+free.total && free.total > free.reusable {
		if err := ix.settle(); err != nil {
			return err
		}
		return ix.roomSettled(n, false)
	}
	return fmt.Errorf("lmdb index %s: put batch of %d needs up to %d pages; %d of the map's %d pages are in use and the last %d are kept for deletes (map_size_bytes %d); nothing of it was written: %w",
		ix.dir, n, need, used, mapPages, mapPages-limit, info.MapSize, indexes.ErrFull)
}

// freeCount is what LMDB's freelist holds: every page on it, and those the
// next write transaction may reuse.
type freeCount struct{ total, reusable int64 }

// freePages returns the pages on LMDB's freelist and the shape of the
// entries' tree. Pages freed by the last commit are not reusable yet: they
// belong to the snapshot before it, which LMDB keeps (its other meta page
// names it) until one more commit. Pages a long reader pins are counted as
// reusable; the reserve absorbs them.
func (ix *Index) freePages(lastTxn int64) (free freeCount, shape treeShape, err error) {
	err = ix.env.View(func(txn *mdb.Txn) error {
		txn.RawRead = true
		st, err := txn.Stat(ix.dbi)
		if err != nil {
			return err
		}
		shape = treeShape{depth: int64(st.Depth), branches: int64(st.BranchPages), leaves: int64(st.LeafPages)}
		// NB: the freelist is LMDB's database 0 (FREE_DBI); each value
		// is an ID list: a count followed by that many page numbers, all
		// of machine word size. Only read transactions may open it.
		cur, err := txn.OpenCursor(mdb.DBI(0))
		if err != nil {
			return err
		}
		defer cur.Close()
		for {
			k, v, err := cur.Get(nil, nil, mdb.Next)
			if mdb.IsNotFound(err) {
				return nil
			}
			if err != nil {
				return err
			}
			if len(v) < 8 {
				continue
			}
			pages := int64(len(v)/8 - 1)
			free.total += pages
			// NB: keys are the freeing transaction's id, a machine word.
			if len(k) != 8 || int64(binary.NativeEndian.Uint64(k)) < lastTxn {
				free.reusable += pages
			}
		}
	})
	if err != nil {
		return freeCount{}, treeShape{}, ix.wrapErr("put: read freelist", 0, err)
	}
	return free, shape, nil
}

// ReserveBytes returns the bytes of a map of mapSize bytes that puts leave
// for deletes, at the system's page size (LMDB's default page size).
func ReserveBytes(mapSize int64) int64 {
	ps := int64(os.Getpagesize())
	return reservePages(mapSize/ps) * ps
}

// settle commits a transaction that changes nothing an entry holds: it
// writes the first entry's value over itself, which copies the path to its
// leaf and so commits a new meta page. The frees of the commit before it
// become reusable. An empty index has nothing to settle (and no frees
// worth having).
func (ix *Index) settle() error {
	wrote := false
	err := ix.env.Update(func(txn *mdb.Txn) error {
		cur, err := txn.OpenCursor(ix.dbi)
		if err != nil {
			return err
		}
		defer cur.Close()
		k, v, err := cur.Get(nil, nil, mdb.First)
		if mdb.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		wrote = true
		return txn.Put(ix.dbi, k, v, 0)
	})
	if err != nil {
		return ix.wrapErr("put (settle)", 1, err)
	}
	if wrote {
		ix.settles.Add(1)
	}
	return nil
}
