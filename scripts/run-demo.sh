#!/usr/bin/env bash
# `make run`: the whole system at work. Starts `kvtier serve` on the
# embedded default stack (a demo geometry: 16 KiB pages, per rank a 4 MiB
# L1, a 16 MiB L2 slab on hugetlbfs or the shm fallback, a 256 MiB L3
# under a temporary data dir), drives it with `kvtier loadgen` on the
# built-in generated workload (every loaded byte verified), prints the
# per-tier table and the step latencies, and stops serve with SIGTERM.
# It moves a few hundred MB; under two minutes on a 2-core machine.
set -euo pipefail
BIN=${BIN:-bin}
RANKS=${RANKS:-2}
REQUESTS=${REQUESTS:-2000}
dir=$(mktemp -d /tmp/kvtier-demo.XXXXXX)
sock="$dir/kvtier.sock"
pid=
cleanup() {
	if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
		kill -TERM "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	fi
	rm -rf "$dir"
}
trap cleanup EXIT
echo "== kvtier serve --data-dir $dir --ranks $RANKS (embedded demo stack: small pages, a few hundred MB moved)"
"$BIN/kvtier" serve --data-dir "$dir/data" --socket "$sock" --ranks "$RANKS" --log-level warn &
pid=$!
for _ in $(seq 1 500); do
	[ -S "$sock" ] && break
	kill -0 "$pid" 2>/dev/null || { echo "kvtier serve exited before listening" >&2; exit 1; }
	sleep 0.02
done
[ -S "$sock" ] || { echo "kvtier serve did not listen within 10 s" >&2; exit 1; }
sleep 0.2 # the socket file exists from bind(), before listen()
echo "== kvtier loadgen --socket $sock --ranks $RANKS --requests $REQUESTS (built-in generated workload)"
"$BIN/kvtier" loadgen --socket "$sock" --ranks "$RANKS" --requests "$REQUESTS"
echo "== stopping kvtier serve (SIGTERM: drain, close tiers in order)"
kill -TERM "$pid"
wait "$pid"
pid=
echo "== done"
