"""kvtier.sglang.KvtierStorage against a real ``kvtier serve --doors store``
(a small store stack: an shm slab, a real l3disk with LMDB), driven as
SGLang's cache controller drives a storage backend, on host pools of
SGLang's shape (MHA and MLA, layer_first and page_first). Every page read
back is compared byte for byte with the bytes its key was written with."""

import multiprocessing as mp
import os
import threading
import time

import pytest
import torch

from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName, PoolTransfer
from sglang.srt.metrics.collector import StorageMetrics

from kvtier import native
from kvtier.sglang import KvtierError, KvtierStorage
from kvtier.store.v1 import store_pb2 as pb
from sglhelp import KIND_BYTES, Controller, HostPool, HugeMount, Serve, chain_keys, page_data, storage_config, store_yaml

LAYOUTS = ("layer_first", "page_first")


def start_serve(kvtier_bin, tmp_path, mla, slab_pages, name="data", lease="2s", mount=None, l3_mib=64, **geometry):
    s = Serve(kvtier_bin, str(tmp_path / name),
              store_yaml(("kv",) if mla else ("k", "v"), slab_pages, mount=mount, l3_mib=l3_mib, **geometry), lease=lease)
    s.start()
    return s


@pytest.fixture(params=[False, True], ids=["mha", "mla"])
def mla(request):
    return request.param


@pytest.fixture
def serve(kvtier_bin, tmp_path, mla):
    s = start_serve(kvtier_bin, tmp_path, mla, 256)
    yield s
    s.stop()


def backend(sock, pool, mla=False, v1=True, tp_rank=0, tp_size=1, **extra):
    cfg = dict(extra)
    cfg.update({"backend_name": "kvtier", "module_path": "kvtier.sglang", "class_name": "KvtierStorage",
                "socket": sock, "timeout_s": extra.get("timeout_s", 5)})
    if v1:
        cfg["interface_v1"] = 1
    b = KvtierStorage(storage_config(tp_rank=tp_rank, tp_size=tp_size, mla=mla, layout=pool.layout, extra=cfg), {})
    b.register_mem_pool_host(pool)
    return b


def fill(pool, keys, slots, salt):
    for k, s in zip(keys, slots):
        pool.fill(s, page_data(k, salt, pool.page_bytes()))


def wrong_pages(pool, keys, slots, salt):
    return [k for k, s in zip(keys, slots) if not torch.equal(pool.read(s), page_data(k, salt, pool.page_bytes()))]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_controller_roundtrip(serve, mla, layout):
    """Backup thread writes 160 pages (two SGLang batches) with
    batch_set_v1; the prefetch thread counts them with batch_exists and
    reads them into other slots with batch_get_v1; a second rank without
    "interface_v1" (the generic get/set path) reads the same pages and
    writes its own, which the v1 rank reads: both paths lay a page out
    alike in the slab."""
    n = 160
    pool = HostPool(mla, layout, pages=2 * n + 8)
    b = backend(serve.sock, pool, mla)
    c = Controller(b, pool, v1=True)
    keys = chain_keys("rt-%s-%s" % (mla, layout), n)
    fill(pool, keys, range(n), 0)
    assert Controller.wait(c.backup(keys, pool.slot_indices(range(n)))) == n
    dst = list(range(n, 2 * n))
    assert Controller.wait(c.prefetch(keys, pool.slot_indices(dst))) == n
    assert wrong_pages(pool, keys, dst, 0) == []
    # A page beyond the stored ones ends the prefix.
    assert b.batch_exists(keys[:5] + chain_keys("absent", 1) + keys[5:7]) == 5

    pool2 = HostPool(mla, layout, pages=2 * n + 8)
    g = backend(serve.sock, pool2, mla, v1=False)
    c2 = Controller(g, pool2, v1=False)
    assert Controller.wait(c2.prefetch(keys, pool2.slot_indices(range(n)))) == n
    assert wrong_pages(pool2, keys, range(n), 0) == []
    keys2 = chain_keys("rt2-%s-%s" % (mla, layout), 20)
    fill(pool2, keys2, range(n, n + 20), 0)
    assert Controller.wait(c2.backup(keys2, pool2.slot_indices(range(n, n + 20)))) == 20
    assert Controller.wait(c.prefetch(keys2, pool.slot_indices(range(0, 20)))) == 20
    assert wrong_pages(pool, keys2, range(20), 0) == []
    assert c.errors == [] and c2.errors == []

    st = b.get_stats()
    assert isinstance(st, StorageMetrics)
    assert sum(st.backup_pgs) == n and sum(st.prefetch_pgs) == n + 20
    assert all(x > 0 for x in st.prefetch_bandwidth + st.backup_bandwidth)
    assert b.get_stats().prefetch_pgs == []  # since the last call
    ds = b.door_stats()
    assert ds["stored_pages"] >= n + 20 and ds.get("corrupt_pages", 0) == 0

    assert b.clear()
    assert b.batch_exists(keys) == 0 and g.batch_exists(keys2) == 0
    c.stop()
    c2.stop()
    b.close()
    g.close()


def test_namespaces_per_rank(kvtier_bin, tmp_path):
    """MHA: each TP rank its own pages; MLA: TP ranks share (rank 0 backs
    up, rank 3 reads); PP and CP ranks, another model revision and another
    KV dtype never share."""
    s = start_serve(kvtier_bin, tmp_path, True, 64)
    try:
        pools = [HostPool(True, "page_first", pages=8) for _ in range(3)]
        r0 = backend(s.sock, pools[0], True, tp_rank=0, tp_size=4)
        r3 = backend(s.sock, pools[1], True, tp_rank=3, tp_size=4)
        keys = chain_keys("mla-share", 4)
        fill(pools[0], keys, range(4), "mla")
        assert r0.batch_set_v1(keys, pools[0].slot_indices(range(4))) == [True] * 4
        assert r3.batch_exists(keys) == 4
        assert r3.batch_get_v1(keys, pools[1].slot_indices(range(4, 8))) == [True] * 4
        assert wrong_pages(pools[1], keys, range(4, 8), "mla") == []
        cfg = storage_config(tp_rank=0, tp_size=4, mla=True, pp_rank=1, pp_size=2,
                             extra={"socket": s.sock, "interface_v1": 1})
        pp = KvtierStorage(cfg, {})
        pp.register_mem_pool_host(pools[2])
        assert pp.batch_exists(keys) == 0
        cfg = storage_config(tp_rank=0, tp_size=4, mla=True, cp_rank=1, cp_size=2, extra={"socket": s.sock})
        cp = KvtierStorage(cfg, {})
        cp.register_mem_pool_host(pools[2])
        assert cp.batch_exists(keys) == 0
        rev = backend(s.sock, pools[2], True, tp_rank=0, tp_size=4, model_revision="other")
        assert rev.batch_exists(keys) == 0
        fp8 = backend(s.sock, pools[2], True, tp_rank=0, tp_size=4, kv_cache_dtype="float8_e5m2")
        assert fp8.batch_exists(keys) == 0
        for b in (r0, r3, pp, cp, rev, fp8):
            b.close()
    finally:
        s.stop()
    s = start_serve(kvtier_bin, tmp_path, False, 64, name="mha")
    try:
        pa, pb_ = HostPool(False, "page_first", pages=4), HostPool(False, "page_first", pages=4)
        t0 = backend(s.sock, pa, tp_rank=0, tp_size=2)
        t1 = backend(s.sock, pb_, tp_rank=1, tp_size=2)
        keys = chain_keys("mha-own", 2)
        fill(pa, keys, range(2), 0)
        assert t0.batch_set_v1(keys, pa.slot_indices(range(2))) == [True, True]
        assert t1.batch_exists(keys) == 0
        t0.close()
        t1.close()
    finally:
        s.stop()


# The 8-rank test's geometry: a page of 64 tokens and 8 layers, 1 MiB per
# rank (MHA: 4 heads of 128 dims a rank, k and v of 512 KiB; MLA: one
# 1024-dim latent kind of 1 MiB): pages no larger than a small model's at
# TP 8 (a 70B model's MHA page is 2.5 MiB a rank, DeepSeek-V3's MLA page
# 4.3 MiB), so the figure is the data path's, not the call overhead of
# 4 MiB batches.
TP8_TOKENS, TP8_HEAD_DIM, TP8_MLA_DIM = 64, 128, 1024


def tp8_kind_bytes(mla):
    return TP8_TOKENS * 8 * (TP8_MLA_DIM if mla else 4 * TP8_HEAD_DIM) * 2


def tp_rank_main(sock, rank, ranks, mla, n, rounds, batch, barrier, q):
    """One SGLang TP rank in its own process: back up n pages of its own
    (MHA: its heads' bytes; MLA: rank 0 only, as SGLang does), read every
    page back and verify it; then the timed phase: rounds x (batch_set_v1
    then batch_get_v1 of batch fresh pages), and the same bytes moved by
    torch copies, every rank at once (barriers)."""
    try:
        torch.set_num_threads(1)
        pool = HostPool(mla, "page_first", pages=n + 2 * batch, page_size=TP8_TOKENS, head_dim=TP8_HEAD_DIM,
                        kv_dim=TP8_MLA_DIM)
        b = backend(sock, pool, mla, tp_rank=rank, tp_size=ranks)
        salt = "mla" if mla else rank
        keys = chain_keys("tp8-%s" % mla, n)
        if not mla or rank == 0:
            fill(pool, keys, range(n), salt)
            assert all(b.batch_set_v1(keys, pool.slot_indices(range(n))))
        barrier.wait()
        pool.kv_buffer.zero_()
        got = b.batch_get_v1(keys, pool.slot_indices(range(n)))
        wrong = len(wrong_pages(pool, [k for k, ok in zip(keys, got) if ok], [i for i, ok in enumerate(got) if ok], salt))
        hits = sum(got)
        pb_ = pool.page_bytes()
        src, dst = pool.slot_indices(range(n, n + batch)), pool.slot_indices(range(n + batch, n + 2 * batch))
        fill(pool, chain_keys("warm", batch), range(n, n + batch), rank)
        moved = t_set = 0
        ks = chain_keys("warmup-%s-%d" % (mla, rank), batch)  # slab pages touched once, untimed
        b.batch_set_v1(ks, src)
        b.batch_get_v1(ks, dst)
        barrier.wait()
        t0 = time.perf_counter()
        for r in range(rounds):
            ks = chain_keys("perf-%s-%d-%d" % (mla, rank, r), batch)
            t1 = time.perf_counter()
            moved += sum(b.batch_set_v1(ks, src)) * pb_
            t_set += time.perf_counter() - t1
            moved += sum(b.batch_get_v1(ks, dst)) * pb_
        t_kv = time.perf_counter() - t0
        barrier.wait()
        a = torch.empty(batch * pb_, dtype=torch.uint8)
        c = torch.empty(batch * pb_, dtype=torch.uint8)
        a.copy_(pool.kv_buffer.view(-1).view(torch.uint8)[:batch * pb_])
        c.copy_(a)  # touched once, untimed
        t0 = time.perf_counter()
        for r in range(rounds):
            c.copy_(a)
            a.copy_(c)
        t_mem = time.perf_counter() - t0
        b.close()
        q.put((rank, hits, wrong, moved, t_kv, 2 * rounds * batch * pb_, t_mem, None, t_set))
    except BaseException as e:  # reported, never hidden
        q.put((rank, 0, 0, 0, 0, 0, 0, repr(e), 0))


@pytest.mark.parametrize("mla_tp", [False, True], ids=["mha", "mla"])
def test_eight_tp_ranks(kvtier_bin, tmp_path, mla_tp):
    """8 client processes (spawn), one per TP rank, against one serve:
    every page read back verified; the 8 together against the same
    processes' torch copies of the same bytes, in parallel."""
    ranks, n, rounds, batch = 8, 8, 3, 64
    # A slab that holds every page of the run (8 x (8 + 64 + 64 + 3 x
    # 64), 2.6 GiB): the sets measure the door, not waits for the L3 to
    # make room.
    # On hugetlbfs where the machine allows: the 8 fresh processes' first
    # writes through their maps of the shm fallback measure the VM's page
    # faults, not kvtier.
    slab_pages = ranks * (n + 2 * batch + rounds * batch)
    kind_bytes = tp8_kind_bytes(mla_tp)
    huge = HugeMount(slab_pages * (1 if mla_tp else 2) * kind_bytes >> 20)
    if huge.path is None:
        print("\nno hugetlbfs (%s): the slab is on the shm fallback" % huge.why)
    try:
        s = start_serve(kvtier_bin, tmp_path, mla_tp, slab_pages, mount=huge.path,
                        kind_bytes=kind_bytes, page_tokens=TP8_TOKENS)
    except BaseException:
        huge.close()
        raise
    try:
        ctx = mp.get_context("spawn")
        q, barrier = ctx.Queue(), ctx.Barrier(ranks)
        procs = [ctx.Process(target=tp_rank_main, args=(s.sock, r, ranks, mla_tp, n, rounds, batch, barrier, q))
                 for r in range(ranks)]
        for p in procs:
            p.start()
        res = [q.get(timeout=240) for _ in procs]
        for p in procs:
            p.join(30)
    finally:
        s.stop()
        huge.close()
    errs = [r for r in res if r[7]]
    assert errs == []
    assert sum(r[2] for r in res) == 0, "wrong pages"
    assert all(r[1] == n for r in res), [(r[0], r[1]) for r in res]
    kv = sum(r[3] for r in res) / max(r[4] for r in res)
    mem = sum(r[5] for r in res) / max(r[6] for r in res)
    assert sum(r[3] for r in res) > 0
    print("\nkvtier.sglang %s: 8 ranks together %.2f GB/s (batch_set_v1 + batch_get_v1, pages of %d KiB, "
          "batches of %d; set %.0f%% of the time), their torch copies of the same bytes in parallel %.2f GB/s: "
          "%.2fx memcpy" % ("MLA" if mla_tp else "MHA", kv / 1e9, (kind_bytes >> 10) * (1 if mla_tp else 2), batch,
                            100 * sum(r[8] for r in res) / sum(r[4] for r in res), mem / 1e9, kv / mem))


def test_serve_killed_under_load(kvtier_bin, tmp_path):
    """SIGKILL serve while the controller's threads back up and prefetch:
    every call answers within its deadline, no exception reaches the
    threads; after the restart the backend registers again by itself, the
    pages that were durable (in L3) are found again, 0 wrong bytes."""
    # An L3 of 128 MiB (about 900 pages) holds every page this test
    # writes, the pressure rounds below included: none of the durable
    # pages leaves the L3 for room.
    s = start_serve(kvtier_bin, tmp_path, False, 160, l3_mib=128)
    pool = HostPool(False, "page_first", pages=300)
    b = backend(s.sock, pool, timeout_s=2, register_retry_s=0.2)
    c = Controller(b, pool, v1=True)
    try:
        durable = chain_keys("durable", 40)
        fill(pool, durable, range(40), 0)
        assert Controller.wait(c.backup(durable, pool.slot_indices(range(40)))) == 40
        # More pages than the slab holds: the durable ones are evicted to
        # L3 once the store has them (a page is evictable only then).
        more = chain_keys("more", 200)
        fill(pool, more, range(40, 240), 1)
        for i in range(0, 200, 50):
            Controller.wait(c.backup(more[i:i + 50], pool.slot_indices(range(40 + i, 90 + i))))
        # A page leaves the slab only when a set needs its slot, and only
        # once the store has it. On a slow disk the durable pages' spills
        # may still run while the sets above look for room: they then
        # evict later pages, or answer NO_SPACE, and the durable pages
        # stay in the slab. Sets of fresh keys, a round a second (at most
        # 8), press on until every durable page was evicted.
        deadline, press, pressed_at = time.time() + 30, 0, time.time()
        while True:
            rep = b._rpc("BatchExists", lambda ss, bb: pb.ExistsRequest(session=ss, boot_id=bb, keys=durable))[0]
            if rep.present == 40 and all(t == pb.TIER_L3 for t in rep.tiers):
                break
            assert time.time() < deadline, "durable pages not in L3 within 30 s (%d pressure rounds): %s" % (
                press, [pb.Tier.Name(t) for t in rep.tiers])
            if press < 8 and time.time() - pressed_at > 1:
                ks = chain_keys("press-%d" % press, 40)
                fill(pool, ks, range(40, 80), 2)
                Controller.wait(c.backup(ks, pool.slot_indices(range(40, 80))))
                press, pressed_at = press + 1, time.time()
            time.sleep(0.1)

        stop = threading.Event()
        slow = []

        def load():
            i = 0
            while not stop.is_set():
                ks = chain_keys("load-%d" % (i % 4), 8)  # 32 keys: the store keeps its L3 budget
                t0 = time.monotonic()
                Controller.wait(c.backup(ks, pool.slot_indices(range(240, 248))))
                Controller.wait(c.prefetch(ks, pool.slot_indices(range(248, 256))))
                if time.monotonic() - t0 > 2 * (2 + 1):
                    slow.append(time.monotonic() - t0)
                i += 1
                time.sleep(0.01)

        th = threading.Thread(target=load)
        th.start()
        time.sleep(0.5)
        s.kill()
        # serve away: misses and False within the deadline.
        calls = [(lambda: b.batch_exists(durable), 0),
                 (lambda: b.batch_get_v1(durable[:4], pool.slot_indices(range(256, 260))), [False] * 4),
                 (lambda: b.batch_set_v1(durable[:4], pool.slot_indices(range(0, 4))), [False] * 4),
                 (lambda: b.get(durable[0], pool.get_dummy_flat_data_page()), None),
                 (lambda: b.batch_exists_v2(durable, []).kv_hit_pages, 0),
                 (b.door_stats, None), (b.clear, False)]
        for i, (call, want) in enumerate(calls):
            t0 = time.monotonic()
            assert call() == want, "call %d" % i
            assert time.monotonic() - t0 < 2 + 0.5, "call %d took %.2f s, timeout_s is 2" % (i, time.monotonic() - t0)
        time.sleep(0.5)
        s.start()
        deadline = time.time() + 30
        while (found := b.batch_exists(durable)) != 40:
            assert time.time() < deadline, "%d of 40 durable pages found after the restart: each %s, stats %s" % (
                found, [b.batch_exists([k]) for k in durable], b.door_stats())
            time.sleep(0.1)
        stop.set()
        th.join(60)
        pool.kv_buffer[:, 260:].zero_()
        assert Controller.wait(c.prefetch(durable, pool.slot_indices(range(260, 300)))) == 40
        assert wrong_pages(pool, durable, range(260, 300), 0) == []
        assert c.errors == [] and slow == []
        assert b.counters["registrations"] >= 2
        # The dead serve's slab (its shm file removed by the new serve) is
        # unmapped once no copy uses it: its memory is not held twice.
        with open("/proc/self/maps") as f:
            stale = [ln for ln in f if "kvtier-sglt" in ln and "(deleted)" in ln]
        assert stale == []
    finally:
        stop_c = getattr(c, "stop")
        stop_c()
        b.close()
        s.stop()


def torn_client_main(sock, keys, ready):
    """Reserves the keys' pages, writes half of the first page's bytes,
    then waits to be killed (a client dying mid-BatchSet)."""
    pool = HostPool(False, "page_first", pages=len(keys))
    b = backend(sock, pool)
    garbage = torch.full((b.kind_bytes[0],), 0xAB, dtype=torch.uint8)

    def copy_in(i, slab, spans):
        slab.view(spans[0], b.kind_bytes[0])[: b.kind_bytes[0] // 2].copy_(garbage[: b.kind_bytes[0] // 2])
        ready.set()
        time.sleep(3600)

    b._set_pages(keys, copy_in)


def test_client_killed_mid_set(kvtier_bin, tmp_path):
    """A client SIGKILLed after BatchSet reserved its pages and before
    Commit: nothing of them is ever readable; the keys are free to set
    again and read back whole."""
    s = start_serve(kvtier_bin, tmp_path, False, 64)
    try:
        keys = chain_keys("torn", 4)
        ctx = mp.get_context("spawn")
        ready = ctx.Event()
        p = ctx.Process(target=torn_client_main, args=(s.sock, keys, ready))
        p.start()
        assert ready.wait(60), "the client did not reserve"
        pool = HostPool(False, "page_first", pages=8)
        b = backend(s.sock, pool)
        assert b.batch_exists(keys) == 0  # reserved, not committed
        p.kill()
        p.join()
        assert b.batch_exists(keys) == 0
        assert b.batch_get_v1(keys, pool.slot_indices(range(4))) == [False] * 4
        fill(pool, keys, range(4), 0)
        deadline = time.time() + 30
        while True:  # the dead client's reservation is freed with its connection
            if b.batch_set_v1(keys, pool.slot_indices(range(4))) == [True] * 4:
                break
            assert time.time() < deadline
            time.sleep(0.1)
        pool.kv_buffer.zero_()
        assert b.batch_get_v1(keys, pool.slot_indices(range(4, 8))) == [True] * 4
        assert wrong_pages(pool, keys, range(4, 8), 0) == []
        b.close()
    finally:
        s.stop()


def test_same_key_at_once(kvtier_bin, tmp_path):
    """Two clients set the same keys at once: both are told saved, serve
    keeps one copy (stored once, the other EXISTS)."""
    s = start_serve(kvtier_bin, tmp_path, False, 128)
    try:
        n = 32
        keys = chain_keys("same", n)
        pools = [HostPool(False, "page_first", pages=n) for _ in range(2)]
        bs = [backend(s.sock, p) for p in pools]
        for p in pools:
            fill(p, keys, range(n), 0)
        before = bs[0].door_stats()
        barrier = threading.Barrier(2)
        out = [None, None]

        def run(i):
            barrier.wait()
            out[i] = bs[i].batch_set_v1(keys, pools[i].slot_indices(range(n)))

        ts = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        assert out == [[True] * n, [True] * n]
        after = bs[0].door_stats()
        assert after["stored_pages"] - before.get("stored_pages", 0) == n
        assert after["exists_pages"] - before.get("exists_pages", 0) == n
        for b in bs:
            b.close()
    finally:
        s.stop()


@pytest.mark.parametrize("client_sums", [True, False], ids=["client-sums", "serve-sums"])
def test_scribbled_page_is_a_miss(kvtier_bin, tmp_path, monkeypatch, client_sums):
    """A committed slab page that something scribbled on fails the check:
    the client's, over the bytes it copies, against the sums it gave at
    Commit (client-sums: the native library), or the one serve runs while
    the client copies it (check_at_release). batch_get_v1 answers False
    for it alone, never its wrong bytes; the others load whole; a retry
    reloads the L3's copy whole or misses."""
    if client_sums and not native.available():
        pytest.fail("the native library did not load: %s" % native.why())
    monkeypatch.setenv("KVTIER_CLIENT_SUMS", "1" if client_sums else "0")
    s = start_serve(kvtier_bin, tmp_path, False, 64)
    try:
        keys = chain_keys("scribble", 4)
        pool = HostPool(False, "page_first", pages=8)
        b = backend(s.sock, pool)
        fill(pool, keys, range(4), 0)
        assert b.batch_set_v1(keys, pool.slot_indices(range(4))) == [True] * 4
        rep, session, boot, _, _ = b._rpc("BatchGet", lambda ss, bb: pb.GetRequest(session=ss, boot_id=bb, keys=[keys[2]]))
        span = rep.pages[0].spans[1]  # the page's "v" kind
        b._stub.Release(pb.ReleaseRequest(session=session, boot_id=boot, lease=rep.lease), timeout=5)
        b._slab.tensors[span.slab][span.offset + 100] ^= 0xFF
        pool.kv_buffer.zero_()
        assert b.batch_get_v1(keys, pool.slot_indices(range(4, 8))) == [True, True, False, True]
        assert wrong_pages(pool, [keys[i] for i in (0, 1, 3)], [4, 5, 7], 0) == []
        assert b.counters["corrupt_pages"] == 1
        assert b.door_stats()["corrupt_pages"] == 1  # serve dropped it, whoever checked
        # Dropped from the slab; the write-through's L3 copy (when it
        # landed before the scribble: the gather checks too) reloads whole.
        pool.kv_buffer.zero_()
        again = b.batch_get_v1(keys[2:3], pool.slot_indices([6]))
        assert again == [False] or wrong_pages(pool, keys[2:3], [6], 0) == []
        b.close()
    finally:
        s.stop()


def test_slab_full(kvtier_bin, tmp_path):
    """A slab of 8 pages, a batch of 12 new pages: the 8 that fit are
    saved, False for the 4 that did not, within the deadline."""
    s = start_serve(kvtier_bin, tmp_path, False, 8)
    try:
        pool = HostPool(False, "page_first", pages=12)
        b = backend(s.sock, pool, timeout_s=2)
        keys = chain_keys("full", 12)
        fill(pool, keys, range(12), 0)
        t0 = time.monotonic()
        res = b.batch_set_v1(keys, pool.slot_indices(range(12)))
        assert time.monotonic() - t0 < 2 * 2 + 1
        assert res == [True] * 8 + [False] * 4
        assert b.door_stats()["no_space_pages"] >= 4
        b.close()
    finally:
        s.stop()


def test_bad_input(kvtier_bin, tmp_path):
    """Bad geometry: register_mem_pool_host raises KvtierError naming the
    kinds. Bad keys and wrong-length or out-of-range host_indices: False
    (or a count that stops there), never an exception into SGLang."""
    s = start_serve(kvtier_bin, tmp_path, False, 64)
    try:
        odd = HostPool(False, "page_first", pages=4, layer_num=4)  # 32 KiB kinds: serve has 64
        cfg = storage_config(extra={"socket": s.sock, "interface_v1": 1})
        with pytest.raises(KvtierError, match="kinds"):
            KvtierStorage(cfg, {}).register_mem_pool_host(odd)
        mla_pool = HostPool(True, "page_first", pages=4)
        with pytest.raises(KvtierError, match="kinds"):
            KvtierStorage(storage_config(mla=True, extra={"socket": s.sock}), {}).register_mem_pool_host(mla_pool)
        with pytest.raises(KvtierError, match="timeout_s"):
            KvtierStorage(storage_config(extra={"socket": s.sock, "timeout_s": -1}), {})
        for v in (-1, "abc", "1.5", 2.5, None, True, [3]):
            with pytest.raises(KvtierError, match="get_deadline_ms"):
                KvtierStorage(storage_config(extra={"socket": s.sock, "get_deadline_ms": v}), {})
        for v, want in ((0, 0), ("250", 250), (250.0, 250), (" 7 ", 7)):
            assert KvtierStorage(storage_config(extra={"socket": s.sock, "get_deadline_ms": v}), {}).get_deadline_ms == want
        with pytest.raises(KvtierError, match="prefetch"):
            KvtierStorage(storage_config(extra={"socket": s.sock, "prefetch": "maybe"}), {})
        with pytest.raises(KvtierError, match="tp_rank"):
            KvtierStorage(storage_config(tp_rank=2, tp_size=2, extra={"socket": s.sock}), {})

        pool = HostPool(False, "page_first", pages=8)
        b = backend(s.sock, pool)
        good = chain_keys("bad-input", 3)
        fill(pool, good, range(3), 0)
        keys = [good[0], "", good[1], "x" * 5000, good[2], None, 7]
        res = b.batch_set_v1(keys, pool.slot_indices([0, 3, 1, 3, 2, 3, 3]))
        assert res == [True, False, True, False, True, False, False]
        assert b.batch_exists(keys) == 1  # stops at the empty key
        assert b.batch_exists([good[0], good[1], 7]) == 2
        assert b.batch_exists("not a list") == 0
        idx = pool.slot_indices(range(2))
        assert b.batch_get_v1(good, idx) == [False] * 3  # 2 pages of indices for 3 keys
        assert b.batch_set_v1(good, idx[:-1]) == [False] * 3
        assert b.batch_get_v1(good[:1], torch.arange(10_000, 10_016)) == [False]  # outside the pool
        assert b.batch_get_v1(good[:1], [0] * 16) == [False]  # not a tensor
        assert b.batch_get_v1("abc", idx) == []
        assert b.batch_get_v1([], torch.zeros(0, dtype=torch.int64)) == []
        assert b.get(good[0], torch.zeros(10)) is None  # wrong target size
        assert b.batch_get(good, [pool.get_dummy_flat_data_page()]) == [None] * 3
        assert b.batch_set(good, [pool.get_data_page(0)]) is False
        assert b.set(good[0], torch.zeros(3)) is False
        t = b.get(good[2], pool.get_dummy_flat_data_page())
        assert torch.equal(t.view(torch.uint8), page_data(good[2], 0, pool.page_bytes()))
        b.close()
    finally:
        s.stop()
    # No serve at all: registration waits for it, every call a miss.
    pool = HostPool(False, "page_first", pages=4)
    b = backend(str(tmp_path / "nothing.sock"), pool, timeout_s=1)
    t0 = time.monotonic()
    assert b.batch_exists(["a"]) == 0
    assert b.batch_get_v1(["a"], pool.slot_indices([0])) == [False]
    assert b.batch_set_v1(["a"], pool.slot_indices([0])) == [False]
    assert b.batch_set(["a"], [pool.get_data_page(0)]) is False
    assert b.batch_get(["a"], [pool.get_dummy_flat_data_page()]) == [None]
    assert time.monotonic() - t0 < 5 * 1 + 1
    b.close()


class StatePool:
    """An extra host pool (Mamba-like states): page_size 1, a page of
    200,000 bytes (more than a KV page: stored in chunks)."""

    def __init__(self, slots, nbytes=200_000):
        self.page_size, self.size = 1, slots
        self.buf = torch.zeros((slots, nbytes), dtype=torch.uint8)

    def get_data_page(self, index, flat=True):
        return self.buf[int(index)]

    def get_dummy_flat_data_page(self):
        return torch.zeros(self.buf.shape[1], dtype=torch.uint8)

    def set_from_flat_data_page(self, index, page):
        self.buf[int(index)].copy_(page.view(torch.uint8))


def test_v2_extra_pools(kvtier_bin, tmp_path):
    """batch_set_v2 / batch_exists_v2 / batch_get_v2 over an extra pool,
    with the ALL_PAGES and TRAILING_PAGES hit policies."""
    s = start_serve(kvtier_bin, tmp_path, False, 128)
    try:
        pool = HostPool(False, "page_first", pages=8)
        b = backend(s.sock, pool)
        st = StatePool(12)
        b.register_mem_host_pool_v2(st, PoolName.MAMBA)
        keys = chain_keys("v2", 6)
        fill(pool, keys, range(6), 0)
        assert b.batch_set_v1(keys, pool.slot_indices(range(6))) == [True] * 6
        for i in range(6):
            st.buf[i].copy_(page_data(keys[i], "state", st.buf.shape[1]))
        # states of pages 0..3 only
        t = PoolTransfer(name=PoolName.MAMBA, host_indices=torch.arange(4), keys=keys[:4])
        assert b.batch_set_v2([t]) == {"mamba": [True] * 4}
        allp = PoolTransfer(name=PoolName.MAMBA, keys=keys, hit_policy=PoolHitPolicy.ALL_PAGES)
        r = b.batch_exists_v2(keys, [allp])
        assert (r.kv_hit_pages, r.extra_pool_hit_pages) == (4, {"kv": 6, "mamba": 4})
        trail = PoolTransfer(name=PoolName.MAMBA, keys=keys[:2], hit_policy=PoolHitPolicy.TRAILING_PAGES)
        r = b.batch_exists_v2(keys, [trail])
        assert r.kv_hit_pages == 4  # windows [4,6) and [3,5) miss page 4; [2,4) holds
        t5 = PoolTransfer(name=PoolName.MAMBA, host_indices=torch.tensor([5]), keys=keys[5:6])
        assert b.batch_set_v2([t5]) == {"mamba": [True]}
        r = b.batch_exists_v2(keys, [PoolTransfer(name=PoolName.MAMBA, keys=keys[:1],
                                                  hit_policy=PoolHitPolicy.TRAILING_PAGES)])
        assert r.kv_hit_pages == 6  # the last page's state is there
        got = b.batch_get_v2([PoolTransfer(name=PoolName.MAMBA, host_indices=torch.arange(6, 10), keys=keys[:4])])
        assert got == {"mamba": [True] * 4}
        for i in range(4):
            assert torch.equal(st.buf[6 + i], page_data(keys[i], "state", st.buf.shape[1]))
        bad = PoolTransfer(name=PoolName.MAMBA, host_indices=torch.arange(3), keys=keys[:4])
        assert b.batch_get_v2([bad]) == {"mamba": [False] * 4}
        assert b.batch_set_v2([PoolTransfer(name=PoolName.SWA, host_indices=torch.arange(1), keys=keys[:1])]) == \
            {"swa": [False]}
        b.close()
    finally:
        s.stop()


def test_serve_stalled(kvtier_bin, tmp_path):
    """serve stopped (SIGSTOP: the socket accepts, nothing answers): each
    call answers miss / False within timeout_s, across all its RPCs; after
    SIGCONT the same session goes on."""
    import signal
    s = start_serve(kvtier_bin, tmp_path, False, 64)
    try:
        pool = HostPool(False, "page_first", pages=8)
        b = backend(s.sock, pool, timeout_s=1)
        keys = chain_keys("stall", 4)
        fill(pool, keys, range(4), 0)
        assert b.batch_set_v1(keys, pool.slot_indices(range(4))) == [True] * 4
        s.proc.send_signal(signal.SIGSTOP)
        try:
            stopped_by = time.time() + 10  # the stop reaches every thread asynchronously
            while not all(open("/proc/%d/task/%s/stat" % (s.proc.pid, t)).read().rsplit(")", 1)[1].split()[0] == "T"
                          for t in os.listdir("/proc/%d/task" % s.proc.pid)):
                assert time.time() < stopped_by, "serve did not stop"
                time.sleep(0.01)
            for call, want in [(lambda: b.batch_exists(keys), 0),
                               (lambda: b.batch_get_v1(keys, pool.slot_indices(range(4, 8))), [False] * 4),
                               (lambda: b.batch_set_v1(chain_keys("stall2", 4), pool.slot_indices(range(4))), [False] * 4)]:
                t0 = time.monotonic()
                assert call() == want
                assert time.monotonic() - t0 < 1 + 0.5
        finally:
            s.proc.send_signal(signal.SIGCONT)
        deadline = time.time() + 30
        while b.batch_exists(keys) != 4:
            assert time.time() < deadline
            time.sleep(0.1)
        assert b.batch_get_v1(keys, pool.slot_indices(range(4, 8))) == [True] * 4
        assert wrong_pages(pool, keys, range(4, 8), 0) == []
        b.close()
    finally:
        s.stop()
