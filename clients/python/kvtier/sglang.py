"""kvtier as SGLang HiCache's L3 storage backend.

SGLang loads it without a patch (docs/sglang.md)::

    --enable-hierarchical-cache --hicache-storage-backend dynamic \\
    --hicache-storage-backend-extra-config '{"backend_name": "kvtier",
        "module_path": "kvtier.sglang", "class_name": "KvtierStorage",
        "interface_v1": 1, "socket": "/run/kvtier/kvtier.sock"}'

Every SGLang rank (one process each) builds one :class:`KvtierStorage`;
each opens a session with the node's ``kvtier serve`` on its page-store
door (kvtier.store.v1, docs/store-api.md) and maps serve's L2 slab. A get
pins pages in the slab and copies them slab -> host pool; a set reserves
slab spans, copies host pool -> slab and commits: one copy each way.

Pages are keyed by SGLang's page hash; the rank's coordinates go into the
session's namespace (MLA: shared across TP ranks; CP and PP ranks keep
their own). An MHA page is two payload kinds, k and v; an MLA page one.

While serve is away every call answers "miss" or ``False`` within its
deadline and never raises into SGLang's prefetch or backup threads; on a
new ``boot_id`` (serve restarted) the backend registers again by itself.
"""

import ctypes
import logging
import os
import threading
import time

import grpc
import torch

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, PoolHitPolicy, PoolName, PoolTransferResult

from kvtier.store.v1 import store_pb2 as pb
from kvtier._storeclient import MappedSlab, PieceBatch, check_hit, native_sums as _native_sums, release_async, whole_number, \
    default_socket as _default_socket, dtype_name as _dtype_name
from kvtier.store.v1 import store_pb2_grpc as pbg

logger = logging.getLogger(__name__)

PROTOCOL_VERSION = 1

# extra_config keys of this backend (the factory's own keys and SGLang's
# ride along in the same dict and are ignored here).
SETTINGS = {
    "socket": "unix socket of kvtier serve (default $KVTIER_SOCKET, else ~/.local/state/kvtier/kvtier.sock)",
    "salt": "separates caches that must not share pages (tenants, adapters); default empty",
    "model_revision": "the weights' revision (commit, checksum): two revisions never share a page",
    "model": "the namespace's model name (default: SGLang's model_name)",
    "timeout_s": "deadline of each call to serve in seconds (default 5)",
    "get_deadline_ms": "bound of a get's reloads from the tiers below L2 (default 0: serve's default, 2 s)",
    "register_retry_s": "while serve is away, try to register at most this often (default 0.5)",
    "kv_cache_dtype": "the KV's dtype in the namespace (default: SGLang's kv_cache_dtype, else the host pool's dtype)",
    "prefetch": "batch_exists (SGLang's prefetch path) asks serve to start reloading the pages it finds in L3 into L2 (default true)",
}
_KNOWN = set(SETTINGS) | {"backend_name", "module_path", "class_name", "interface_v1", "tp_lcm_size"}

def _flag(extra, key, default):
    """A boolean extra_config setting (true/false, 1/0, yes/no)."""
    v = extra.get(key, default)
    if isinstance(v, bool):
        return v
    if isinstance(v, (int, float)) and v in (0, 1):
        return bool(v)
    if isinstance(v, str) and v.strip().lower() in ("true", "1", "yes", "on", "false", "0", "no", "off"):
        return v.strip().lower() in ("true", "1", "yes", "on")
    raise KvtierError("kvtier: extra_config.%s %r: want true or false" % (key, v))


def _count(extra, key, default):
    """A whole-number extra_config setting >= 0."""
    v = extra.get(key, default)
    n = whole_number(v)
    if n is None:
        raise KvtierError("kvtier: extra_config.%s %r: want a whole number >= 0" % (key, v))
    return n


_MHA_KINDS = ("k", "v")
_MLA_KINDS = ("kv",)

_memmove = ctypes.memmove  # a foreign call: it releases the GIL while it copies


class KvtierError(Exception):
    """A configuration or geometry error, raised at construction or at
    register_mem_pool_host (never from a data path call)."""


class _Lost(Exception):
    """serve is away or the session is gone: the call answers miss."""


class _Slab(MappedSlab):
    """serve's slab files, mapped shared; uint8 tensors over them."""

    def __init__(self, geometry):
        super().__init__(geometry, KvtierError)

    def wrap(self, m):
        return torch.frombuffer(m, dtype=torch.uint8)

    def view(self, span, length):
        self.check(span, length)
        return self.tensors[span.slab][span.offset:span.offset + length]


class KvtierStorage(HiCacheStorage):
    """SGLang HiCache storage backend over ``kvtier serve``'s page-store door.

    Built by SGLang's factory as ``KvtierStorage(storage_config, kwargs)``;
    the host pool arrives through :meth:`register_mem_pool_host`, which
    registers the session (the namespace needs the pool's geometry). Until
    a session is open every call is a miss.
    """

    def __init__(self, storage_config, kwargs=None):
        self.config = storage_config
        extra = dict(storage_config.extra_config or {})
        unknown = sorted(k for k in extra if k not in _KNOWN)
        if unknown:
            logger.info("kvtier: extra_config keys not used by kvtier: %s", ", ".join(unknown))
        self.socket = str(extra.get("socket") or _default_socket())
        self.salt = str(extra.get("salt", ""))
        self.model_revision = str(extra.get("model_revision", ""))
        self.model = str(extra.get("model") or storage_config.model_name or "")
        if not self.model:
            raise KvtierError("kvtier: no model name: SGLang gave none (model_name) and extra_config has no \"model\"")
        self.timeout = self._positive(extra, "timeout_s", 5.0)
        self.register_retry = self._positive(extra, "register_retry_s", 0.5)
        self.get_deadline_ms = _count(extra, "get_deadline_ms", 0)
        self.prefetch = _flag(extra, "prefetch", True)
        for name in ("tp", "pp", "attn_cp", "dp"):
            r, n = getattr(storage_config, name + "_rank", 0) or 0, getattr(storage_config, name + "_size", 1) or 1
            if not (0 <= r < n):
                raise KvtierError("kvtier: %s_rank %d of %s_size %d" % (name, r, name, n))
        self.is_mla = bool(storage_config.is_mla_model)
        self.kind_names = _MLA_KINDS if self.is_mla else _MHA_KINDS
        self.enable_metrics = bool(getattr(storage_config, "enable_storage_metrics", False))
        self.client_id = "sglang-%d-tp%d-pp%d-cp%d-dp%d" % (
            os.getpid(), storage_config.tp_rank, storage_config.pp_rank, storage_config.attn_cp_rank,
            getattr(storage_config, "dp_rank", 0))

        self.mem_pool_host = None
        self.registered_pools = {}
        self._lock = threading.Lock()  # guards the session fields below
        self._tl = threading.local()  # the deadline of this thread's current call
        self._session = None
        self._boot_id = ""
        self._slab = None
        self._kinds = ()  # page bytes of each kind, in the server's order
        self._limits = None
        self._next_register = 0.0
        self._geometry_error = None
        self._stats_lock = threading.Lock()
        self._metrics = {"prefetch_pgs": [], "backup_pgs": [], "prefetch_bandwidth": [], "backup_bandwidth": []}
        self.counters = {"get_pages": 0, "hit_pages": 0, "set_pages": 0, "stored_pages": 0,
                         "exists_calls": 0, "unavailable_calls": 0, "registrations": 0, "errors": 0,
                         "corrupt_pages": 0}

        self._channel = None
        self._redial_at = 0.0
        self._dial()

    def _dial(self):
        """A new channel to serve. grpc's channel can stay in
        TRANSIENT_FAILURE after serve restarts on the same socket path
        (seen with grpcio 1.51 over unix sockets), so a backend that sees
        UNAVAILABLE dials again, at most once per register_retry_s. The old
        channel is closed; a call still on it fails and is a miss."""
        old = self._channel
        self._channel = grpc.insecure_channel("unix:" + self.socket, options=[
            ("grpc.max_receive_message_length", 64 << 20),
            ("grpc.max_send_message_length", 64 << 20),
            ("grpc.use_local_subchannel_pool", 1),  # its own connection, not shared with other backends
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000)])
        self._stub = pbg.StoreStub(self._channel)
        if old is not None:
            old.close()

    @staticmethod
    def _positive(extra, key, default):
        v = extra.get(key, default)
        try:
            v = float(v)
        except (TypeError, ValueError):
            raise KvtierError("kvtier: extra_config.%s %r: want a positive number" % (key, v)) from None
        if not v > 0:
            raise KvtierError("kvtier: extra_config.%s %r: want a positive number" % (key, v))
        return v

    # ---- host pool and session -------------------------------------------

    def register_mem_pool_host(self, mem_pool_host):
        """Takes SGLang's host KV pool and registers the session; a bad
        geometry (serve's kinds differ) raises KvtierError naming it. serve
        being away is not an error: the backend registers on a later call."""
        super().register_mem_pool_host(mem_pool_host)
        self.page_size = int(mem_pool_host.page_size)
        if self.page_size <= 0:
            raise KvtierError("kvtier: host pool page_size %d" % self.page_size)
        page_bytes = self._pool_page_bytes(mem_pool_host)
        n = len(self.kind_names)
        if page_bytes % n:
            raise KvtierError("kvtier: host pool page of %d bytes does not split into %d kinds" % (page_bytes, n))
        self.page_bytes = page_bytes
        self.kind_bytes = [page_bytes // n] * n
        self.layout = str(getattr(mem_pool_host, "layout", "") or "")
        # The KV dtype names the namespace: an fp8 pool stores uint8, so the
        # KV's own dtype (newer SGLang's storage_config.kv_cache_dtype, or
        # extra_config "kv_cache_dtype") wins over the pool's storage dtype.
        kvd = (self.config.extra_config or {}).get("kv_cache_dtype") or getattr(self.config, "kv_cache_dtype", None)
        self.dtype = _dtype_name(kvd or getattr(mem_pool_host, "dtype", ""))
        try:
            with self._lock:
                self._deadline(self._register)
        except _Lost:
            logger.warning("kvtier: serve at %s is not answering; pages are misses until it does", self.socket)

    @staticmethod
    def _pool_page_bytes(pool):
        spt = getattr(pool, "size_per_token", None)
        if not spt:
            spt = pool.get_size_per_token()
        return int(spt) * int(pool.page_size)

    def _namespace(self):
        c = self.config
        return pb.Namespace(
            model=self.model, model_revision=self.model_revision, kv_layout=self.layout, dtype=self.dtype,
            page_tokens=self.page_size,
            kinds=[pb.PayloadKind(name=k, page_bytes=b) for k, b in zip(self.kind_names, self.kind_bytes)],
            tp_rank=c.tp_rank, tp_size=c.tp_size, cp_rank=c.attn_cp_rank, cp_size=c.attn_cp_size,
            pp_rank=c.pp_rank, pp_size=c.pp_size, dp_rank=getattr(c, "dp_rank", 0), dp_size=getattr(c, "dp_size", 1),
            shared_across_tp=self.is_mla, salt=self.salt)

    def _register(self, force=False):
        """Opens a session (under self._lock by the caller or here); raises
        _Lost while serve is away, KvtierError on a refused namespace."""
        if self.mem_pool_host is None:
            raise _Lost("no host pool registered yet")
        now = time.monotonic()
        if not force and now < self._next_register:
            raise _Lost("serve was away %.2f s ago" % (self.register_retry - (self._next_register - now)))
        self._next_register = now + self.register_retry
        try:
            rep = self._stub.Register(pb.RegisterRequest(client_id=self.client_id, namespace=self._namespace(),
                                                         protocol_versions=[PROTOCOL_VERSION]), timeout=self._remaining())
        except grpc.RpcError as e:
            if e.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION):
                self._geometry_error = "kvtier: serve refused the namespace: %s" % e.details()
                raise KvtierError(self._geometry_error) from None
            if e.code() == grpc.StatusCode.UNAVAILABLE and now >= self._redial_at:
                self._redial_at = now + self.register_retry
                self._dial()
            raise _Lost("register: %s" % e.code().name) from None
        except ValueError:
            raise _Lost("register: channel redialed") from None
        kinds = [(k.name, k.page_bytes) for k in rep.kinds]
        want = list(zip(self.kind_names, self.kind_bytes))
        if kinds != want:
            self._geometry_error = "kvtier: serve's kinds %s, this rank's pool %s" % (kinds, want)
            raise KvtierError(self._geometry_error)
        slab = _Slab(rep.slab)
        if self._slab is not None:
            self._slab.retire()  # unmapped when the copies through it end
        self._slab, self._session, self._boot_id = slab, rep.session, rep.boot_id
        self._limits, self._geometry_error = rep.limits, None
        self.counters["registrations"] += 1
        logger.info("kvtier: session %s with serve boot %s (%s)", rep.session, rep.boot_id, self.client_id)

    def _ensure(self):
        """The session's (session, boot_id, slab, limits), registering if
        needed; raises _Lost."""
        with self._lock:
            if self._session is None:
                self._register()
            self._slab.acquire()
            return self._session, self._boot_id, self._slab, self._limits

    def _lost(self, session, why):
        with self._lock:
            if self._session == session:
                self._session = None
                self._next_register = 0.0  # re-register at the next call
        logger.info("kvtier: session %s lost (%s); registering again", session, why)

    def _rpc(self, name, build, hold=False):
        """Calls one method with the current session; on NotFound (serve
        restarted, session gone) registers again once and retries. Returns
        (reply, session, boot, slab, limits) or raises _Lost. With hold the
        slab stays acquired: the caller releases it after its copies."""
        for attempt in range(2):
            session, boot, slab, limits = self._ensure()
            ok = False
            try:
                out = self._rpc_once(name, build, attempt, session, boot, slab, limits)
                ok = out is not None
            finally:
                if not (ok and hold):
                    slab.release()
            if ok:
                return out
        raise _Lost(name)

    def _rpc_once(self, name, build, attempt, session, boot, slab, limits):
        """One try of _rpc: the result, or None to try again."""
        try:
            rep = getattr(self._stub, name)(build(session, boot), timeout=self._remaining())
        except ValueError:  # the channel was closed under us (_dial)
            raise _Lost("%s: channel redialed" % name) from None
        except grpc.RpcError as e:
            code = e.code()
            if code == grpc.StatusCode.UNAVAILABLE:
                self._unavailable()
            if code == grpc.StatusCode.NOT_FOUND and attempt == 0:
                self._lost(session, "NotFound: " + (e.details() or ""))
                return None
            if code == grpc.StatusCode.NOT_FOUND:
                self._lost(session, "NotFound: " + (e.details() or ""))
            self.counters["unavailable_calls"] += 1
            raise _Lost("%s: %s %s" % (name, code.name, e.details() or "")) from None
        if getattr(rep, "boot_id", boot) and rep.boot_id != boot:
            self._lost(session, "boot_id %s, was %s" % (rep.boot_id, boot))
            if attempt == 0:
                return None
            raise _Lost("%s: serve restarted" % name)
        return rep, session, boot, slab, limits

    def _remaining(self, floor=None):
        """Seconds left of the current call's deadline (timeout_s from its
        start); raises _Lost when none is left, unless floor is given (the
        Release or Commit that must follow a copy)."""
        d = getattr(self._tl, "deadline", None)
        if d is None:
            return self.timeout
        r = d - time.monotonic()
        if floor is not None:
            return max(r, floor)
        if r <= 0:
            raise _Lost("the call's deadline (timeout_s %.3g) passed" % self.timeout)
        return r

    def _deadline(self, fn):
        """Runs fn with one deadline, timeout_s from now, over all its RPCs."""
        outer = getattr(self._tl, "deadline", None)
        if outer is None:
            self._tl.deadline = time.monotonic() + self.timeout
        try:
            return fn()
        finally:
            if outer is None:
                self._tl.deadline = None

    def _unavailable(self):
        with self._lock:
            now = time.monotonic()
            if now >= self._redial_at:
                self._redial_at = now + self.register_retry
                self._dial()

    def _batches(self, n):
        limits = self._limits
        step = max(1, int(limits.max_batch_pages) if limits is not None and limits.max_batch_pages else 128)
        return [(i, min(n, i + step)) for i in range(0, n, step)]

    # ---- keys -------------------------------------------------------------

    def _key_ok(self, key):
        if not isinstance(key, str) or not key:
            return False
        limits = self._limits
        mk = limits.max_key_bytes if limits is not None and limits.max_key_bytes else 1024
        return len(key.encode("utf-8", "surrogatepass")) <= mk

    # ---- the three page operations over the door ------------------------

    def _exists_count(self, keys, prefetch=False):
        """Leading count of keys present (0 while serve is away); with
        prefetch, serve starts reloading the L3 ones into L2."""
        if not keys:
            return 0
        total = 0
        for lo, hi in self._batches(len(keys)):
            batch = keys[lo:hi]
            bad = next((i for i, k in enumerate(batch) if not self._key_ok(k)), None)
            if bad is not None:
                batch = batch[:bad]
                if not batch:
                    return total
            rep = self._rpc("BatchExists", lambda s, b: pb.ExistsRequest(session=s, boot_id=b, keys=batch, prefetch=prefetch))[0]
            self.counters["exists_calls"] += 1
            present = min(int(rep.present), len(batch))
            total += present
            if present < hi - lo:
                break
        return total

    def _get_pages(self, keys, copy_out, pieces_out=None):
        """BatchGet keys; for each HIT calls copy_out(i, slab, spans) (the
        copy slab -> destination); returns list[bool]. Pins are released.

        With pieces_out (pieces_out(i, slab, spans, batch, group0) adds the
        page's copies to a PieceBatch, kind k's in the order of its slab
        bytes under group group0 + k) and the native library, the batch's
        copies run in one call that also takes each kind's CRC32C, checked
        against the sums serve sent (client_verifies): serve reads no page."""
        if pieces_out is not None and _native_sums():
            return self._get_pages_verified(keys, pieces_out)
        results = [False] * len(keys)
        for idx, ks, rep, session, boot, slab in self._get_batches(keys, False):
            copied = []  # positions j of ks copied: confirmed only by Release
            try:
                if len(rep.pages) != len(ks):
                    raise ValueError("BatchGet: %d pages for %d keys" % (len(rep.pages), len(ks)))
                for j, page in enumerate(rep.pages):
                    if page.status != pb.GET_STATUS_HIT:
                        continue
                    try:
                        if len(page.spans) != len(self.kind_bytes):
                            raise ValueError("%d spans, want %d" % (len(page.spans), len(self.kind_bytes)))
                        copy_out(idx[j], slab, page.spans)
                        copied.append(j)
                    except (ValueError, RuntimeError) as e:
                        self.counters["errors"] += 1
                        logger.error("kvtier: get of page %r: %s", keys[idx[j]], e)
            finally:
                slab.release()
                corrupt = None  # None: the hits are unconfirmed
                if rep.lease:
                    try:
                        rel = self._stub.Release(pb.ReleaseRequest(session=session, boot_id=boot, lease=rep.lease),
                                                 timeout=self._remaining(0.1))
                        corrupt = set(rel.corrupt)
                    except (grpc.RpcError, ValueError) as e:
                        # The lease ends by itself (lease_ms, or the session's
                        # end); its check is unconfirmed: no hit counts.
                        logger.info("kvtier: release of lease %d: %s: the batch's pages count as misses", rep.lease, e)
                else:
                    corrupt = set()  # nothing pinned: no hit to confirm
            if corrupt is not None:
                for j in copied:
                    if j in corrupt:
                        self.counters["corrupt_pages"] += 1
                        logger.error("kvtier: page %r failed its check while it was copied: a miss", keys[idx[j]])
                    else:
                        results[idx[j]] = True
        self.counters["get_pages"] += len(keys)
        self.counters["hit_pages"] += sum(results)
        return results

    def _get_batches(self, keys, client_verifies):
        """Yields, per batch of valid keys, (positions in keys, the keys,
        BatchGet's reply, session, boot, slab): the slab is held, and the
        caller releases it after its copies. check_at_release is always
        set: a serve older than client_verifies ignores that flag, sends no
        sums and checks while the client copies instead."""
        for lo, hi in self._batches(len(keys)):
            idx = [i for i in range(lo, hi) if self._key_ok(keys[i])]
            if not idx:
                continue
            ks = [keys[i] for i in idx]
            rep, session, boot, slab, _ = self._rpc(
                "BatchGet", lambda s, b: pb.GetRequest(session=s, boot_id=b, keys=ks, deadline_ms=self.get_deadline_ms,
                                                       check_at_release=True, client_verifies=client_verifies),
                hold=True)
            yield idx, ks, rep, session, boot, slab

    def _get_pages_verified(self, keys, pieces_out):
        """_get_pages with the client's check: one native copy of the
        batch, each page's CRC32C compared with serve's sums; a page whose
        copy differs is a miss, reported at Release (serve drops it)."""
        nk = len(self.kind_bytes)
        results = [False] * len(keys)
        for idx, ks, rep, session, boot, slab in self._get_batches(keys, True):
            mine, theirs, bad = [], [], []  # hits checked here; by serve (no sums); failed here
            corrupt = None  # None: serve's check (of pages without sums) is unconfirmed
            try:
                if len(rep.pages) != len(ks):
                    raise ValueError("BatchGet: %d pages for %d keys" % (len(rep.pages), len(ks)))
                batch = PieceBatch()
                for j, page in enumerate(rep.pages):
                    if page.status != pb.GET_STATUS_HIT:
                        continue
                    try:
                        check_hit(page, nk)
                        mark = len(batch)
                        try:
                            pieces_out(idx[j], slab, page.spans, batch, j * nk)
                        except ValueError:
                            batch.truncate(mark)
                            raise
                        (mine if page.sums else theirs).append(j)
                    except (ValueError, RuntimeError) as e:
                        self.counters["errors"] += 1
                        logger.error("kvtier: get of page %r: %s", keys[idx[j]], e)
                sums = batch.run(len(ks) * nk)
                for j in mine:
                    want = rep.pages[j].sums
                    if any(sums[j * nk + k] != want[k] for k in range(nk)):
                        bad.append(j)
            finally:
                slab.release()
                if rep.lease and not theirs and not bad:
                    # Every hit was checked here and passed: nothing in the
                    # reply is needed, so the Release is not waited for (a
                    # failure is logged, and the lease then ends by
                    # itself). A failed page's report is waited for: serve
                    # has dropped it when the call returns, so a retry
                    # does not find it again.
                    release_async(self._stub, pb.ReleaseRequest(session=session, boot_id=boot, lease=rep.lease, corrupt=bad), self.timeout)
                    corrupt = set()
                elif rep.lease:
                    try:
                        rel = self._stub.Release(pb.ReleaseRequest(session=session, boot_id=boot, lease=rep.lease, corrupt=bad),
                                                 timeout=self._remaining(0.1))
                        corrupt = set(rel.corrupt)
                    except (grpc.RpcError, ValueError) as e:
                        # The pins end with the lease; the pages checked
                        # here stay good, serve's checks are unconfirmed.
                        logger.info("kvtier: release of lease %d: %s", rep.lease, e)
                else:
                    corrupt = set()
            for j in bad:
                self.counters["corrupt_pages"] += 1
                logger.error("kvtier: page %r failed its check as it was copied: a miss", keys[idx[j]])
            for j in mine:
                if j not in bad:
                    results[idx[j]] = True
            for j in theirs:
                if corrupt is not None and j not in corrupt:
                    results[idx[j]] = True
                elif corrupt is not None:
                    self.counters["corrupt_pages"] += 1
        self.counters["get_pages"] += len(keys)
        self.counters["hit_pages"] += sum(results)
        return results

    def _set_pages(self, keys, copy_in, pieces_in=None):
        """BatchSet keys; for each RESERVED page calls copy_in(i, slab,
        spans) (the copy source -> slab), then commits; returns list[bool]
        (True: stored now or already).

        With pieces_in (as _get_pages' pieces_out, source -> slab) and the
        native library, the batch's copies run in one call that also takes
        each kind's CRC32C, and Commit hands the sums to serve, which then
        reads no page."""
        results = [False] * len(keys)
        for lo, hi in self._batches(len(keys)):
            idx = [i for i in range(lo, hi) if self._key_ok(keys[i])]
            if not idx:
                continue
            ks = [keys[i] for i in idx]
            rep, session, boot, slab, _ = self._rpc("BatchSet", lambda s, b: pb.SetRequest(session=s, boot_id=b, keys=ks),
                                                    hold=True)
            sums = None
            try:
                if pieces_in is not None and _native_sums():
                    written, sums = self._fill_summed(rep, ks, idx, keys, slab, pieces_in, results)
                else:
                    written = self._fill(rep, ks, idx, keys, slab, copy_in, results)
            finally:
                slab.release()
            if rep.lease:
                try:
                    c = self._stub.Commit(pb.CommitRequest(session=session, boot_id=boot, lease=rep.lease, written=written,
                                                           sums=sums or []),
                                          timeout=self._remaining(0.1))
                except (grpc.RpcError, ValueError) as e:
                    if isinstance(e, grpc.RpcError) and e.code() == grpc.StatusCode.NOT_FOUND:
                        self._lost(session, "Commit: NotFound")
                    logger.info("kvtier: commit of lease %d: %s", rep.lease, e)
                    for j in range(len(ks)):
                        if rep.pages[j].status == pb.SET_STATUS_RESERVED:
                            results[idx[j]] = False
                    continue
                for j, ok in enumerate(c.stored[:len(ks)]):
                    results[idx[j]] = bool(ok)
        self.counters["set_pages"] += len(keys)
        self.counters["stored_pages"] += sum(results)
        return results

    def _fill(self, rep, ks, idx, keys, slab, copy_in, results):
        """Copies each RESERVED page into its spans; the Commit's written[]."""
        if len(rep.pages) != len(ks):
            raise _Lost("BatchSet: %d pages for %d keys" % (len(rep.pages), len(ks)))
        written = [False] * len(ks)
        for j, page in enumerate(rep.pages):
            if page.status == pb.SET_STATUS_EXISTS:
                results[idx[j]] = True
            elif page.status == pb.SET_STATUS_RESERVED:
                try:
                    if len(page.spans) != len(self.kind_bytes):
                        raise ValueError("%d spans, want %d" % (len(page.spans), len(self.kind_bytes)))
                    copy_in(idx[j], slab, page.spans)
                    written[j] = True
                except (ValueError, RuntimeError) as e:
                    self.counters["errors"] += 1
                    logger.error("kvtier: set of page %r: %s", keys[idx[j]], e)
        return written

    def _fill_summed(self, rep, ks, idx, keys, slab, pieces_in, results):
        """_fill in one native call that also takes every written page's
        CRC32C: the Commit's written[] and sums[]."""
        if len(rep.pages) != len(ks):
            raise _Lost("BatchSet: %d pages for %d keys" % (len(rep.pages), len(ks)))
        nk = len(self.kind_bytes)
        written = [False] * len(ks)
        batch = PieceBatch()
        for j, page in enumerate(rep.pages):
            if page.status == pb.SET_STATUS_EXISTS:
                results[idx[j]] = True
            elif page.status == pb.SET_STATUS_RESERVED:
                mark = len(batch)
                try:
                    if len(page.spans) != nk:
                        raise ValueError("%d spans, want %d" % (len(page.spans), nk))
                    pieces_in(idx[j], slab, page.spans, batch, j * nk)
                    written[j] = True
                except (ValueError, RuntimeError) as e:
                    batch.truncate(mark)
                    self.counters["errors"] += 1
                    logger.error("kvtier: set of page %r: %s", keys[idx[j]], e)
        return written, batch.run(len(ks) * nk)

    # ---- copies between the host pool and the slab -----------------------

    def _meta(self, host_indices, npages):
        """The host pool's page buffers, per page: a list per kind of
        (address, bytes) chunks that concatenate to the kind's payload."""
        ptrs, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices)
        if len(ptrs) != len(sizes) or npages == 0 or len(ptrs) % npages:
            raise ValueError("get_page_buffer_meta: %d pointers, %d sizes for %d pages" % (len(ptrs), len(sizes), npages))
        per = len(ptrs) // npages
        nk = len(self.kind_bytes)
        if per % nk:
            raise ValueError("get_page_buffer_meta: %d buffers a page for %d kinds" % (per, nk))
        pages = []
        for p in range(npages):
            kinds = [[] for _ in range(nk)]
            for j in range(per):
                kinds[j % nk].append((ptrs[p * per + j], sizes[p * per + j]))
            for k, chunks in enumerate(kinds):
                if sum(s for _, s in chunks) != self.kind_bytes[k]:
                    raise ValueError("get_page_buffer_meta: kind %s of page %d has %d bytes, want %d" % (
                        self.kind_names[k], p, sum(s for _, s in chunks), self.kind_bytes[k]))
            pages.append(kinds)
        return pages

    def _check_indices(self, keys, host_indices, what):
        if not isinstance(keys, (list, tuple)):
            raise ValueError("%s: keys is a %s, want a list" % (what, type(keys).__name__))
        if not isinstance(host_indices, torch.Tensor):
            raise ValueError("%s: host_indices is a %s, want a tensor" % (what, type(host_indices).__name__))
        if host_indices.numel() != len(keys) * self.page_size:
            raise ValueError("%s: %d host_indices for %d keys of %d tokens" % (
                what, host_indices.numel(), len(keys), self.page_size))
        if host_indices.numel():
            lo, hi = int(host_indices.min()), int(host_indices.max())
            size = int(getattr(self.mem_pool_host, "size", hi + 1))
            if lo < 0 or hi >= size:
                raise ValueError("%s: host_indices in [%d, %d], pool holds %d tokens" % (what, lo, hi, size))

    def batch_get_v1(self, keys, host_indices, extra_info=None):
        """Pages slab -> the host pool at host_indices (zero-copy path):
        list[bool], one per key, never None."""
        t0 = time.perf_counter()
        try:
            self._check_indices(keys, host_indices, "batch_get_v1")
            meta = self._meta(host_indices.cpu(), len(keys)) if keys else []
        except (ValueError, AttributeError, AssertionError) as e:
            logger.error("kvtier: %s", e)
            return [False] * (len(keys) if isinstance(keys, (list, tuple)) else 0)

        def copy_out(i, slab, spans):
            for k, span in enumerate(spans):
                src = slab.check(span, self.kind_bytes[k])
                for addr, n in meta[i][k]:
                    _memmove(addr, src, n)
                    src += n

        def pieces_out(i, slab, spans, batch, g):
            for k, span in enumerate(spans):
                src = slab.check(span, self.kind_bytes[k])
                for addr, n in meta[i][k]:
                    batch.add(addr, src, n, g + k)
                    src += n

        res = self._guard(lambda: self._get_pages(keys, copy_out, pieces_out), len(keys), "batch_get_v1")
        self._observe("prefetch", sum(res), t0)
        return res

    def batch_set_v1(self, keys, host_indices, extra_info=None):
        """Pages host pool -> slab -> kvtier: list[bool], one per key."""
        t0 = time.perf_counter()
        try:
            self._check_indices(keys, host_indices, "batch_set_v1")
            meta = self._meta(host_indices.cpu(), len(keys)) if keys else []
        except (ValueError, AttributeError, AssertionError) as e:
            logger.error("kvtier: %s", e)
            return [False] * (len(keys) if isinstance(keys, (list, tuple)) else 0)

        def copy_in(i, slab, spans):
            for k, span in enumerate(spans):
                dst = slab.check(span, self.kind_bytes[k])
                for addr, n in meta[i][k]:
                    _memmove(dst, addr, n)
                    dst += n

        def pieces_in(i, slab, spans, batch, g):
            for k, span in enumerate(spans):
                dst = slab.check(span, self.kind_bytes[k])
                for addr, n in meta[i][k]:
                    batch.add(dst, addr, n, g + k)
                    dst += n

        res = self._guard(lambda: self._set_pages(keys, copy_in, pieces_in), len(keys), "batch_set_v1")
        self._observe("backup", sum(res), t0)
        return res

    def _guard(self, fn, n, what):
        """Runs a data-path call: serve away or any failure is all-False,
        never an exception into SGLang's threads."""
        try:
            return self._deadline(fn)
        except _Lost as e:
            logger.debug("kvtier: %s: %s", what, e)
            return [False] * n
        except KvtierError as e:
            logger.error("%s", e)
            return [False] * n
        except Exception:  # a bug must not kill SGLang's prefetch/backup thread
            self.counters["errors"] += 1
            logger.exception("kvtier: %s failed", what)
            return [False] * n

    # ---- generic path (no "interface_v1") ---------------------------------

    def _flat(self, t, what):
        if not isinstance(t, torch.Tensor):
            raise ValueError("%s: a %s, want a tensor" % (what, type(t).__name__))
        if t.device.type != "cpu" or not t.is_contiguous():
            raise ValueError("%s: want a contiguous CPU tensor" % what)
        b = t.view(-1).view(torch.uint8) if t.numel() else t.view(torch.uint8)
        if b.numel() != self.page_bytes:
            raise ValueError("%s: %d bytes, a page has %d" % (what, b.numel(), self.page_bytes))
        return b

    def _split(self, b):
        out, off = [], 0
        for n in self.kind_bytes:
            out.append(b[off:off + n])
            off += n
        return out

    def batch_get(self, keys, target_locations=None, target_sizes=None):
        """Generic path: each page into its target tensor (SGLang passes
        get_dummy_flat_data_page()); a list with the tensor or None per key."""
        if not isinstance(keys, (list, tuple)):
            logger.error("kvtier: batch_get: keys is a %s", type(keys).__name__)
            return []
        if self.mem_pool_host is None:
            return [None] * len(keys)
        targets = list(target_locations) if target_locations is not None else [None] * len(keys)
        if len(targets) != len(keys):
            logger.error("kvtier: batch_get: %d targets for %d keys", len(targets), len(keys))
            return [None] * len(keys)
        views = []
        for i, t in enumerate(targets):
            try:
                if t is None:
                    t = self.mem_pool_host.get_dummy_flat_data_page()
                    targets[i] = t
                views.append(self._split(self._flat(t, "batch_get target %d" % i)))
            except ValueError as e:
                logger.error("kvtier: %s", e)
                views.append(None)
        ks = [k if views[i] is not None else "" for i, k in enumerate(keys)]
        t0 = time.perf_counter()

        def copy_out(i, slab, spans):
            for k, span in enumerate(spans):
                views[i][k].copy_(slab.view(span, self.kind_bytes[k]))

        def pieces_out(i, slab, spans, batch, g):
            for k, span in enumerate(spans):
                batch.add(views[i][k].data_ptr(), slab.check(span, self.kind_bytes[k]), self.kind_bytes[k], g + k)

        res = self._guard(lambda: self._get_pages(ks, copy_out, pieces_out), len(keys), "batch_get")
        self._observe("prefetch", sum(res), t0)
        return [targets[i] if ok else None for i, ok in enumerate(res)]

    def get(self, key, target_location=None, target_sizes=None):
        return self.batch_get([key], [target_location] if target_location is not None else None)[0]

    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None):
        """Generic path: each value (a flat page, get_data_page) stored;
        True when every page is stored."""
        return all(self._batch_set_list(keys, values)) if isinstance(keys, (list, tuple)) and keys else False

    def _batch_set_list(self, keys, values):
        if not isinstance(keys, (list, tuple)) or values is None or len(values) != len(keys):
            logger.error("kvtier: batch_set: %s keys, %s values", len(keys) if isinstance(keys, (list, tuple)) else keys,
                         None if values is None else len(values))
            return [False] * (len(keys) if isinstance(keys, (list, tuple)) else 0)
        if self.mem_pool_host is None:
            return [False] * len(keys)
        views = []
        for i, v in enumerate(values):
            try:
                views.append(self._split(self._flat(v.contiguous() if isinstance(v, torch.Tensor) else v,
                                                    "batch_set value %d" % i)))
            except ValueError as e:
                logger.error("kvtier: %s", e)
                views.append(None)
        ks = [k if views[i] is not None else "" for i, k in enumerate(keys)]
        t0 = time.perf_counter()

        def copy_in(i, slab, spans):
            for k, span in enumerate(spans):
                slab.view(span, self.kind_bytes[k]).copy_(views[i][k])

        def pieces_in(i, slab, spans, batch, g):
            for k, span in enumerate(spans):
                batch.add(slab.check(span, self.kind_bytes[k]), views[i][k].data_ptr(), self.kind_bytes[k], g + k)

        res = self._guard(lambda: self._set_pages(ks, copy_in, pieces_in), len(keys), "batch_set")
        self._observe("backup", sum(res), t0)
        return res

    def set(self, key, value=None, target_location=None, target_sizes=None):
        return self.batch_set([key], [value])

    def exists(self, key):
        return self._batch_exists([key], False) == 1

    def batch_exists(self, keys, extra_info=None):
        """The number of leading keys stored (0 while serve is away). It is
        SGLang's prefetch path's first call: with the "prefetch" setting,
        serve starts reloading the pages it finds in L3 into L2."""
        return self._batch_exists(keys, self.prefetch)

    def _batch_exists(self, keys, prefetch):
        if not isinstance(keys, (list, tuple)):
            logger.error("kvtier: batch_exists: keys is a %s", type(keys).__name__)
            return 0
        try:
            return self._deadline(lambda: self._exists_count(list(keys), prefetch=prefetch))
        except (_Lost, KvtierError) as e:
            logger.debug("kvtier: batch_exists: %s", e)
            return 0
        except Exception:
            self.counters["errors"] += 1
            logger.exception("kvtier: batch_exists failed")
            return 0

    # ---- v2: extra host pools (Mamba, SWA, indexer) ----------------------

    def register_mem_host_pool_v2(self, host_pool, host_pool_name):
        """An extra pool's page is stored in chunks of the door's page size
        (serve has one payload geometry), under "<key>.<pool>.<chunk>"."""
        super().register_mem_host_pool_v2(host_pool, host_pool_name)

    def _pool_name(self, name):
        return str(getattr(name, "value", name))

    def _chunk_keys(self, key, pool, nchunks):
        return ["%s.%s.%d" % (key, pool, c) for c in range(nchunks)]

    def _pool_geometry(self, name):
        pool = self.registered_pools.get(name) if hasattr(self, "registered_pools") else None
        if pool is None:
            pool = self.registered_pools.get(self._pool_name(name)) if hasattr(self, "registered_pools") else None
        if pool is None:
            raise ValueError("pool %r is not registered (register_mem_host_pool_v2)" % (name,))
        ps = int(getattr(pool, "page_size", 1) or 1)
        nbytes = pool.get_dummy_flat_data_page()
        nbytes = nbytes.numel() * nbytes.element_size()
        if nbytes <= 0:
            raise ValueError("pool %r: a page of %d bytes" % (name, nbytes))
        return pool, ps, nbytes, -(-nbytes // self.page_bytes)

    def batch_exists_v2(self, keys, pool_transfers=None, extra_info=None):
        """The usable KV prefix given every pool's hit policy."""
        return self._deadline(lambda: self._exists_v2(keys, pool_transfers))

    def _exists_v2(self, keys, pool_transfers):
        kv = self.batch_exists(keys)
        hits = {str(PoolName.KV.value): kv} if kv else {}
        final = kv
        for t in pool_transfers or []:
            if final == 0:
                break
            name = self._pool_name(t.name)
            try:
                _, _, _, nch = self._pool_geometry(t.name)
                if t.hit_policy == PoolHitPolicy.TRAILING_PAGES:
                    boundary = self._trailing(keys, kv, name, nch, max(1, len(t.keys) if t.keys else 1))
                else:
                    ck = [c for k in keys[:kv] for c in self._chunk_keys(k, name, nch)]
                    boundary = self._exists_count(ck) // nch
            except (_Lost, KvtierError, ValueError) as e:
                logger.debug("kvtier: batch_exists_v2 %s: %s", name, e)
                boundary = 0
            if boundary:
                hits[name] = boundary
            final = min(final, boundary)
        return PoolTransferResult(final, hits)

    def _trailing(self, keys, kv, name, nch, trailing):
        """The longest prefix p <= kv whose last `trailing` pages all have
        the pool's page: asks for the pages from p-1 down, so the door's
        leading count is the run present at the prefix's end."""
        p = kv
        while p > 0:
            want = min(trailing, p)
            ck = [c for i in range(p - 1, p - 1 - want, -1) for c in self._chunk_keys(keys[i], name, nch)]
            run = self._exists_count(ck) // nch
            if run >= want:
                return p
            p = p - 1 - run  # every window holding the missing page fails
        return 0

    def _v2(self, transfers, op):
        out = {}
        for t in transfers or []:
            name = self._pool_name(t.name)
            keys = list(t.keys or [])
            try:
                pool, ps, nbytes, nch = self._pool_geometry(t.name)
                hi = t.host_indices
                if hi is None or hi.numel() != len(keys) * ps:
                    raise ValueError("%s: %s host_indices for %d keys of %d tokens" % (
                        name, None if hi is None else hi.numel(), len(keys), ps))
            except ValueError as e:
                logger.error("kvtier: batch_%s_v2: %s", op, e)
                out[name] = [False] * len(keys)
                continue
            hi = hi.cpu()
            offsets = [int(hi[i * ps]) for i in range(len(keys))]
            ck = [c for k in keys for c in self._chunk_keys(k, name, nch)]
            if op == "get":
                pages = [pool.get_dummy_flat_data_page() for _ in keys]
                flats = [p.view(-1).view(torch.uint8) for p in pages]
            else:
                pages = [pool.get_data_page(o, flat=True).contiguous() for o in offsets]
                flats = [p.view(-1).view(torch.uint8) for p in pages]

            def chunk(i):
                f = flats[i // nch]
                c = i % nch
                return f[c * self.page_bytes:min(nbytes, (c + 1) * self.page_bytes)]

            def copy(i, slab, spans, get=(op == "get")):
                src = chunk(i)
                off = 0
                for k, span in enumerate(spans):
                    n = min(self.kind_bytes[k], src.numel() - off)
                    if n <= 0:
                        break
                    view = slab.view(span, self.kind_bytes[k])[:n]
                    if get:
                        src[off:off + n].copy_(view)
                    else:
                        view.copy_(src[off:off + n])
                    off += n

            if op == "get":
                res = self._guard(lambda: self._get_pages(ck, copy), len(ck), "batch_get_v2")
            else:
                res = self._guard(lambda: self._set_pages(ck, copy), len(ck), "batch_set_v2")
            ok = [all(res[i * nch:(i + 1) * nch]) for i in range(len(keys))]
            if op == "get":
                for i, good in enumerate(ok):
                    if good:
                        pool.set_from_flat_data_page(offsets[i], pages[i])
            out[name] = ok
        return out

    def batch_get_v2(self, transfers, extra_info=None):
        """Each transfer's pages into its pool: {pool name: list[bool]}."""
        return self._v2(transfers, "get")

    def batch_set_v2(self, transfers, extra_info=None):
        """Each transfer's pages from its pool: {pool name: list[bool]}."""
        return self._v2(transfers, "set")

    # ---- clear, stats, close ---------------------------------------------

    def clear(self):
        """Forgets every page of this rank's namespace (every session of
        it): True when serve did."""
        try:
            self._deadline(lambda: self._rpc("Clear", lambda s, b: pb.ClearRequest(session=s, boot_id=b)))
            return True
        except (_Lost, KvtierError) as e:
            logger.warning("kvtier: clear: %s", e)
            return False

    def _observe(self, what, pages, t0):
        if not self.enable_metrics or pages <= 0:
            return
        dt = time.perf_counter() - t0
        with self._stats_lock:
            self._metrics[what + "_pgs"].append(pages)
            self._metrics[what + "_bandwidth"].append(pages * self.page_bytes / max(dt, 1e-9) / 1e9)

    def get_stats(self):
        """SGLang's StorageMetrics since the last call (pages a prefetch or
        backup batch moved, its bandwidth in GB/s), or None without
        --enable-metrics (enable_storage_metrics)."""
        if not self.enable_metrics:
            return None
        try:
            from sglang.srt.metrics.collector import StorageMetrics
        except ImportError:
            return None
        with self._stats_lock:
            m, self._metrics = self._metrics, {k: [] for k in self._metrics}
        sm = StorageMetrics()
        for k, v in m.items():
            getattr(sm, k).extend(v)
        return sm

    def door_stats(self):
        """serve's door counters (StatsReply) as a dict, or None while
        serve is away."""
        try:
            rep = self._deadline(lambda: self._rpc("Stats", lambda s, b: pb.StatsRequest(session=s, boot_id=b)))[0]
        except (_Lost, KvtierError):
            return None
        return {f.name: v for f, v in rep.ListFields() if f.name != "boot_id"}

    def close(self):
        with self._lock:
            session, boot, self._session = self._session, self._boot_id, None
            slab, self._slab = self._slab, None
        if session:
            try:
                self._stub.Close(pb.CloseRequest(session=session, boot_id=boot), timeout=self.timeout)
            except (grpc.RpcError, ValueError):
                pass
        self._channel.close()
        if slab is not None:
            slab.retire()
