package lmdb

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/kvtier/kvtier/indexes"
)

// The on-disk layout of LMDB 0.9 (mdb.c) on a 64-bit little-endian host,
// as far as VerifyFile needs it.
const (
	mdbMagic       = 0xBEEFC0DE
	mdbDataVersion = 1
	pageHdrSize    = 16 // mp_pgno 8, mp_pad 2, mp_flags 2, lower 2, upper 2
	nodeHdrSize    = 8  // mn_lo 2, mn_hi 2, mn_flags 2, mn_ksize 2
	dbRecordSize   = 48 // MDB_db
	maxKeySize     = 511
	maxTreeDepth   = 64
	invalidPgno    = ^uint64(0)

	pBranch   = 0x01
	pLeaf     = 0x02
	pOverflow = 0x04
	pMeta     = 0x08

	fBigData = 0x01
	fSubData = 0x02
	fDupData = 0x04

	// meta offsets within page 0 and 1 (after the page header).
	metaMagic   = pageHdrSize + 0
	metaVersion = pageHdrSize + 4
	metaDBs     = pageHdrSize + 24 // after magic, version, address, mapsize
	metaLastPg  = metaDBs + 2*dbRecordSize
	metaTxnID   = metaLastPg + 8
)

// mdbDB is an MDB_db record: one B+tree's root and counters.
type mdbDB struct {
	pad, flags, depth               uint32
	branch, leaf, overflow, entries uint64
	root                            uint64
}

func decodeDB(b []byte) mdbDB {
	return mdbDB{
		pad:      binary.LittleEndian.Uint32(b[0:]),
		flags:    uint32(binary.LittleEndian.Uint16(b[4:])),
		depth:    uint32(binary.LittleEndian.Uint16(b[6:])),
		branch:   binary.LittleEndian.Uint64(b[8:]),
		leaf:     binary.LittleEndian.Uint64(b[16:]),
		overflow: binary.LittleEndian.Uint64(b[24:]),
		entries:  binary.LittleEndian.Uint64(b[32:]),
		root:     binary.LittleEndian.Uint64(b[40:]),
	}
}

// VerifyFile checks an LMDB data file (data.mdb) against its own meta
// pages without mapping it: magic, version and page size of both metas,
// then, from the meta LMDB would use, every page of the free, main and
// named trees: each lies inside the file and below the last page, carries
// its own number and the type its depth calls for, has bounds and nodes
// inside the page and keys in order, and the counters match the tree. A
// file that passes can be mapped and read without a SIGBUS or an assertion
// in mdb.c on a page of the wrong type. Any failure wraps
// indexes.ErrCorrupt and names the page. A missing or empty file is fine
// (LMDB creates it).
//
// The check reads the whole file once; another process committing while
// it runs can make it fail spuriously, so callers retry before believing it.
func VerifyFile(path string) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("verify %s: %w", path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("verify %s: %w", path, err)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("verify %s: not a regular file (%s): %w", path, st.Mode().Type(), indexes.ErrCorrupt)
	}
	if st.Size() == 0 {
		return nil
	}
	v := &verifier{f: f, path: path, size: st.Size(), seen: map[uint64]bool{}}
	if err := v.run(); err != nil {
		return fmt.Errorf("lmdb file %s: %w: %w", path, err, indexes.ErrCorrupt)
	}
	return nil
}

type verifier struct {
	f      io.ReaderAt
	path   string
	size   int64
	psize  uint64
	lastPg uint64
	seen   map[uint64]bool
	// counts of the tree being walked
	branch, leaf, overflow, entries uint64
}

func (v *verifier) run() error {
	hdr := make([]byte, metaTxnID+8)
	if v.size < int64(len(hdr)) {
		return fmt.Errorf("%d bytes, shorter than a meta page", v.size)
	}
	var metas [2][]byte
	for i := range metas {
		off := int64(0)
		if i == 1 {
			off = int64(v.psize)
		}
		b := make([]byte, len(hdr))
		if _, err := v.f.ReadAt(b, off); err != nil {
			return fmt.Errorf("meta page %d: read at %d: %v", i, off, err)
		}
		if fl := binary.LittleEndian.Uint16(b[10:]); fl&pMeta == 0 {
			return fmt.Errorf("meta page %d: flags %#x are not a meta page's", i, fl)
		}
		if m := binary.LittleEndian.Uint32(b[metaMagic:]); m != mdbMagic {
			return fmt.Errorf("meta page %d: magic %#x, want %#x", i, m, uint32(mdbMagic))
		}
		if ver := binary.LittleEndian.Uint32(b[metaVersion:]); ver != mdbDataVersion {
			return fmt.Errorf("meta page %d: version %d, want %d", i, ver, mdbDataVersion)
		}
		if i == 0 {
			ps := uint64(decodeDB(b[metaDBs:]).pad)
			if ps < 512 || ps > 1<<15 || ps&(ps-1) != 0 {
				return fmt.Errorf("meta page 0: page size %d", ps)
			}
			v.psize = ps
		}
		metas[i] = b
	}
	m := metas[0]
	t0, t1 := binary.LittleEndian.Uint64(metas[0][metaTxnID:]), binary.LittleEndian.Uint64(metas[1][metaTxnID:])
	if t0 < t1 {
		m = metas[1]
	}
	// NB: each commit writes its meta to page txnid&1, so the two metas
	// hold consecutive transactions, the even one on page 0 (or both 0 in
	// a new file). A flipped bit in the older one's id would make LMDB
	// open that older snapshot as the newest: a consistent tree that
	// silently lacks the last commits.
	if (t0 != 0 || t1 != 0) && (t0&1 != 0 || t1&1 != 1 || max(t0, t1)-min(t0, t1) != 1) {
		return fmt.Errorf("meta pages hold transactions %d and %d, not consecutive ones on pages of their parity", t0, t1)
	}
	v.lastPg = binary.LittleEndian.Uint64(m[metaLastPg:])
	if v.lastPg < 1 || v.lastPg > uint64(1)<<44/v.psize {
		return fmt.Errorf("meta: last page %d", v.lastPg)
	}
	// NB: LMDB writes a transaction's pages before the meta that names
	// them, so the file holds every page up to the last one in use. A meta
	// naming a later page is damaged: trusted, it would count phantom
	// pages as in use and fill the map.
	if (v.lastPg+1)*v.psize > uint64(v.size) {
		return fmt.Errorf("meta: last page %d lies past the end of the %d-byte file", v.lastPg, v.size)
	}
	free, main := decodeDB(m[metaDBs:]), decodeDB(m[metaDBs+dbRecordSize:])
	// The free tree's records are page lists (a count, then page
	// numbers): LMDB writes new pages over them, so one that names a page
	// in use would overwrite a live page of another type.
	var freePages []uint64
	if err := v.tree("free", free, func(_, data []byte, _ uint16) error {
		if len(data) < 8 {
			return fmt.Errorf("free list of %d bytes", len(data))
		}
		n := binary.LittleEndian.Uint64(data)
		if n > uint64(len(data)/8-1) {
			return fmt.Errorf("free list of %d pages in %d bytes", n, len(data))
		}
		for i := range n {
			freePages = append(freePages, binary.LittleEndian.Uint64(data[8+8*i:]))
		}
		return nil
	}); err != nil {
		return err
	}
	var named []mdbDB
	if err := v.tree("main", main, func(key, data []byte, flags uint16) error {
		if flags&fSubData != 0 {
			if len(data) != dbRecordSize {
				return fmt.Errorf("named database %q: record of %d bytes", key, len(data))
			}
			named = append(named, decodeDB(data))
		}
		return nil
	}); err != nil {
		return err
	}
	for i, db := range named {
		if err := v.tree(fmt.Sprintf("named database %d", i), db, nil); err != nil {
			return err
		}
	}
	listed := make(map[uint64]bool, len(freePages))
	for _, p := range freePages {
		switch {
		case p < 2 || p > v.lastPg:
			return fmt.Errorf("free list names page %d outside [2, %d]", p, v.lastPg)
		case v.seen[p]:
			return fmt.Errorf("free list names page %d, which a tree uses", p)
		case listed[p]:
			return fmt.Errorf("free list names page %d twice", p)
		}
		listed[p] = true
	}
	return nil
}

// tree walks one B+tree from db's root; leaf, if set, sees every leaf
// node's key and inline data.
func (v *verifier) tree(name string, db mdbDB, leaf func(key, data []byte, flags uint16) error) error {
	if db.root == invalidPgno {
		if db.depth != 0 || db.entries != 0 {
			return fmt.Errorf("%s tree: no root but depth %d, %d entries", name, db.depth, db.entries)
		}
		return nil
	}
	if db.depth < 1 || db.depth > maxTreeDepth {
		return fmt.Errorf("%s tree: depth %d", name, db.depth)
	}
	v.branch, v.leaf, v.overflow, v.entries = 0, 0, 0, 0
	ordered := name != "free" // the free tree has integer keys
	if err := v.page(name, db.root, int(db.depth), ordered, nil, nil, leaf); err != nil {
		return err
	}
	if v.branch != db.branch || v.leaf != db.leaf || v.overflow != db.overflow || v.entries != db.entries {
		return fmt.Errorf("%s tree: walked %d branch, %d leaf, %d overflow pages and %d entries; its record says %d, %d, %d and %d",
			name, v.branch, v.leaf, v.overflow, v.entries, db.branch, db.leaf, db.overflow, db.entries)
	}
	return nil
}

// readPage reads page pgno after checking it lies inside the file.
func (v *verifier) readPage(name string, pgno, n uint64) ([]byte, error) {
	if pgno < 2 || pgno > v.lastPg || n == 0 || n > v.lastPg-pgno+1 {
		return nil, fmt.Errorf("%s tree: page %d (+%d) outside [2, %d]", name, pgno, n, v.lastPg)
	}
	end := (pgno + n) * v.psize
	if end > uint64(v.size) {
		return nil, fmt.Errorf("%s tree: page %d ends at byte %d, past the end of the %d-byte file (truncated)", name, pgno+n-1, end, v.size)
	}
	for p := pgno; p < pgno+n; p++ {
		if v.seen[p] {
			return nil, fmt.Errorf("%s tree: page %d reached twice", name, p)
		}
		v.seen[p] = true
	}
	b := make([]byte, v.psize)
	if _, err := v.f.ReadAt(b, int64(pgno*v.psize)); err != nil {
		return nil, fmt.Errorf("%s tree: page %d: %v", name, pgno, err)
	}
	if got := binary.LittleEndian.Uint64(b); got != pgno {
		return nil, fmt.Errorf("%s tree: page %d says it is page %d", name, pgno, got)
	}
	return b, nil
}

// page walks the subtree at pgno. In an ordered tree every key in it must
// lie in [lo, hi) (nil: unbounded), the range its parent's separators give
// it: a damaged separator leaves each page in order while lookups of the
// keys beside it go to the wrong child and miss entries that iteration
// still returns.
func (v *verifier) page(name string, pgno uint64, depth int, ordered bool, lo, hi []byte, leaf func(key, data []byte, flags uint16) error) error {
	b, err := v.readPage(name, pgno, 1)
	if err != nil {
		return err
	}
	flags := binary.LittleEndian.Uint16(b[10:])
	want := uint16(pLeaf)
	if depth > 1 {
		want = pBranch
	}
	if flags != want {
		return fmt.Errorf("%s tree: page %d has flags %#x at depth %d, want %#x", name, pgno, flags, depth, want)
	}
	lower, upper := uint64(binary.LittleEndian.Uint16(b[12:])), uint64(binary.LittleEndian.Uint16(b[14:]))
	if lower < pageHdrSize || lower%2 != 0 || lower > upper || upper > v.psize {
		return fmt.Errorf("%s tree: page %d bounds lower %d, upper %d", name, pgno, lower, upper)
	}
	n := int((lower - pageHdrSize) / 2)
	if n == 0 {
		return fmt.Errorf("%s tree: page %d has no nodes", name, pgno)
	}
	if depth > 1 {
		v.branch++
	} else {
		v.leaf++
	}
	// node parses node i's header and key.
	node := func(i int) (ptr uint64, key []byte, err error) {
		ptr = uint64(binary.LittleEndian.Uint16(b[pageHdrSize+2*i:]))
		if ptr < upper || ptr%2 != 0 || ptr+nodeHdrSize > v.psize {
			return 0, nil, fmt.Errorf("%s tree: page %d node %d at offset %d outside [%d, %d)", name, pgno, i, ptr, upper, v.psize)
		}
		ksize := uint64(binary.LittleEndian.Uint16(b[ptr+6:]))
		if ksize > maxKeySize || ptr+nodeHdrSize+ksize > v.psize {
			return 0, nil, fmt.Errorf("%s tree: page %d node %d key of %d bytes overruns the page", name, pgno, i, ksize)
		}
		return ptr, b[ptr+nodeHdrSize : ptr+nodeHdrSize+ksize], nil
	}
	var prev []byte
	for i := range n {
		ptr, key, err := node(i)
		if err != nil {
			return err
		}
		nd := b[ptr:]
		dlo, dhi := uint64(binary.LittleEndian.Uint16(nd[0:])), uint64(binary.LittleEndian.Uint16(nd[2:]))
		nflags := binary.LittleEndian.Uint16(nd[4:])
		ksize := uint64(len(key))
		if ordered && (depth == 1 || i > 0) {
			if prev != nil && bytes.Compare(prev, key) >= 0 {
				return fmt.Errorf("%s tree: page %d node %d key out of order", name, pgno, i)
			}
			if (lo != nil && bytes.Compare(key, lo) < 0) || (hi != nil && bytes.Compare(key, hi) >= 0) {
				return fmt.Errorf("%s tree: page %d node %d key outside the range its parent gives the page", name, pgno, i)
			}
			prev = key
		}
		if depth > 1 {
			child := dlo | dhi<<16 | uint64(nflags)<<32
			clo, chi := lo, hi
			if ordered {
				if i > 0 {
					clo = key
				}
				if i+1 < n {
					_, next, err := node(i + 1)
					if err != nil {
						return err
					}
					chi = next
				}
			}
			if err := v.page(name, child, depth-1, ordered, clo, chi, leaf); err != nil {
				return err
			}
			continue
		}
		v.entries++
		dsize := dlo | dhi<<16
		if nflags&^(fBigData|fSubData) != 0 || nflags&fDupData != 0 {
			return fmt.Errorf("%s tree: page %d node %d flags %#x", name, pgno, i, nflags)
		}
		dataOff := ptr + nodeHdrSize + ksize
		if nflags&fBigData != 0 {
			if dataOff+8 > v.psize {
				return fmt.Errorf("%s tree: page %d node %d overflow pointer overruns the page", name, pgno, i)
			}
			ov := binary.LittleEndian.Uint64(b[dataOff:])
			if err := v.overflowPages(name, ov, dsize); err != nil {
				return err
			}
			if leaf != nil {
				data := make([]byte, pageHdrSize+dsize)
				if _, err := v.f.ReadAt(data, int64(ov*v.psize)); err != nil {
					return fmt.Errorf("%s tree: overflow page %d: %v", name, ov, err)
				}
				if err := leaf(key, data[pageHdrSize:], nflags); err != nil {
					return fmt.Errorf("%s tree: page %d node %d: %w", name, pgno, i, err)
				}
			}
			continue
		}
		if dataOff+dsize > v.psize {
			return fmt.Errorf("%s tree: page %d node %d data of %d bytes overruns the page", name, pgno, i, dsize)
		}
		if leaf != nil {
			if err := leaf(key, b[dataOff:dataOff+dsize], nflags); err != nil {
				return fmt.Errorf("%s tree: page %d node %d: %w", name, pgno, i, err)
			}
		}
	}
	return nil
}

func (v *verifier) overflowPages(name string, pgno, dsize uint64) error {
	b, err := v.readPage(name, pgno, 1)
	if err != nil {
		return err
	}
	if fl := binary.LittleEndian.Uint16(b[10:]); fl != pOverflow {
		return fmt.Errorf("%s tree: overflow page %d has flags %#x", name, pgno, fl)
	}
	pages := uint64(binary.LittleEndian.Uint32(b[12:]))
	need := (pageHdrSize-1+dsize)/v.psize + 1
	if pages < need {
		return fmt.Errorf("%s tree: overflow page %d spans %d pages, its %d bytes need %d", name, pgno, pages, dsize, need)
	}
	if pages > 1 {
		delete(v.seen, pgno)
		if _, err := v.readPage(name, pgno, pages); err != nil {
			return err
		}
	}
	v.overflow += pages
	return nil
}
