"""kvtier as a secondary tier of vLLM's native CPU offloading.

vLLM's offloading connector keeps a CPU primary tier; its tiering spec
(``TieringOffloadingSpec``) cascades every block stored there to its
secondary tiers and promotes blocks back from them. :class:`KvtierTier`
is such a tier (a ``SecondaryTierManager``) over the node's ``kvtier
serve`` page-store door (kvtier.store.v1, docs/store-api.md), so a vLLM
that already offloads to CPU gets kvtier's slab, disk, Redis and plugin
tiers from one ``secondary_tiers`` entry (docs/vllm-offloading.md)::

    {"type": "kvtier", "socket": "/run/kvtier/kvtier.sock"}

with ``kvtier.vllm_tier.register()`` run in the scheduler process first
(it calls ``SecondaryTierFactory.register_tier("kvtier",
"kvtier.vllm_tier", "KvtierTier")``), or, where the vLLM's factory
resolves out-of-tree tiers by ``module_path``, ``{"type": "KvtierTier",
"module_path": "kvtier.vllm_tier", ...}`` alone.

Target: vLLM at 041410b9 (:data:`VLLM_SNAPSHOT`), whose factory builds a
tier as ``Cls(offloading_spec=..., primary_kv_view=..., tier_type=...,
**entry)``. Later vLLM builds tiers with ``vllm_config=`` and renames
methods (get_finished_jobs, on_new_request); this class refuses that
form at construction, naming the snapshot.

Every method vLLM calls runs on its scheduler thread and returns without
waiting on serve: ``lookup`` answers from a table of what serve said
(BatchExists runs on a background thread, batched per request, with
``prefetch``), ``submit_store`` and ``submit_load`` queue jobs that
threads of this tier run (BatchSet + one copy primary row -> slab span +
Commit; BatchGet + one copy slab span -> primary row + Release), and
``get_finished`` returns the results those threads left. A load reports
success only when every page was a hit that passed its CRC32C check:
never wrong bytes in the primary. With the native library
(:mod:`kvtier.native`; ``$KVTIER_CLIENT_SUMS`` not "0") the tier takes
each page kind's CRC32C in the same pass as its copy: a store's
``Commit`` carries the sums and a load checks what it copied against the
sums serve sends (``client_verifies``), so serve reads no page's bytes
(docs/store-api.md, "Checksums carried by the client"). Without it the
copies are memmoves, serve takes the sums at Commit and checks each hit
while the tier copies it (``check_at_release``). While serve is away every
lookup is a miss and every job fails at once; on a new ``boot_id`` the
tier registers again and maps the new slab by itself.
"""

import collections
import ctypes
import logging
import os
import queue
import threading
import time

import grpc

from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager

from kvtier.store.v1 import store_pb2 as pb
from kvtier._storeclient import MappedSlab, release_async, PieceBatch, address as _address, default_socket as _default_socket, whole_number, \
    native_sums as _native_sums
from kvtier.store.v1 import store_pb2_grpc as pbg

logger = logging.getLogger(__name__)

# The vLLM commit whose SecondaryTierManager (vllm/v1/kv_offload/tiering/
# base.py) and SecondaryTierFactory this tier implements.
VLLM_SNAPSHOT = "041410b9b13a5e762e6bfce4a0ce39574def5919"

PROTOCOL_VERSION = 1

# The namespace's kv_layout: a page is one row of vLLM's CPU primary tier
# (every layer, KV cache group and worker of one offloaded block), split
# in order over the payload kinds.
KV_LAYOUT = "vllm-cpu-primary-row/v1"

# Tier-config keys (the secondary_tiers entry; "type" is the factory's).
SETTINGS = {
    "socket": "unix socket of kvtier serve (default $KVTIER_SOCKET, else ~/.local/state/kvtier/kvtier.sock)",
    "kinds": "payload kind names a row is split into, in order, equal parts (default [\"kv\"]: the whole row); "
             "must equal serve's stack (model.payloads)",
    "model": "the namespace's model (default: the offloading spec's model)",
    "model_revision": "the weights' revision: two revisions never share a page (default: the spec's revision, else empty)",
    "dtype": "the KV cache dtype in the namespace (default: the spec's cache dtype; 'auto' means the model's dtype)",
    "page_tokens": "tokens of one offloaded block (default: the spec's offloaded block size)",
    "tp_size": "tensor-parallel size in the namespace (default: the spec's)",
    "pp_size": "pipeline-parallel size in the namespace (default: the spec's)",
    "salt": "separates caches that must not share pages (tenants, adapters); default empty",
    "timeout_s": "deadline of each BatchSet/Commit/BatchGet/Release/Register call (default 5)",
    "lookup_timeout_s": "deadline of a BatchExists; past it serve counts as away (default 1)",
    "get_deadline_ms": "bound of a get's reloads from the tiers below L2 (default 0: serve's default, 2 s)",
    "register_retry_s": "while serve is away, try to register at most this often (default 0.5)",
    "miss_ttl_s": "a miss is answered from the table for this long, then asked again in the background (default 1)",
    "prefetch": "BatchExists asks serve to reload the pages it finds in L3 into L2 (default true)",
    "max_cached_keys": "the lookup table is emptied when it grows past this many keys (default 1048576)",
    "module_path": "vLLM's factory's own key (the module of an out-of-tree tier); ignored here",
}

_memmove = ctypes.memmove  # a foreign call: it releases the GIL while it copies

# Lookup-table values besides True (an L2 page) and a float (a miss, and
# when it was answered).
_PENDING = object()  # a BatchExists for it is queued or in flight
_L3 = object()  # serve has it below the slab and is reloading it (prefetch)
_FORGET = object()  # (a result) the answer is unknown: drop the entry, ask again
_GONE = object()  # (a result) a load found it missing or corrupt: a miss, whatever the table said


class KvtierError(Exception):
    """A configuration or geometry error, raised at construction (never
    from a call vLLM's scheduler makes afterwards)."""


class _Lost(Exception):
    """serve is away, stalled, or the session is gone."""


class _Slab(MappedSlab):
    """serve's slab files, mapped shared, and their base addresses."""

    def __init__(self, geometry):
        super().__init__(geometry, KvtierError)


class _Session:
    """One registration: its ids, slab and limits."""

    __slots__ = ("session", "boot_id", "slab", "limits", "epoch", "slab_backing")

    def __init__(self, session, boot_id, slab, limits, epoch, slab_backing=""):
        self.session, self.boot_id, self.slab, self.limits, self.epoch = session, boot_id, slab, limits, epoch
        self.slab_backing = slab_backing


def _path(obj, dotted):
    for name in dotted.split("."):
        obj = getattr(obj, name, None)
        if obj is None:
            return None
    return obj


def _first(spec, *paths):
    for p in paths:
        v = _path(spec, p)
        if v is not None and v != "":
            return v
    return None


def _single(v):
    """A block size given as an int or as one per KV cache group."""
    if isinstance(v, (list, tuple)):
        vals = set(int(x) for x in v)
        return vals.pop() if len(vals) == 1 else None
    return int(v)


class KvtierTier(SecondaryTierManager):
    """A vLLM secondary tier over ``kvtier serve``'s page-store door.

    Built by vLLM's ``SecondaryTierFactory`` (snapshot 041410b9) as
    ``KvtierTier(offloading_spec=, primary_kv_view=, tier_type=,
    **entry)``; ``entry`` is the secondary_tiers dict without "type"
    (:data:`SETTINGS` lists its keys; an unknown key is an error).
    ``primary_kv_view`` is the CPU primary's memoryview of shape
    (num_blocks, row bytes): block ``b`` is row ``b``, and a row is one
    kvtier page.
    """

    def __init__(self, offloading_spec=None, primary_kv_view=None, tier_type="kvtier", **config):
        if "vllm_config" in config or offloading_spec is None:
            raise KvtierError("kvtier: KvtierTier targets vLLM %s, whose SecondaryTierFactory passes "
                              "offloading_spec=; this vLLM passed %s" % (
                                  VLLM_SNAPSHOT[:8], ", ".join(sorted(config)) or "no offloading_spec"))
        super().__init__(offloading_spec=offloading_spec, primary_kv_view=primary_kv_view, tier_type=tier_type)
        unknown = sorted(k for k in config if k not in SETTINGS)
        if unknown:
            raise KvtierError("kvtier: unknown secondary tier keys %s (known: %s)" % (unknown, ", ".join(SETTINGS)))
        self._geometry(primary_kv_view, config)
        self.socket = str(config.get("socket") or _default_socket())
        self.timeout = self._positive(config, "timeout_s", 5.0)
        self.lookup_timeout = self._positive(config, "lookup_timeout_s", 1.0)
        self.register_retry = self._positive(config, "register_retry_s", 0.5)
        self.miss_ttl = self._positive(config, "miss_ttl_s", 1.0)
        self.max_cached = int(self._positive(config, "max_cached_keys", 1 << 20))
        self.get_deadline_ms = whole_number(config.get("get_deadline_ms", 0))
        if self.get_deadline_ms is None:
            raise KvtierError("kvtier: get_deadline_ms %r: want a whole number >= 0" % (config.get("get_deadline_ms"),))
        self.prefetch = self._flag(config, "prefetch", True)
        self.namespace = self._namespace(offloading_spec, config)
        self.client_id = "vllm-tier-%d" % os.getpid()

        # Owned by the scheduler thread: the lookup table (key -> True, a
        # float, _PENDING or _L3) and the epoch of the session it is about.
        self._verdict = {}
        self._seen_epoch = 0
        # Background -> scheduler: (epoch, key, answer) and ("epoch", n, None).
        self._results = collections.deque()
        # Background -> scheduler: finished JobResults.
        self._finished = collections.deque()
        # Scheduler -> lookup thread: keys (bytes), each preceded by its
        # request's id (a str) when the request changes; no tuple per key,
        # so a scan of new keys allocates no objects for the collector.
        # _ask_req is the scheduler's last id sent, _ask_cur the lookup
        # thread's last id read; a kick wakes the lookup thread.
        self._asks = collections.deque()
        self._ask_req = self._ask_cur = None
        self._kick = queue.SimpleQueue()
        self._kicked = False
        self._loads, self._stores = queue.SimpleQueue(), queue.SimpleQueue()

        self._mu = threading.Lock()  # guards registration and the fields below
        self._sess = None
        self._epoch = 0
        self._up = False  # read by the scheduler: False -> every lookup misses
        self._next_register = 0.0
        self._redial_at = 0.0
        self._stopping = False
        self._stats_mu = threading.Lock()
        self.counters = collections.Counter()
        self._channel = None
        self._dial()
        try:
            self._register()
        except KvtierError:
            self._channel.close()
            raise
        except _Lost as e:
            logger.warning("kvtier: serve at %s is not answering (%s): lookups miss and jobs fail until it does",
                           self.socket, e)
        self._threads = [threading.Thread(target=self._lookup_loop, name="kvtier-tier-lookup", daemon=True),
                         threading.Thread(target=self._job_loop, args=(self._loads, self._run_load),
                                          name="kvtier-tier-load", daemon=True),
                         threading.Thread(target=self._job_loop, args=(self._stores, self._run_store),
                                          name="kvtier-tier-store", daemon=True)]
        for t in self._threads:
            t.start()

    # ---- configuration ------------------------------------------------------

    @staticmethod
    def _positive(config, key, default):
        v = config.get(key, default)
        try:
            v = float(v)
        except (TypeError, ValueError):
            raise KvtierError("kvtier: %s %r: want a positive number" % (key, v)) from None
        if not v > 0:
            raise KvtierError("kvtier: %s %r: want a positive number" % (key, v))
        return v

    @staticmethod
    def _flag(config, key, default):
        v = config.get(key, default)
        if isinstance(v, bool):
            return v
        if isinstance(v, str) and v.strip().lower() in ("true", "1", "yes", "on", "false", "0", "no", "off"):
            return v.strip().lower() in ("true", "1", "yes", "on")
        if isinstance(v, int) and v in (0, 1):
            return bool(v)
        raise KvtierError("kvtier: %s %r: want true or false" % (key, v))

    def _geometry(self, view, config):
        if not isinstance(view, memoryview):
            raise KvtierError("kvtier: primary_kv_view is a %s, want a memoryview" % type(view).__name__)
        if view.ndim != 2 or not view.c_contiguous or view.readonly:
            raise KvtierError("kvtier: primary_kv_view: want a writable C-contiguous (num_blocks, row bytes) view, "
                              "got ndim %d, contiguous %s, readonly %s" % (view.ndim, view.c_contiguous, view.readonly))
        self.num_blocks, self.page_bytes = view.shape[0], view.strides[0]
        kinds = config.get("kinds", ["kv"])
        if isinstance(kinds, str) or not kinds or not all(isinstance(k, str) and k for k in kinds):
            raise KvtierError("kvtier: kinds %r: want a list of names" % (kinds,))
        if self.page_bytes <= 0 or self.page_bytes % len(kinds):
            raise KvtierError("kvtier: a primary row of %d bytes does not split into %d kinds" % (self.page_bytes, len(kinds)))
        self.kind_names = tuple(kinds)
        kb = self.page_bytes // len(kinds)
        self.kind_bytes = (kb,) * len(kinds)
        self.kind_offsets = tuple(i * kb for i in range(len(kinds)))
        self._kinds = tuple(zip(self.kind_offsets, self.kind_bytes))
        self._base = _address(view) if self.num_blocks else 0

    def _namespace(self, spec, config):
        def pick(key, *paths):
            v = config.get(key)
            return v if v is not None and v != "" else _first(spec, *paths)

        model = pick("model", "vllm_config.model_config.model", "config.model.name")
        if not model:
            raise KvtierError("kvtier: no model name: the offloading spec has none; set \"model\" in the tier entry")
        revision = pick("model_revision", "vllm_config.model_config.revision", "config.model.revision") or ""
        dtype = config.get("dtype") or _first(spec, "vllm_config.cache_config.cache_dtype", "config.model.dtype")
        if dtype is None or str(dtype) == "auto":
            dtype = _first(spec, "vllm_config.model_config.dtype", "config.model.dtype")
        if not dtype:
            raise KvtierError("kvtier: no KV dtype: the offloading spec has none; set \"dtype\" in the tier entry")
        page_tokens = config.get("page_tokens")
        if page_tokens is None:
            page_tokens = _first(spec, "offloaded_block_size", "block_size")
            if page_tokens is None:
                gpu, factor = _first(spec, "gpu_block_size"), _first(spec, "block_size_factor", "blocks_per_chunk")
                tph = _first(spec, "config.cache.tokens_per_hash")
                if gpu is not None and _single(gpu) is not None:
                    page_tokens = _single(gpu) * int(factor or 1)
                elif tph is not None:
                    page_tokens = int(tph) * int(factor or 1)
        try:
            page_tokens = _single(page_tokens) if page_tokens is not None else None
        except (TypeError, ValueError):
            page_tokens = None
        if not page_tokens or page_tokens <= 0:
            raise KvtierError("kvtier: no block size: the offloading spec has none; set \"page_tokens\" in the tier entry")
        tp = int(pick("tp_size", "vllm_config.parallel_config.tensor_parallel_size", "config.parallel.tp_size") or 1)
        pp = int(pick("pp_size", "vllm_config.parallel_config.pipeline_parallel_size", "config.parallel.pp_size") or 1)
        if tp <= 0 or pp <= 0:
            raise KvtierError("kvtier: tp_size %d, pp_size %d: want positive" % (tp, pp))
        # A row holds every worker's part of the block, so the whole
        # parallel layout is the page's: rank 0 of tp_size x pp_size.
        return pb.Namespace(model=str(model), model_revision=str(revision), kv_layout=KV_LAYOUT,
                            dtype=str(dtype).replace("torch.", ""), page_tokens=int(page_tokens),
                            kinds=[pb.PayloadKind(name=n, page_bytes=b) for n, b in zip(self.kind_names, self.kind_bytes)],
                            tp_rank=0, tp_size=tp, cp_rank=0, cp_size=1, pp_rank=0, pp_size=pp,
                            dp_rank=0, dp_size=1, salt=str(config.get("salt", "")))

    # ---- the session (background threads) -----------------------------------

    def _dial(self):
        """A new channel. grpc's channel can stay in TRANSIENT_FAILURE after
        serve restarts on the same socket path, so a tier that sees
        UNAVAILABLE dials again, at most once per register_retry_s."""
        old = self._channel
        self._channel = grpc.insecure_channel("unix:" + self.socket, options=[
            ("grpc.max_receive_message_length", 64 << 20),
            ("grpc.max_send_message_length", 64 << 20),
            ("grpc.use_local_subchannel_pool", 1),
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000)])
        self._stub = pbg.StoreStub(self._channel)
        if old is not None:
            old.close()

    def _register(self):
        """Opens a session; raises _Lost while serve is away and KvtierError
        when it refuses the namespace or its kinds differ."""
        with self._mu:
            try:
                rep = self._stub.Register(pb.RegisterRequest(client_id=self.client_id, namespace=self.namespace,
                                                             protocol_versions=[PROTOCOL_VERSION]), timeout=self.timeout)
            except grpc.RpcError as e:
                if e.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION):
                    raise KvtierError("kvtier: serve refused the namespace: %s" % e.details()) from None
                self._redial_locked(e.code())
                raise _Lost("register: %s" % e.code().name) from None
            except ValueError:
                raise _Lost("register: channel redialed") from None
            kinds = [(k.name, k.page_bytes) for k in rep.kinds]
            want = list(zip(self.kind_names, self.kind_bytes))
            if kinds != want:
                raise KvtierError("kvtier: serve's kinds %s, this tier's rows %s (%d-byte rows)" % (
                    kinds, want, self.page_bytes))
            try:
                slab = _Slab(rep.slab)
            except OSError as e:
                raise KvtierError("kvtier: map serve's slab: %s (serve must run on this host)" % e) from None
            old = self._sess
            self._epoch += 1
            self._sess = _Session(rep.session, rep.boot_id, slab, rep.limits, self._epoch, rep.slab.backing)
            # The scheduler empties its table on this marker, before it can
            # see _up: answers about the old boot never reach the new one.
            self._results.append(("epoch", self._epoch, None))
            self._up = True
            self._count(registrations=1)
        if old is not None:
            old.slab.retire()
        logger.info("kvtier: session %s with serve boot %s (%s)", rep.session, rep.boot_id, self.client_id)

    def _redial_locked(self, code):
        now = time.monotonic()
        if code == grpc.StatusCode.UNAVAILABLE and now >= self._redial_at:
            self._redial_at = now + self.register_retry
            self._dial()

    def _away(self, sess, why):
        """serve is away or stalled: lookups miss, jobs fail, until the
        lookup thread brings the session back or registers again."""
        with self._mu:
            if self._sess is sess or sess is None:
                if self._up:
                    logger.warning("kvtier: serve at %s away (%s): lookups miss, jobs fail", self.socket, why)
                    self._count(away=1)
                self._up = False
        self._kick.put(1)  # the lookup thread waits for serve now

    def _gone(self, sess, why):
        """The session is unknown to serve (restarted, expired): register again."""
        with self._mu:
            if self._sess is sess:
                self._sess = None
                self._up = False
                self._next_register = 0.0
        self._kick.put(1)  # the lookup thread registers again
        logger.info("kvtier: session lost (%s); registering again", why)

    def _recover(self):
        """Called by the lookup thread while serve is away: the session
        goes on if serve still has it, else a new one."""
        now = time.monotonic()
        if now < self._next_register:
            return
        self._next_register = now + self.register_retry
        sess = self._sess
        if sess is not None:
            try:
                rep = self._stub.BatchExists(pb.ExistsRequest(session=sess.session, boot_id=sess.boot_id),
                                             timeout=self.lookup_timeout)
                if rep.boot_id == sess.boot_id:
                    with self._mu:
                        if self._sess is sess:
                            self._up = True
                    logger.info("kvtier: serve at %s answers again; session %s goes on", self.socket, sess.session)
                    return
                self._gone(sess, "boot_id %s, was %s" % (rep.boot_id, sess.boot_id))
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.NOT_FOUND:
                    self._gone(sess, "NotFound")
                else:
                    with self._mu:
                        self._redial_locked(e.code())
                    return
            except ValueError:
                return
        try:
            self._register()
        except _Lost:
            pass
        except KvtierError as e:
            logger.error("%s", e)

    def _call(self, sess, name, req, timeout):
        """One RPC on sess; NotFound or a new boot_id end the session,
        UNAVAILABLE and DEADLINE_EXCEEDED mark serve away: both raise _Lost."""
        try:
            rep = getattr(self._stub, name)(req, timeout=timeout)
        except ValueError:  # the channel was closed under us (a redial)
            raise _Lost("%s: channel redialed" % name) from None
        except grpc.RpcError as e:
            code = e.code()
            if code == grpc.StatusCode.NOT_FOUND:
                self._gone(sess, "%s: NotFound %s" % (name, e.details() or ""))
            else:
                self._away(sess, "%s: %s" % (name, code.name))
                with self._mu:
                    self._redial_locked(code)
            raise _Lost("%s: %s" % (name, code.name)) from None
        if getattr(rep, "boot_id", "") and rep.boot_id != sess.boot_id:
            self._gone(sess, "boot_id %s, was %s" % (rep.boot_id, sess.boot_id))
            raise _Lost("%s: serve restarted" % name)
        return rep

    def _current(self):
        """The open session, or _Lost."""
        sess = self._sess
        if sess is None or not self._up or self._stopping:
            raise _Lost("no session")
        return sess

    def _batch(self, sess):
        n = sess.limits.max_batch_pages if sess.limits is not None else 0
        return int(n) if n else 128

    def _count(self, **kw):
        with self._stats_mu:
            self.counters.update(kw)

    # ---- lookups --------------------------------------------------------------

    def lookup(self, key, req_context):
        """True: the page is in serve's slab (L2), a load now is a copy.
        None: not known yet, or serve is reloading it from L3 (a
        BatchExists with prefetch is on its way): ask again. False: serve
        has no page for the key, or serve is away. Never waits on serve."""
        if not self._up:
            return False
        if self._results:
            self._apply()
        verdict = self._verdict
        v = verdict.get(key)
        if v is True:
            return True
        if v is None or v is _L3:
            verdict[key] = _PENDING
            rid = req_context.req_id
            if rid != self._ask_req:
                self._ask_req = rid
                self._asks.append(rid)
            self._asks.append(key)
            if not self._kicked:
                self._kicked = True
                self._kick.put(1)
            return None
        if v is _PENDING:
            return None
        now = time.monotonic()  # a miss, answered at v
        if now - v > self.miss_ttl:
            verdict[key] = now  # one refresh per miss_ttl_s; False until it answers
            rid = req_context.req_id
            if rid != self._ask_req:
                self._ask_req = rid
                self._asks.append(rid)
            self._asks.append(key)
            if not self._kicked:
                self._kicked = True
                self._kick.put(1)
        return False

    def _apply(self):
        """Takes the background threads' answers into the table (scheduler thread)."""
        results, verdict = self._results, self._verdict
        if len(verdict) >= self.max_cached:
            verdict.clear()  # everything is asked again: bounded memory, rarely
        now = time.monotonic()
        while results:
            epoch, key, answer = results.popleft()
            if epoch == "epoch":
                if key != self._seen_epoch:
                    verdict.clear()
                    self._seen_epoch = key
                continue
            if epoch != self._seen_epoch:
                continue
            if answer is _FORGET:
                if verdict.get(key) is _PENDING:
                    del verdict[key]
            elif answer is False:
                # An exists answer may have been asked before this tier's
                # own store of the key committed: it does not undo a True
                # (a True that is wrong fails its load, which says _GONE).
                if verdict.get(key) is not True:
                    verdict[key] = now
            elif answer is _GONE:
                verdict[key] = now
            else:
                verdict[key] = answer

    def _lookup_loop(self):
        while True:
            try:
                self._kick.get(timeout=None if self._up else self.register_retry)
            except queue.Empty:
                pass
            if self._stopping:
                return
            # A kick comes with the first key vLLM's scan asks for; let the
            # scan finish first (while the queue grows, at most 20 ms):
            # one BatchExists for the step, and this thread does not take
            # the GIL from the scheduler in the middle of its step.
            n, waited = len(self._asks), 0.0
            while n and waited < 0.02:
                time.sleep(0.0005)
                waited += 0.0005
                m = len(self._asks)
                if m == n:
                    break
                n = m
            self._kicked = False
            if not self._up:
                try:
                    self._recover()
                except Exception:  # a bug must not end the lookups
                    logger.exception("kvtier: registering again failed")
            groups = {}  # req_id -> {key: None}, in the order asked
            cur, q = self._ask_cur, self._asks
            while q:
                item = q.popleft()
                if isinstance(item, bytes):
                    groups.setdefault(cur, {})[item] = None
                else:
                    cur = item
            self._ask_cur = cur
            if not groups:
                continue
            try:
                self._exists(groups)
            except Exception:  # a bug must not end the lookups: forget them
                logger.exception("kvtier: lookups failed")
                self._answer(None, [k for g in groups.values() for k in g], _FORGET)

    def _answer(self, sess, keys, answer):
        epoch = sess.epoch if sess is not None else self._epoch
        for k in keys:
            self._results.append((epoch, k, answer))

    def _exists(self, groups):
        """BatchExists per request, in the order vLLM asked (a request's
        keys are a prefix chain: the door counts the leading ones)."""
        sess = self._sess if self._up else None
        for keys in groups.values():
            keys = list(keys)
            if sess is None:
                self._answer(None, keys, _FORGET)
                continue
            step = self._batch(sess)
            for lo in range(0, len(keys), step):
                part = keys[lo:lo + step]
                try:
                    rep = self._call(sess, "BatchExists", pb.ExistsRequest(
                        session=sess.session, boot_id=sess.boot_id, keys=[k.hex() for k in part],
                        prefetch=self.prefetch), self.lookup_timeout)
                except _Lost:
                    self._answer(sess, keys[lo:], _FORGET)
                    sess = None
                    break
                n = min(int(rep.present), len(part))
                l2 = l3 = 0
                for j in range(n):
                    if rep.tiers[j] == pb.TIER_L2:
                        self._results.append((sess.epoch, part[j], True))
                        l2 += 1
                    else:
                        self._results.append((sess.epoch, part[j], _L3))
                        l3 += 1
                self._count(exists_calls=1, exists_l2=l2, exists_l3=l3, exists_miss=int(n < len(part)))
                if n < len(part):
                    # The first absent key misses; the ones after it are
                    # unknown (the door stops counting there): asked again
                    # if vLLM asks for them.
                    self._results.append((sess.epoch, part[n], False))
                    self._answer(sess, part[n + 1:] + keys[lo + step:], _FORGET)
                    break

    # ---- jobs -------------------------------------------------------------------

    def submit_store(self, job_metadata):
        """Queues a store of job_metadata.keys from the primary rows
        job_metadata.block_ids; its result comes from get_finished. While
        serve is away the job fails at once (the pages are not stored)."""
        self._submit(self._stores, job_metadata, "store")

    def submit_load(self, job_metadata):
        """Queues a load of job_metadata.keys into the primary rows
        job_metadata.block_ids; success only when every page arrived whole
        and passed its CRC32C check (the tier's with client sums, else serve's)."""
        self._submit(self._loads, job_metadata, "load")

    def _submit(self, q, job, what):
        if not self._up or self._stopping:
            self._finished.append(JobResult(job_id=job.job_id, success=False))
            self._count(**{what + "_dropped": 1})
            return
        q.put(job)

    def get_finished(self):
        """The jobs that ended since the last call (successful or not)."""
        if self._results:
            self._apply()
        out = []
        fin = self._finished
        while fin:
            out.append(fin.popleft())
        return out

    def touch(self, keys, req_context):
        """The door has no touch: serve's policy learns recency from the
        gets and sets it serves. Nothing to do here."""
        return

    def request_finished(self, req_context):
        """No per-request state: the lookup table is shared by all requests."""
        return

    def _job_loop(self, q, run):
        while True:
            job = q.get()
            if job is None:
                return
            ok = False
            try:
                if not self._stopping:
                    ok = run(job)
            except _Lost as e:
                logger.debug("kvtier: job %s: %s", job.job_id, e)
            except Exception:  # a bug fails the job; it must not end the thread
                self._count(errors=1)
                logger.exception("kvtier: job %s failed", job.job_id)
            self._finished.append(JobResult(job_id=job.job_id, success=bool(ok)))

    def _rows(self, job):
        keys = list(job.keys)
        blocks = [int(b) for b in job.block_ids]
        if len(keys) != len(blocks):
            raise ValueError("%d keys for %d block_ids" % (len(keys), len(blocks)))
        bad = [b for b in blocks if not 0 <= b < self.num_blocks]
        if bad:
            raise ValueError("block_ids %s outside the primary's %d blocks" % (bad[:4], self.num_blocks))
        return keys, blocks

    def _run_store(self, job):
        keys, blocks = self._rows(job)
        sess = self._current()
        step, stored = self._batch(sess), 0
        copy_s = copied = nruns = summed = 0
        nk = len(self._kinds)
        for lo in range(0, len(keys), step):
            ks, bs = keys[lo:lo + step], blocks[lo:lo + step]
            rep = self._call(sess, "BatchSet", pb.SetRequest(session=sess.session, boot_id=sess.boot_id,
                                                              keys=[k.hex() for k in ks]), self.timeout)
            if len(rep.pages) != len(ks):
                raise _Lost("BatchSet: %d pages for %d keys" % (len(rep.pages), len(ks)))
            written = [False] * len(ks)
            sums = None  # the Commit's sums: every written page's kinds, summed as copied
            if not sess.slab.acquire():
                raise _Lost("slab retired")
            try:
                t0 = time.perf_counter()
                if _native_sums():
                    batch = PieceBatch()
                    for j, page in enumerate(rep.pages):
                        if page.status == pb.SET_STATUS_RESERVED:
                            written[j] = self._pieces(batch, sess.slab, page, bs[j], True, j * nk)
                    if self._stopping:
                        written = [False] * len(ks)  # the primary may be going away: copy nothing
                    else:
                        sums = batch.run(len(ks) * nk)
                        nruns += len(batch)
                        summed += sum(written)
                        copied += self.page_bytes * sum(written)
                else:
                    runs = []
                    for j, page in enumerate(rep.pages):
                        if page.status == pb.SET_STATUS_RESERVED:
                            written[j] = self._plan(runs, sess.slab, page, bs[j], True)
                    if self._stopping:
                        written = [False] * len(ks)  # the primary may be going away: copy nothing
                    else:
                        for dst, src, n in runs:
                            _memmove(dst, src, n)
                        copied += self.page_bytes * sum(written)
                        nruns += len(runs)
                copy_s += time.perf_counter() - t0
            finally:
                sess.slab.release()
            ok = [page.status == pb.SET_STATUS_EXISTS for page in rep.pages]
            if rep.lease:
                c = self._call(sess, "Commit", pb.CommitRequest(session=sess.session, boot_id=sess.boot_id,
                                                                lease=rep.lease, written=written, sums=sums or []),
                               self.timeout)
                ok = [bool(x) for x in c.stored[:len(ks)]] + [False] * max(0, len(ks) - len(c.stored))
            for j, good in enumerate(ok):
                if good:
                    self._results.append((sess.epoch, ks[j], True))
            stored += sum(ok)
        self._count(store_jobs=1, store_pages=len(keys), stored_pages=stored, store_bytes=copied, store_memmoves=nruns,
                    store_summed_pages=summed)
        with self._stats_mu:
            self.counters["store_copy_s"] += copy_s
        return stored == len(keys)

    def _spans(self, slab, page):
        """[(slab address, row offset, bytes)] of a page's kinds, or None
        (logged) when serve's spans do not fit the slab or the kinds."""
        spans = page.spans
        if len(spans) != len(self._kinds):
            logger.error("kvtier: %d spans for %d kinds", len(spans), len(self._kinds))
            return None
        addrs, sizes = slab.addrs, slab.sizes
        at = []
        for sp, (off, n) in zip(spans, self._kinds):
            f, o = sp.slab, sp.offset
            if f >= len(addrs) or sp.length != n or o + n > sizes[f]:
                logger.error("kvtier: span [%d, +%d) of slab file %d does not fit a %d-byte kind", o, sp.length, f, n)
                return None
            at.append((addrs[f] + o, off, n))
        return at

    def _plan(self, runs, slab, page, block, to_slab):
        """Adds a page's copies, one per kind between primary row `block`
        and the page's slab spans, to runs ([dst, src, bytes]); a copy
        that continues the last one on both sides extends it (a page's
        kinds side by side in the slab, consecutive rows in consecutive
        slots): fewer, longer memmoves. False, with nothing added, when
        serve's spans do not fit the slab or the kinds."""
        at = self._spans(slab, page)
        if at is None:
            return False
        row = self._base + block * self.page_bytes
        for a, off, n in at:
            dst, src = (a, row + off) if to_slab else (row + off, a)
            if runs:
                last = runs[-1]
                if last[0] + last[2] == dst and last[1] + last[2] == src:
                    last[2] += n
                    continue
            runs.append([dst, src, n])
        return True

    def _pieces(self, batch, slab, page, block, to_slab, group0):
        """_plan for a summing batch: one piece per kind, each its whole
        span, in group group0 + k (pieces are never merged across kinds or
        rows: each kind's CRC32C is its own). False, with nothing added,
        when serve's spans do not fit the slab or the kinds."""
        at = self._spans(slab, page)
        if at is None:
            return False
        row = self._base + block * self.page_bytes
        for k, (a, off, n) in enumerate(at):
            if to_slab:
                batch.add(a, row + off, n, group0 + k)
            else:
                batch.add(row + off, a, n, group0 + k)
        return True

    def _run_load(self, job):
        keys, blocks = self._rows(job)
        sess = self._current()
        step, loaded = self._batch(sess), 0
        copy_s = copied = nruns = verified = 0
        nk = len(self._kinds)
        all_ok = True
        for lo in range(0, len(keys), step):
            ks, bs = keys[lo:lo + step], blocks[lo:lo + step]
            # With client sums, check_at_release too: a serve older than
            # client_verifies ignores it, sends no sums and checks while
            # the tier copies instead.
            summing = _native_sums()
            rep = self._call(sess, "BatchGet", pb.GetRequest(session=sess.session, boot_id=sess.boot_id,
                                                              keys=[k.hex() for k in ks], deadline_ms=self.get_deadline_ms,
                                                              check_at_release=True, client_verifies=summing),
                             self.timeout)
            hits = []  # copied; checked by serve at release (pages without sums)
            mine, bad = [], []  # copied and checked here; of them, failed
            try:
                if len(rep.pages) != len(ks):
                    raise _Lost("BatchGet: %d pages for %d keys" % (len(rep.pages), len(ks)))
                if not sess.slab.acquire():
                    raise _Lost("slab retired")
                try:
                    t0 = time.perf_counter()
                    if summing:
                        batch = PieceBatch()
                        for j, page in enumerate(rep.pages):
                            if page.status != pb.GET_STATUS_HIT:
                                continue
                            if len(page.sums) not in (0, nk):
                                logger.error("kvtier: %d sums for %d kinds", len(page.sums), nk)
                                continue
                            if self._pieces(batch, sess.slab, page, bs[j], False, j * nk):
                                (mine if page.sums else hits).append(j)
                        if self._stopping:
                            mine, hits = [], []  # the primary may be going away: copy nothing
                        else:
                            sums = batch.run(len(ks) * nk)
                            for j in mine:
                                want = rep.pages[j].sums
                                if any(sums[j * nk + k] != want[k] for k in range(nk)):
                                    bad.append(j)
                            copied += self.page_bytes * (len(mine) + len(hits))
                            nruns += len(batch)
                            verified += len(mine)
                    else:
                        runs = []
                        for j, page in enumerate(rep.pages):
                            if page.status == pb.GET_STATUS_HIT and self._plan(runs, sess.slab, page, bs[j], False):
                                hits.append(j)
                        if self._stopping:
                            hits = []  # the primary may be going away: copy nothing
                        else:
                            for dst, src, n in runs:
                                _memmove(dst, src, n)
                            copied += self.page_bytes * len(hits)
                            nruns += len(runs)
                    copy_s += time.perf_counter() - t0
                finally:
                    sess.slab.release()
            finally:
                corrupt = None  # None: serve's check of hits (pages without sums) is unconfirmed
                if rep.lease and not hits and not bad:
                    # Every hit was checked here and passed (or there is
                    # none): the reply is not needed, so the Release is not
                    # waited for. A failed page's report is waited for:
                    # serve has dropped it when the call returns.
                    release_async(self._stub, pb.ReleaseRequest(session=sess.session, boot_id=sess.boot_id, lease=rep.lease), self.timeout)
                    corrupt = set()
                elif rep.lease:
                    try:
                        rel = self._call(sess, "Release", pb.ReleaseRequest(
                            session=sess.session, boot_id=sess.boot_id, lease=rep.lease, corrupt=bad), self.timeout)
                        corrupt = set(rel.corrupt)
                    except _Lost as e:
                        logger.info("kvtier: release of lease %d: %s: the job's pages %scount as misses", rep.lease, e,
                                    "serve checks " if mine else "")
                else:
                    corrupt = set()
            badset = set(bad)
            good = [j for j in mine if j not in badset] + [j for j in hits if corrupt is not None and j not in corrupt]
            loaded += len(good)
            goodset = set(good)
            failed = badset | {j for j in hits if corrupt is not None and j in corrupt}
            for j, page in enumerate(rep.pages):
                if j in goodset:
                    self._results.append((sess.epoch, ks[j], True))
                elif page.status in (pb.GET_STATUS_MISS, pb.GET_STATUS_CORRUPT, pb.GET_STATUS_INVALID) or j in failed:
                    # Gone or failed its check: a miss from now on, so vLLM
                    # does not promote it again and again.
                    self._results.append((sess.epoch, ks[j], _GONE))
                else:
                    self._results.append((sess.epoch, ks[j], _FORGET))
            if failed:
                self._count(corrupt_pages=len(failed))
                logger.error("kvtier: %d page(s) failed their check while copied: the load fails", len(failed))
            if len(good) < len(ks):
                all_ok = False
                break  # the job fails: vLLM drops every block of it
        self._count(load_jobs=1, load_pages=len(keys), loaded_pages=loaded, load_bytes=copied, load_memmoves=nruns,
                    load_verified_pages=verified)
        with self._stats_mu:
            self.counters["load_copy_s"] += copy_s
        return all_ok and loaded == len(keys)

    # ---- the end ------------------------------------------------------------------

    def door_stats(self):
        """serve's door counters (StatsReply) as a dict, or None while
        serve is away. Blocks on serve: for tools and tests, not for vLLM's
        scheduler."""
        try:
            sess = self._current()
            rep = self._call(sess, "Stats", pb.StatsRequest(session=sess.session, boot_id=sess.boot_id), self.timeout)
        except _Lost:
            return None
        return {f.name: v for f, v in rep.ListFields() if f.name != "boot_id"}

    def shutdown(self):
        """Stops the threads (a job in flight ends within its RPC deadlines;
        queued ones fail without touching the primary), closes the session
        and unmaps the slab. After it returns nothing of this tier reads or
        writes the primary's memory."""
        if self._stopping:
            return
        self._stopping = True
        self._kick.put(None)
        self._loads.put(None)
        self._stores.put(None)
        for t in self._threads:
            t.join(2 * self.timeout + 5)
            if t.is_alive():
                logger.error("kvtier: thread %s did not end within %.0f s", t.name, 2 * self.timeout + 5)
        with self._mu:
            sess, self._sess, self._up = self._sess, None, False
        if sess is not None:
            try:
                self._stub.Close(pb.CloseRequest(session=sess.session, boot_id=sess.boot_id), timeout=self.timeout)
            except (grpc.RpcError, ValueError):
                pass
            sess.slab.retire()
        self._channel.close()


def register(tier_type="kvtier"):
    """Registers KvtierTier with vLLM's SecondaryTierFactory under
    tier_type. Importing this module does it for "kvtier" (so naming the
    module as the offloading spec's spec_module_path is enough); call it
    for another name. Registering twice is a no-op."""
    from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory

    try:
        SecondaryTierFactory.register_tier(tier_type, __name__, "KvtierTier")
    except ValueError:
        pass  # already registered


def __getattr__(name):
    """KvtierTieringSpec: vLLM's TieringOffloadingSpec, unchanged, under a
    name vLLM's OffloadingSpecFactory loads from this module
    ("spec_name": "KvtierTieringSpec", "spec_module_path":
    "kvtier.vllm_tier"): importing the module registers the "kvtier"
    tier in the process that builds the tiers, with no plugin and no
    patch. Built on first use, so importing this module does not import
    the tiering spec's module."""
    if name == "KvtierTieringSpec":
        from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

        cls = type(name, (TieringOffloadingSpec,), {
            "__module__": __name__,
            "__doc__": "vLLM's TieringOffloadingSpec, loaded from kvtier.vllm_tier so that the kvtier tier is "
                       "registered (docs/vllm-offloading.md).",
        })
        globals()[name] = cls
        return cls
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


try:
    register()
except ImportError:  # a vLLM without the tiering factory: KvtierTier is still importable
    logger.debug("kvtier: vLLM's SecondaryTierFactory is not importable; the kvtier tier is not registered")
