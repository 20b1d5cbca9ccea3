"""Benchmark of kvtier.vllm.KvtierConnector, vLLM's KV connector over the
store door, against a real ``kvtier serve --doors store``.

    cd clients/python && /usr/bin/python3 -m kvtier.bench_vllm

It reports, each as a ratio to a limit measured in the same run:

- scheduler: the connector's calls on vLLM's scheduler thread in one step,
  for --requests requests of --tokens tokens (blocks of 16), against one
  empty call (Ping) on the connector's own channel to the same socket
  (target <= 3x). The steps, as vLLM's scheduler makes them:
    arrive:  on_new_request and get_num_new_matched_tokens (None: the
             lookup is out) for every request, build_connector_meta;
    miss:    get_num_new_matched_tokens (0) for every request,
             build_connector_meta with every request's prompt scheduled
             (every block planned as a save);
    hit:     get_num_new_matched_tokens (a hit), update_state_after_alloc
             for every request, build_connector_meta (every block planned
             as a load);
    decode:  build_connector_meta with every request decoding one token;
    finish:  request_finished for every request.
  The lookups themselves (BatchExists) run on the connector's lookup
  threads between steps; their time is reported beside, not counted.
- copies: the worker's load and save copies (one memmove per block, layer
  and kind between vLLM's KV tensors and the mapped slab) in GB/s, against
  one torch copy_ of the same number of bytes between two buffers already
  faulted in (target >= 0.7x). --blocks blocks (125: one 2,000-token
  request) of a model of --layers layers, --heads KV heads of --head-dim
  (bfloat16); block ids in order (a fresh request's) and shuffled (a
  fragmented cache's).
- overlap: the step time of a CPU engine (tests/vllmhelp.py: the
  connector called as vLLM's scheduler and worker call it, the forward's
  accelerator time an idle wait of --compute-ms; with --device cuda the
  KV cache is on the GPU and the forward a kernel that spins as long,
  the host waiting for it) decoding --decoders
  requests, while --loaders other requests wait on their prefixes coming
  back from L3 (serve restarted: its slab empty, the pages in l3disk;
  None while serve's prefetch reloads them, then asynchronous loads),
  --overlap-rounds groups of them one after the other, against the steps
  of the same decoders with no load pending (target <= 1.0x: an L3 load
  does not slow the step down). A step counts as one with loads pending
  when it schedules the decoders alone while a group waits; the step
  that schedules the loaded requests (their first token, and the test
  engine's check of every position they loaded) is reported beside.

It uses the stand-in vLLM interface of the tests (clients/python/tests)
and needs a kvtier binary: --kvtier, else ``kvtier`` on PATH, else it
builds one with ``go build``.
"""

import argparse
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
TESTS = os.path.join(HERE, "..", "tests")
# The stand-in vLLM interface and the tests' engine (tests/vllmhelp.py).
sys.path[:0] = [os.path.join(TESTS, "standin"), TESTS]

import torch  # noqa: E402

import vllmhelp as vh  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheBlocks  # noqa: E402
from vllm.v1.core.kv_cache_utils import KVCacheBlock  # noqa: E402
from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput  # noqa: E402

from kvtier.store.v1 import store_pb2 as pb  # noqa: E402
from kvtier._serveproc import kvtier_binary, wait_listening  # noqa: E402
from kvtier.vllm import KvtierConnector, KvtierMetadata  # noqa: E402
from kvtier._storeclient import native_sums as _native_sums  # noqa: E402


class Req:
    """What the connector reads of a vLLM request."""

    def __init__(self, rid, hashes, ntokens):
        self.request_id, self.block_hashes, self.num_tokens = rid, hashes, ntokens
        self.num_publishable_block_hashes = len(hashes)


def connector_thread_cpu():
    """CPU seconds so far of this process's connector threads, by role
    (the lookup threads together, the load thread, the save thread), from
    /proc/self/task (Linux; empty elsewhere)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        name = names.get(int(tid), "")
        if name.startswith("kvtier-lookup"):
            role = "lookups"
        elif name in ("kvtier-load", "kvtier-save"):
            role = name[len("kvtier-"):]
        else:
            continue
        try:
            with open("/proc/self/task/%s/stat" % tid) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[role] = out.get(role, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def med(xs):
    return statistics.median(xs)


def span(xs, fmt="%.2f"):
    return (fmt + "-" + fmt) % (min(xs), max(xs))


# --serve-cpus: serve runs on these CPUs (taskset), this process on the others.
SERVE_CPUS = ""


class Serve:
    """``kvtier serve --doors store`` with a stack of its own."""

    def __init__(self, binary, data, yaml_text, extra=()):
        self.binary, self.data, self.extra = binary, data, list(extra)
        os.makedirs(data, exist_ok=True)
        self.cfg = data.rstrip("/") + "-store.yaml"
        with open(self.cfg, "w") as f:
            f.write(yaml_text)
        self.sockdir = tempfile.mkdtemp(prefix="kvbv-")
        self.sock = os.path.join(self.sockdir, "s.sock")
        self.proc = None

    def start(self):
        log = open(self.data.rstrip("/") + "-serve.log", "ab")
        pin = ["taskset", "-c", SERVE_CPUS] if SERVE_CPUS else []
        self.proc = subprocess.Popen(pin + [self.binary, "serve", "--doors", "store", "--store-config", self.cfg,
                                      "--data-dir", self.data, "--socket", self.sock, "--log-level", "warn",
                                      "--store-lease", "5s"] + self.extra, stdout=subprocess.DEVNULL, stderr=log)
        wait_listening(self.proc, self.sock, 60, log.name)

    def cpu_s(self):
        with open("/proc/%d/stat" % self.proc.pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def wait_idle(self, quiet=0.15, timeout=30):
        """Until serve used no CPU for `quiet` seconds (its checksums and
        write-through of what was just set are done)."""
        deadline = time.monotonic() + timeout
        last = self.cpu_s()
        while time.monotonic() < deadline:
            time.sleep(quiet)
            now = self.cpu_s()
            if now - last < 0.01:
                return
            last = now

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def serve(binary, tmp, name, kinds, slab_pages, l3_mib, extra=()):
    s = Serve(binary, os.path.join(tmp, name), vh.store_yaml(kinds, slab_pages, l3_mib=l3_mib), extra)
    s.start()
    return s


def wait_finished(conn, send=None, recv=None, timeout=60):
    deadline = time.monotonic() + timeout
    s, r = set(), set()
    while (send and send - s) or (recv and recv - r):
        a, b = conn.get_finished(send or set())
        s |= a or set()
        r |= b or set()
        if time.monotonic() > deadline:
            raise TimeoutError("saves %s / loads %s not finished" % (send - s if send else (), recv - r if recv else ()))
        time.sleep(0.005)  # vLLM asks once a step


def bench_scheduler(binary, tmp, args):
    geom = vh.Geometry(layers=2, heads=1, head_dim=64)
    kb = vh.kind_bytes(1, geom)
    nblk = args.tokens // vh.BLOCK
    pages = args.requests * nblk * (args.rounds + 2) + 64
    s = serve(binary, tmp, "sched", [("k", kb), ("v", kb)], pages, 64 + (pages * 2 * kb >> 20))
    try:
        cfg = vh.vllm_config(s.sock, 1)
        kcc = vh.kv_cache_config(nblk + 8, 1, geom)
        conn = KvtierConnector(cfg, KVConnectorRole.SCHEDULER, kcc)
        stub = conn._scheduler.door.stub
        for _ in range(50):
            stub.Ping(pb.PingRequest(), timeout=5)
        pings = []
        for _ in range(400):
            t0 = time.perf_counter()
            stub.Ping(pb.PingRequest(), timeout=5)
            pings.append(time.perf_counter() - t0)
        ping = med(pings)

        # The pages the "hit" requests find: stored by a worker.
        w = vh.Worker(s.sock, 0, 1, nblk + 8, geom=geom)
        stored = []
        for i in range(args.requests):
            hs = [os.urandom(32) for _ in range(nblk)]
            w.conn.bind_connector_metadata(KvtierMetadata(saves=[("st%d" % i, hs, list(range(nblk)))]))
            w.conn.start_load_kv(None)
            w.conn.wait_for_save()
            wait_finished(w.conn, send={"st%d" % i})
            w.conn.clear_connector_metadata()
            stored.append(hs)
        ids = list(range(nblk + 1))
        blocks = KVCacheBlocks(([KVCacheBlock(b) for b in ids],))
        res = {k: [] for k in ("arrive", "miss", "hit", "decode", "finish")}
        lookup_ms = []
        for rnd in range(args.rounds):
            for kind in ("miss", "hit"):
                reqs = []
                for i in range(args.requests):
                    hs = stored[i] if kind == "hit" else [os.urandom(32) for _ in range(nblk)]
                    reqs.append(Req("%s-%d-%d" % (kind, rnd, i), hs, args.tokens))
                empty = SchedulerOutput.make_empty()
                t0 = time.perf_counter()
                for r in reqs:
                    conn.on_new_request(r)
                    got = conn.get_num_new_matched_tokens(r, 0)
                conn.build_connector_meta(empty)
                res["arrive"].append(time.perf_counter() - t0)
                # The lookups run on the connector's threads meanwhile.
                lk = conn._scheduler._lookups
                while not all(lk[r.request_id].done for r in reqs):
                    time.sleep(0.0002)
                lookup_ms.append((time.perf_counter() - t0) * 1e3)
                answers = [conn.get_num_new_matched_tokens(r, 0) for r in reqs]
                want = (args.tokens - 1 if args.tokens % vh.BLOCK == 0 else nblk * vh.BLOCK) if kind == "hit" else 0
                assert all(a[0] == want for a in answers), (kind, answers[:3], want)
                so = SchedulerOutput.make_empty()
                so.scheduled_new_reqs = [NewRequestData(r.request_id, None, [], None, None, (ids,), a[0], None)
                                         for r, a in zip(reqs, answers)]
                so.num_scheduled_tokens = {r.request_id: args.tokens - a[0] for r, a in zip(reqs, answers)}
                t0 = time.perf_counter()
                for r in reqs:
                    ext, _ = conn.get_num_new_matched_tokens(r, 0)
                    if ext:
                        conn.update_state_after_alloc(r, blocks, ext)
                meta = conn.build_connector_meta(so)
                res[kind].append(time.perf_counter() - t0)
                if kind == "hit":
                    assert sum(len(ld[2]) for ld in meta.loads) == args.requests * nblk
                else:
                    assert sum(len(sv[2]) for sv in meta.saves) == args.requests * nblk
                so = SchedulerOutput.make_empty()
                so.scheduled_cached_reqs = CachedRequestData(
                    req_ids=[r.request_id for r in reqs], resumed_req_ids=set(), new_token_ids=[], all_token_ids={},
                    new_block_ids=[None] * len(reqs), num_computed_tokens=[args.tokens] * len(reqs),
                    num_output_tokens=[1] * len(reqs))
                so.num_scheduled_tokens = {r.request_id: 1 for r in reqs}
                t0 = time.perf_counter()
                conn.build_connector_meta(so)
                res["decode"].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                for r in reqs:
                    conn.request_finished(r, ids)
                res["finish"].append(time.perf_counter() - t0)
        w.shutdown()
        conn.shutdown()
    finally:
        s.stop()
    print("scheduler side, %d requests of %d tokens (%d blocks each), %d rounds; Ping on the same socket: "
          "median %.0f us (p10 %.0f, p90 %.0f)" % (
              args.requests, args.tokens, nblk, args.rounds, ping * 1e6, sorted(pings)[len(pings) // 10] * 1e6,
              sorted(pings)[9 * len(pings) // 10] * 1e6))
    out = {}
    for k, xs in res.items():
        ratio = med(xs) / ping
        out[k] = ratio
        print("  %-7s %7.0f us a step (%s), %5.2fx Ping  [target <= 3x: %s]" % (
            k, med(xs) * 1e6, span([x * 1e6 for x in xs], "%.0f"), ratio, "met" if ratio <= 3 else "NOT met"))
    print("  lookups (on the connector's threads, not the scheduler's): all %d back %s ms after they arrived" % (
        args.requests, span(lookup_ms, "%.1f")))
    return out


def bench_copies(binary, tmp, args, verify=True):
    geom = vh.Geometry(layers=args.layers, heads=args.heads, head_dim=args.head_dim)
    kb = vh.kind_bytes(1, geom)
    n = args.blocks
    page = 2 * kb
    s = serve(binary, tmp, "copies-%s" % verify, [("k", kb), ("v", kb)], n * 3 + 8,
              64 + (n * (2 * args.rounds + 2) * page >> 20), [] if verify else ["--store-verify=false"])
    rows = {"sequential": [], "shuffled": []}
    try:
        w = vh.Worker(s.sock, 0, 1, 2 * n + 8, geom=geom, device=args.device)
        for t in w.kv.values():
            t.view(torch.int16).random_()
        rng = random.Random(1)
        nbytes = n * page
        cuda = args.device == "cuda"
        # The limit's buffers: host to host, or (CUDA) page-locked host
        # memory and the GPU, copied each way (a load's direction, a save's).
        a = torch.empty(nbytes, dtype=torch.uint8, pin_memory=cuda)
        b = torch.empty(nbytes, dtype=torch.uint8, device=args.device)
        a.random_()
        b.copy_(a)

        def memcpy():
            """(first, best) of three timed copies toward the blocks (a
            load's), then (first, best) away from them (a save's). The limit
            is the first, as the connector's copies are timed once each:
            the best of three (the limit before 2026-12-07, shown beside it)
            picked the limit's luckiest moment and set each copy's every
            moment against it. On the host both ways are one copy."""
            out = []
            for dst, src in ((b, a), (a, b)) if cuda else ((b, a),):
                dts = []
                for _ in range(3):
                    t0 = time.perf_counter()
                    dst.copy_(src, non_blocking=cuda)
                    if cuda:
                        torch.cuda.synchronize()
                    dts.append(time.perf_counter() - t0)
                out.append((dts[0], min(dts)))
            return out[0] + out[-1]

        for rnd in range(2 * args.rounds + 1):
            order = "sequential" if rnd % 2 == 0 else "shuffled"
            hs = [os.urandom(32) for _ in range(n)]
            src = list(range(n))
            dst = list(range(n, 2 * n))
            if order == "shuffled":
                rng.shuffle(src)
                rng.shuffle(dst)
            w.conn.get_kv_connector_stats()
            s.wait_idle()
            mem = [memcpy()]
            cpu0 = s.cpu_s()
            w.conn.bind_connector_metadata(KvtierMetadata(saves=[("s%d" % rnd, hs, src)]))
            w.conn.start_load_kv(None)
            w.conn.wait_for_save()
            wait_finished(w.conn, send={"s%d" % rnd})
            w.conn.clear_connector_metadata()
            s.wait_idle()  # serve checksums the pages and writes them through
            cpu1 = s.cpu_s()
            mem.append(memcpy())
            cpu2 = s.cpu_s()
            w.conn.bind_connector_metadata(KvtierMetadata(loads=[("l%d" % rnd, hs, dst, True)]))
            w.conn.start_load_kv(None)
            w.conn.wait_for_save()
            wait_finished(w.conn, recv={"l%d" % rnd})
            errors = w.conn.get_block_ids_with_load_errors()
            w.conn.clear_connector_metadata()
            s.wait_idle()
            cpu3 = s.cpu_s()
            mem.append(memcpy())
            st = w.conn.get_kv_connector_stats().data
            wrong = 0
            for name in w.names:
                for k in range(2):
                    kvk = w.kv[name][k].view(torch.int16)  # bit patterns: random bf16 has NaNs
                    wrong += int((kvk[dst] != kvk[src]).sum())
            assert not errors and wrong == 0, (errors, wrong)
            assert st["save_bytes"] == nbytes and st["load_bytes"] == nbytes, st
            if rnd == 0:
                continue  # warm-up: the slab's pages and the caches touched once
            m = nbytes / med([x[0] for x in mem])
            ms = nbytes / med([x[2] for x in mem])
            rows[order].append({"save": nbytes / st["save_copy_s"] / ms, "load": nbytes / st["load_copy_s"] / m,
                                "mem": m / 1e9, "mem_best": nbytes / min(x[1] for x in mem) / 1e9, "mem_save": ms / 1e9,
                                "save_gbps": nbytes / st["save_copy_s"] / 1e9, "load_gbps": nbytes / st["load_copy_s"] / 1e9,
                                "save_path": nbytes / st["save_s"] / 1e9, "load_path": nbytes / st["load_s"] / 1e9,
                                "save_cpu": (cpu1 - cpu0) / (nbytes / 1e9), "load_cpu": (cpu3 - cpu2) / (nbytes / 1e9)})
        w.shutdown()
    finally:
        s.stop()
    print("copies, KV cache on %s, serve %s, %d blocks of %d KiB (%d layers, %d KV heads x %d, bf16: %d KiB a "
          "block, layer and kind), %d rounds of each block order after a warm-up, 0 wrong bytes; memcpy: one torch "
          "copy_ of the same bytes%s, the median of its runs before, between and after a round's save and load; "
          "serve's CPU: seconds of serve's process a GB, the save's until serve is idle again (its checksums, if it "
          "takes them, and the write-through to L3), the load's likewise; client sums %s:" % (
              args.device,
              "checking each loaded page's CRC32C while it is copied (--store-verify, the default)" if verify
              else "with --store-verify=false (no check beside the load's copies)",
              n, page >> 10, geom.layers, geom.heads, geom.head_dim, kb // geom.layers >> 10, args.rounds,
              " (CUDA: page-locked host memory to the GPU, the load's limit; back, the save's)" if cuda else "",
              "on (kvtier.native)" if _native_sums() else "off"))
    out = {}
    for order, rs in rows.items():
        print("  block ids %s; memcpy %s GB/s (one copy each, the limit; the best of three %s GB/s)%s" % (
            order, span([r["mem"] for r in rs]), span([r["mem_best"] for r in rs]),
            "; from the GPU %s GB/s (the saves' limit)" % span([r["mem_save"] for r in rs])
            if args.device == "cuda" else ""))
        for op in ("load", "save"):
            ratios = [r[op] for r in rs]
            out[order + "-" + op] = med(ratios)
            print("    %s copies %s GB/s, %sx memcpy (median %.2fx) [target >= 0.7x: %s]; whole path with serve's "
                  "calls %s GB/s; serve's CPU %s s a GB" % (op, span([r[op + "_gbps"] for r in rs]), span(ratios),
                                                             med(ratios), "met" if med(ratios) >= 0.7 else "NOT met",
                                                             span([r[op + "_path"] for r in rs]),
                                                             span([r[op + "_cpu"] for r in rs])))
    return out


def bench_overlap(binary, tmp, args):
    geom = vh.Geometry(layers=8, heads=8, head_dim=128)
    kb = vh.kind_bytes(1, geom)
    ptoks = args.load_tokens
    nblk = -(-ptoks // vh.BLOCK) + 1
    groups = max(1, args.overlap_rounds)
    nb = (args.decoders + args.loaders) * (nblk + 4) + 64
    s = serve(binary, tmp, "overlap", [("k", kb), ("v", kb)], 4 * args.loaders * nblk + 64,
              64 + (4 * groups * args.loaders * nblk * 2 * kb >> 20))
    e = None
    try:
        e = vh.Engine(s.sock, tp=1, num_blocks=nb, inproc=True, geom=geom, compute_s=args.compute_ms / 1e3,
                      device=args.device,
                      token_budget=max(2048, ptoks * args.loaders), max_running=args.decoders + args.loaders,
                      extra={"load_mode": "async"})
        cached = [[[50000 + 100000 * g + 1000 * i + j for j in range(ptoks)] for i in range(args.loaders)]
                  for g in range(groups)]
        for g, group in enumerate(cached):
            for i, p in enumerate(group):
                e.add("store%d-%d" % (g, i), p, 1)
            e.run(timeout=300)
        time.sleep(1.0)  # the write-through to l3disk
        worker_door = e.workers[0].conn._worker.door
        regs = worker_door.registrations
        s.stop()
        s.start()  # a new slab: the pages are in L3 only
        decoders = [[7 + 3 * i + j for j in range(vh.BLOCK * 2 + 5)] for i in range(args.decoders)]
        dec_ids = {"dec%d" % i for i in range(args.decoders)}
        for i, p in enumerate(decoders):
            e.add("dec%d" % i, p, (groups + 1) * (args.steps * 3 + 64))

        def timed_step():
            t0 = time.perf_counter()
            so = e.step()
            return so, time.perf_counter() - t0

        def decode_only(so):
            sched = so.num_scheduled_tokens
            return bool(sched) and set(sched) == dec_ids and all(v == 1 for v in sched.values())

        base, pending, joined = [], [], []
        launch = {"base": [], "loads": []}  # the engine thread's launch of each counted step
        load_wall = []  # a group's time from its arrival to the start of the step that schedules it
        # The connector's threads' CPU over each phase, and the phase's steps.
        cpu = {"base": {}, "loads": {}}
        nsteps = {"base": 0, "loads": 0}

        def account(phase, before, steps):
            for k, v in connector_thread_cpu().items():
                cpu[phase][k] = cpu[phase].get(k, 0.0) + v - before.get(k, 0.0)
            nsteps[phase] += steps

        sc = e.sched
        exists = 0  # serve's BatchExists calls during the groups' lookups and loads

        def exists_calls():
            return e.conn._scheduler.door.call("Stats", lambda s, b: pb.StatsRequest(session=s, boot_id=b))[0].exists_calls

        # The worker registers again with the new serve at its first call
        # (its first save) and maps and pre-faults the new slab: seconds
        # of CPU on its save thread, not a step's cost: wait it out.
        deadline = time.monotonic() + 120
        while worker_door.registrations == regs and time.monotonic() < deadline:
            so, _ = timed_step()
            if not so.num_scheduled_tokens:
                time.sleep(0.0005)
        for g in range(groups + 1):
            # Steps of the decoders alone, nothing pending (the first few
            # after a group joined warm up again).
            n, steps, deadline, before = 0, 0, time.monotonic() + 120, connector_thread_cpu()
            while n < args.steps and time.monotonic() < deadline:
                so, dt = timed_step()
                steps += 1
                if decode_only(so):
                    n += 1
                    if n > 3:
                        base.append(dt)
                        launch["base"].append(e.workers[0].launch)
                elif not so.num_scheduled_tokens:
                    time.sleep(0.0005)
            account("base", before, steps)
            if g == groups:
                break
            ids = {"load%d-%d" % (g, i) for i in range(args.loaders)}
            for i, p in enumerate(cached[g]):
                e.add("load%d-%d" % (g, i), p, 1)
            # Steps while the group's prefixes are looked up and loaded
            # from L3: the decoders alone are scheduled. The step that
            # schedules the loaded requests is theirs (their first token,
            # and the test engine's check of every loaded position), not
            # one with loads pending: reported beside.
            deadline, steps, before, calls = time.monotonic() + 120, 0, connector_thread_cpu(), exists_calls()
            t_add, njoined = time.perf_counter(), len(joined)
            while ids & {r.request_id for r in sc.waiting} and time.monotonic() < deadline:
                started = time.perf_counter()
                so, dt = timed_step()
                steps += 1
                if decode_only(so):
                    pending.append(dt)
                    launch["loads"].append(e.workers[0].launch)
                elif ids & set(so.num_scheduled_tokens):
                    if len(joined) == njoined:
                        load_wall.append(started - t_add)
                    joined.append(dt)
            account("loads", before, steps)
            exists += exists_calls() - calls
            while any(r.request_id in ids for r in sc.running) and time.monotonic() < deadline:
                so, dt = timed_step()
                if ids & set(so.num_scheduled_tokens):
                    joined.append(dt)
        st = e.stats.data if e.stats else {}
        loaded = st.get("load_blocks", 0)
        if not pending or not base:
            raise RuntimeError("no steps measured (%d without loads, %d with): %s" % (len(base), len(pending), st))
        e.run(timeout=300)
        for g, group in enumerate(cached):
            for i, p in enumerate(group):
                assert e.outputs["load%d-%d" % (g, i)] == vh.expected_output(p, 1)
        assert e.wrong_used == 0
    finally:
        if e is not None:
            e.close()
        s.stop()
    ratio = med(pending) / med(base)
    print("overlap: %d decoders, KV cache on %s, forward's accelerator time %.0f ms (%s); %d rounds of %d requests "
          "of %d tokens whose prefixes come back from L3 (%d blocks of %d KiB loaded):" % (
              args.decoders, args.device, args.compute_ms,
              "an idle wait" if args.device == "cpu" else "a kernel spinning that long, the host waiting for it",
              groups, args.loaders, ptoks, loaded, 2 * kb >> 10))
    print("  step with no load pending: median %.1f ms (%d steps, %s); with L3 loads pending (the decoders alone "
          "scheduled while the loads run): median %.1f ms (%d steps, %s): %.2fx [target <= 1.0x: %s]" % (
              med(base) * 1e3, len(base), span([x * 1e3 for x in base], "%.1f"), med(pending) * 1e3, len(pending),
              span([x * 1e3 for x in pending], "%.1f"), ratio, "met" if ratio <= 1.0 else "NOT met"))
    print("  a group from its arrival to the step that schedules it (its lookups and loads): median %.0f ms (%s); BatchExists calls "
          "while the groups were looked up and loaded: %d (%d requests)" % (
              med(load_wall) * 1e3, span([x * 1e3 for x in load_wall], "%.0f"), exists, groups * args.loaders))
    for phase, what in (("base", "no load pending"), ("loads", "loads pending")):
        n = max(1, nsteps[phase])
        print("  the connector's background threads' CPU a step, %s (%d steps): %s" % (
            what, nsteps[phase], ", ".join("%s %.2f ms" % (k, v * 1e3 / n) for k, v in sorted(cpu[phase].items()))
            or "-"))
    print("  the engine thread's launch of a step (the test engine's host work before the forward's idle wait), "
          "medians, wall / on a CPU / runnable waiting for one: no load pending %s; loads pending %s" % tuple(
              " / ".join("%.2f ms" % (med([x[i] for x in launch[ph]]) * 1e3) for i in range(3))
              for ph in ("base", "loads")))
    if joined:
        print("  steps that schedule the loaded requests (their first token and the test engine's check of "
              "every loaded position, no target): median %.1f ms (%d steps, %s)" % (
                  med(joined) * 1e3, len(joined), span([x * 1e3 for x in joined], "%.1f")))
    return {"overlap": ratio}


def _cpus(spec):
    out = set()
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kvtier", help="the kvtier binary (default: kvtier on PATH, else go build)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=2000)
    ap.add_argument("--blocks", type=int, default=125)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--decoders", type=int, default=8)
    ap.add_argument("--loaders", type=int, default=8)
    ap.add_argument("--load-tokens", type=int, default=512)
    ap.add_argument("--compute-ms", type=float, default=20.0)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--overlap-rounds", type=int, default=3,
                    help="overlap: groups of --loaders requests loaded from L3 one after the other")
    ap.add_argument("--only", choices=("scheduler", "copies", "overlap"))
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                    help="copies and overlap: the test engine's KV cache on this device (cuda: the connector's "
                         "GPU path, scripts/gpu-check.sh)")
    ap.add_argument("--serve-cpus", default="",
                    help="run serve on these CPUs (taskset list, e.g. 1) and this process on the others")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device")
    global SERVE_CPUS
    SERVE_CPUS = args.serve_cpus
    if SERVE_CPUS:
        mine = set(range(os.cpu_count())) - _cpus(SERVE_CPUS)
        if not mine:
            raise SystemExit("--serve-cpus %s leaves no CPU for this process" % SERVE_CPUS)
        os.sched_setaffinity(0, mine)
    tmp = tempfile.mkdtemp(prefix="kvtier-bench-vllm-")
    try:
        binary = kvtier_binary(args.kvtier, tmp, REPO)
        print("kvtier.bench_vllm: load average %s, %d CPUs, torch %s (%d threads)%s" % (
            " ".join("%.2f" % x for x in os.getloadavg()), os.cpu_count(), torch.__version__, torch.get_num_threads(),
            "; serve on CPUs %s, this process on %s" % (SERVE_CPUS, sorted(os.sched_getaffinity(0)))
            if SERVE_CPUS else ""))
        if args.only in (None, "scheduler"):
            bench_scheduler(binary, tmp, args)
        if args.only in (None, "copies"):
            bench_copies(binary, tmp, args, verify=True)
            bench_copies(binary, tmp, args, verify=False)
        if args.only in (None, "overlap"):
            bench_overlap(binary, tmp, args)
        print("load average at the end %s" % " ".join("%.2f" % x for x in os.getloadavg()))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
