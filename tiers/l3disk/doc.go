// Package l3disk is kvtier's L3 tier: a Store v1 that keeps payload pages
// in preallocated slab files of fixed-size, 4 KiB-aligned slots on local
// disks, written and read with O_DIRECT single transfers, and located
// through an Index v1 (LMDB or Badger) keyed by page hash and payload kind.
//
// On disk: one slab file per (stack, rank, payload kind) in the rank's disk
// directory, a 4 KiB superblock (geometry and epoch) then the slots. A slot
// is a 64-byte self-describing header (magic, version, kind, epoch, page
// hash, payload length, header CRC-32C, payload CRC-32C), the payload and
// zero padding. Every read verifies all of it: a torn, foreign, stale or
// rotten slot is a miss, never wrong bytes.
//
// Ordering: a put is data -> fdatasync -> index commit, so an index entry
// always names a durable slot; a reclaim is index delete -> slot free, so a
// reader racing a reuse sees a miss. The writer goroutine alone owns the
// slot free lists, the page-level LRU and garbage collection.
//
// The slabs are the truth and the index a cache of them: a cold start
// load whose index is damaged, corrupt or missing rebuilds it from the slot
// headers, verifying every payload CRC. Epochs never go backwards (a file
// recreated from an unreadable superblock starts above every epoch its
// headers and the index have seen), a put is deduplicated only against a
// slot verified since open (a durable ack is never false), a truncated slab
// keeps its intact slots, and the store opens only regular files it can
// reach without following a symlink. See docs/reliability.md.
//
// The store moves bytes and keeps its own bookkeeping. It never decides
// what the cache holds (that is the host's replicated decision); its
// garbage collection only reclaims disk space, and a reclaimed page is a
// miss the host recomputes. It never retries an fdatasync that failed.
package l3disk
