"""Benchmark of kvtier.vllm_tier.KvtierTier, vLLM's secondary tier over
the store door, against a real ``kvtier serve --doors store``.

    cd clients/python && /usr/bin/python3 -m kvtier.bench_vllm_tier

It reports, each as a ratio measured in the same run:

- the tier's scheduler-side cost per step, for --requests requests of
  --tokens tokens (blocks of --block-tokens tokens, one OffloadKey each),
  against an empty call (Ping) on the tier's own channel and socket
  (target <= 3x). Three kinds of step, each the calls vLLM's tiering
  manager makes into the tier in one scheduler step:
    hit:   every block of every request looked up (all in serve's slab:
           True), one submit_load per request, get_finished;
    first: every block of every request looked up for the first time
           (None: asked in the background), get_finished;
    store: one lookup per request (a known miss: False), one submit_store
           per request of all its blocks, get_finished.
  Between steps the tier's threads run the jobs (the model's forward pass
  in vLLM); that time is not the scheduler's and is not counted.
- the tier's copies (one memmove per payload kind of a page, primary row
  <-> slab span, on its threads) in GB/s, against one memcpy of the same
  number of bytes between two buffers already faulted in (target >=
  0.7x), for loads and for stores.

Without vLLM installed it uses the stand-in interface of the tests
(clients/python/tests/standin). It needs a kvtier binary: --kvtier, else
``kvtier`` on PATH, else it builds one with ``go build``.
"""

import argparse
import ctypes
import hashlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))

try:
    import vllm.v1.kv_offload.tiering.base  # noqa: F401
    STANDIN = False
except ImportError:
    sys.path.insert(0, os.path.join(HERE, "..", "tests", "standin"))
    STANDIN = True

import numpy as np  # noqa: E402
import torch  # noqa: E402

from vllm.v1.kv_offload.base import OffloadingSpec, ReqContext, make_offload_key  # noqa: E402
from vllm.v1.kv_offload.tiering.base import JobMetadata  # noqa: E402

from kvtier._serveproc import kvtier_binary, wait_listening  # noqa: E402
from kvtier.store.v1 import store_pb2 as pb  # noqa: E402
from kvtier.vllm_tier import KvtierTier  # noqa: E402

STACK = """version: 1
model:
  page_tokens: %(tokens)d
  payloads:
%(payloads)s
tiers:
  - name: l2
    role: slab
    use: l2hugetlb
    config: {size: %(slab)d, fallback: shm, name: "kvtier-bvt-{{DIRHASH}}", stale: remove, populate: true}
  - name: l3
    role: store
    use: l3disk
    index: {use: lmdb, config: {dir: "{{DIR}}/store/index"}}
    config:
      disks: [{dir: "{{DIR}}/store/l3", budget: %(l3)d}]
policy:
  evictor: lru
write_policy: write_through
ranks: {world_size: 1, rank: 0}
"""


KINDS = ["k", "v"]


def start_serve(binary, tmp, stack, extra=()):
    cfg = os.path.join(tmp, "store.yaml")
    with open(cfg, "w") as f:
        f.write(stack)
    sock = os.path.join(tmp, "s.sock")
    log = open(os.path.join(tmp, "serve.log"), "ab")
    proc = subprocess.Popen([binary, "serve", "--doors", "store", "--store-config", cfg, "--data-dir",
                             os.path.join(tmp, "data"), "--socket", sock, "--log-level", "warn"] + list(extra),
                            stdout=subprocess.DEVNULL, stderr=log)
    try:
        wait_listening(proc, sock, 60, log.name)
    except RuntimeError:
        proc.kill()
        raise
    return proc, sock


def keys_of(prefix, n):
    out, h = [], hashlib.sha256(prefix.encode()).digest()
    for i in range(n):
        h = hashlib.sha256(h + i.to_bytes(4, "little")).digest()
        out.append(make_offload_key(h, 0))
    return out


class Bench:
    def __init__(self, args, sock):
        self.args = args
        self.nblocks = args.tokens // args.block_tokens
        self.row = args.row_kib * 1024
        n = args.requests * self.nblocks
        # Two sets of primary blocks: a step's promotions land in one while
        # the other's jobs may still be finishing.
        self.primary = torch.empty((2 * n, self.row), dtype=torch.uint8)
        self.primary.random_(0, 256)
        self.view = memoryview(self.primary.numpy())
        sp = OffloadingSpec(vllm_config=None, kv_cache_config=None, extra_config={})
        self.tier = KvtierTier(offloading_spec=sp, primary_kv_view=self.view, tier_type="kvtier", socket=sock,
                               kinds=["kv"] if args.kinds == 1 else KINDS, model="bench/model", dtype="bfloat16", page_tokens=args.block_tokens,
                               timeout_s=30)
        self.job = 0
        self.open = set()

    def jobmeta(self, keys, blocks, promotion, ctx):
        self.job += 1
        self.open.add(self.job)
        return JobMetadata(job_id=self.job, keys=keys, block_ids=np.asarray(blocks, dtype=np.int64),
                           is_promotion=promotion, req_context=ctx)

    def drain(self, timeout=120):
        """Waits for every job (the forward pass, outside the timed part);
        returns how many failed."""
        failed = 0
        deadline = time.time() + timeout
        while self.open:
            for r in self.tier.get_finished():
                self.open.discard(r.job_id)
                failed += not r.success
            if time.time() > deadline:
                raise RuntimeError("%d jobs not finished in %d s: %s" % (len(self.open), timeout, dict(self.tier.counters)))
            time.sleep(0.001)
        return failed

    def requests(self, tag):
        return [(ReqContext(req_id="%s-%d" % (tag, i)), keys_of("%s-%d" % (tag, i), self.nblocks))
                for i in range(self.args.requests)]

    def store(self, reqs, base=0):
        """The store step: one lookup per request (a known miss), one
        submit_store per request, get_finished. Returns its seconds."""
        tier, n = self.tier, self.nblocks
        # vLLM builds the jobs' metadata (its cost, not the tier's).
        jobs = [self.jobmeta(keys, range(base + i * n, base + (i + 1) * n), False, ctx)
                for i, (ctx, keys) in enumerate(reqs)]
        t0 = time.perf_counter()
        for (ctx, keys), job in zip(reqs, jobs):
            tier.lookup(keys[0], ctx)
            tier.submit_store(job)
        tier.get_finished()
        return time.perf_counter() - t0

    def first(self, reqs):
        """Every key of every request looked up for the first time."""
        tier = self.tier
        lookup = tier.lookup
        t0 = time.perf_counter()
        for ctx, keys in reqs:
            for k in keys:
                lookup(k, ctx)
        tier.get_finished()
        return time.perf_counter() - t0

    def hit(self, reqs, base):
        """Every key looked up (True), one submit_load per request."""
        tier, n = self.tier, self.nblocks
        jobs = [self.jobmeta(keys, range(base + i * n, base + (i + 1) * n), True, ctx)
                for i, (ctx, keys) in enumerate(reqs)]
        lookup = tier.lookup
        t0 = time.perf_counter()
        for ctx, keys in reqs:
            for k in keys:
                lookup(k, ctx)
        for job in jobs:
            tier.submit_load(job)
        tier.get_finished()
        dt = time.perf_counter() - t0
        hits = sum(lookup(k, ctx) is True for ctx, keys in reqs for k in keys)
        if hits != len(reqs) * n:
            raise RuntimeError("hit step: %d of %d lookups True" % (hits, len(reqs) * n))
        return dt

    def settle(self, reqs):
        """Steps (untimed) until every request's scan resolves, as vLLM's
        does: a None goes on to the next key, a miss ends the scan."""
        for _ in range(5000):
            pending = False
            for ctx, keys in reqs:
                for k in keys:
                    r = self.tier.lookup(k, ctx)
                    if r is None:
                        pending = True
                    elif r is False:
                        break
            self.tier.get_finished()
            if not pending:
                return
            time.sleep(0.002)
        raise RuntimeError("lookups did not settle: %s" % dict(self.tier.counters))

    def ping(self, n):
        stub = self.tier._stub
        stub.Ping(pb.PingRequest(), timeout=5)
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            stub.Ping(pb.PingRequest(), timeout=5)
            out.append(time.perf_counter() - t0)
        return out


def memcpy_gbps(nbytes, reps=5):
    """One memcpy of nbytes between two buffers faulted in beforehand."""
    a = torch.empty(nbytes, dtype=torch.uint8)
    b = torch.empty(nbytes, dtype=torch.uint8)
    a.fill_(1)
    b.fill_(2)
    pa, pb_ = a.data_ptr(), b.data_ptr()
    best = []
    for _ in range(reps):
        t0 = time.perf_counter()
        ctypes.memmove(pb_, pa, nbytes)
        best.append(time.perf_counter() - t0)
    return nbytes / statistics.median(best) / 1e9


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kvtier", help="kvtier binary (default: kvtier on PATH, else go build)")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=2000)
    ap.add_argument("--block-tokens", type=int, default=16)
    ap.add_argument("--row-kib", type=int, default=64, help="bytes of a primary row, one block (KiB)")
    ap.add_argument("--kinds", type=int, default=1, choices=(1, 2),
                    help="payload kinds a row is split into: 1 (kv, the tier's default) or 2 (k, v)")
    ap.add_argument("--steps", type=int, default=8, help="timed steps of each kind")
    ap.add_argument("--pings", type=int, default=2000)
    ap.add_argument("--no-verify", action="store_true",
                    help="serve with --store-verify=false (no CRC32C check of slab hits beside the tier's load copies)")
    args = ap.parse_args(argv)
    args.tokens -= args.tokens % args.block_tokens

    tmp = tempfile.mkdtemp(prefix="kvtier-bvt-")
    proc = None
    bench = None
    try:
        binary = kvtier_binary(args.kvtier, tmp, REPO)
        nblocks = args.tokens // args.block_tokens
        per_step = args.requests * nblocks
        row = args.row_kib * 1024
        if args.kinds == 1:
            payloads = "    - {name: kv, page_bytes: %d}" % row
        else:
            payloads = "\n".join("    - {name: %s, page_bytes: %d}" % (k, row // 2) for k in KINDS)
        # The slab holds three steps' pages (on /dev/hugepages when it has
        # them free, else shm): the store steps cycle through it.
        slab_pages = per_step * 3
        stack = STACK % {"tokens": args.block_tokens, "payloads": payloads, "slab": slab_pages * row,
                         "l3": slab_pages * row * 4}
        proc, sock = start_serve(binary, tmp, stack, ["--store-verify=false"] if args.no_verify else [])
        bench = Bench(args, sock)
        tier = bench.tier

        print("kvtier.vllm_tier bench: %d requests x %d tokens, %d-token blocks (%d keys a step), rows of %d KiB, "
              "slab of %d MiB on %s; vLLM interface: %s; load average %s" % (
                  args.requests, args.tokens, args.block_tokens, per_step, row >> 10, (slab_pages * row) >> 20,
                  tier._sess.slab_backing if tier._sess else "?",
                  "stand-in (tests/standin)" if STANDIN else "installed vllm", " ".join(
                      "%.2f" % x for x in os.getloadavg())))

        # The hit set: stored once (the tier then knows it: True).
        hitset = bench.requests("hit")
        bench.store(hitset, 0)
        if bench.drain():
            raise RuntimeError("storing the hit set failed: %s" % dict(tier.counters))
        for k in ("load_copy_s", "load_bytes", "store_copy_s", "store_bytes"):
            tier.counters[k] = 0

        # The Ping is timed just before each timed step, in the same
        # conditions (serve may still be checksumming and writing through
        # the last step's pages).
        per = max(1, args.pings // (3 * args.steps))
        hit, first, store = [], [], []
        pings = {"hit": [], "first": [], "store": []}
        unstored = 0
        for s in range(args.steps):
            pings["hit"] += bench.ping(per)
            hit.append(bench.hit(hitset, (s % 2) * per_step))
            if bench.drain():
                raise RuntimeError("a load failed: %s" % dict(tier.counters))
        for s in range(args.steps):
            reqs = bench.requests("first%d" % s)
            pings["first"] += bench.ping(per)
            first.append(bench.first(reqs))
            bench.settle(reqs)  # every scan resolved (a miss) before the store step
            pings["store"] += bench.ping(per)
            store.append(bench.store(reqs, 0))
            unstored += bench.drain()

        def row_of(name, xs):
            med, ping = statistics.median(xs), statistics.median(pings[name])
            return "  %-5s step: median %8.1f us (max %8.1f us); Ping before it: median %6.1f us; ratio %5.2fx" % (
                name, med * 1e6, max(xs) * 1e6, ping * 1e6, med / ping)

        print("scheduler-side cost per step against an empty call (Ping) on the tier's channel, %d steps each:" % (
            args.steps))
        print(row_of("hit", hit))
        print(row_of("first", first))
        print(row_of("store", store))
        if unstored:
            print("  (%d store jobs not wholly stored: the slab was full of pages not yet written through)" % unstored)
        print("  per lookup (hit step, %d lookups + %d submit_load): %.3f us a call" % (
            per_step, args.requests, statistics.median(hit) / (per_step + args.requests) * 1e6))

        c = tier.counters
        base = memcpy_gbps(per_step * row)
        queued = {w: (c[w + "_bytes"], c[w + "_copy_s"]) for w in ("load", "store")}
        # The copies of one request's blocks at a time (one job), each
        # right after a memcpy of the same number of bytes between two
        # buffers faulted in long before (not in cache), so both see the
        # same moment of this machine; serve is idle between jobs.
        spaced = {"load": [0, 0.0, 0.0], "store": [0, 0.0, 0.0]}
        jb = nblocks * row
        ring_a = torch.empty(per_step * row, dtype=torch.uint8)
        ring_b = torch.empty(per_step * row, dtype=torch.uint8)
        ring_a.fill_(1)
        ring_b.fill_(2)
        reqs = bench.requests("copy")
        for what, blocks_at in (("store", 0), ("load", per_step)):
            for i, (ctx, keys) in enumerate(reqs):
                t0 = time.perf_counter()
                ctypes.memmove(ring_b.data_ptr() + i * jb, ring_a.data_ptr() + i * jb, jb)
                spaced[what][2] += time.perf_counter() - t0
                b0, s0 = c[what + "_bytes"], c[what + "_copy_s"]
                blocks = range(blocks_at + i * nblocks, blocks_at + (i + 1) * nblocks)
                job = bench.jobmeta(keys, blocks, what == "load", ctx)
                (tier.submit_load if what == "load" else tier.submit_store)(job)
                if bench.drain():
                    raise RuntimeError("a spaced %s failed: %s" % (what, dict(c)))
                spaced[what][0] += c[what + "_bytes"] - b0
                spaced[what][1] += c[what + "_copy_s"] - s0
                time.sleep(0.1)  # serve checksums and writes the job's pages through
        if not torch.equal(bench.primary[:per_step], bench.primary[per_step:2 * per_step]):
            raise RuntimeError("the loaded rows differ from the stored ones")
        print("copies (the tier's threads: plan from serve's spans, then memmove primary row <-> slab span):")
        for what in ("load", "store"):
            nbytes, secs, mc = spaced[what]
            gbps, mgbps = nbytes / secs / 1e9, nbytes / mc / 1e9
            print("  %-5s one job at a time: %6.2f GB/s over %4d MiB; a memcpy of each job's %d MiB just before "
                  "it: %6.2f GB/s; ratio %.2fx" % (what, gbps, nbytes >> 20, jb >> 20, mgbps, gbps / mgbps))
        for what in ("load", "store"):
            nbytes, secs = queued[what]
            if secs:
                gbps = nbytes / secs / 1e9
                print("  %-5s jobs queued (the steps above): %6.2f GB/s over %5d MiB; against one memcpy of %d MiB "
                      "(%.2f GB/s) %.2fx" % (what, gbps, nbytes >> 20, (per_step * row) >> 20, base, gbps / base))
        print("  tier counters: %s" % {k: (round(v, 3) if isinstance(v, float) else v) for k, v in sorted(c.items())})
    finally:
        if bench is not None:
            bench.tier.shutdown()
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
