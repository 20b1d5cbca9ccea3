package lmdb

import (
	"bytes"
	"fmt"

	mdb "github.com/PowerDNS/lmdb-go/lmdb"

	"github.com/kvtier/kvtier/indexes"
)

// The checks below run only when invariants is on. Each panics with the
// state that proves a broken invariant: a write batch that does not read
// back inside its own transaction, or an iteration out of key order.

// checkWritten requires txn to hold, for every key of entries, the record
// of the key's last entry.
func (ix *Index) checkWritten(txn *mdb.Txn, entries []indexes.Entry) {
	want := make(map[indexes.Key]indexes.Record, len(entries))
	for _, e := range entries {
		want[e.Key] = e.Record
	}
	var kb [indexes.KeySize]byte
	for k, rec := range want {
		indexes.EncodeKey(&kb, k)
		v, err := txn.Get(ix.dbi, kb[:])
		if err != nil {
			panic(fmt.Sprintf("lmdb index %s: invariant: key %s written in this transaction reads back as %v", ix.dir, k, err))
		}
		got, err := indexes.DecodeRecord(k, v)
		if err != nil || got != rec {
			panic(fmt.Sprintf("lmdb index %s: invariant: key %s written as %+v reads back as %+v (%v)", ix.dir, k, rec, got, err))
		}
	}
}

// checkAbsent requires txn to hold none of keys.
func (ix *Index) checkAbsent(txn *mdb.Txn, keys []indexes.Key) {
	var kb [indexes.KeySize]byte
	for _, k := range keys {
		indexes.EncodeKey(&kb, k)
		if _, err := txn.Get(ix.dbi, kb[:]); !mdb.IsNotFound(err) {
			panic(fmt.Sprintf("lmdb index %s: invariant: key %s deleted in this transaction is still there (%v)", ix.dir, k, err))
		}
	}
}

// checkOrder requires key to sort strictly after prev, and records it.
func (ix *Index) checkOrder(prev *[]byte, key []byte) {
	if *prev != nil && bytes.Compare(*prev, key) >= 0 {
		panic(fmt.Sprintf("lmdb index %s: invariant: iterate yielded key %x after %x", ix.dir, key, *prev))
	}
	*prev = append((*prev)[:0], key...)
}

// checkTouched requires every key of keys present in txn to carry at.
func (ix *Index) checkTouched(txn *mdb.Txn, keys []indexes.Key, at uint64) {
	var kb [indexes.KeySize]byte
	for _, k := range keys {
		indexes.EncodeKey(&kb, k)
		v, err := txn.Get(ix.dbi, kb[:])
		if mdb.IsNotFound(err) {
			continue
		}
		if err != nil {
			panic(fmt.Sprintf("lmdb index %s: invariant: key %s touched in this transaction reads back as %v", ix.dir, k, err))
		}
		if rec, err := indexes.DecodeRecord(k, v); err == nil && rec.LastAccess != at {
			panic(fmt.Sprintf("lmdb index %s: invariant: key %s touched at %d reads back with last access %d", ix.dir, k, at, rec.LastAccess))
		}
	}
}
