#!/usr/bin/env bash
# `make run`: the whole system at work, each figure beside its bound or
# baseline from the same run. Starts `kvtier serve` on the embedded demo
# stack (16 KiB pages of 512 tokens; per rank a 256-page L1, a 16 MiB =
# 1024-page L2 slab on hugetlbfs or the shm fallback, a 256 MiB = 16384-page
# L3 under a temporary data dir; write-through, so L3 holds every page),
# drives it with `kvtier loadgen` on the built-in generated workload (every
# loaded byte verified, an empty Ping timed before every step), replays the
# very requests loadgen ran (`kvtier replay`, metadata only) with LRU at
# each tier's capacity and at infinite capacity, prints what each ratio
# means, and stops serve with SIGTERM. serve's and loadgen's logs (WARN
# lines such as the hugetlbfs fallback) go to the log file named at the
# start, not into the tables. Under a minute on a 2-core machine.
set -euo pipefail
BIN=${BIN:-bin}
RANKS=${RANKS:-2}
REQUESTS=${REQUESTS:-2000}
# The demo stack's capacities per rank, in tokens (pages x 512): L1 256
# pages, L1+L2 1024 pages (the slab holds what L1 holds), L3 16384 pages.
L1_TOKENS=131072
L2_TOKENS=524288
L3_TOKENS=8388608
dir=$(mktemp -d /tmp/kvtier-demo.XXXXXX)
log="$dir.log"
sock="$dir/kvtier.sock"
trace="$dir/requests.jsonl"
pid=
cleanup() {
	if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
		kill -TERM "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	fi
	rm -rf "$dir"
}
trap cleanup EXIT
: >"$log"
echo "== kvtier serve --ranks $RANKS on the embedded demo stack (logs: $log)"
"$BIN/kvtier" serve --data-dir "$dir/data" --socket "$sock" --ranks "$RANKS" --log-level warn >>"$log" 2>&1 &
pid=$!
for _ in $(seq 1 500); do
	[ -S "$sock" ] && break
	kill -0 "$pid" 2>/dev/null || { echo "kvtier serve exited before listening; its log:" >&2; cat "$log" >&2; exit 1; }
	sleep 0.02
done
[ -S "$sock" ] || { echo "kvtier serve did not listen within 10 s (log: $log)" >&2; exit 1; }
sleep 0.2 # the socket file exists from bind(), before listen()
grep -q 'NOT hugepage-backed' "$log" && echo "   (the L2 slab is on the shm fallback, not hugetlbfs: see the log)"
echo "== kvtier loadgen --socket $sock --ranks $RANKS --requests $REQUESTS --ping (built-in generated workload)"
out=$("$BIN/kvtier" loadgen --socket "$sock" --ranks "$RANKS" --requests "$REQUESTS" --ping --write-trace "$trace" 2>>"$log")
echo "$out"
echo "== stopping kvtier serve (SIGTERM: drain, close tiers in order)"
kill -TERM "$pid"
wait "$pid"
pid=
echo "== bounds: kvtier replay of the same requests, LRU at each tier's capacity and infinite capacity"
bounds=$("$BIN/kvtier" replay "$trace" --policy lru --capacity "$L1_TOKENS,$L2_TOKENS,$L3_TOKENS,inf" --json 2>>"$log")
# rate POLICY CAPACITY: the hit rate of that replay row, in percent.
rate() { echo "$bounds" | awk -v p="\"policy\":\"$1\"" -v c="\"capacity_tokens\":$2," 'index($0, p) && index($0, c) { match($0, /"hit_rate":[0-9.e-]+/); printf "%.2f", 100 * substr($0, RSTART + 11, RLENGTH - 11) }'; }
inf=$(echo "$bounds" | awk '/"policy":"infinite"/ { match($0, /"hit_rate":[0-9.e-]+/); printf "%.2f", 100 * substr($0, RSTART + 11, RLENGTH - 11); exit }')
lru1=$(rate lru $L1_TOKENS)
lru2=$(rate lru $L2_TOKENS)
lru3=$(rate lru $L3_TOKENS)
# share TIER: loadgen's hit share of that tier, in percent.
share() { echo "$out" | awk -v t="$1" '$1 == t { sub(/%/, "", $3); print $3 }'; }
l1=$(share l1)
l2=$(share l2)
total=$(share total)
upto2=$(awk -v a="$l1" -v b="$l2" 'BEGIN { printf "%.2f", a + b }')
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2fx", a / b; else print "-" }'; }
printf '%-34s %9s %9s %7s\n' "hit rate (share of input tokens)" "serve" "bound" "ratio"
printf '%-34s %8s%% %8s%% %7s\n' "L1 vs LRU at L1's 256 pages" "$l1" "$lru1" "$(ratio "$l1" "$lru1")"
printf '%-34s %8s%% %8s%% %7s\n' "L1+L2 vs LRU at 1024 pages" "$upto2" "$lru2" "$(ratio "$upto2" "$lru2")"
printf '%-34s %8s%% %8s%% %7s\n' "all tiers vs LRU at L3's 16384" "$total" "$lru3" "$(ratio "$total" "$lru3")"
printf '%-34s %8s%% %8s%% %7s\n' "all tiers vs infinite capacity" "$total" "$inf" "$(ratio "$total" "$inf")"
cat <<'TXT'

What the ratios mean:
  hit rate / LRU at the same capacity: how close serve's tiers come to an
    offline LRU replay of the same requests with pages of the same size.
    Good is near 1.0x; serve falls short where pages are still in flight
    when a later request asks for them (8 new requests per step), where
    copies were skipped for want of space, and by its own eviction policy.
  hit rate / infinite capacity: the share of the reusable tokens found at
    all. The infinite row is the ceiling no cache can pass (only first
    sights miss); a ratio near the LRU row's means capacity is not the limit.
  step p50/p99 / Ping p50/p99: the cost of a step over an empty call on the
    same socket (the RPC and scheduling floor). A few x is the lookups,
    plans and copies; tens of x at p99 is queueing behind copies or GC.
  load and store GB/s / memcpy: the engine's copies through the mapped slab
    against a plain memcpy of the same pages in this process. Load near
    1.0x is good (a load is a copy out of the slab). A store is the copy
    into the slab and the page's CRC-32C in the same pass (the sum serve's
    tiers keep). On the shm fallback the first write of each slab page
    through the engine's mapping can cost ~10 us a 4 KiB page (some VMs:
    docs/perf.md), so stores sit below loads there; on hugetlbfs they
    come near them.
TXT
echo "== done (logs: $log)"
