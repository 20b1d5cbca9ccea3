// Package redis is kvtier's scale-out Store v1 (kvtier.tier.store.v1/redis):
// content-addressed pages in Redis Cluster, or in one standalone Redis (or
// Valkey) server, through github.com/redis/go-redis/v9.
//
// One key per page payload: key_prefix + "p" + kind + ":" + hex(page hash).
// The value is self-describing: the payload followed by a 64-byte trailer
// (magic, format version, payload kind, page hash, payload length, payload
// CRC-32C, trailer CRC-32C); a read verifies all of it against the key and
// the stack's page size and turns any mismatch (a torn or foreign value, a
// value someone else overwrote, a value in the older header-first format
// version 1) into a counted corrupt miss. A hit is never wrong bytes.
//
// Puts copy nothing: a sender pipelines, per page, SET key payload (go-redis
// writes the payload from the slab straight to the socket, and the server
// keeps the bulk string it read as the value) and APPEND key trailer (the
// CRC-32C computed as the command is written, right after the payload went
// out), pipeline_depth pages per round trip, two round trips in flight. An
// item is acknowledged gathered and durable together once the server — and,
// with min_replicas, that many replicas (WAIT) — confirmed: only then is the
// slab span no longer read. The two commands are not a transaction (inside
// MULTI/EXEC the server copies the payload for the APPEND): a read between
// them is a corrupt miss, never bytes; a put refused half way (the SET as
// OOM but not the APPEND, or the reverse) unlinks what it left (best effort:
// if the server is gone, that reads as a corrupt miss once it is back); a
// put whose APPEND finds another put's interleaved commands writes the page
// again, and unlinks it if that races too. In cluster mode a put goes to each page's master
// directly and is resent once to the new master after MOVED.
//
// Gets and LongestPrefix are one pipelined round trip per pipeline_depth
// pages. Touch refreshes the server's recency (TOUCH, and the TTL when one
// is set). Eviction is the server's maxmemory-policy: the tier keeps no
// index and never needs its own garbage collection.
//
// Failures are misses and failed puts, never hangs: every round trip is
// bounded by the config's timeout. A master that is down makes its slots
// miss and its puts fail; MOVED and ASK redirections and failovers are
// followed by the cluster client, and the tier recovers by itself when the
// node (or its promoted replica) answers again.
//
// Every miss, corrupt miss and failed put is counted in Stats and, when the
// host passes a Registerer, in kvtier_redis_* Prometheus counters; failures
// are logged at most once per interval.
//
// The store must never decide what the cache contains: the host decides, the
// server's memory policy evicts, and the store only moves and verifies
// bytes. It keeps no package-level state and never logs secrets: the
// password comes from a file named in the config.
package redis
