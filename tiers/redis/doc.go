// Package redis is kvtier's scale-out Store v1 (kvtier.tier.store.v1/redis):
// content-addressed pages in Redis Cluster, or in one standalone Redis (or
// Valkey) server, through github.com/redis/go-redis/v9.
//
// One key per page payload: key_prefix + "p" + kind + ":" + hex(page hash).
// The value is self-describing, a 64-byte header (magic, format version,
// payload kind, page hash, payload length, payload CRC-32C, header CRC-32C)
// followed by the payload; a read verifies all of it against the key and
// the stack's page size and turns any mismatch (a torn or foreign value, a
// value someone else overwrote) into a counted corrupt miss. A hit is never
// wrong bytes.
//
// Puts run on two goroutines: a gatherer copies each item out of the slab
// into a staging buffer, checksumming as it copies, and acknowledges it
// gathered (the slab span may be reused); a sender writes staged items in
// pipelined batches of pipeline_depth and acknowledges them durable once the
// server — and, with min_replicas, that many replicas (WAIT) — confirmed.
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
