"""kvtier.vllm.KvtierConnector, vLLM's KV connector over the store door,
without vLLM: the stand-in interface (tests/standin/vllm) against a table
of the facts, and a CPU engine (tests/vllmhelp.py) that calls the
connector as vLLM's scheduler and workers do, against a real ``kvtier
serve --doors store``. Every block read back is compared with the KV the
model writes for its prefix: 0 wrong bytes."""

import dataclasses
import inspect
import os
import threading
import time

import numpy as np
import pytest
import torch

from vllm.distributed.kv_transfer.kv_connector.v1 import base as vbase
from vllm.distributed.kv_transfer.kv_connector.v1 import metrics as vmetrics
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.parallel_state import set_ranks
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_utils import KVCacheBlock
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, MLAAttentionSpec
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import Request

import vllmhelp as vh
from kvtier import native
from kvtier import vllm as kv
from kvtier.store.v1 import store_pb2 as pb
from sglhelp import Serve

# ---- the interface's facts (vllm-project/vllm
# vllm/distributed/kv_transfer/kv_connector/v1/base.py at 003df296) ------

# method -> parameters after self (or cls), in order; "*kw" for **kwargs.
FACTS = {
    "__init__": ("vllm_config", "role", "kv_cache_config"),
    "set_eagle_prefix_cache_hashing": ("enabled",),
    # worker side
    "bind_connector_metadata": ("connector_metadata",),
    "clear_connector_metadata": (),
    "_get_connector_metadata": (),
    "has_connector_metadata": (),
    "register_kv_caches": ("kv_caches",),
    "register_cross_layers_kv_cache": ("kv_cache", "attn_backend"),
    "set_host_xfer_buffer_ops": ("copy_operation",),
    "handle_preemptions": ("kv_connector_metadata",),
    "start_load_kv": ("forward_context", "*kw"),
    "wait_for_layer_load": ("layer_name",),
    "save_kv_layer": ("layer_name", "kv_layer", "attn_metadata", "*kw"),
    "wait_for_save": (),
    "get_finished": ("finished_req_ids",),
    "get_block_ids_with_load_errors": (),
    "shutdown": (),
    "get_kv_connector_stats": (),
    "get_kv_connector_kv_cache_events": (),
    "get_handshake_metadata": (),
    "build_connector_worker_meta": (),
    # scheduler side
    "bind_gpu_block_pool": ("gpu_block_pool",),
    "get_num_new_matched_tokens": ("request", "num_computed_tokens"),
    "update_state_after_alloc": ("request", "blocks", "num_external_tokens"),
    "build_connector_meta": ("scheduler_output",),
    "on_new_request": ("request",),
    "update_connector_output": ("connector_output",),
    "request_finished": ("request", "block_ids"),
    "take_events": (),
    "has_pending_push_work": (),
    "get_required_kvcache_layout": ("vllm_config",),
    "requires_piecewise_for_cudagraph": ("extra_config",),
    "get_finished_count": (),
    "build_kv_connector_stats": ("data",),
    "set_xfer_handshake_metadata": ("metadata",),
    "set_xfer_handshake_metadata_pp_aware": ("metadata",),
    "build_prom_metrics": ("vllm_config", "metric_types", "labelnames", "per_engine_labelvalues"),
    "reset_cache": (),
}
ABSTRACT = {"start_load_kv", "wait_for_layer_load", "save_kv_layer", "wait_for_save",
            "get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta"}
CLASSMETHODS = {"get_required_kvcache_layout", "requires_piecewise_for_cudagraph", "build_kv_connector_stats",
                "build_prom_metrics"}
PROPERTIES = {"prefer_cross_layer_blocks", "supports_eagle_prefix_cache_hashing", "requires_kv_delivery", "role"}
# What vLLM calls on a connector that the class must implement (vLLM
# passes some arguments by name).
OVERRIDDEN = ABSTRACT | {"register_kv_caches", "handle_preemptions", "get_finished", "get_block_ids_with_load_errors",
                         "shutdown", "get_kv_connector_stats", "on_new_request", "update_connector_output",
                         "request_finished", "get_required_kvcache_layout", "build_kv_connector_stats",
                         "build_prom_metrics", "reset_cache"}
STATS_METHODS = {"reset": (), "aggregate": ("other",), "reduce": (), "is_empty": ()}


def params(fn):
    out = []
    for p in inspect.signature(fn).parameters.values():
        if p.kind == inspect.Parameter.VAR_KEYWORD:
            out.append("*kw")
        else:
            out.append(p.name)
    return tuple(out[1:]) if out and out[0] in ("self", "cls") else tuple(out)


@pytest.mark.parametrize("name", sorted(FACTS))
def test_standin_base_methods(name):
    fn = inspect.getattr_static(vbase.KVConnectorBase_V1, name)
    assert isinstance(fn, classmethod) == (name in CLASSMETHODS), name
    got = params(getattr(vbase.KVConnectorBase_V1, name))
    assert got == FACTS[name], "stand-in %s%s, the facts %s" % (name, got, FACTS[name])


def test_standin_base_shape():
    B = vbase.KVConnectorBase_V1
    assert B.__abstractmethods__ == frozenset(ABSTRACT)
    for p in PROPERTIES:
        assert isinstance(inspect.getattr_static(B, p), property), p
    assert [r.name for r in vbase.KVConnectorRole] == ["SCHEDULER", "WORKER"]
    assert [r.value for r in vbase.KVConnectorRole] == [0, 1]
    assert vbase.KVConnectorWorkerMetadata.__abstractmethods__ == frozenset({"aggregate"})
    assert vbase.SupportsHMA.__abstractmethods__ == frozenset({"request_finished_all_groups"})
    for n in ("KVConnectorMetadata", "KVConnectorHandshakeMetadata", "CopyBlocksOp", "supports_hma"):
        assert hasattr(vbase, n), n
    assert [f.name for f in dataclasses.fields(vmetrics.KVConnectorStats)] == ["data"]
    for n, want in STATS_METHODS.items():
        assert params(getattr(vmetrics.KVConnectorStats, n)) == want, n
    assert params(vmetrics.KVConnectorPromMetrics.__init__) == FACTS["build_prom_metrics"]
    assert params(vmetrics.KVConnectorPromMetrics.observe) == ("transfer_stats_data", "engine_idx")
    assert [f.name for f in dataclasses.fields(KVConnectorOutput)] == [
        "finished_sending", "finished_recving", "kv_connector_stats", "kv_cache_events",
        "kv_connector_worker_meta", "invalid_block_ids", "expected_finished_count"]
    assert [f.name for f in dataclasses.fields(SchedulerOutput)][:9] == [
        "scheduled_new_reqs", "scheduled_cached_reqs", "num_scheduled_tokens", "total_num_scheduled_tokens",
        "scheduled_spec_decode_tokens", "scheduled_encoder_inputs", "num_common_prefix_blocks",
        "finished_req_ids", "free_encoder_mm_hashes"]


@pytest.mark.parametrize("name", sorted(FACTS))
def test_connector_signatures(name):
    """KvtierConnector keeps vLLM's parameter names and overrides what
    vLLM calls; it is concrete and loads by its module path."""
    C = kv.KvtierConnector
    assert issubclass(C, vbase.KVConnectorBase_V1)
    assert not getattr(C, "__abstractmethods__", None)
    assert params(getattr(C, name)) == FACTS[name], "KvtierConnector.%s%s" % (name, params(getattr(C, name)))
    if name in vars(C):
        assert isinstance(vars(C)[name], classmethod) == (name in CLASSMETHODS), name
    if name in OVERRIDDEN:
        assert name in vars(C), "%s not overridden" % name
    assert issubclass(kv.KvtierConnectorStats, vmetrics.KVConnectorStats)
    assert issubclass(kv.KvtierMetadata, vbase.KVConnectorMetadata)
    assert kv.VLLM_COMMIT == "003df2961dd8830c317a61f9745ccd557da9fa06"


# ---- construction, settings, serve absent -------------------------------


def test_construction_and_settings(tmp_path):
    sock = str(tmp_path / "none.sock")
    kcc = vh.kv_cache_config(32)
    cfg = vh.vllm_config(sock)
    assert kv.KvtierConnector.get_required_kvcache_layout(cfg) == "NHD"
    assert kv.KvtierConnector.get_required_kvcache_layout(vh.vllm_config(sock, extra={"kv_layout": "hnd"})) == "HND"
    assert kv.KvtierConnector.requires_piecewise_for_cudagraph({}) is False
    for extra, msg in [({"load_mode": "lazy"}, "load_mode"), ({"kv_layout": "XYZ"}, "kv_layout"),
                       ({"timeout_s": "soon"}, "timeout_s"), ({"prefetch_wait_ms": -1}, "prefetch_wait_ms")]:
        with pytest.raises(kv.KvtierError, match=msg):
            kv.KvtierConnector(vh.vllm_config(sock, extra=extra), KVConnectorRole.SCHEDULER, kcc)
    two = KVCacheConfig(num_blocks=8, kv_cache_tensors=[], kv_cache_groups=kcc.kv_cache_groups * 2)
    with pytest.raises(kv.KvtierError, match="hybrid"):
        kv.KvtierConnector(cfg, KVConnectorRole.SCHEDULER, two)
    cp = vh.vllm_config(sock)
    cp.parallel_config.decode_context_parallel_size = 2
    with pytest.raises(kv.KvtierError, match="context parallel"):
        kv.KvtierConnector(cp, KVConnectorRole.SCHEDULER, kcc)
    nocfg = vh.vllm_config(sock)
    nocfg.kv_transfer_config = None
    with pytest.raises(ValueError):
        kv.KvtierConnector(nocfg, KVConnectorRole.SCHEDULER, kcc)

    # No serve at all: every lookup a miss at once, a worker's loads fail
    # (reported) and its saves are skipped; nothing raises.
    t0 = time.monotonic()
    c = kv.KvtierConnector(cfg, KVConnectorRole.SCHEDULER, kcc)
    assert c.requires_kv_delivery is False
    assert c.namespace.kinds[0].page_bytes == vh.kind_bytes()
    assert c.namespace.kv_layout == "vllm/NHD/tp1/pp1/sha256" and c.namespace.dtype == "bfloat16"
    r = Request("r", list(range(40)), block_hasher=vh.MiniScheduler(c, 8).hasher)
    c.on_new_request(r)
    assert c.get_num_new_matched_tokens(r, 0) == (0, False)
    meta = c.build_connector_meta(SchedulerOutput.make_empty())
    assert meta.loads == [] and meta.saves == []
    w = vh.Worker(sock, 0, 1, 8)
    w.conn.bind_connector_metadata(kv.KvtierMetadata(loads=[("x", r.block_hashes, [3, 4], True)],
                                                     saves=[("y", r.block_hashes, [1, 2])]))
    w.conn.start_load_kv(None)
    w.conn.wait_for_save()
    deadline = time.monotonic() + 5
    got = set()
    while not got and time.monotonic() < deadline:
        _, recv = w.conn.get_finished(set())
        got |= recv or set()
        time.sleep(0.01)
    assert got == {"x"} and w.conn.get_block_ids_with_load_errors() == {3, 4}
    assert w.conn.get_finished({"y"})[0] in ({"y"}, None)
    w.conn.clear_connector_metadata()
    w.shutdown()
    c.shutdown()
    assert time.monotonic() - t0 < 8


# ---- against a real serve --------------------------------------------------


def start_serve(kvtier_bin, tmp_path, kinds, slab_pages=512, name="data"):
    s = Serve(kvtier_bin, str(tmp_path / name), vh.store_yaml(kinds, slab_pages), lease="2s")
    s.start()
    return s


def settle(conn, req, timeout=5):
    """get_num_new_matched_tokens until it answers (vLLM asks again every
    step while it says None)."""
    deadline = time.monotonic() + timeout
    while True:
        got = conn.get_num_new_matched_tokens(req, 0)
        if got[0] is not None or time.monotonic() > deadline:
            return got
        time.sleep(0.002)


def test_scheduler_side(kvtier_bin, tmp_path):
    """Lookups: None until the BatchExists is back, then only whole blocks
    loadable now; a block-aligned prompt leaves its last token to compute;
    local hits are subtracted; update_state_after_alloc decides by
    num_external_tokens (called twice for an async load, one load);
    num_publishable_block_hashes caps the saves; after a serve restart the
    pages are in L3: None while serve's prefetch brings them back, then
    hits; serve away: misses, nothing raises."""
    kb = vh.kind_bytes()
    s = start_serve(kvtier_bin, tmp_path, [("k", kb), ("v", kb)])
    try:
        e = vh.Engine(s.sock, tp=1, num_blocks=64, inproc=True)
        p70 = list(range(1, 71))            # 4 whole blocks + 6 tokens
        p64 = list(range(500, 564))         # exactly 4 blocks
        e.add("w1", p70, 2)
        e.add("w2", p64, 2)
        e.run()
        assert e.outputs["w1"] == vh.expected_output(p70, 2)
        c = e.conn
        r = e.sched.add("q1", p70, 2)
        e.sched.waiting.clear()
        first = c.get_num_new_matched_tokens(r, 0)
        assert first in ((None, False), (64, True))  # None while the lookup is out
        assert settle(c, r) == (64, True)            # the tail block (6 tokens) is never stored
        assert c.get_num_new_matched_tokens(r, 0) == (64, True)  # side-effect free
        assert c.get_num_new_matched_tokens(r, 32) == (32, True)  # 2 blocks were local hits
        r2 = e.sched.add("q2", p64, 2)
        e.sched.waiting.clear()
        assert settle(c, r2) == (63, True)  # the last token is computed, not loaded
        miss = e.sched.add("q3", [7] * 40, 2)
        e.sched.waiting.clear()
        assert settle(c, miss) == (0, False)
        short = e.sched.add("q4", [1, 2, 3], 2)
        assert c.get_num_new_matched_tokens(short, 0) == (0, False)
        # update_state_after_alloc: by num_external_tokens, twice for async.
        blocks = KVCacheBlocks(([KVCacheBlock(b) for b in (40, 41, 42, 43, 44)],))
        c.get_num_new_matched_tokens(r, 0)
        c.update_state_after_alloc(r, blocks, 64)
        c.update_state_after_alloc(r, blocks, 0)
        c.update_state_after_alloc(miss, blocks, 0)
        meta = c.build_connector_meta(SchedulerOutput.make_empty())
        assert [(ld[0], ld[2], ld[3]) for ld in meta.loads] == [("q1", [40, 41, 42, 43], True)]
        assert meta.loads[0][1] == r.block_hashes[:4]
        assert c.build_connector_meta(SchedulerOutput.make_empty()).loads == []  # one plan a step
        for q in (r, r2, miss, short):
            assert c.request_finished(q, []) == (False, None)

        # num_publishable_block_hashes caps what is saved.
        class Unpublished(Request):
            num_publishable_block_hashes = 2

        e.sched.hasher = e.sched.hasher
        u = Unpublished("u", list(range(900, 980)), block_hasher=e.sched.hasher, max_tokens=1)
        e.sched.requests["u"] = u
        e.sched.waiting.append(u)
        c.on_new_request(u)
        e.run()
        pub = e.sched.add("u2", list(range(900, 980)), 1)
        e.sched.waiting.clear()
        assert settle(c, pub) == (32, True)

        # Restart: the slab is new and empty; the pages are in L3.
        e.close()
        s.stop()
        s.start()
        # prefetch_poll_ms at its least: were the lookup polled while serve
        # reloads, it would ask many times; serve answers the second ask
        # when the reloads have landed (ExistsRequest.wait_ms).
        e = vh.Engine(s.sock, tp=1, num_blocks=64, inproc=True,
                      extra={"prefetch_wait_ms": 3000, "prefetch_poll_ms": 0.1})
        c = e.conn
        door = c._scheduler.door
        asks, call = [], door.call

        def counting(name, build, *a, **kw):
            if name == "BatchExists":
                asks.append(build("s", "b").wait_ms)
            return call(name, build, *a, **kw)

        door.call = counting
        r = e.sched.add("after", p70, 2)
        e.sched.waiting.clear()
        got = c.get_num_new_matched_tokens(r, 0)
        assert got == (None, False)
        assert settle(c, r, timeout=10) == (64, True)
        st = c.get_kv_connector_stats().data
        assert st.get("lookups_waited_l3", 0) >= 1, st
        assert 2 <= len(asks) <= 3 and asks[0] == 0 and all(w > 0 for w in asks[1:]), asks
        # The lookup threads run lowered (thread_nice, default 10).
        names = {t.native_id: t.name for t in threading.enumerate()}
        nice = {}
        for tid in os.listdir("/proc/self/task"):
            if names.get(int(tid), "").startswith("kvtier-lookup"):
                with open("/proc/self/task/%s/stat" % tid) as f:
                    nice[int(tid)] = int(f.read().rsplit(")", 1)[1].split()[16])
        assert nice and all(v == min(19, os.getpriority(os.PRIO_PROCESS, 0) + 10) for v in nice.values()), nice
        assert c.request_finished(r, []) == (False, None)
        e.sched.requests.pop("after")

        # The engine loads them: 0 wrong bytes.
        e.add("after2", p70, 2)
        e.run()
        assert e.outputs["after2"] == vh.expected_output(p70, 2)
        assert e.wrong_used == 0 and e.checked > 0

        # serve away: misses within the lookup deadline, loads fail, no raise.
        s.kill()
        t0 = time.monotonic()
        r = e.sched.add("away", p64, 2)
        e.run()
        assert e.outputs["away"] == vh.expected_output(p64, 2)
        assert time.monotonic() - t0 < 10
        e.close()
        s.start()  # removes the killed serve's slab file; the stop below removes its own
    finally:
        s.stop()


def _roundtrip(sock, kv_caches, kcc, block, extra=None, tp_rank=0, tp=1):
    """Saves blocks through a worker connector and loads them into other
    blocks (async loads): scattered blocks (one memmove a block, layer and
    kind) and a run of 6 (torch copies of strided views), or, with client
    sums, every piece in one native call; the bytes must match.
    block(tensor, i) is block i of a layer's cache."""
    summed = kv._native_sums()
    set_ranks(tp_rank, tp)
    cfg = vh.vllm_config(sock, tp, extra)
    w = kv.KvtierConnector(cfg, KVConnectorRole.WORKER, kcc)
    w.register_kv_caches(kv_caches)
    deadline = time.monotonic() + 20
    for n, (src, dst) in enumerate((([1, 3, 2], [13, 5, 9]), (list(range(2, 8)), list(range(8, 14))))):
        hashes = [os.urandom(32) for _ in src]
        w.bind_connector_metadata(kv.KvtierMetadata(saves=[("s%d" % n, hashes, src)]))
        w.start_load_kv(None)
        w.wait_for_save()
        while w.get_finished({"s%d" % n})[0] != {"s%d" % n}:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        w.clear_connector_metadata()
        w.bind_connector_metadata(kv.KvtierMetadata(loads=[("l%d" % n, hashes, dst, True)]))
        w.start_load_kv(None)
        w.wait_for_save()
        while w.get_finished(set())[1] != {"l%d" % n}:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert w.get_block_ids_with_load_errors() == set()
        w.clear_connector_metadata()
        for t in kv_caches.values():
            for a, b in zip(src, dst):
                assert torch.equal(block(t, a), block(t, b)), (a, b)
        st = w.get_kv_connector_stats().data
        if summed:  # every block through the summing native copy
            assert st.get("copy_summed_blocks", 0) == (6 if n == 0 else 12) and "copy_run_blocks" not in st, st
        else:
            # The scattered blocks one by one; the run (a fresh slab's
            # pages are consecutive) as views.
            assert st.get("copy_run_blocks", 0) == (0 if n == 0 else 12), st
            assert "copy_summed_blocks" not in st, st
    w.shutdown()


@pytest.mark.parametrize("client_sums", [True, False], ids=["client-sums", "serve-sums"])
def test_kv_layouts(kvtier_bin, tmp_path, monkeypatch, client_sums):
    """FlashAttention's (2, blocks, ...) and FlashInfer's (blocks, 2, ...)
    shapes lay a block out alike; an HND cache (heads before tokens in
    memory, kv_layout "HND"); MLA's (blocks, tokens, dim) with one kind;
    a cache in the wrong order or of the wrong size is refused, naming it.
    Both copy paths: the native one that carries the sums, and memmove /
    torch copies with serve's sums."""
    if client_sums and not native.available():
        pytest.fail("the native library did not load: %s" % native.why())
    monkeypatch.setenv("KVTIER_CLIENT_SUMS", "1" if client_sums else "0")
    kb = vh.kind_bytes()
    s = start_serve(kvtier_bin, tmp_path, [("k", kb), ("v", kb)], 64)
    try:
        kcc = vh.kv_cache_config(16)
        names = vh.layer_names()
        flash = {n: torch.randn(2, 16, vh.BLOCK, vh.HEADS, vh.HEAD_DIM).to(vh.DTYPE) for n in names}
        _roundtrip(s.sock, flash, kcc, lambda t, i: t[:, i])
        infer = {n: torch.randn(16, 2, vh.BLOCK, vh.HEADS, vh.HEAD_DIM).to(vh.DTYPE) for n in names}
        _roundtrip(s.sock, infer, kcc, lambda t, i: t[i])
        # HND: allocated (2, blocks, heads, tokens, dim), seen as (2, blocks, tokens, heads, dim).
        hnd = {n: torch.randn(2, 16, vh.HEADS, vh.BLOCK, vh.HEAD_DIM).to(vh.DTYPE).transpose(2, 3) for n in names}
        _roundtrip(s.sock, hnd, kcc, lambda t, i: t[:, i], extra={"kv_layout": "HND"})
        w = kv.KvtierConnector(vh.vllm_config(s.sock), KVConnectorRole.WORKER, kcc)
        with pytest.raises(kv.KvtierError, match="not dense in NHD order"):
            w.register_kv_caches(hnd)
        with pytest.raises(kv.KvtierError, match="bytes a block"):
            w.register_kv_caches({n: torch.zeros(2, 16, vh.BLOCK, vh.HEADS, 16, dtype=vh.DTYPE) for n in names})
        with pytest.raises(kv.KvtierError, match="3 KV cache tensors"):
            w.register_kv_caches({n: flash[n] for n in names[:3]})
    finally:
        s.stop()
    mkb = vh.GEOM.layers * vh.BLOCK * vh.MLA_DIM * 2
    s = start_serve(kvtier_bin, tmp_path, [("kv", mkb)], 64, name="mla")
    try:
        kcc = vh.kv_cache_config(16, mla=True)
        assert isinstance(kcc.kv_cache_groups[0].kv_cache_spec, MLAAttentionSpec)
        names = vh.layer_names()
        mla = {n: torch.randn(16, vh.BLOCK, vh.MLA_DIM).to(vh.DTYPE) for n in names}
        _roundtrip(s.sock, mla, kcc, lambda t, i: t[i], tp_rank=0, tp=2)
        # MLA TP ranks share one copy: the keys carry no TP rank.
        c = kv.KvtierConnector(vh.vllm_config(s.sock, 2), KVConnectorRole.SCHEDULER, kcc)
        assert c.key_suffixes() == [""] and c.namespace.kv_layout == "vllm/mla/tp2/pp1/sha256"
        c.shutdown()
        # A geometry serve does not have: refused at register, naming both.
        w = kv.KvtierConnector(vh.vllm_config(s.sock), KVConnectorRole.WORKER, vh.kv_cache_config(16))
        with pytest.raises(kv.KvtierError, match="payload kinds"):
            w.register_kv_caches({n: torch.zeros(2, 16, vh.BLOCK, vh.HEADS, vh.HEAD_DIM, dtype=vh.DTYPE)
                                  for n in names})
    finally:
        set_ranks(0, 1)
        s.stop()


def corrupt_page(sock, namespace, key):
    """Flips a byte of a committed page's "v" span in serve's slab (what a
    stray write through the shared mapping would do)."""
    door = kv._Door(sock, "test-scribbler", namespace, 2, 0.2, True)
    try:
        rep, ctx = door.call("BatchGet", lambda s, b: pb.GetRequest(session=s, boot_id=b, keys=[key]), hold=True)
        try:
            assert rep.pages[0].status == pb.GET_STATUS_HIT, rep
            span = rep.pages[0].spans[1]
            door.stub.Release(pb.ReleaseRequest(session=ctx.session, boot_id=ctx.boot, lease=rep.lease), timeout=5)
            ctx.slab.tensors[span.slab][span.offset + 100] ^= 0xFF
        finally:
            ctx.slab.release()
    finally:
        door.close()


class _Worker:
    """One worker connector (TP 1) on a CPU cache of 16 blocks, driven as
    vLLM's worker is: save blocks, load them into others (async or sync,
    layer by layer), what get_block_ids_with_load_errors says."""

    def __init__(self, sock, mode):
        set_ranks(0, 1)
        self.kcc = vh.kv_cache_config(16)
        self.names = vh.layer_names()
        self.caches = {n: torch.randn(2, 16, vh.BLOCK, vh.HEADS, vh.HEAD_DIM).to(vh.DTYPE) for n in self.names}
        self.w = kv.KvtierConnector(vh.vllm_config(sock, 1, {"load_mode": mode}), KVConnectorRole.WORKER, self.kcc)
        self.w.register_kv_caches(self.caches)
        self.mode = mode
        self.n = 0

    def save(self, hashes, ids):
        w, rid = self.w, "s%d" % self.n
        self.n += 1
        w.bind_connector_metadata(kv.KvtierMetadata(saves=[(rid, hashes, ids)]))
        w.start_load_kv(None)
        w.wait_for_save()
        deadline = time.monotonic() + 20
        while w.get_finished({rid})[0] != {rid}:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        w.clear_connector_metadata()

    def load(self, hashes, ids):
        """Loads into ids; the block ids reported failed."""
        w, rid = self.w, "l%d" % self.n
        self.n += 1
        w.bind_connector_metadata(kv.KvtierMetadata(loads=[(rid, hashes, ids, self.mode == "async")]))
        w.start_load_kv(None)
        if self.mode == "sync":
            for name in self.names:
                w.wait_for_layer_load(name)
            w.wait_for_save()
            w.get_finished(set())
        else:
            w.wait_for_save()
            deadline = time.monotonic() + 20
            while w.get_finished(set())[1] != {rid}:
                assert time.monotonic() < deadline
                time.sleep(0.01)
        w.clear_connector_metadata()
        return w.get_block_ids_with_load_errors()

    def same(self, a, b):
        return all(torch.equal(t[:, a], t[:, b]) for t in self.caches.values())

    def scribble(self, key):
        """Flips a byte of a committed page's "v" span through this
        worker's own map of serve's slab."""
        door = self.w._worker.door
        rep, ctx = door.call("BatchGet", lambda s, b: pb.GetRequest(session=s, boot_id=b, keys=[key]), hold=True)
        try:
            assert rep.pages[0].status == pb.GET_STATUS_HIT, rep
            span = rep.pages[0].spans[1]
            door.stub.Release(pb.ReleaseRequest(session=ctx.session, boot_id=ctx.boot, lease=rep.lease), timeout=5)
            ctx.slab.tensors[span.slab][span.offset + 100] ^= 0xFF
        finally:
            ctx.slab.release()

    def door_stats(self):
        rep, _ = self.w._worker.door.call("Stats", lambda s, b: pb.StatsRequest(session=s, boot_id=b))
        return rep

    def close(self):
        self.w.shutdown()


@pytest.mark.parametrize("mode", ["async", "sync"])
@pytest.mark.parametrize("sums", ["client-sums", "serve-sums", "old-serve"])
def test_scribbled_page_fails_its_load(kvtier_bin, tmp_path, monkeypatch, sums, mode):
    """A committed slab page that something scribbled on (through the
    worker's own slab map) fails its check: the client's, over the bytes
    it copies, against the sums it gave at Commit (client-sums; a
    synchronous load chains each layer's sums), or serve's while it is
    copied (check_at_release: serve-sums, and old-serve, a serve that
    ignores client_verifies and sends no sums). Its block is reported by
    get_block_ids_with_load_errors (vLLM recomputes it, never uses it),
    the other blocks load whole, serve counts it corrupt and drops it."""
    client_sums = sums != "serve-sums"
    if client_sums and not native.available():
        pytest.fail("the native library did not load: %s" % native.why())
    monkeypatch.setenv("KVTIER_CLIENT_SUMS", "1" if client_sums else "0")
    kb = vh.kind_bytes()
    s = start_serve(kvtier_bin, tmp_path, [("k", kb), ("v", kb)], 64)
    wk = None
    try:
        wk = _Worker(s.sock, mode)
        if sums == "old-serve":
            wk.w._worker.door.stub = vh.OldServe(wk.w._worker.door.stub)
        hashes = [os.urandom(32) for _ in range(4)]
        src, dst = [1, 2, 3, 4], [9, 11, 10, 13]
        wk.save(hashes, src)
        st = wk.w.get_kv_connector_stats().data
        assert st["save_stored_blocks"] == 4 and st.get("copy_summed_blocks", 0) == (4 if client_sums else 0), st
        wk.scribble(wk.w._worker._keys(hashes[2:3])[0])
        assert wk.load(hashes, dst) == {dst[2]}
        for i in (0, 1, 3):
            assert wk.same(src[i], dst[i]), i
        st = wk.w.get_kv_connector_stats().data
        assert st["load_corrupt_blocks"] == 1 and st["load_failed_blocks"] == 1 and st["load_blocks"] == 3, st
        assert st.get("copy_summed_blocks", 0) == (4 if client_sums else 0), st
        assert wk.door_stats().corrupt_pages == 1  # serve dropped it, whoever checked
        # Dropped from the slab: a miss, or the L3 copy reloaded whole.
        again = wk.load(hashes[2:3], [12])
        assert again == {12} or (again == set() and wk.same(src[2], 12)), again
    finally:
        if wk is not None:
            wk.close()
        s.stop()


class _WrongFirstSum:
    """Fault injection (a client whose sum is wrong): wraps
    _Blocks.copy_summed so that a save's first page's first kind gets its
    CRC32C with one bit flipped; loads are left alone."""

    def __init__(self, real):
        self.real = real

    def __call__(self, blocks, to_blocks, pages, layers):
        sums = self.real(blocks, to_blocks, pages, layers)
        if not to_blocks and len(sums):
            sums[0] ^= 1
        return sums


@pytest.mark.parametrize("client_sums", [True, False], ids=["client-sums", "serve-sums"])
def test_commit_carries_the_clients_sums(kvtier_bin, tmp_path, monkeypatch, client_sums):
    """With client sums serve keeps the sums the save's Commit carried:
    a page committed with a wrong one (fault injection) is refused at the
    next load (the client's check against serve's sums fails; serve counts
    it corrupt), the others load whole. Without them copy_summed is not
    used and serve's own sums make every page load."""
    if client_sums and not native.available():
        pytest.fail("the native library did not load: %s" % native.why())
    monkeypatch.setenv("KVTIER_CLIENT_SUMS", "1" if client_sums else "0")
    kb = vh.kind_bytes()
    s = start_serve(kvtier_bin, tmp_path, [("k", kb), ("v", kb)], 64)
    wk = None
    try:
        wk = _Worker(s.sock, "async")
        hashes = [os.urandom(32) for _ in range(3)]
        real = kv._Blocks.copy_summed
        monkeypatch.setattr(kv._Blocks, "copy_summed", lambda *a: _WrongFirstSum(real)(*a))
        wk.save(hashes, [1, 2, 3])
        monkeypatch.setattr(kv._Blocks, "copy_summed", real)
        failed = wk.load(hashes, [4, 5, 6])
        if client_sums:
            assert failed == {4}
            assert wk.door_stats().corrupt_pages == 1
        else:
            assert failed == set()
            assert wk.door_stats().corrupt_pages == 0
        for a, b in zip([1, 2, 3], [4, 5, 6]):
            if b not in failed:
                assert wk.same(a, b), (a, b)
    finally:
        if wk is not None:
            wk.close()
        s.stop()


def test_sum_continuation():
    """_Shift chains the CRC32C of consecutive parts (a synchronous load's
    layers): combine(crc(A), crc(B)) == crc(A + B) for B of the shift's
    length; seeded random bytes."""
    if not native.available():
        pytest.fail("the native library did not load: %s" % native.why())
    import random
    seed = 20261206
    r = random.Random(seed)
    for n in (1, 3, 64, 4096, 65536):
        sh = kv._Shift(n)
        a = [r.randbytes(r.randrange(1, 300)) for _ in range(6)]
        b = [r.randbytes(n) for _ in range(6)]
        got = sh.combine(np.array([native.crc32c(x) for x in a], dtype=np.uint32),
                         np.array([native.crc32c(x) for x in b], dtype=np.uint32))
        assert got.tolist() == [native.crc32c(x + y) for x, y in zip(a, b)], "seed %d, n %d" % (seed, n)


def test_engine_tp2(kvtier_bin, tmp_path):
    """The engine with 2 worker processes (TP 2) against one serve:
    requests sharing prefixes, asynchronous loads, preemption (a small KV
    pool) and aborts; a second vLLM with synchronous, layer-by-layer loads
    finds every prefix; a page corrupted in the store is reported by
    get_block_ids_with_load_errors and recomputed, the output right; serve
    killed under load (misses, nothing raises) and restarted (registered
    again, the pages found in L3). Every loaded block checked: 0 wrong
    bytes used."""
    kb = vh.kind_bytes(2)
    s = start_serve(kvtier_bin, tmp_path, [("k", kb), ("v", kb)], 512)
    e = None
    try:
        t0 = time.monotonic()
        # A pool of 36 blocks: 8 running requests of 4-7 blocks, each growing
        # a block or two while it decodes, preempt each other.
        e = vh.Engine(s.sock, tp=2, num_blocks=36)
        ps = vh.prompts(16, seed=1)
        for i, p in enumerate(ps[:8]):
            e.add("a%d" % i, p, 20)
        aborted = []

        def more(n):
            if n == 3:
                for i, p in enumerate(ps[8:]):
                    e.add("a%d" % (i + 8), p, 20)
            if n == 6:  # one running, one waiting (maybe loading)
                for rid in ("a1", "a12"):
                    e.sched.abort(rid)
                    aborted.append(rid)

        e.run(on_step=more)
        for i, p in enumerate(ps):
            if "a%d" % i not in aborted:
                assert e.outputs["a%d" % i] == vh.expected_output(p, 20), i
        assert e.sched.preemptions > 0
        assert e.wrong_used == 0 and e.wrong_dropped == 0
        st = e.stats.data
        assert st["save_stored_blocks"] > 0 and st.get("save_failed_blocks", 0) == 0, st
        assert len(e.sched.free) == 36 and not e.sched.blocks  # every block came back
        print("\nphase async: %d steps, %d preemptions, %s" % (e.steps, e.sched.preemptions, e.stats.reduce()))

        # A second vLLM on the node, synchronous loads layer by layer.
        e.rebuild({"load_mode": "sync"})
        e.stats = None
        for i, p in enumerate(ps):
            e.add("b%d" % i, p, 3)
        e.run()
        for i, p in enumerate(ps):
            assert e.outputs["b%d" % i] == vh.expected_output(p, 3), i
        st = e.stats.data
        assert e.wrong_used == 0 and e.checked > 0
        assert st["load_blocks"] >= 2 * 16 * 3 and st.get("load_failed_blocks", 0) == 0, st
        print("phase sync: %s" % e.stats.reduce())

        # A page corrupted in the store (rank 1's copy of a block): with a
        # synchronous load the forward that read it is dropped by vLLM and
        # the block recomputed; with an asynchronous one the request never
        # reads it (it is cut at the block before it is scheduled).
        for mode, prompt, block in (("sync", ps[0], 1), ("async", ps[1], 2)):
            if mode == "async":
                e.rebuild({"load_mode": "async"})
            key = vh.Request("x", prompt, block_hasher=e.sched.hasher).block_hashes[block].hex() + ".1"
            corrupt_page(s.sock, e.conn.namespace, key)
            e.stats, e.invalid, e.wrong_dropped = None, set(), 0
            e.add("c-" + mode, prompt, 3)
            e.run()
            assert e.outputs["c-" + mode] == vh.expected_output(prompt, 3)
            assert len(e.invalid) == 1, "the corrupted page was not reported: %s" % e.invalid
            assert e.wrong_used == 0
            if mode == "async":
                assert e.wrong_dropped == 0
            st = e.stats.data
            assert st.get("load_corrupt_blocks", 0) == 1 and st["load_failed_blocks"] == 1, st
            print("corrupt page, %s load: invalid blocks %s, %d wrong elements read in dropped steps" % (
                mode, sorted(e.invalid), e.wrong_dropped))

        # serve killed under load, then restarted on the same data.
        e.stats = None
        qs = vh.prompts(8, seed=3)

        def kill_restart(n):
            if n == 2:
                s.kill()
            if n == 8:
                s.start()

        for i, p in enumerate(qs):
            e.add("d%d" % i, p, 12)
        e.run(on_step=kill_restart)
        for i, p in enumerate(qs):
            assert e.outputs["d%d" % i] == vh.expected_output(p, 12), i
        print("serve killed and restarted: %s" % e.stats.reduce())
        away = dict(e.stats.data)
        assert sum(away.get(k, 0) for k in ("load_failed_blocks", "lookups_unavailable", "save_failed_blocks")) > 0, away
        # Once the connectors reach the new serve (grpc may still be backing
        # off its reconnect for a moment), the old prefixes come back from L3.
        for attempt in range(6):
            for i, p in enumerate(ps[:4]):
                e.add("f%d-%d" % (attempt, i), p, 2)
            e.run()
            for i, p in enumerate(ps[:4]):
                assert e.outputs["f%d-%d" % (attempt, i)] == vh.expected_output(p, 2), i
            if e.stats.data.get("load_blocks", 0) > away.get("load_blocks", 0):
                break
            time.sleep(0.5)
        st = e.stats.data
        assert e.wrong_used == 0
        assert st["load_blocks"] > away.get("load_blocks", 0), st
        # The scheduler side and both workers registered again on the new
        # boot (by themselves, at their first call after it).
        assert st["registrations"] == 3, st
        print("after restart: %s; %.1f s" % (e.stats.reduce(), time.monotonic() - t0))
    finally:
        if e is not None:
            e.close()
        s.stop()


def test_stats_and_prometheus():
    a = kv.KvtierConnector.build_kv_connector_stats({"load_blocks": 2, "load_bytes": 4e9, "load_s": 2.0})
    b = kv.KvtierConnectorStats(data={"load_blocks": 3, "save_stored_blocks": 1})
    assert not a.is_empty() and kv.KvtierConnectorStats().is_empty()
    a.aggregate(b)
    assert a.data["load_blocks"] == 5 and a.data["save_stored_blocks"] == 1
    red = a.reduce()
    assert red["load_blocks"] == 5 and red["load_GBps"] == 2.0 and "load_s" not in red
    a.reset()
    assert a.is_empty()
    types = {vmetrics.Gauge: vmetrics.Gauge, vmetrics.Counter: vmetrics.Counter,
             vmetrics.Histogram: vmetrics.Histogram}
    prom = kv.KvtierConnector.build_prom_metrics(vh.vllm_config("/x"), types, ["model_name", "engine"],
                                                 {0: ["m", "0"], 1: ["m", "1"]})
    prom.observe({"load_blocks": 4, "load_failed_blocks": 1, "save_stored_blocks": 2, "load_bytes": 100,
                  "registrations": 1, "unknown": 3}, engine_idx=1)
    vals = {c.metric.name: c.metric.values for c in prom._children.values()}
    assert vals["vllm:kvtier_load_blocks"] == {("m", "1", "loaded"): 4, ("m", "1", "failed"): 1}
    assert vals["vllm:kvtier_save_blocks"] == {("m", "1", "stored"): 2}
    assert vals["vllm:kvtier_bytes"] == {("m", "1", "load"): 100}
    assert vals["vllm:kvtier_registrations"] == {("m", "1"): 1}


@pytest.mark.skipif(os.environ.get("KVTIER_BENCH") != "1", reason="benchmark: KVTIER_BENCH=1 runs it")
def test_bench(kvtier_bin):
    """The benchmark of docs/vllm.md (kvtier.bench_vllm) on this machine."""
    from kvtier import bench_vllm

    assert bench_vllm.main(["--kvtier", kvtier_bin, "--rounds", "3"]) == 0


class _BlocksConn:
    """What _Blocks reads of its connector, for copies without a serve."""

    def __init__(self, layers, heads, head_dim, esize=2):
        self.block_size, self.num_layers, self.mla, self.kv_layout = vh.BLOCK, layers, False, "NHD"
        self.chunk_bytes = [vh.BLOCK * heads * head_dim * esize] * 2
        self.kind_bytes = [layers * c for c in self.chunk_bytes]
        self.kind_names = ["k", "v"]
        self.counts = {}

    def _count(self, **kv_):
        for k, v in kv_.items():
            self.counts[k] = self.counts.get(k, 0) + v


@pytest.mark.parametrize("shape", ["flash", "flashinfer"])
@pytest.mark.parametrize("staged_pages", [2, 16])
def test_staged_copy_matches_views(shape, staged_pages):
    """The CUDA path's staged copy (_Blocks._copy_staged: runs' slab
    ranges packed into a device buffer a piece at a time, then a copy or
    an index_copy_/index_select a layer on the device) moves the same
    bytes as the strided views of the host path (_copy_runs), both ways:
    a buffer of 2 pages (a run split in pieces, pieces of parts of two
    runs) and of 16 (every run in one piece). Run here on CPU tensors: on
    a GPU the buffer is device memory and the copies are ordered on one
    stream."""
    seed = 20261207
    g = torch.Generator().manual_seed(seed)
    layers, heads, hd, nb = 3, 2, 8, 24
    conn = _BlocksConn(layers, heads, hd)
    mk = (lambda: torch.zeros(2, nb, vh.BLOCK, heads, hd, dtype=torch.bfloat16)) if shape == "flash" else (
        lambda: torch.zeros(nb, 2, vh.BLOCK, heads, hd, dtype=torch.bfloat16))
    names = ["model.layers.%d.self_attn" % i for i in range(layers)]

    def caches():
        return {n: mk() for n in names}

    src = caches()
    for t in src.values():
        t.view(torch.int16).copy_(torch.randint(-32768, 32767, t.shape, generator=g, dtype=torch.int16))
    # Pages: a run of 7 (blocks 3-9 in slab pages 0-6), a run of 2, a single.
    plan = [(3, 7, 0), (14, 2, 9), (20, 1, 12)]
    npages = 14
    for direction in ("to_slab", "to_blocks"):
        out = {}
        for how in ("views", "staged"):
            blocks = kv._Blocks(conn, src if direction == "to_slab" else caches(), nb)
            slab = [torch.zeros(npages * kb, dtype=torch.uint8) for kb in conn.kind_bytes]
            if direction == "to_blocks":
                for k, t in enumerate(slab):
                    t.copy_(torch.randint(0, 256, t.shape, generator=torch.Generator().manual_seed(seed + k),
                                          dtype=torch.uint8))
            pages, runs = [], []
            for b0, r, p0 in plan:
                runs.append((len(pages), r))
                for j in range(r):
                    pages.append((b0 + j, [0, 0], [(slab[k], (p0 + j) * kb, k) for k, kb in enumerate(conn.kind_bytes)]))
            lays = range(layers)
            if how == "views":
                blocks._copy_runs(direction == "to_blocks", pages, runs, lays, False)
            else:
                staging = torch.empty(staged_pages * max(conn.kind_bytes) + 5, dtype=torch.uint8)
                blocks._copy_staged(direction == "to_blocks", pages, runs, lays, staging)
            out[how] = ([t.clone() for t in slab] if direction == "to_slab" else
                        [blocks.layers[li][k][0].clone() for li in lays for k in range(2)])
        for a, b in zip(out["views"], out["staged"]):
            assert torch.equal(a, b), "seed %d, %s" % (seed, direction)
        assert any(t.any() for t in out["staged"]), "seed %d: nothing copied" % seed


class _FakeCudart:
    """A stand-in for torch.cuda.cudart(), for fault injection: records
    the registrations; refuse: every cudaHostRegister fails (error 1)."""

    def __init__(self, refuse=False):
        self.refuse, self.registered, self.unregistered = refuse, [], []

    def cudaHostRegister(self, addr, size, flags):
        if self.refuse:
            return 1
        self.registered.append((addr, size, flags))
        return 0

    def cudaHostUnregister(self, addr):
        self.unregistered.append(addr)
        return 0


@pytest.mark.parametrize("refuse", [False, True], ids=["pinned", "refused"])
def test_slab_pinning(tmp_path, monkeypatch, caplog, refuse):
    """A CUDA worker's slab maps are page-locked (cudaHostRegister, every
    file's whole map) and unregistered before they are unmapped, once,
    after the last copy through a retired slab; a driver that refuses
    leaves them pageable with one warning and nothing to unregister."""
    fake = _FakeCudart(refuse)
    monkeypatch.setattr(kv, "_cudart", lambda: fake)
    monkeypatch.setattr(kv._Slab, "_refused", False)
    files = []
    for i, size in enumerate((3 * 4096, 5 * 4096)):
        p = tmp_path / ("slab%d" % i)
        p.write_bytes(b"\0" * size)
        files.append(dataclasses.make_dataclass("F", ["id", "path", "size"])(i, str(p), size))
    geom = dataclasses.make_dataclass("G", ["files"])(files)
    s = kv._Slab(geom, pin=True)
    if refuse:
        assert fake.registered == [] and "cudaHostRegister of the slab" in caplog.text
    else:
        assert fake.registered == [(a, n, 0) for a, n in zip(s.addrs, s.sizes)]
    assert s.acquire()
    s.retire()
    assert fake.unregistered == []  # a copy still runs through it
    s.release()
    assert fake.unregistered == ([] if refuse else [a for a, _, _ in fake.registered])
    s.close()  # again: nothing more
    assert len(fake.unregistered) == (0 if refuse else 2)
    plain = kv._Slab(geom)
    plain.close()
    assert len(fake.registered) == (0 if refuse else 2)


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="no CUDA device: scripts/gpu-check.sh runs this where there is one")
@pytest.mark.parametrize("load_mode", ["async", "sync"])
def test_engine_on_cuda(kvtier_bin, tmp_path, caplog, load_mode):
    """vLLM's KV cache on a GPU: the worker page-locks the slab, saves and
    asynchronous loads run on streams of their own through device staging
    buffers, synchronous loads on the forward's stream; a second engine
    (its cache empty) loads what the first saved: every loaded position
    is what the model wrote (0 wrong bytes)."""
    kb = vh.kind_bytes()
    s = start_serve(kvtier_bin, tmp_path, [("k", kb), ("v", kb)])
    prompts = {"a": list(range(1, 71)), "b": list(range(1, 50)) + [9] * 30, "c": list(range(500, 564))}
    try:
        for gen in (0, 1):
            e = vh.Engine(s.sock, tp=1, num_blocks=64, inproc=True, device="cuda", extra={"load_mode": load_mode})
            try:
                for rid, p in prompts.items():
                    e.add("%s%d" % (rid, gen), p, 2)
                e.run(timeout=120)
                for rid, p in prompts.items():
                    assert e.outputs["%s%d" % (rid, gen)] == vh.expected_output(p, 2)
                assert e.wrong_used == 0
                w = e.workers[0].conn._worker
                assert w.blocks.cuda and w.door._slab is not None and w.door._slab._pinned
                if gen == 1:
                    st = e.stats.data
                    assert e.checked > 0 and st.get("load_blocks", 0) > 0 and not st.get("load_failed_blocks"), st
            finally:
                e.close()
        assert "cudaHostRegister of the slab" not in caplog.text
    finally:
        s.stop()
