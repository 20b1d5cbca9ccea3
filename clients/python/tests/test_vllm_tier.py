"""kvtier.vllm_tier.KvtierTier, vLLM's secondary tier over the page-store
door, driven as vLLM's tiering manager drives a secondary tier (snapshot
041410b9: lookup per block key on a primary miss, one batched submit_load
per request at the end of the step, submit_store after each store into
the CPU primary, get_finished once per step), on a torch CPU tensor as
the CPU primary, against a real ``kvtier serve --doors store`` (an shm
slab, a real l3disk with LMDB). Every block loaded is compared byte for
byte with what its key was stored with. vLLM is not installed:
tests/standin has the interface (conftest puts it on sys.path)."""

import ctypes
import hashlib
import inspect
import os
import signal
import time
import types

import grpc
import numpy as np
import pytest
import torch

from vllm.v1.kv_offload.base import OffloadingSpec, ReqContext, RequestOffloadingContext, make_offload_key
from vllm.v1.kv_offload.tiering import base as tierbase
from vllm.v1.kv_offload.tiering.base import JobMetadata, JobResult, SecondaryTierManager
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory

import vllmhelp as vh
from kvtier import native
from kvtier import vllm_tier
from kvtier.store.v1 import store_pb2 as pb
from kvtier.store.v1 import store_pb2_grpc as pbg
from kvtier.vllm_tier import KvtierError, KvtierTier
from sglhelp import KIND_BYTES, Serve, page_data, store_yaml

ROW = 2 * KIND_BYTES  # a primary row: kinds k and v of the test stack
KINDS = ["k", "v"]

# SecondaryTierManager at vLLM 041410b9 (vllm/v1/kv_offload/tiering/
# base.py), from the facts: method -> (parameters, abstract).
TIER_TABLE = {
    "__init__": (["self", "offloading_spec", "primary_kv_view", "tier_type"], False),
    "lookup": (["self", "key", "req_context"], True),
    "submit_store": (["self", "job_metadata"], True),
    "submit_load": (["self", "job_metadata"], True),
    "get_finished": (["self"], True),
    "touch": (["self", "keys", "req_context"], False),
    "get_request_offloading_context": (["self", "req_context"], False),
    "request_finished": (["self", "req_context"], False),
    "shutdown": (["self"], False),
}
JOB_METADATA_FIELDS = ["job_id", "keys", "block_ids", "is_promotion", "req_context"]
JOB_RESULT_FIELDS = ["job_id", "success"]
FACTORY_TABLE = {
    "register_tier": ["cls", "tier_type", "module_path", "class_name"],
    "create_secondary_tier": ["cls", "tier_config", "primary_kv_view", "offloading_spec"],
}


def spec(model="test/model", dtype="auto"):
    cfg = types.SimpleNamespace(
        model_config=types.SimpleNamespace(model=model, revision="rev1", dtype="bfloat16"),
        cache_config=types.SimpleNamespace(cache_dtype=dtype),
        parallel_config=types.SimpleNamespace(tensor_parallel_size=1, pipeline_parallel_size=1))
    return OffloadingSpec(vllm_config=cfg, kv_cache_config=None, extra_config={}, gpu_block_size=(16,),
                          block_size_factor=1)


def keys_of(prefix, n):
    """n chained block keys (vLLM's OffloadKey: a 32-byte block hash and
    the KV cache group index)."""
    out, h = [], hashlib.sha256(prefix.encode()).digest()
    for i in range(n):
        h = hashlib.sha256(h + i.to_bytes(4, "little")).digest()
        out.append(make_offload_key(h, 0))
    return out


def data(key):
    return page_data(key.hex(), 0, ROW)


class Tiering:
    """Calls a secondary tier as vLLM's TieringOffloadingManager does
    (written from its documented behaviour, not its code): the CPU
    primary is a (blocks, row bytes) uint8 tensor whose memoryview the
    tier gets; lookup asks the primary first, then the tier, and on a
    tier hit allocates a primary block and answers None (promotion
    started); end_step submits one batched load per request; finished
    jobs are taken once per step, and a failed promotion frees its
    blocks (vLLM recomputes them)."""

    def __init__(self, blocks):
        self.primary = torch.zeros((blocks, ROW), dtype=torch.uint8)
        self.view = memoryview(self.primary.numpy())
        self.free = list(range(blocks))
        self.ready = {}  # key -> primary block
        self.loading = {}  # key -> primary block
        self.pending = {}  # req_id -> (ctx, keys, blocks)
        self.jobs = {}  # job_id -> JobMetadata
        self.results = {}  # job_id -> success
        self.next_job = 0
        self.polled = False
        self.tier = None

    def attach(self, tier):
        self.tier = tier

    def poll(self):
        if self.polled:
            return
        self.polled = True
        for r in self.tier.get_finished():
            assert isinstance(r, JobResult)
            meta = self.jobs.pop(r.job_id)  # a result for a job never submitted fails here
            self.results[r.job_id] = r.success
            if meta.is_promotion:
                for k, b in zip(meta.keys, meta.block_ids):
                    del self.loading[k]
                    if r.success:
                        self.ready[k] = int(b)
                    else:
                        self.free.append(int(b))

    def lookup(self, key, ctx):
        self.poll()
        if key in self.ready:
            return True
        if key in self.loading:
            return None
        hit = self.tier.lookup(key, ctx)
        if hit is True:
            if not self.free:
                return False
            b = self.free.pop()
            self.loading[key] = b
            _, ks, bs = self.pending.setdefault(ctx.req_id, (ctx, [], []))
            ks.append(key)
            bs.append(b)
            return None
        return hit

    def scan(self, keys, ctx):
        """The connector's prefix scan: hits counted up to the first miss;
        None while any lookup asked to come back."""
        hits, again = 0, False
        for k in keys:
            r = self.lookup(k, ctx)
            if r is True:
                hits += 1
            elif r is None:
                again = True
            else:
                break
        return None if again else hits

    def end_step(self):
        self.poll()
        self.polled = False
        for ctx, ks, bs in self.pending.values():
            self.tier.submit_load(self._job(ks, bs, True, ctx))
        self.pending.clear()

    def _job(self, keys, blocks, promotion, ctx):
        j = JobMetadata(job_id=self.next_job, keys=list(keys), block_ids=np.array(blocks, dtype=np.int64),
                        is_promotion=promotion, req_context=ctx)
        self.jobs[j.job_id] = j
        self.next_job += 1
        return j

    def store(self, keys, ctx):
        """Blocks computed on the GPU land in fresh primary blocks and are
        cascaded to the tier (submit_store); returns the job id."""
        blocks = [self.free.pop() for _ in keys]
        for k, b in zip(keys, blocks):
            self.primary[b].copy_(data(k))
            self.ready[k] = b
        j = self._job(keys, blocks, False, ctx)
        self.tier.submit_store(j)
        return j.job_id

    def evict(self, keys):
        for k in keys:
            self.free.append(self.ready.pop(k))

    def run(self, keys, ctx, steps=400, sleep=0.005):
        """Steps until the scan of keys resolves; returns the hit count."""
        for _ in range(steps):
            n = self.scan(keys, ctx)
            self.end_step()
            if n is not None:
                return n
            time.sleep(sleep)
        raise AssertionError("the scan did not resolve in %d steps; tier %s" % (steps, dict(self.tier.counters)))

    def wait(self, job_ids, timeout=30):
        deadline = time.time() + timeout
        while not all(j in self.results for j in job_ids):
            assert time.time() < deadline, "jobs %s not finished: %s" % (
                [j for j in job_ids if j not in self.results], dict(self.tier.counters))
            self.poll()
            self.polled = False
            time.sleep(0.005)
        return [self.results[j] for j in job_ids]

    def wrong(self, keys):
        return [k for k in keys if not torch.equal(self.primary[self.ready[k]], data(k))]


class Door:
    """A raw client of the store door in the tier's namespace (the
    test's own session): where a page is, without prefetching it, and
    scribbling on a slab page."""

    def __init__(self, sock, namespace):
        self.channel = grpc.insecure_channel("unix:" + sock)
        self.stub = pbg.StoreStub(self.channel)
        rep = self.stub.Register(pb.RegisterRequest(client_id="test", namespace=namespace, protocol_versions=[1]),
                                 timeout=5)
        self.session, self.boot = rep.session, rep.boot_id
        self.slab = vllm_tier._Slab(rep.slab)

    def tiers(self, keys):
        rep = self.stub.BatchExists(pb.ExistsRequest(session=self.session, boot_id=self.boot,
                                                     keys=[k.hex() for k in keys]), timeout=5)
        return list(rep.tiers)

    def scribble(self, key):
        rep = self.stub.BatchGet(pb.GetRequest(session=self.session, boot_id=self.boot, keys=[key.hex()]), timeout=5)
        assert rep.pages[0].status == pb.GET_STATUS_HIT
        span = rep.pages[0].spans[1]
        addr = self.slab.check(span, KIND_BYTES) + 100
        b = ctypes.c_ubyte.from_address(addr)
        b.value ^= 0xFF
        self.stub.Release(pb.ReleaseRequest(session=self.session, boot_id=self.boot, lease=rep.lease), timeout=5)

    def close(self):
        self.slab.retire()
        self.channel.close()


def start_serve(kvtier_bin, tmp_path, slab_pages, name="data"):
    s = Serve(kvtier_bin, str(tmp_path / name), store_yaml(("k", "v"), slab_pages), lease="2s")
    s.start()
    return s


def make_tier(sock, t, **extra):
    cfg = {"type": "kvtier", "socket": sock, "kinds": KINDS, "timeout_s": 3, "register_retry_s": 0.1}
    cfg.update(extra)
    vllm_tier.register()
    tier = SecondaryTierFactory.create_secondary_tier(cfg, t.view, spec())
    t.attach(tier)
    return tier


def wait_stopped(pid):
    deadline = time.time() + 10  # SIGSTOP reaches every thread asynchronously
    while not all(open("/proc/%d/task/%s/stat" % (pid, tid)).read().rsplit(")", 1)[1].split()[0] == "T"
                  for tid in os.listdir("/proc/%d/task" % pid)):
        assert time.time() < deadline, "serve did not stop"
        time.sleep(0.01)


# ---- the interface ----------------------------------------------------------


def _params(fn):
    return list(inspect.signature(fn).parameters)


def test_interface_table():
    """The stand-in's SecondaryTierManager, job types and factory match
    the facts of vLLM 041410b9; KvtierTier implements every method with
    the same parameters and is a SecondaryTierManager."""
    for name, (params, abstract) in TIER_TABLE.items():
        fn = getattr(SecondaryTierManager, name)
        assert _params(fn) == params, name
        assert (name in SecondaryTierManager.__abstractmethods__) == abstract, name
        if name != "__init__":
            assert _params(getattr(KvtierTier, name)) == params, name
            assert getattr(KvtierTier, name) is not fn or not abstract, name
    assert set(SecondaryTierManager.__abstractmethods__) == {n for n, (_, a) in TIER_TABLE.items() if a}
    assert not KvtierTier.__abstractmethods__
    # The factory builds with keywords: KvtierTier takes them (and the tier's own keys).
    assert _params(KvtierTier.__init__)[:4] == TIER_TABLE["__init__"][0]
    assert [f for f in JobMetadata.__dataclass_fields__] == JOB_METADATA_FIELDS
    assert [f for f in JobResult.__dataclass_fields__] == JOB_RESULT_FIELDS
    assert tierbase.JobId is int
    for name, params in FACTORY_TABLE.items():
        assert ["cls"] + _params(getattr(SecondaryTierFactory, name)) == params, name
    assert vllm_tier.VLLM_SNAPSHOT.startswith("041410b9")


def test_loading_from_config(tmp_path):
    """What vLLM's config names is enough: OffloadingSpecFactory loads
    spec_name KvtierTieringSpec from spec_module_path kvtier.vllm_tier (a
    TieringOffloadingSpec; importing the module registered the "kvtier"
    tier), and the spec's secondary_tiers entry {"type": "kvtier", ...}
    builds a KvtierTier through SecondaryTierFactory."""
    import importlib

    from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

    mod = importlib.import_module("kvtier.vllm_tier")
    spec_cls = getattr(mod, "KvtierTieringSpec")
    assert issubclass(spec_cls, TieringOffloadingSpec)
    assert "kvtier" in SecondaryTierFactory._registry
    t = Tiering(4)
    sp = spec_cls(vllm_config=spec().vllm_config, extra_config={
        "spec_name": "KvtierTieringSpec", "spec_module_path": "kvtier.vllm_tier", "cpu_bytes_to_use": 1 << 30,
        "secondary_tiers": [{"type": "kvtier", "socket": str(tmp_path / "none.sock"), "kinds": KINDS,
                             "page_tokens": 16}]})
    (tier,) = sp.secondary_tiers(t.view)
    try:
        assert isinstance(tier, KvtierTier) and tier.tier_type == "kvtier"
        assert tier.namespace.model == "test/model" and tier.namespace.page_tokens == 16
    finally:
        tier.shutdown()
    with pytest.raises(AttributeError):
        getattr(mod, "NoSuchSpec")


def test_config_errors(tmp_path):
    """Configuration errors raise at construction and name the key; a
    vLLM whose factory passes vllm_config= is refused, naming the
    snapshot; serve away is not an error."""
    t = Tiering(4)
    sock = str(tmp_path / "none.sock")
    with pytest.raises(KvtierError, match="unknown secondary tier keys"):
        KvtierTier(offloading_spec=spec(), primary_kv_view=t.view, tier_type="kvtier", socket=sock, bogus=1)
    for v in (-1, "abc", 2.5, None, True):
        with pytest.raises(KvtierError, match="get_deadline_ms"):
            KvtierTier(offloading_spec=spec(), primary_kv_view=t.view, tier_type="kvtier", socket=sock, get_deadline_ms=v)
    with pytest.raises(KvtierError, match="041410b9"):
        KvtierTier(vllm_config=object(), primary_kv_view=t.view, tier_type="kvtier")
    with pytest.raises(KvtierError, match="split into 3 kinds"):
        KvtierTier(offloading_spec=spec(), primary_kv_view=t.view, tier_type="kvtier", kinds=["a", "b", "c"])
    with pytest.raises(KvtierError, match="model"):
        KvtierTier(offloading_spec=OffloadingSpec(), primary_kv_view=t.view, tier_type="kvtier", socket=sock)
    with pytest.raises(KvtierError, match="writable"):
        KvtierTier(offloading_spec=spec(), primary_kv_view=memoryview(bytes(ROW * 2)).cast("B", (2, ROW)),
                   tier_type="kvtier", socket=sock)
    # serve absent: built, every lookup a miss, every job failed at once.
    tier = KvtierTier(offloading_spec=spec(), primary_kv_view=t.view, tier_type="kvtier", socket=sock, kinds=KINDS,
                      module_path="kvtier.vllm_tier")
    t.attach(tier)
    ctx = ReqContext(req_id="r")
    k = keys_of("absent", 1)
    assert tier.lookup(k[0], ctx) is False
    j = t.store(k, ctx)
    assert t.wait([j]) == [False]
    assert tier.namespace.model == "test/model" and tier.namespace.dtype == "bfloat16"
    assert tier.namespace.page_tokens == 16 and tier.namespace.model_revision == "rev1"
    assert isinstance(tier.get_request_offloading_context(ctx), RequestOffloadingContext)
    tier.shutdown()


def test_lookup_table(tmp_path):
    """The scheduler's table (white box, no serve): an exists miss asked
    before the tier's own store committed does not undo the store's True;
    a load that found the page gone does; a new session's marker empties
    the table; an unknown key is asked once and is None until answered."""
    t = Tiering(4)
    tier = KvtierTier(offloading_spec=spec(), primary_kv_view=t.view, tier_type="kvtier",
                      socket=str(tmp_path / "none.sock"), kinds=KINDS)
    try:
        tier._up = True  # as if registered; the lookup thread finds no serve and forgets
        ctx = ReqContext(req_id="r")
        a, b = keys_of("table", 2)
        e = tier._seen_epoch
        tier._results.extend([(e, a, True), (e, a, False)])
        assert tier.lookup(a, ctx) is True
        tier._results.append((e, a, vllm_tier._GONE))
        assert tier.lookup(a, ctx) is False
        tier._verdict[b] = vllm_tier._PENDING
        assert tier.lookup(b, ctx) is None and not tier._asks  # asked already: not again
        tier._results.append(("epoch", e + 1, None))
        tier._up = True
        assert tier.get_finished() == [] and tier._verdict == {}
        tier._results.append((e, a, True))  # an answer about the old session
        assert tier.get_finished() == [] and a not in tier._verdict
    finally:
        tier.shutdown()


# ---- against serve ------------------------------------------------------------


def test_store_then_load(kvtier_bin, tmp_path):
    """Four requests' blocks stored into the tier, dropped from the
    primary, then found (None first: the tier asks serve in the
    background; then True) and promoted into other primary blocks: 0
    wrong bytes. An unknown chain is None, then False. A tier whose
    rows do not match serve's kinds is refused at construction."""
    s = start_serve(kvtier_bin, tmp_path, 256)
    t = Tiering(256)
    tier = make_tier(s.sock, t)
    try:
        reqs = [(ReqContext(req_id="r%d" % i), keys_of("req%d" % i, 16)) for i in range(4)]
        jobs = [t.store(ks, ctx) for ctx, ks in reqs]
        assert t.wait(jobs) == [True] * 4
        for _, ks in reqs:
            t.evict(ks)
        t.primary.zero_()
        for ctx, ks in reqs:
            assert tier.lookup(ks[0], ctx) is True  # the tier stored it: known at once
        for ctx, ks in reqs:
            assert t.run(ks, ctx) == 16
        assert t.wrong([k for _, ks in reqs for k in ks]) == []
        assert tier.counters["loaded_pages"] == 64 and tier.counters["stored_pages"] == 64
        # Never seen: None (asked in the background), then False.
        ctx = ReqContext(req_id="new")
        new = keys_of("never", 8)
        assert tier.lookup(new[0], ctx) is None
        assert t.run(new, ctx) == 0
        assert tier.lookup(new[0], ctx) is False
        # A store of blocks serve has already: EXISTS counts as stored.
        j = t.store(reqs[0][1][:4], reqs[0][0])
        assert t.wait([j]) == [True]
        # Another tier whose rows serve's kinds do not match.
        with pytest.raises(KvtierError, match="kinds"):
            KvtierTier(offloading_spec=spec(), primary_kv_view=t.view, tier_type="kvtier", socket=s.sock, kinds=["kv"])
    finally:
        tier.shutdown()
        s.stop()


def test_corrupt_page_fails_its_load(kvtier_bin, tmp_path):
    """A slab page something scribbled on fails serve's check while the
    tier copies it: its load job reports failure (vLLM recomputes the
    blocks, never uses the copied bytes), the key is a miss from then on;
    the other blocks load whole."""
    s = start_serve(kvtier_bin, tmp_path, 64)
    t = Tiering(32)
    tier = make_tier(s.sock, t)
    door = Door(s.sock, tier.namespace)
    try:
        good, bad = ReqContext(req_id="good"), ReqContext(req_id="bad")
        ks = keys_of("scribble", 4)
        assert t.wait([t.store(ks, good)]) == [True]
        t.evict(ks)
        door.scribble(ks[2])
        assert t.run(ks[:2] + ks[3:], good) == 3
        assert t.wrong(ks[:2] + ks[3:]) == []
        assert t.scan(ks[2:3], bad) is None  # promotion started
        t.end_step()
        (job,) = [j for j, m in t.jobs.items() if m.req_context is bad]
        assert t.wait([job]) == [False]
        assert ks[2] not in t.ready
        assert tier.counters["corrupt_pages"] == 1
        t.end_step()
        assert tier.lookup(ks[2], bad) is False
    finally:
        door.close()
        tier.shutdown()
        s.stop()


def _scribble_own(door, tier, key):
    """Flips a byte of a committed page's "v" span through the tier's own
    map of serve's slab (the test's door only says where the page is)."""
    rep = door.stub.BatchGet(pb.GetRequest(session=door.session, boot_id=door.boot, keys=[key.hex()]), timeout=5)
    assert rep.pages[0].status == pb.GET_STATUS_HIT
    span = rep.pages[0].spans[1]
    door.stub.Release(pb.ReleaseRequest(session=door.session, boot_id=door.boot, lease=rep.lease), timeout=5)
    b = ctypes.c_ubyte.from_address(tier._sess.slab.check(span, KIND_BYTES) + 100)
    b.value ^= 0xFF


@pytest.mark.parametrize("mode", ["client-sums", "serve-sums", "old-serve"])
def test_scribbled_page_fails_either_check(kvtier_bin, tmp_path, monkeypatch, mode):
    """A committed slab page scribbled on through the tier's own slab map
    fails its check: the tier's, over the bytes it copies, against the
    sums it gave at Commit (client-sums: the native library), or serve's
    while the tier copies it (check_at_release: serve-sums, and old-serve,
    a serve that ignores client_verifies and sends no sums). Its load job
    fails (vLLM never uses the bytes), the key is a miss from then on, the
    other blocks load whole, and serve counts it corrupt (and drops it)."""
    client_sums = mode != "serve-sums"
    if client_sums and not native.available():
        pytest.fail("the native library did not load: %s" % native.why())
    monkeypatch.setenv("KVTIER_CLIENT_SUMS", "1" if client_sums else "0")
    s = start_serve(kvtier_bin, tmp_path, 64)
    t = Tiering(32)
    tier = make_tier(s.sock, t)
    if mode == "old-serve":
        tier._stub = vh.OldServe(tier._stub)
    door = Door(s.sock, tier.namespace)
    try:
        good, bad = ReqContext(req_id="good"), ReqContext(req_id="bad")
        ks = keys_of("scribble", 4)
        assert t.wait([t.store(ks, good)]) == [True]
        assert tier.counters["store_summed_pages"] == (4 if client_sums else 0)
        t.evict(ks)
        _scribble_own(door, tier, ks[2])
        assert t.run(ks[:2] + ks[3:], good) == 3
        assert t.wrong(ks[:2] + ks[3:]) == []
        assert tier.counters["load_verified_pages"] == (3 if mode == "client-sums" else 0)
        assert t.scan(ks[2:3], bad) is None  # promotion started
        t.end_step()
        (job,) = [j for j, m in t.jobs.items() if m.req_context is bad]
        assert t.wait([job]) == [False]
        assert ks[2] not in t.ready
        assert tier.counters["corrupt_pages"] == 1
        assert tier.door_stats()["corrupt_pages"] == 1  # serve dropped it, whoever checked
        t.end_step()
        assert tier.lookup(ks[2], bad) is False
    finally:
        door.close()
        tier.shutdown()
        s.stop()


class _WrongFirstSum(vllm_tier.PieceBatch):
    """Fault injection (a client whose sum is wrong): the first group's
    CRC32C comes back with one bit flipped."""

    def run(self, ngroups):
        sums = super().run(ngroups)
        if sums:
            sums[0] ^= 1
        return sums


@pytest.mark.parametrize("client_sums", [True, False], ids=["client-sums", "serve-sums"])
def test_commit_carries_the_tiers_sums(kvtier_bin, tmp_path, monkeypatch, client_sums):
    """With client sums serve keeps the sums a store's Commit carried: the
    first page of a store committed with a wrong one (fault injection) is
    refused at the next load (the tier's check against serve's sums
    fails; serve counts it corrupt). Without them the summing batch is not
    used and serve's own sums make every page load."""
    if client_sums and not native.available():
        pytest.fail("the native library did not load: %s" % native.why())
    monkeypatch.setenv("KVTIER_CLIENT_SUMS", "1" if client_sums else "0")
    s = start_serve(kvtier_bin, tmp_path, 64)
    t = Tiering(32)
    tier = make_tier(s.sock, t)
    try:
        ctx = ReqContext(req_id="a")
        ks = keys_of("wrongsum", 3)
        monkeypatch.setattr(vllm_tier, "PieceBatch", _WrongFirstSum)
        assert t.wait([t.store(ks, ctx)]) == [True]
        monkeypatch.setattr(vllm_tier, "PieceBatch", _WrongFirstSum.__mro__[1])
        t.evict(ks)
        t.primary.zero_()
        if client_sums:
            assert t.run(ks, ctx) == 0  # the first block fails: the request loads none
            assert tier.counters["corrupt_pages"] == 1
            assert tier.door_stats()["corrupt_pages"] == 1
            assert t.run(ks[1:], ReqContext(req_id="b")) == 2
            assert t.wrong(ks[1:]) == []
        else:
            assert t.run(ks, ctx) == 3
            assert t.wrong(ks) == []
            assert tier.counters["corrupt_pages"] == 0
            assert tier.door_stats().get("corrupt_pages", 0) == 0
    finally:
        tier.shutdown()
        s.stop()


def test_non_blocking_while_serve_stalls(kvtier_bin, tmp_path):
    """serve stopped (SIGSTOP: the socket accepts, nothing answers):
    every scheduler-side call returns while the tier's jobs are blocked
    on serve (their results come only after SIGCONT). A lookup that
    serve does not answer within lookup_timeout_s turns serve away:
    lookups miss, new jobs fail at once; after SIGCONT the same session
    goes on."""
    s = start_serve(kvtier_bin, tmp_path, 128)
    t = Tiering(64)
    tier = make_tier(s.sock, t, lookup_timeout_s=0.5, timeout_s=10)
    try:
        ctx = ReqContext(req_id="r")
        stored = keys_of("stall-stored", 8)
        assert t.wait([t.store(stored, ctx)]) == [True]
        t.evict(stored)
        s.proc.send_signal(signal.SIGSTOP)
        try:
            wait_stopped(s.proc.pid)
            store_job = t.store(keys_of("stall-new", 8), ctx)  # returns: BatchSet hangs on its thread
            assert t.scan(stored, ctx) is None  # known: promotions queued
            t.end_step()  # submit_load returns: BatchGet hangs on its thread
            fresh = keys_of("stall-fresh", 4)
            assert tier.lookup(fresh[0], ctx) is None  # BatchExists hangs on its thread
            tier.touch(stored, ctx)
            tier.request_finished(ctx)
            assert tier.get_finished() == []  # every call above returned before any job ended
            assert store_job not in t.results
            # The stalled BatchExists turns serve away within lookup_timeout_s.
            deadline = time.time() + 5
            while tier.lookup(fresh[1], ctx) is not False:
                assert time.time() < deadline
                time.sleep(0.01)
            dropped = t.store(keys_of("stall-dropped", 2), ctx)
            assert t.wait([dropped]) == [False]  # failed at once, not queued behind the stall
            assert store_job not in t.results and t.jobs  # the stalled jobs still hang
        finally:
            s.proc.send_signal(signal.SIGCONT)
        # The stalled jobs end (their RPCs answer, or time out: a failure).
        t.wait(list(t.jobs), timeout=20)
        deadline = time.time() + 10
        while tier.lookup(stored[0], ctx) is False or not tier._up:
            assert time.time() < deadline, dict(tier.counters)
            time.sleep(0.02)
        assert tier.counters["registrations"] == 1  # the same session went on
        assert t.run(stored, ctx) == 8
        assert t.wrong(stored) == []
    finally:
        s.proc.send_signal(signal.SIGCONT)
        tier.shutdown()
        s.stop()


def test_serve_killed_and_restarted(kvtier_bin, tmp_path):
    """Blocks written through to L3, then serve SIGKILLed: lookups miss,
    stores and loads are reported failed, nothing raises. serve started
    again: the tier registers again by itself (a new boot_id); the
    durable blocks are None while serve reloads them from L3 (prefetch),
    then True, and load whole: 0 wrong bytes."""
    s = start_serve(kvtier_bin, tmp_path, 40)
    t = Tiering(160)
    tier = make_tier(s.sock, t)
    door = Door(s.sock, tier.namespace)
    try:
        ctx = ReqContext(req_id="durable")
        durable = keys_of("durable", 16)
        assert t.wait([t.store(durable, ctx)]) == [True]
        t.evict(durable)
        # More blocks than the slab holds: the durable ones go to L3 once
        # the store has them (a page is evictable only then).
        for i in range(4):
            c = ReqContext(req_id="more%d" % i)
            ks = keys_of("more%d" % i, 16)
            t.wait([t.store(ks, c)])
            t.evict(ks)
        # A block leaves the slab only when a store needs its slot, and
        # only once the L3 has it. On a slow disk the durable blocks'
        # write-through may still run while the stores above look for
        # room: they then evict later blocks, or are refused, and the
        # durable ones stay in the slab. Stores of fresh blocks, a round a
        # second (at most 8), press on until every durable block left it.
        deadline, press, pressed_at = time.time() + 30, 0, time.time()
        while door.tiers(durable) != [pb.TIER_L3] * 16:
            assert time.time() < deadline, "durable blocks not in L3 within 30 s (%d pressure rounds): %s" % (
                press, door.tiers(durable))
            if press < 8 and time.time() - pressed_at > 1:
                c = ReqContext(req_id="press%d" % press)
                ks = keys_of("press%d" % press, 16)
                t.wait([t.store(ks, c)])
                t.evict(ks)
                press, pressed_at = press + 1, time.time()
            time.sleep(0.05)
        door.close()
        door = None
        s.kill()
        # Away: the table says True until a call to serve fails (here the
        # promotion's BatchGet); then misses, and the failed jobs reported.
        deadline = time.time() + 5
        while tier._up:
            t.scan(durable, ctx)
            t.end_step()
            assert time.time() < deadline
            time.sleep(0.01)
        t.end_step()
        assert all(ok is False for ok in t.wait(list(t.jobs)))
        assert t.scan(durable, ctx) == 0
        j = t.store(keys_of("while-away", 4), ctx)
        assert t.wait([j]) == [False]
        s.start()
        deadline = time.time() + 30
        while tier.counters["registrations"] < 2:
            assert time.time() < deadline, dict(tier.counters)
            time.sleep(0.02)
        l3_before = tier.counters["exists_l3"]
        assert t.run(durable, ctx) == 16
        assert tier.counters["exists_l3"] > l3_before  # None while serve reloaded them from L3
        assert t.wrong(durable) == []
        assert tier.door_stats().get("prefetch_pages", 0) > 0
    finally:
        if door is not None:
            door.close()
        tier.shutdown()
        s.stop()


def test_reexported_from_kvtier_vllm():
    """The issue's name for the tier, kvtier.vllm.KvtierTier, is the class
    of kvtier.vllm_tier, loaded on first use."""
    import kvtier.vllm as v
    import kvtier.vllm_tier as vt
    assert v.KvtierTier is vt.KvtierTier and v.KvtierTieringSpec is vt.KvtierTieringSpec
