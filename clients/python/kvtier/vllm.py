"""kvtier as a vLLM KV connector: :class:`KvtierConnector`.

vLLM loads it without a patch (docs/vllm.md)::

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "KvtierConnector",
        "kv_connector_module_path": "kvtier.vllm", "kv_role": "kv_both",
        "kv_connector_extra_config": {"socket": "/run/kvtier/kvtier.sock"}}'

Written against vLLM's KV connector v1 interface
(vllm/distributed/kv_transfer/kv_connector/v1/base.py) at
:data:`VLLM_COMMIT`. vLLM builds the class once in its scheduler process
(role SCHEDULER) and once in every worker (role WORKER), each as
``KvtierConnector(vllm_config, role, kv_cache_config)``. Both sides talk to
the node's ``kvtier serve`` over its page-store door (kvtier.store.v1,
docs/store-api.md).

Scheduler side: a request's prefix is looked up by vLLM's block hashes with
``BatchExists`` (with ``prefetch``: serve starts bringing pages it finds in
L3 back into its L2 slab), off the scheduler's thread: the lookup starts
when the request arrives (``on_new_request``) and
``get_num_new_matched_tokens`` answers ``None`` ("ask again") until it is
back, and while pages are still coming back from L3 (at most
``prefetch_wait_ms``). It counts only whole blocks in L2 (loadable now).
``build_connector_meta`` makes one plan a step: the loads
``update_state_after_alloc`` recorded and the blocks each scheduled request
completes in this step (its saves).

Worker side: ``register_kv_caches`` takes vLLM's paged KV tensors and maps
serve's slab. A load pins pages in the slab (``BatchGet``), copies them into
vLLM's blocks and releases them; an asynchronous load (the default) runs on
a thread between steps and is reported by ``get_finished``; a synchronous
one copies layer by layer on a thread while the forward runs,
``wait_for_layer_load`` waiting for its layer. A page that misses, fails
its check or is refused is reported by
``get_block_ids_with_load_errors`` and recomputed by vLLM, never used. Saves
run after the forward on a thread: ``BatchSet`` reserves slab spans, the
computed blocks are copied in and ``Commit`` ends it; a request with saves
is held by ``request_finished`` until ``get_finished`` reports them.

Copies go through the tensors' own memory: torch views give each block's
address, and on CPU one ``memmove`` a block, layer and kind (the GIL is
released while it copies); on CUDA torch copies of the same views.

Checksums: with the native library (:mod:`kvtier.native`;
``$KVTIER_CLIENT_SUMS`` not "0") and a host (CPU) cache, the copies run as
one native call a batch (a synchronous load: one a layer) that also takes
each page kind's CRC32C: a save's ``Commit`` carries the sums and a load
compares them with the sums serve sends (``client_verifies``; a page
whose copy differs is listed in the ``Release``, which serve drops), so
serve reads no page's bytes (docs/store-api.md, "Checksums carried by the
client"). A synchronous load's layers are summed call by call and chained
(a kind's span is its layers' chunks in layer order). Without the
library, and for a CUDA cache (copied by torch), serve takes the sums at
``Commit`` and checks each hit while it is copied (``check_at_release``).

While serve is away every lookup is a miss and every load a failure; nothing
raises into vLLM. On a new ``boot_id`` both sides register again by
themselves.
"""

import ctypes
import logging
import math
import os
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import grpc
import numpy as np
import torch

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics, KVConnectorStats

from kvtier.store.v1 import store_pb2 as pb
from kvtier import native as _native
from kvtier._storeclient import MappedSlab, check_hit, release_async, default_socket as _default_socket, dtype_name as _dtype_name, \
    native_sums as _native_sums
from kvtier.store.v1 import store_pb2_grpc as pbg

logger = logging.getLogger(__name__)

# The vLLM snapshot the interface was read from.
VLLM_COMMIT = "003df2961dd8830c317a61f9745ccd557da9fa06"

PROTOCOL_VERSION = 1

# kv_connector_extra_config keys of this connector.
SETTINGS = {
    "socket": "unix socket of kvtier serve (default $KVTIER_SOCKET, else ~/.local/state/kvtier/kvtier.sock)",
    "model": "the namespace's model name (default: vLLM's model)",
    "model_revision": "the weights' revision: two revisions never share a page (default: vLLM's revision, else empty)",
    "salt": "separates caches that must not share pages (tenants); default empty",
    "load_mode": "async (default): loads run between steps and the request waits for them; "
                 "sync: loads run in the step's forward, layer by layer",
    "kv_layout": "the in-block order vLLM is asked to use, NHD (default) or HND; part of the namespace",
    "timeout_s": "deadline of each worker call to serve in seconds (default 5)",
    "lookup_timeout_ms": "deadline of a lookup's BatchExists (default 1000)",
    "prefetch_wait_ms": "how long a request whose pages are in L3 waits for serve to bring them into L2 (default 2000)",
    "lookup_threads": "threads that run the scheduler side's lookups (default 2)",
    "prefetch_poll_ms": "how often such a request's pages are looked up again meanwhile, where serve "
                        "cannot wait for them itself (default 5)",
    "thread_nice": "niceness of the connector's background threads (lookups, asynchronous loads, saves), so "
                   "that they run in the step's idle time rather than beside its CPU work (default 10; 0: "
                   "as vLLM's own threads)",
    "get_deadline_ms": "bound of a load's reloads from below L2 (default 0: serve's default, 2 s)",
    "register_retry_s": "while serve is away, try to register at most this often (default 0.5)",
}

def _lower_thread(nice):
    """Lowers the calling thread's CPU priority by nice (Linux: a thread
    id names one thread). Best effort: a platform or sandbox that refuses
    leaves the thread as it is."""
    if nice <= 0:
        return
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
    except (AttributeError, OSError) as e:
        logger.debug("kvtier: thread priority unchanged: %s", e)


# CUDA: pages a copy stages through its device buffer at a time (a buffer
# of this many pages of the largest kind per copying role).
STAGING_PAGES = 16

_MHA_KINDS = ("k", "v")
_MLA_KINDS = ("kv",)
_U32 = 0xFFFFFFFF

_memmove = ctypes.memmove  # a foreign call: it releases the GIL while it copies

# Runs of at least this many pages are copied as torch views (one copy a
# run, layer and kind); shorter ones one memmove a block, layer and kind.
_MIN_RUN = 4


class KvtierError(Exception):
    """A configuration or geometry error, raised at construction or at
    register_kv_caches (never from a step's call)."""


class _Lost(Exception):
    """serve is away or the session is gone: the call is a miss."""


def _setting(extra, key, default, kind=float, minimum=None):
    v = extra.get(key, default)
    try:
        v = kind(v)
    except (TypeError, ValueError):
        raise KvtierError("kvtier: kv_connector_extra_config.%s %r: want a number" % (key, v)) from None
    if minimum is not None and v < minimum:
        raise KvtierError("kvtier: kv_connector_extra_config.%s %r: want at least %s" % (key, v, minimum))
    return v


def _hex(h):
    """A block hash as a key: bytes in hex; an int (older vLLM) as 16
    hex digits of its low 64 bits."""
    if isinstance(h, (bytes, bytearray)):
        return h.hex()
    return "%016x" % (int(h) & 0xFFFFFFFFFFFFFFFF)


def _layer_order(name):
    """Natural order of layer names (model.layers.10 after .9)."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


class _Shift:
    """CRC32C continuation over a fixed length n: ``combine(a, b)`` is the
    CRC32C of A followed by B from a = crc32c(A) and b = crc32c(B), B of
    n bytes, for numpy uint32 arrays of sums (elementwise). It is
    ``L(a) ^ b``, L the CRC register's run over n zero bytes (linear over
    GF(2)), applied a byte at a time through four 256-entry tables built
    from L's 32 columns (each taken by kvtier.native over n zero bytes).
    The synchronous load copies a page kind's layers in separate calls;
    this chains their sums into the kind's, in its slab byte order."""

    def __init__(self, n):
        zeros = bytes(n)
        cols = [(~_native.crc32c(zeros, crc=(~(1 << i)) & _U32)) & _U32 for i in range(32)]
        t = np.zeros((4, 256), dtype=np.uint32)
        for j in range(4):
            for bit in range(8):
                half = 1 << bit
                t[j, half:2 * half] = t[j, :half] ^ np.uint32(cols[8 * j + bit])
        self.t = t

    def combine(self, a, b):
        t = self.t
        return t[0][a & 0xFF] ^ t[1][(a >> 8) & 0xFF] ^ t[2][(a >> 16) & 0xFF] ^ t[3][a >> 24] ^ b


def _cudart():
    """torch's CUDA runtime bindings (cudaHostRegister, cudaHostUnregister)."""
    return torch.cuda.cudart()


def _cuda_call(name, *args):
    """None when the CUDA runtime call succeeded, else what went wrong
    (its error code, or the exception a torch without it raised)."""
    try:
        err = getattr(_cudart(), name)(*args)
        return None if int(err) == 0 else err
    except Exception as e:  # noqa: BLE001 (a CPU-only torch, an old binding)
        return e


class _Slab(MappedSlab):
    """serve's slab files, mapped shared; uint8 tensors over them.

    pin (a worker whose KV cache is on CUDA): each file's map is
    page-locked with cudaHostRegister, so that torch's copies between it
    and the GPU are DMA on the copy's stream, not staged through a bounce
    buffer with the host waiting; a map is unregistered before it is
    unmapped. A driver that refuses leaves the maps pageable (the copies
    stay correct, slower), said once in the log."""

    _refused = False  # a registration was refused (logged once a process)

    def __init__(self, geometry, pin=False):
        self._pin, self._pinned = pin, []
        super().__init__(geometry, KvtierError)

    def wrap(self, m):
        t = torch.frombuffer(m, dtype=torch.uint8)
        if self._pin:
            self._register(t.data_ptr(), t.numel())
        return t

    def _register(self, addr, size):
        err = _cuda_call("cudaHostRegister", addr, size, 0)
        if err is None:
            self._pinned.append(addr)
            return
        if not _Slab._refused:
            _Slab._refused = True
            logger.warning("kvtier: cudaHostRegister of the slab (%d bytes at 0x%x) refused: %s; copies between "
                           "the slab and the GPU are staged (slower)", size, addr, err)

    def close(self):
        pinned, self._pinned = self._pinned, []
        for addr in pinned:
            err = _cuda_call("cudaHostUnregister", addr)
            if err is not None:
                logger.warning("kvtier: cudaHostUnregister of the slab at 0x%x: %s", addr, err)
        super().close()

    def view(self, span):
        return self.tensors[span.slab][span.offset:span.offset + span.length]


@dataclass
class _Ctx:
    """One session's coordinates, as a call saw them."""
    session: str
    boot: str
    slab: object
    limits: object


class _Door:
    """A session with serve's page-store door, shared by one connector's
    threads. Every method raises _Lost while serve is away or the session
    is gone (after arranging to register again), KvtierError when serve
    refuses the namespace."""

    def __init__(self, socket, client_id, namespace, timeout, register_retry, map_slab, pin=False):
        self.socket, self.client_id, self.namespace = socket, client_id, namespace
        self.timeout, self.register_retry, self.map_slab, self.pin = timeout, register_retry, map_slab, pin
        self.kinds = [(k.name, k.page_bytes) for k in namespace.kinds]
        self._lock = threading.Lock()
        self._session = None
        self._boot = ""
        self._slab = None
        self._limits = None
        self._next_register = 0.0
        self._redial_at = 0.0
        self.registrations = 0
        self.unavailable = 0
        self.closed = False
        self._channel = None
        self._dial()

    def _dial(self):
        """A new channel. grpc's channel can stay in TRANSIENT_FAILURE after
        serve restarts on the same socket path (grpcio 1.51 over unix
        sockets), so a connector that sees UNAVAILABLE dials again, at most
        once per register_retry_s; a call still on the old one fails (a miss)."""
        old = self._channel
        self._channel = grpc.insecure_channel("unix:" + self.socket, options=[
            ("grpc.max_receive_message_length", 64 << 20),
            ("grpc.max_send_message_length", 64 << 20),
            ("grpc.use_local_subchannel_pool", 1),
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000)])
        self.stub = pbg.StoreStub(self._channel)
        if old is not None:
            old.close()

    @property
    def away(self):
        """True while serve did not answer the last registration (calls are
        misses until the next try, register_retry_s later)."""
        return self._session is None and time.monotonic() < self._next_register

    @property
    def limits(self):
        return self._limits

    def _register(self):
        """Opens a session; under self._lock."""
        now = time.monotonic()
        if self.closed:
            raise _Lost("closed")
        if now < self._next_register:
            raise _Lost("serve was away less than register_retry_s ago")
        self._next_register = now + self.register_retry
        try:
            rep = self.stub.Register(pb.RegisterRequest(client_id=self.client_id, namespace=self.namespace,
                                                        protocol_versions=[PROTOCOL_VERSION]), timeout=self.timeout)
        except ValueError:
            raise _Lost("register: channel redialed") from None
        except grpc.RpcError as e:
            if e.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION):
                raise KvtierError("kvtier: serve refused the namespace: %s" % e.details()) from None
            if e.code() == grpc.StatusCode.UNAVAILABLE and now >= self._redial_at:
                self._redial_at = now + self.register_retry
                self._dial()
            self.unavailable += 1
            raise _Lost("register: %s" % e.code().name) from None
        kinds = [(k.name, k.page_bytes) for k in rep.kinds]
        if kinds != self.kinds:
            raise KvtierError("kvtier: serve's payload kinds %s, this vLLM's pages %s (docs/vllm.md: the stack's "
                              "model.payloads must match)" % (kinds, self.kinds))
        slab = _Slab(rep.slab, pin=self.pin) if self.map_slab else None
        if self._slab is not None:
            self._slab.retire()
        self._slab, self._session, self._boot, self._limits = slab, rep.session, rep.boot_id, rep.limits
        self._next_register = 0.0
        self.registrations += 1
        logger.info("kvtier: session %s with serve boot %s (%s)", rep.session, rep.boot_id, self.client_id)

    def register(self):
        """Registers now unless a session is open; _Lost while away."""
        with self._lock:
            if self._session is None:
                self._register()

    def ensure(self):
        """The current session (registering if needed); its slab acquired
        when the door maps one: the caller releases it."""
        with self._lock:
            if self._session is None:
                self._register()
            if self._slab is not None:
                self._slab.acquire()
            return _Ctx(self._session, self._boot, self._slab, self._limits)

    def lost(self, ctx, why):
        with self._lock:
            if self._session == ctx.session:
                self._session = None
                self._next_register = 0.0
        logger.info("kvtier: session %s lost (%s); registering again", ctx.session, why)

    def failed(self, code):
        """A call failed with code: UNAVAILABLE redials (at most once per
        register_retry_s)."""
        self.unavailable += 1
        if code == grpc.StatusCode.UNAVAILABLE:
            with self._lock:
                now = time.monotonic()
                if now >= self._redial_at:
                    self._redial_at = now + self.register_retry
                    self._dial()

    def check(self, ctx, rep):
        """False when a reply comes from another boot (the session is then
        dropped: the caller retries or gives up)."""
        if rep.boot_id and rep.boot_id != ctx.boot:
            self.lost(ctx, "boot_id %s, was %s" % (rep.boot_id, ctx.boot))
            return False
        return True

    def call(self, name, build, timeout=None, hold=False):
        """Calls name with the current session, registering again once on
        NotFound or a new boot_id. Returns (reply, ctx); with hold the
        slab stays acquired (the caller releases it)."""
        for attempt in range(2):
            ctx = self.ensure()
            ok = False
            try:
                try:
                    rep = getattr(self.stub, name)(build(ctx.session, ctx.boot), timeout=timeout or self.timeout)
                except ValueError:
                    raise _Lost("%s: channel redialed" % name) from None
                except grpc.RpcError as e:
                    if e.code() == grpc.StatusCode.NOT_FOUND:
                        self.lost(ctx, "NotFound: %s" % e.details())
                        if attempt == 0:
                            continue
                    else:
                        self.failed(e.code())
                    raise _Lost("%s: %s %s" % (name, e.code().name, e.details() or "")) from None
                if not self.check(ctx, rep):
                    if attempt == 0:
                        continue
                    raise _Lost("%s: serve restarted" % name)
                ok = True
                return rep, ctx
            finally:
                if ctx.slab is not None and not (ok and hold):
                    ctx.slab.release()
        raise _Lost(name)

    def close(self):
        with self._lock:
            self.closed = True
            session, boot, self._session = self._session, self._boot, None
            slab, self._slab = self._slab, None
        if session:
            try:
                self.stub.Close(pb.CloseRequest(session=session, boot_id=boot), timeout=min(self.timeout, 2))
            except (grpc.RpcError, ValueError):
                pass
        self._channel.close()
        if slab is not None:
            slab.retire()


# ---- what the scheduler side hands the workers ---------------------------


@dataclass
class KvtierMetadata(KVConnectorMetadata):
    """One step's plan, built by the scheduler side.

    loads: (req_id, block hashes, vLLM block ids, asynchronous) per request
    whose prefix is loaded; saves: (req_id, block hashes, block ids) per
    request whose blocks this step completes; preempted: the requests
    preempted this step (their saves must be copied before their blocks are
    reused)."""
    loads: list = field(default_factory=list)
    saves: list = field(default_factory=list)
    preempted: frozenset = frozenset()
    step: int = 0


class KvtierConnectorStats(KVConnectorStats):
    """Counters since the previous report (data: name -> number). Workers'
    and the scheduler's are summed by vLLM (aggregate) and reduced once per
    logging interval into the "KV Transfer metrics" line."""

    def reset(self):
        self.data = {}

    def aggregate(self, other):
        if other is not None and other.data:
            d = dict(self.data)
            for k, v in other.data.items():
                d[k] = d.get(k, 0) + v
            self.data = d
        return self

    def reduce(self):
        d = self.data
        out = {k: d[k] for k in sorted(d) if not k.endswith("_s") and not k.endswith("_bytes")}
        for op in ("load", "save"):
            b, s, cs = d.get(op + "_bytes", 0), d.get(op + "_s", 0), d.get(op + "_copy_s", 0)
            if b:
                # GBps: the whole path (calls to serve and copies), per
                # thread; copy_GBps: the copies alone.
                out[op + "_GB"] = round(b / 1e9, 3)
                out[op + "_GBps"] = round(b / max(s, 1e-9) / 1e9, 2)
                if cs:
                    out[op + "_copy_GBps"] = round(b / cs / 1e9, 2)
        return out

    def is_empty(self):
        return not any(self.data.values())


# Prometheus counters: (name, documentation, label, {label value: stats key}).
_PROM = [
    ("vllm:kvtier_lookups", "Prefix lookups the kvtier connector answered, by outcome.", "outcome",
     {"hit": "lookups_hit", "miss": "lookups_miss", "unavailable": "lookups_unavailable"}),
    ("vllm:kvtier_load_blocks", "Blocks loaded from kvtier into vLLM's KV cache, by outcome.", "outcome",
     {"loaded": "load_blocks", "failed": "load_failed_blocks"}),
    ("vllm:kvtier_save_blocks", "Blocks offered to kvtier, by outcome.", "outcome",
     {"stored": "save_stored_blocks", "exists": "save_exists_blocks", "failed": "save_failed_blocks"}),
    ("vllm:kvtier_bytes", "Bytes copied between vLLM's KV cache and kvtier's slab.", "direction",
     {"load": "load_bytes", "save": "save_bytes"}),
    ("vllm:kvtier_registrations", "Sessions opened with kvtier serve (1 per process, +1 per serve restart).", None,
     {"": "registrations"}),
]


class KvtierPromMetrics(KVConnectorPromMetrics):
    """The connector's counters as vLLM Prometheus counters (with vLLM's
    labels, per engine)."""

    def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._children = {}  # (engine, stats key) -> counter child
        for name, doc, label, keys in _PROM:
            names = list(labelnames) + ([label] if label else [])
            c = self._counter_cls(name=name, documentation=doc, labelnames=names)
            for idx, values in per_engine_labelvalues.items():
                for lv, key in keys.items():
                    self._children[(idx, key)] = c.labels(*(list(values) + ([lv] if label else [])))

    def observe(self, transfer_stats_data, engine_idx=0):
        for key, v in (transfer_stats_data or {}).items():
            child = self._children.get((engine_idx, key))
            if child is not None and v:
                child.inc(v)


# ---- the connector -------------------------------------------------------


class KvtierConnector(KVConnectorBase_V1):
    """vLLM KV connector over ``kvtier serve``'s page-store door.

    One class for both roles: the scheduler side answers lookups and plans
    each step's loads and saves; the worker side copies between vLLM's
    paged KV and serve's slab."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        tc = vllm_config.kv_transfer_config
        self.extra = dict(getattr(tc, "kv_connector_extra_config", None) or {})
        unknown = sorted(k for k in self.extra if k not in SETTINGS)
        if unknown:
            logger.info("kvtier: kv_connector_extra_config keys not used by kvtier: %s", ", ".join(unknown))
        e = self.extra
        self.socket = str(e.get("socket") or _default_socket())
        self.load_mode = str(e.get("load_mode", "async"))
        if self.load_mode not in ("async", "sync"):
            raise KvtierError("kvtier: load_mode %r: want async or sync" % self.load_mode)
        self.kv_layout = str(e.get("kv_layout", "NHD")).upper()
        if self.kv_layout not in ("NHD", "HND"):
            raise KvtierError("kvtier: kv_layout %r: want NHD or HND" % self.kv_layout)
        self.timeout = _setting(e, "timeout_s", 5.0, minimum=0.001)
        self.lookup_timeout = _setting(e, "lookup_timeout_ms", 1000, minimum=1) / 1000.0
        self.prefetch_wait = _setting(e, "prefetch_wait_ms", 2000, minimum=0) / 1000.0
        self.prefetch_poll = _setting(e, "prefetch_poll_ms", 5, minimum=0.1) / 1000.0
        self.get_deadline_ms = _setting(e, "get_deadline_ms", 0, kind=int, minimum=0)
        self.register_retry = _setting(e, "register_retry_s", 0.5, minimum=0.001)
        self.lookup_threads = _setting(e, "lookup_threads", 2, kind=int, minimum=1)
        self.thread_nice = _setting(e, "thread_nice", 10, kind=int, minimum=0)
        role_name = getattr(tc, "kv_role", None) or "kv_both"
        self.saving = role_name in ("kv_both", "kv_producer")
        self.loading = role_name in ("kv_both", "kv_consumer")

        mc, cc, pc = vllm_config.model_config, vllm_config.cache_config, vllm_config.parallel_config
        self.block_size = int(cc.block_size)
        self.tp_size = int(getattr(pc, "tensor_parallel_size", 1) or 1)
        self.pp_size = int(getattr(pc, "pipeline_parallel_size", 1) or 1)
        for cp in ("decode_context_parallel_size", "prefill_context_parallel_size"):
            if int(getattr(pc, cp, 1) or 1) > 1:
                raise KvtierError("kvtier: %s %s: context parallelism is not supported" % (cp, getattr(pc, cp)))
        spec, self.layer_names = self._spec(kv_cache_config)
        self.mla = type(spec).__name__.startswith("MLA") or bool(getattr(mc, "use_mla", False))
        self.kind_names = _MLA_KINDS if self.mla else _MHA_KINDS
        esize = torch.tensor([], dtype=spec.dtype).element_size()
        heads, hk = int(spec.num_kv_heads), int(spec.head_size)
        hv = int(getattr(spec, "head_size_v", None) or hk)
        nl = len(self.layer_names)
        self.chunk_bytes = ([self.block_size * heads * hk * esize] if self.mla
                            else [self.block_size * heads * hk * esize, self.block_size * heads * hv * esize])
        self.kind_bytes = [nl * c for c in self.chunk_bytes]
        self.num_layers = nl
        self.esize = esize
        cache_dtype = str(getattr(cc, "cache_dtype", "auto") or "auto")
        self.dtype = _dtype_name(spec.dtype) if cache_dtype == "auto" else cache_dtype
        self.model = str(e.get("model") or getattr(mc, "model", "") or "")
        if not self.model:
            raise KvtierError("kvtier: no model name: vLLM gave none and kv_connector_extra_config has no \"model\"")
        self.model_revision = str(e.get("model_revision") or getattr(mc, "revision", None) or "")
        self.salt = str(e.get("salt", ""))
        algo = str(getattr(cc, "prefix_caching_hash_algo", "sha256") or "sha256")
        # Keys carry the rank that holds a page's bytes, so one namespace (one
        # session) covers every rank and the scheduler asks for all of them
        # in one BatchExists: MHA TP ranks hold different heads; MLA ranks
        # the same latent (TP rank 0 saves, every rank loads); PP stages
        # different layers.
        self.owners = (1 if self.mla else self.tp_size) * self.pp_size
        layout = "vllm/%s/tp%d/pp%d/%s" % ("mla" if self.mla else self.kv_layout, self.tp_size, self.pp_size, algo)
        dp_size = max(1, int(getattr(pc, "data_parallel_size", 1) or 1))
        dp_rank = min(int(getattr(pc, "data_parallel_rank", 0) or 0), dp_size - 1)
        self.namespace = pb.Namespace(
            model=self.model, model_revision=self.model_revision, kv_layout=layout, dtype=self.dtype,
            page_tokens=self.block_size,
            kinds=[pb.PayloadKind(name=n, page_bytes=b) for n, b in zip(self.kind_names, self.kind_bytes)],
            tp_rank=0, tp_size=1, cp_rank=0, cp_size=1, pp_rank=0, pp_size=1, dp_rank=dp_rank, dp_size=dp_size,
            shared_across_tp=False, salt=self.salt)
        if os.environ.get("PYTHONHASHSEED") is None:
            logger.warning("kvtier: PYTHONHASHSEED is not set: vLLM's block hashes differ in every run, so pages "
                           "are found again only by this vLLM process (docs/vllm.md)")

        self._stats_lock = threading.Lock()
        self._stats = {}
        self._door = None
        if role == KVConnectorRole.SCHEDULER:
            self._scheduler = _SchedulerSide(self)
            self._worker = None
        else:
            self._scheduler = None
            self._worker = _WorkerSide(self)

    def _spec(self, kv_cache_config):
        if kv_cache_config is None:
            raise KvtierError("kvtier: no kv_cache_config (vLLM builds connectors with it)")
        groups = list(kv_cache_config.kv_cache_groups)
        if len(groups) != 1:
            raise KvtierError("kvtier: %d KV cache groups: hybrid models (sliding window, Mamba) are not "
                              "supported" % len(groups))
        spec = groups[0].kv_cache_spec
        for a in ("num_kv_heads", "head_size", "dtype", "block_size"):
            if not hasattr(spec, a):
                raise KvtierError("kvtier: KV cache spec %s has no %s: only attention layers are supported" % (
                    type(spec).__name__, a))
        if int(spec.block_size) != self.block_size:
            raise KvtierError("kvtier: KV block size %d, vLLM's block size %d" % (spec.block_size, self.block_size))
        return spec, sorted(groups[0].layer_names, key=_layer_order)

    def _count(self, **kv):
        with self._stats_lock:
            for k, v in kv.items():
                self._stats[k] = self._stats.get(k, 0) + v

    def _new_door(self, client_id, map_slab, pin=False):
        return _Door(self.socket, client_id, self.namespace, self.timeout, self.register_retry, map_slab, pin)

    def key_suffixes(self):
        return [""] if self.owners == 1 else [".%d" % o for o in range(self.owners)]

    # ---- properties and class methods vLLM reads ------------------------

    @property
    def requires_kv_delivery(self):
        """A cache: a dropped save is a later miss."""
        return False

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config):
        """vLLM's in-block order is part of a page's bytes: kvtier asks for
        one (NHD unless kv_layout says otherwise)."""
        tc = getattr(vllm_config, "kv_transfer_config", None)
        extra = getattr(tc, "kv_connector_extra_config", None) or {}
        return str(extra.get("kv_layout", "NHD")).upper()

    @classmethod
    def build_kv_connector_stats(cls, data=None):
        return KvtierConnectorStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        return KvtierPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def get_kv_connector_stats(self):
        """The counters since the previous call (each side its own)."""
        with self._stats_lock:
            d, self._stats = self._stats, {}
        if self._worker is not None:
            d["registrations"] = d.get("registrations", 0) + self._worker.take_registrations()
        elif self._scheduler is not None:
            d["registrations"] = d.get("registrations", 0) + self._scheduler.take_registrations()
        if not any(d.values()):
            return None
        return KvtierConnectorStats(data=d)

    # ---- scheduler side --------------------------------------------------

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        return self._scheduler.matched(request, num_computed_tokens)

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        self._scheduler.after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output):
        return self._scheduler.build(scheduler_output)

    def on_new_request(self, request):
        self._scheduler.on_new(request)

    def update_connector_output(self, connector_output):
        """Failed loads cap what is offered again for their requests."""
        bad = getattr(connector_output, "invalid_block_ids", None)
        if bad:
            self._scheduler.failed_loads(bad)
        done = getattr(connector_output, "finished_recving", None)
        if done:
            self._scheduler.loaded(done)

    def request_finished(self, request, block_ids):
        return self._scheduler.finished(request)

    def reset_cache(self):
        """Forgets every page of this namespace in serve (Clear): for every
        vLLM sharing it. True when serve did."""
        if self._scheduler is None:
            return None
        return self._scheduler.clear()

    # ---- worker side ------------------------------------------------------

    def register_kv_caches(self, kv_caches):
        self._worker.register(kv_caches)

    def handle_preemptions(self, kv_connector_metadata):
        if self._worker is not None and kv_connector_metadata is not None:
            self._worker.preempt(kv_connector_metadata.preempted)

    def start_load_kv(self, forward_context, **kwargs):
        if self.has_connector_metadata():
            self._worker.start(self._get_connector_metadata())

    def wait_for_layer_load(self, layer_name):
        self._worker.wait_layer(layer_name)

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        """Nothing per layer: a step's saves are copied after its forward,
        off the forward's thread (wait_for_save)."""
        return

    def wait_for_save(self):
        self._worker.end_forward()

    def get_finished(self, finished_req_ids):
        return self._worker.finished(finished_req_ids)

    def get_block_ids_with_load_errors(self):
        return self._worker.take_errors()

    def shutdown(self):
        if self._worker is not None:
            self._worker.shutdown()
        if self._scheduler is not None:
            self._scheduler.shutdown()


# ---- scheduler side --------------------------------------------------------


class _Lookup:
    """One request's prefix lookup, run by the lookup thread."""

    __slots__ = ("rid", "hexes", "n", "present", "l2", "counted", "started", "next_at", "done", "loadable",
                 "local", "cancelled", "l3_seen")

    def __init__(self, rid, hashes, now):
        self.rid = rid
        self.hexes = hashes  # block hashes; turned into hex by the lookup thread
        self.n = len(hashes)
        self.present = 0     # leading blocks present (every owner's page)
        self.l2 = 0          # leading blocks present in L2
        self.counted = False
        self.started = now
        self.next_at = now
        self.done = False
        self.loadable = 0
        self.local = 0
        self.cancelled = False
        self.l3_seen = False


class _ReqState:
    __slots__ = ("request", "block_ids", "saved")

    def __init__(self, request):
        self.request = request
        self.block_ids = []
        self.saved = 0


class _SchedulerSide:
    def __init__(self, conn):
        self.c = conn
        self.bs = conn.block_size
        self.suffixes = conn.key_suffixes()
        self.door = conn._new_door("vllm-scheduler-%d" % os.getpid(), map_slab=False)
        try:
            self.door.register()
        except _Lost:
            logger.warning("kvtier: serve at %s is not answering; lookups are misses until it does", conn.socket)
        except KvtierError:
            self.door.close()
            raise
        self._reg_seen = 0
        self._lookups = {}
        self._reqs = {}
        self._state = {}
        self._saving = set()
        self._loads = []
        self._planned = {}  # rid -> (first block index, block ids) of its last load, until it ends
        self._cap = {}      # rid -> blocks it may be offered at most (after a failed load)
        self._step = 0
        self._mu = threading.Condition()
        self._queue = deque()
        self._stop = False
        self._threads = [threading.Thread(target=self._loop, name="kvtier-lookup-%d" % i, daemon=True)
                         for i in range(self.c.lookup_threads)]
        for th in self._threads:
            th.start()

    def take_registrations(self):
        n = self.door.registrations - self._reg_seen
        self._reg_seen = self.door.registrations
        return n

    # ---- vLLM's calls ----------------------------------------------------

    def on_new(self, request):
        self._reqs[request.request_id] = request
        if self.c.loading and request.block_hashes and request.request_id not in self._lookups:
            self._start(request)

    def _start(self, request):
        now = time.monotonic()
        lk = _Lookup(request.request_id, list(request.block_hashes), now)
        self._lookups[request.request_id] = lk
        if self.door.away:
            # serve is away: a miss now, not a wait.
            lk.done = True
            self.c._count(lookups_unavailable=1)
            return lk
        with self._mu:
            self._queue.append(lk)
            self._mu.notify()
        return lk

    def matched(self, request, num_computed_tokens):
        if not self.c.loading:
            return 0, False
        rid = request.request_id
        self._reqs[rid] = request
        lk = self._lookups.get(rid)
        if lk is None:
            if not request.block_hashes:
                return 0, False
            lk = self._start(request)
        if not lk.done:
            if self.door.away or time.monotonic() - lk.started > self.c.lookup_timeout + self.c.prefetch_wait + 1:
                return 0, False
            return None, False
        tokens = min(lk.loadable, self._cap.get(rid, lk.loadable)) * self.bs
        if tokens >= request.num_tokens:
            tokens = request.num_tokens - 1  # vLLM computes at least the last token
        ext = tokens - num_computed_tokens
        if ext <= 0:
            return 0, False
        lk.local = num_computed_tokens
        return ext, self.c.load_mode == "async"

    def after_alloc(self, request, blocks, num_external_tokens):
        if num_external_tokens <= 0:
            return
        rid = request.request_id
        lk = self._lookups.get(rid)
        if lk is None:
            logger.error("kvtier: update_state_after_alloc for %s with %d tokens, not matched", rid, num_external_tokens)
            return
        first = lk.local // self.bs
        last = -(-(lk.local + num_external_tokens) // self.bs)
        ids = blocks.get_block_ids()[0]
        if last > len(ids) or last > len(request.block_hashes):
            logger.error("kvtier: %s: blocks [%d, %d) to load, %d allocated, %d hashes", rid, first, last, len(ids),
                         len(request.block_hashes))
            return
        plan = ids[first:last]
        self._loads.append((rid, request.block_hashes[first:last], plan, self.c.load_mode == "async"))
        self._planned[rid] = (first, plan)
        self.c._count(load_planned_blocks=last - first)

    def failed_loads(self, invalid):
        """Blocks of planned loads failed (a page missed, failed serve's
        check or was refused): vLLM recomputes them, and the request is
        never again offered that block or any after it (a lookup from
        before the failure would offer it again, and a request whose async
        load failed from its first block is asked again)."""
        for rid, (first, ids) in list(self._planned.items()):
            for i, b in enumerate(ids):
                if b in invalid:
                    self._cap[rid] = min(self._cap.get(rid, first + i), first + i)
                    self._lookups.pop(rid, None)
                    self._planned.pop(rid, None)
                    break

    def loaded(self, rids):
        for rid in rids:
            self._planned.pop(rid, None)

    def build(self, so):
        self._step += 1
        preempted = frozenset(so.preempted_req_ids or ())
        meta = KvtierMetadata(loads=self._loads, preempted=preempted, step=self._step)
        self._loads = []
        for rid in preempted:
            # Its saves are copied before its blocks are reused (the workers'
            # handle_preemptions); it is looked up afresh when it comes back.
            self._saving.discard(rid)
            self._lookups.pop(rid, None)
            self._planned.pop(rid, None)
            st = self._state.get(rid)
            if st is not None:
                st.block_ids, st.saved = [], 0
        if not self.c.saving:
            return meta
        nst = so.num_scheduled_tokens
        for nr in so.scheduled_new_reqs:
            st = self._state_of(nr.req_id)
            if st is None:
                continue
            st.block_ids = list(nr.block_ids[0]) if nr.block_ids else []
            st.saved = nr.num_computed_tokens // self.bs
            self._plan(nr.req_id, st, nr.num_computed_tokens + nst.get(nr.req_id, 0), meta)
        cr = so.scheduled_cached_reqs
        resumed = cr.resumed_req_ids
        for i, rid in enumerate(cr.req_ids):
            st = self._state_of(rid)
            if st is None:
                continue
            nb = cr.new_block_ids[i]
            if rid in resumed:
                st.block_ids = list(nb[0]) if nb else []
                st.saved = cr.num_computed_tokens[i] // self.bs
            elif nb:
                st.block_ids.extend(nb[0])
            self._plan(rid, st, cr.num_computed_tokens[i] + nst.get(rid, 0), meta)
        return meta

    def _state_of(self, rid):
        st = self._state.get(rid)
        if st is None:
            req = self._reqs.get(rid)
            if req is None:
                return None
            st = self._state[rid] = _ReqState(req)
        return st

    def _plan(self, rid, st, computed_after, meta):
        """The blocks this step completes: whole, hashed, publishable."""
        req = st.request
        hashes = req.block_hashes
        limit = min(computed_after // self.bs, len(hashes), len(st.block_ids))
        pub = getattr(req, "num_publishable_block_hashes", None)
        if pub is not None:
            limit = min(limit, pub)
        if limit > st.saved:
            meta.saves.append((rid, hashes[st.saved:limit], st.block_ids[st.saved:limit]))
            self.c._count(save_planned_blocks=limit - st.saved)
            st.saved = limit
            self._saving.add(rid)

    def finished(self, request):
        rid = request.request_id
        self._reqs.pop(rid, None)
        self._state.pop(rid, None)
        self._planned.pop(rid, None)
        self._cap.pop(rid, None)
        lk = self._lookups.pop(rid, None)
        if lk is not None:
            lk.cancelled = True
        delay = rid in self._saving
        self._saving.discard(rid)
        return delay, None

    def clear(self):
        try:
            self.door.call("Clear", lambda s, b: pb.ClearRequest(session=s, boot_id=b))
        except (_Lost, KvtierError) as e:
            logger.warning("kvtier: reset_cache: %s", e)
            return False
        self._lookups.clear()
        return True

    def shutdown(self):
        with self._mu:
            self._stop = True
            self._mu.notify_all()
        for th in self._threads:
            th.join(5)
        self.door.close()

    # ---- the lookup threads ----------------------------------------------

    def _loop(self):
        """Takes due lookups one at a time; one BatchExists each (blocking
        calls: grpcio's futures deadlocked here, starting their channel's
        spin thread, under Python 3.11)."""
        _lower_thread(self.c.thread_nice)
        while True:
            with self._mu:
                while True:
                    if self._stop:
                        return
                    now = time.monotonic()
                    lk = next((x for x in self._queue if x.next_at <= now), None)
                    if lk is not None:
                        self._queue.remove(lk)
                        break
                    if self._queue:
                        self._mu.wait(max(0.0, min(x.next_at for x in self._queue) - now))
                    else:
                        self._mu.wait()
            try:
                self._ask(lk)
            except Exception:  # a bug must not end lookups: they become misses
                logger.exception("kvtier: lookup of %s failed", lk.rid)
                self._finish(lk, 0)
            if not lk.done and not lk.cancelled:
                with self._mu:
                    self._queue.append(lk)
                    self._mu.notify()

    def _finish(self, lk, loadable):
        lk.loadable = loadable
        lk.done = True
        if loadable:
            self.c._count(lookups_hit=1, lookup_hit_blocks=loadable)
        else:
            self.c._count(lookups_miss=1)

    def _ask(self, lk):
        """One BatchExists of the lookup's next keys."""
        if lk.cancelled:
            lk.done = True
            return
        if not isinstance(lk.hexes[0], str):
            lk.hexes = [_hex(h) for h in lk.hexes]
        limits = self.door.limits
        per_call = max(1, (limits.max_batch_pages if limits is not None and limits.max_batch_pages else 1024)
                       // len(self.suffixes))
        wait = 0.0
        if not lk.counted:
            lo, hi, prefetch = lk.present, min(lk.n, lk.present + per_call), True
        else:
            # Asked again while serve reloads the pages: serve answers when
            # they land (wait_ms; a serve without it answers at once and
            # the lookup is polled every prefetch_poll_ms).
            lo, hi, prefetch = lk.l2, min(lk.present, lk.l2 + per_call), False
            wait = max(0.0, min(self.c.prefetch_wait - (time.monotonic() - lk.started), self.c.lookup_timeout))
        keys = [h + s for h in lk.hexes[lo:hi] for s in self.suffixes]
        try:
            rep, _ = self.door.call("BatchExists", lambda s, b: pb.ExistsRequest(
                session=s, boot_id=b, keys=keys, prefetch=prefetch, wait_ms=int(wait * 1000)),
                timeout=self.c.lookup_timeout + wait)
        except _Lost as e:
            logger.debug("kvtier: lookup of %s: %s", lk.rid, e)
            self.c._count(lookups_unavailable=1)
            lk.loadable, lk.done = 0, True
            return
        except KvtierError as e:
            logger.error("%s", e)
            self._finish(lk, 0)
            return
        self._update(lk, lo, hi, rep)

    def _update(self, lk, lo, hi, rep):
        owners = len(self.suffixes)
        full = min(int(rep.present), (hi - lo) * owners) // owners
        tiers = rep.tiers
        # Leading blocks of [lo, lo + full) whose every owner's page is in L2.
        run = 0
        for b in range(full):
            if all(tiers[b * owners + o] == pb.TIER_L2 for o in range(owners)):
                run += 1
            else:
                break
        now = time.monotonic()
        if not lk.counted:
            if lk.l2 == lk.present:
                lk.l2 += run
            lk.present += full
            if full < hi - lo or lk.present >= lk.n:
                lk.counted = True
            if lk.present > lk.l2:
                lk.l3_seen = True
        else:
            # Re-asking [l2, present): pages may have come into L2, or gone.
            if full < hi - lo:
                lk.present = lo + full
            lk.l2 = lo + run
        if not lk.counted:
            return
        if lk.present > lk.l2 and now - lk.started < self.c.prefetch_wait:
            lk.next_at = now + self.c.prefetch_poll
            return
        if lk.l3_seen:
            self.c._count(lookups_waited_l3=1)
        self._finish(lk, lk.l2)


# ---- worker side -----------------------------------------------------------


class _Blocks:
    """vLLM's paged KV of one worker, as addresses: for every layer and
    kind, the address of block 0 and the stride between blocks; a block's
    bytes of one layer and kind are one dense chunk."""

    def __init__(self, conn, kv_caches, num_blocks):
        self.c = conn
        bs = conn.block_size
        seen, layers, index = {}, [], {}
        for name in sorted(kv_caches, key=_layer_order):
            t = kv_caches[name]
            key = (t.data_ptr(), tuple(t.shape), tuple(t.stride()))
            if key in seen:  # layers that share one cache (KV sharing)
                index[name] = seen[key]
                continue
            views = self._kinds(name, t, num_blocks, bs)
            seen[key] = index[name] = len(layers)
            layers.append(views)
        if len(layers) != conn.num_layers:
            raise KvtierError("kvtier: %d KV cache tensors, the KV cache config names %d layers" % (
                len(layers), conn.num_layers))
        self.index = index
        # [layer][kind] -> (uint8 view [num_blocks, chunk bytes], address of
        # block 0, bytes between blocks, int64 view or None)
        self.layers = layers
        self.wide = [all(lay[k][3] is not None for lay in layers) and c % 8 == 0
                     for k, c in enumerate(conn.chunk_bytes)]
        self.num_blocks = num_blocks
        self.device = layers[0][0][0].device
        self.cuda = self.device.type == "cuda"
        # CUDA: the background threads' copies (asynchronous loads, saves)
        # run on streams of their own, so that they can overlap the
        # forward's kernels instead of serializing with them on the
        # default stream (a thread's current stream unless it sets one),
        # and a copy's wait ends with its own work.
        self.streams, self._stage = {}, {}
        if self.cuda:
            self.streams = {role: torch.cuda.Stream(device=self.device) for role in ("load", "save")}
        # Per kind, per layer: the address of block 0 and the bytes between
        # blocks (the summing copy's pieces are computed from them).
        self.base = [np.array([lay[k][1] for lay in layers], dtype=np.uint64) for k in range(len(conn.chunk_bytes))]
        self.stride = [np.array([lay[k][2] for lay in layers], dtype=np.uint64) for k in range(len(conn.chunk_bytes))]
        self._shifts = {}

    def _kinds(self, name, t, nb, bs):
        c = self.c
        want = tuple(c.chunk_bytes)
        if c.mla:
            if t.dim() != 3 or t.shape[0] != nb or t.shape[1] != bs:
                raise KvtierError("kvtier: layer %s: KV cache of shape %s, want (%d blocks, %d tokens, dim) (MLA)" % (
                    name, tuple(t.shape), nb, bs))
            kinds = [t]
        else:
            if t.dim() != 5:
                raise KvtierError("kvtier: layer %s: KV cache of shape %s, want 5 dimensions" % (name, tuple(t.shape)))
            if t.shape[0] == 2 and t.shape[1] == nb:
                kinds = [t[0], t[1]]
            elif t.shape[1] == 2 and t.shape[0] == nb:
                kinds = [t[:, 0], t[:, 1]]
            else:
                raise KvtierError("kvtier: layer %s: KV cache of shape %s: no (2, %d blocks) dimensions" % (
                    name, tuple(t.shape), nb))
        out = []
        for k, v in enumerate(kinds):
            # v: [blocks, tokens, heads, dim] (MLA: [blocks, tokens, dim]).
            inner = list(zip(v.shape[1:], v.stride()[1:]))
            if not c.mla and c.kv_layout == "HND":
                inner = [inner[1], inner[0], inner[2]]
            expect = 1
            for size, stride in reversed(inner):
                if size > 1 and stride != expect:
                    raise KvtierError("kvtier: layer %s: a block's KV is not dense in %s order (shape %s, strides %s)" % (
                        name, "MLA" if c.mla else c.kv_layout, tuple(t.shape), tuple(t.stride())))
                expect *= size
            chunk = expect * t.element_size()
            if chunk != want[k]:
                raise KvtierError("kvtier: layer %s: %d bytes a block for kind %s, the KV cache spec gives %d" % (
                    name, chunk, c.kind_names[k], want[k]))
            # A view [blocks, chunk bytes] over the same memory.
            flat = torch.as_strided(v, (nb, expect), (v.stride(0), 1))
            u8 = flat.view(torch.uint8) if t.element_size() == 1 else self._bytes(flat, t.element_size())
            wide = None
            if chunk % 8 == 0 and u8.stride(0) % 8 == 0 and u8.data_ptr() % 8 == 0:
                wide = u8.view(torch.int64)
            out.append((u8, v.data_ptr(), v.stride(0) * t.element_size(), wide))
        return out

    @staticmethod
    def _bytes(flat, esize):
        ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[esize]
        return flat.view(ints).view(torch.uint8)

    def copy(self, to_blocks, pages, layers, role=None):
        """Copies pages between vLLM's blocks and the slab for the given
        layers. pages is [(block id, [slab address per kind], [(slab file
        tensor, offset, file index) per kind])]. On CUDA the copies go on
        the stream of role ("load", "save"; None: the current stream, the
        forward's) and are done when this returns.

        Pages in runs (consecutive block ids in consecutive slab pages, what
        a fresh request's blocks and a fresh slab give) go as one torch
        copy of strided views a run, layer and kind: the copy runs in C,
        without the GIL. The others (a fragmented cache) go one memmove a
        block, layer and kind, page after page (a page's chunks lie one
        after another in the slab) in block order; each memmove releases
        the GIL (yielding it after every page as well halved their speed
        here and did not shorten the forward's steps)."""
        layers = list(layers)
        chunks, kinds = self.c.chunk_bytes, self.c.kind_bytes
        nk = len(kinds)
        pages = sorted(pages, key=lambda p: p[0])
        n = len(pages)
        runs, single = [], []
        i = 0
        while i < n:
            j = i + 1
            while j < n and pages[j][0] == pages[j - 1][0] + 1 and all(
                    pages[j][2][k][2] == pages[j - 1][2][k][2]
                    and pages[j][2][k][1] == pages[j - 1][2][k][1] + kinds[k] for k in range(nk)):
                j += 1
            if j - i >= _MIN_RUN or self.cuda:
                runs.append((i, j - i))
            else:
                single.extend(pages[i:j])
            i = j
        if len(layers) == len(self.layers) or (layers and layers[0] == 0):
            self.c._count(copy_run_blocks=n - len(single), copy_single_blocks=len(single))
        if self.cuda:
            stream = self.streams[role] if role is not None else torch.cuda.current_stream(self.device)
            with torch.cuda.stream(stream):
                staging = self._staging(role)
                if staging is None:
                    self._copy_runs(to_blocks, pages, runs, layers, True)
                else:
                    self._copy_staged(to_blocks, pages, runs, layers, staging)
            stream.synchronize()
            return
        self._copy_runs(to_blocks, pages, runs, layers, False)
        if not single:
            return
        mm = _memmove
        geo = [[(self.layers[li][k][1], self.layers[li][k][2], li * size) for li in layers]
               for k, size in enumerate(chunks)]
        for b, addrs, *_ in single:
            for k, size in enumerate(chunks):
                a = addrs[k]
                if to_blocks:
                    for base, stride, off in geo[k]:
                        mm(base + b * stride, a + off, size)
                else:
                    for base, stride, off in geo[k]:
                        mm(a + off, base + b * stride, size)

    def _staging(self, role):
        """The device buffer role's copies stage through (allocated at
        first use: STAGING_PAGES of the largest page kind), or None where
        the device has no room (the copies then go as strided views)."""
        st = self._stage.get(role, False)
        if st is False:
            st = None
            try:
                st = torch.empty(STAGING_PAGES * max(self.c.kind_bytes), dtype=torch.uint8, device=self.device)
            except RuntimeError as e:  # out of device memory: vLLM took it
                logger.warning("kvtier: no staging buffer on %s (%s): copies go as strided views", self.device, e)
            self._stage[role] = st
        return st

    def _copy_staged(self, to_blocks, pages, runs, layers, staging):
        """copy's runs through a buffer on the blocks' device. A run's
        pages of a kind are one contiguous range of the slab (a page kind's
        span is its layers' chunks in layer order), so it moves between the
        slab and the buffer in ONE copy (a DMA from page-locked memory on
        CUDA); the runs are packed into the buffer a piece at a time (a run
        longer than the buffer is split), and each layer of a piece moves
        between the buffer and vLLM's blocks in one device copy: a slice of
        the blocks when the piece is one run (consecutive blocks), else an
        index_copy_ (a load) or index_select (a save) of the piece's blocks.
        torch would otherwise make every strided slab view contiguous in
        pageable host memory first, and a fragmented cache would take a
        copy a block and layer. The buffer is reused piece after piece:
        the copies are ordered on one stream."""
        chunks, kinds = self.c.chunk_bytes, self.c.kind_bytes
        for k, size in enumerate(chunks):
            per = max(1, staging.numel() // kinds[k])
            piece, filled = [], 0
            for i, r in runs:
                lo = 0
                while lo < r:
                    n = min(per - filled, r - lo)
                    piece.append((i + lo, n))
                    filled, lo = filled + n, lo + n
                    if filled == per:
                        self._piece(to_blocks, pages, piece, filled, k, size, layers, staging)
                        piece, filled = [], 0
            if piece:
                self._piece(to_blocks, pages, piece, filled, k, size, layers, staging)

    def _layer(self, rows, li, k, size, wide):
        """Layer li of kind k: its columns of rows (pages' bytes of the
        kind, as int64 where wide) and vLLM's blocks of it, in the same
        element type."""
        blk = self.layers[li][k][3] if wide else self.layers[li][k][0]
        unit = 8 if wide else 1
        return rows[:, li * size // unit:(li + 1) * size // unit], blk

    def _piece(self, to_blocks, pages, piece, filled, k, size, layers, staging):
        """One piece of _copy_staged: the slices (first page, pages) of
        runs, filled pages in all, of kind k."""
        kb = self.c.kind_bytes[k]
        w = self.wide[k]
        rows = staging[:filled * kb].view(filled, kb)
        if w:
            rows = rows.view(torch.int64)
        b0, idx = pages[piece[0][0]][0], None
        if len(piece) > 1:
            ids = [pages[i + j][0] for i, n in piece for j in range(n)]
            idx = torch.tensor(ids, dtype=torch.int64).to(self.device, non_blocking=True)

        def slab_moves(into_slab):
            at = 0
            for i, n in piece:
                t, off, _ = pages[i][2][k]
                host, dev = t[off:off + n * kb], staging[at * kb:(at + n) * kb]
                if into_slab:
                    host.copy_(dev, non_blocking=True)
                else:
                    dev.copy_(host, non_blocking=True)
                at += n

        if to_blocks:
            slab_moves(False)
        for li in layers:
            sl, blk = self._layer(rows, li, k, size, w)
            if to_blocks:
                if idx is None:
                    blk[b0:b0 + filled].copy_(sl)
                else:
                    blk.index_copy_(0, idx, sl)
            elif idx is None:
                sl.copy_(blk[b0:b0 + filled])
            else:
                sl.copy_(blk.index_select(0, idx))
        if not to_blocks:
            slab_moves(True)

    def _copy_runs(self, to_blocks, pages, runs, layers, non_blocking):
        """One torch copy a run, layer and kind (see copy)."""
        chunks, kinds = self.c.chunk_bytes, self.c.kind_bytes
        for i, r in runs:
            b0 = pages[i][0]
            for k, size in enumerate(chunks):
                t, off0, _ = pages[i][2][k]
                rows = t[off0:off0 + r * kinds[k]].view(r, kinds[k])
                w = self.wide[k] and off0 % 8 == 0
                if w:  # 8-byte elements: torch's strided copy at memcpy's speed here, 0.88x as bytes
                    rows = rows.view(torch.int64)
                for li in layers:
                    sl, blk = self._layer(rows, li, k, size, w)
                    blk = blk[b0:b0 + r]
                    if to_blocks:
                        blk.copy_(sl, non_blocking=non_blocking)
                    else:
                        sl.copy_(blk, non_blocking=non_blocking)

    def summing(self):
        """Whether copies go through kvtier.native and take each page
        kind's CRC32C (host memory only: a CUDA cache is copied by torch
        and serve takes and checks the sums)."""
        return not self.cuda and _native_sums()

    def copy_summed(self, to_blocks, pages, layers):
        """copy() in one native call (the GIL released) that also takes
        the CRC32C of each page kind's slab bytes for the given layers (in
        increasing order): a piece per page, kind and layer, a kind's in
        its slab order (layer li's chunk lies at li x chunk bytes in the
        kind's span). Returns a numpy uint32 array of len(pages) x kinds
        sums, page-major in the order of pages (the CRC32C of the layers'
        part of each span; all layers: the span's)."""
        chunks = self.c.chunk_bytes
        nk, npg = len(chunks), len(pages)
        li = np.asarray(list(layers), dtype=np.intp)
        nl = len(li)
        if npg == 0 or nl == 0:
            return np.zeros(npg * nk, dtype=np.uint32)
        # The pieces go in the order of vLLM's block ids (a page's layers
        # and kinds together, each kind's in its slab order): each layer's
        # KV tensor is then walked upwards, not at random (bench_vllm's
        # copies row, shuffled blocks; docs/perf.md). The sums stay
        # page-major in the order of pages (groups).
        ids = np.fromiter((p[0] for p in pages), dtype=np.uint64, count=npg)
        order = np.argsort(ids, kind="stable")
        blk = ids[order][:, None]
        slab = np.array([p[1] for p in pages], dtype=np.uint64).reshape(npg, nk)[order]
        dst = np.empty((npg, nk, nl), dtype=np.uint64)
        src = np.empty((npg, nk, nl), dtype=np.uint64)
        lens = np.empty((npg, nk, nl), dtype=np.uint64)
        for k, size in enumerate(chunks):
            b = self.base[k][li][None, :] + blk * self.stride[k][li][None, :]
            s = slab[:, k][:, None] + li.astype(np.uint64)[None, :] * np.uint64(size)
            dst[:, k], src[:, k] = (b, s) if to_blocks else (s, b)
            lens[:, k] = size
        groups = order.astype(np.uint32)[:, None] * np.uint32(nk) + np.arange(nk, dtype=np.uint32)[None, :]
        groups = np.broadcast_to(groups.reshape(npg, nk, 1), (npg, nk, nl))
        sums = _native.copy_pages(dst.ravel(), src.ravel(), lens.ravel(), groups.ravel(), npg * nk)
        if nl == len(self.layers) or li[0] == 0:  # a sync load's blocks counted at its first layer
            self.c._count(copy_summed_blocks=npg)
        return np.array(sums, dtype=np.uint32)

    def chain(self, acc, layer_sums):
        """The running sums (page-major, kinds) of a kind's first layers,
        continued by the next layer's (copy_summed of that layer alone)."""
        nk = len(self.c.chunk_bytes)
        out = np.empty_like(acc)
        for k, size in enumerate(self.c.chunk_bytes):
            sh = self._shifts.get(size)
            if sh is None:
                sh = self._shifts[size] = _Shift(size)
            out[k::nk] = sh.combine(acc[k::nk], layer_sums[k::nk])
        return out


class _SaveJob:
    __slots__ = ("seq", "saves", "event", "rids")

    def __init__(self, seq, saves, event):
        self.seq, self.saves, self.event = seq, saves, event
        self.rids = {s[0] for s in saves}


class _SyncLoad:
    """One step's synchronous loads: pages pinned, copied layer by layer
    on a thread; Release after the last layer."""

    def __init__(self, nlayers):
        self.events = [threading.Event() for _ in range(nlayers)]
        self.failed = set()
        self.thread = None


class _WorkerSide:
    def __init__(self, conn):
        self.c = conn
        tp_rank, pp_rank = 0, 0
        try:
            from vllm.distributed.parallel_state import get_pp_group, get_tensor_model_parallel_rank

            tp_rank = int(get_tensor_model_parallel_rank())
            pp_rank = int(get_pp_group().rank_in_group)
        except Exception as e:  # noqa: BLE001 (no groups: a single process)
            rank = int(getattr(conn._vllm_config.parallel_config, "rank", 0) or 0)
            tp_rank, pp_rank = rank % conn.tp_size, rank // conn.tp_size
            logger.info("kvtier: TP/PP rank from parallel_config.rank %d (%s)", rank, e)
        if not (0 <= tp_rank < conn.tp_size and 0 <= pp_rank < conn.pp_size):
            raise KvtierError("kvtier: TP rank %d of %d, PP rank %d of %d" % (tp_rank, conn.tp_size, pp_rank,
                                                                            conn.pp_size))
        self.tp_rank, self.pp_rank = tp_rank, pp_rank
        owner = (0 if conn.mla else tp_rank) + pp_rank * (1 if conn.mla else conn.tp_size)
        self.suffix = conn.key_suffixes()[owner]
        # MLA: every TP rank holds the same bytes; TP rank 0 writes them.
        self.writes = conn.saving and (not conn.mla or tp_rank == 0)
        self.door = None
        self.blocks = None
        self._reg_seen = 0
        self._mu = threading.Condition()
        self._saving = set()       # requests with saves (the scheduler's rule: held at finish)
        self._jobs_of = {}         # rid -> seqs of its save jobs not yet done
        self._finished = set()     # finished (vLLM said so) and saving, not yet reported
        self._seq = 0
        self._copied = 0           # highest save job seq whose copies are done
        self._save_q = deque()
        self._load_q = deque()
        self._recv_done = set()
        self._recv_errors = {}     # rid -> failed block ids of its async load
        self._errors = set()       # block ids to report
        self._pending_meta = None  # this step's metadata until its saves are queued
        self._sync = None
        self._stop = False
        self._threads = []

    def take_registrations(self):
        if self.door is None:
            return 0
        n = self.door.registrations - self._reg_seen
        self._reg_seen = self.door.registrations
        return n

    # ---- registration ----------------------------------------------------

    def register(self, kv_caches):
        kcc = self.c._kv_cache_config
        nb = int(getattr(kcc, "num_blocks", 0) or 0)
        if nb <= 0:
            first = next(iter(kv_caches.values()))
            nb = int(first.shape[0] if self.c.mla or first.shape[0] != 2 else first.shape[1])
        blocks = _Blocks(self.c, kv_caches, nb)
        self.door = self.c._new_door("vllm-worker-tp%d-pp%d-%d" % (self.tp_rank, self.pp_rank, os.getpid()),
                                     map_slab=True, pin=blocks.cuda)
        try:
            self.door.register()
        except _Lost:
            logger.warning("kvtier: serve at %s is not answering; loads fail and saves are skipped until it does",
                           self.c.socket)
        except KvtierError:
            self.door.close()
            self.door = None
            raise
        self.blocks = blocks
        for name, fn in (("kvtier-save", self._save_loop), ("kvtier-load", self._load_loop)):
            th = threading.Thread(target=fn, name=name, daemon=True)
            th.start()
            self._threads.append(th)

    # ---- a step ----------------------------------------------------------

    def start(self, meta):
        if self.blocks is None:
            return
        self._queue_saves()  # a previous step whose wait_for_save did not come
        self.preempt(meta.preempted)
        with self._mu:
            for rid, _, _ in meta.saves:
                self._saving.add(rid)
                self._jobs_of.setdefault(rid, set()).add(self._seq + 1)
            if meta.saves:
                self._seq += 1
            self._pending_meta = (meta, self._seq) if meta.saves else None
        sync = [ld for ld in meta.loads if not ld[3]]
        for ld in meta.loads:
            if ld[3]:
                with self._mu:
                    self._load_q.append(ld)
                    self._mu.notify_all()
        if sync:
            self._start_sync(sync)

    def wait_layer(self, layer_name):
        s = self._sync
        if s is None:
            return
        i = self.blocks.index.get(layer_name)
        if i is None:
            s.events[-1].wait()
        else:
            s.events[i].wait()

    def end_forward(self):
        self._end_sync()
        self._queue_saves()

    def _queue_saves(self):
        with self._mu:
            pm, self._pending_meta = self._pending_meta, None
        if pm is None:
            return
        meta, seq = pm
        event = None
        if self.blocks.cuda:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(self.blocks.device))
        job = _SaveJob(seq, meta.saves, event)
        with self._mu:
            self._save_q.append(job)
            self._mu.notify_all()

    def preempt(self, rids):
        """The preempted requests' blocks may be reused from this step on:
        their saves' copies end first."""
        with self._mu:
            rids = [r for r in rids if r in self._saving]
            if not rids:
                return
        self._queue_saves()
        deadline = time.monotonic() + self.c.timeout * 4
        with self._mu:
            last = max(max(self._jobs_of.get(r, ()), default=0) for r in rids)
            while self._copied < last and time.monotonic() < deadline:
                self._mu.wait(0.05)
            if self._copied < last:
                logger.error("kvtier: saves of preempted %s still copying after %.1f s", rids, self.c.timeout * 4)
            for r in rids:
                self._saving.discard(r)
                self._finished.discard(r)
                self._jobs_of.pop(r, None)

    def finished(self, finished_req_ids):
        self._end_sync()
        with self._mu:
            self._finished |= set(finished_req_ids or ()) & self._saving
            sending = {r for r in self._finished if not self._jobs_of.get(r)}
            self._finished -= sending
            self._saving -= sending
            for r in sending:
                self._jobs_of.pop(r, None)
            recving, self._recv_done = self._recv_done, set()
            for r in recving:
                self._errors |= self._recv_errors.pop(r, set())
        return (sending or None), (recving or None)

    def take_errors(self):
        with self._mu:
            e, self._errors = self._errors, set()
        return e

    def shutdown(self):
        """Ends the threads after the queued saves (at most 4 x timeout_s)
        and closes the session."""
        if self.blocks is None:
            return
        self._end_sync()
        self._queue_saves()
        with self._mu:
            self._stop = True
            self._mu.notify_all()
        for th in self._threads:
            th.join(self.c.timeout * 4)
        self.door.close()

    # ---- loads -----------------------------------------------------------

    def _keys(self, hashes):
        return [_hex(h) + self.suffix for h in hashes]

    def _get(self, keys, block_ids, verify=False):
        """BatchGet of keys (in batches): [(ctx, lease, positions, hits)]
        with hits [(block id, [slab address per kind], [slab view per
        kind], serve's sums per kind or ())], and the block ids that
        missed. Every batch's slab stays acquired until _release. verify:
        client_verifies (serve sends each hit's sums and checks none)."""
        c = self.c
        nb = self.blocks.num_blocks
        nk = len(c.kind_bytes)
        failed, batches = set(), []
        limits = self.door.limits
        step = max(1, limits.max_batch_pages if limits is not None and limits.max_batch_pages else 1024)
        for lo in range(0, len(keys), step):
            ks, ids = keys[lo:lo + step], block_ids[lo:lo + step]
            try:
                # NB: check_at_release with client_verifies: a serve older
                # than client_verifies ignores it, sends no sums and checks
                # while the pages are copied instead.
                rep, ctx = self.door.call("BatchGet", lambda s, b: pb.GetRequest(
                    session=s, boot_id=b, keys=ks, deadline_ms=c.get_deadline_ms, check_at_release=True,
                    client_verifies=verify), hold=True)
            except (_Lost, KvtierError) as e:
                logger.debug("kvtier: load of %d pages: %s", len(ks), e)
                failed.update(ids)
                continue
            hits, pos = [], []
            if len(rep.pages) != len(ks):
                logger.error("kvtier: BatchGet: %d pages for %d keys", len(rep.pages), len(ks))
            for j, page in enumerate(rep.pages[:len(ks)]):
                b = ids[j]
                if page.status != pb.GET_STATUS_HIT or not (0 <= b < nb):
                    failed.add(b)
                    continue
                try:
                    check_hit(page, nk)
                    addrs = [ctx.slab.check(sp, n) for sp, n in zip(page.spans, c.kind_bytes)]
                    views = [(ctx.slab.tensors[sp.slab], sp.offset, sp.slab) for sp in page.spans]
                except ValueError as e:
                    logger.error("kvtier: get of page %s: %s", ks[j], e)
                    failed.add(b)
                    continue
                hits.append((b, addrs, views, tuple(page.sums)))
                pos.append(j)
            failed.update(ids[len(rep.pages):])
            batches.append((ctx, rep.lease, pos, hits))
        return batches, failed

    def _judge(self, batches, sums):
        """The client's check of a summing copy of every batch's hits (in
        order; sums from copy_summed): per batch, the positions whose copy
        differs from serve's sums. Hits without sums (an older serve)
        are left to serve's check at release."""
        nk = len(self.c.kind_bytes)
        out, i = [], 0
        for _, _, pos, hits in batches:
            bad = []
            for j, h in zip(pos, hits):
                if h[3] and tuple(int(x) for x in sums[i * nk:(i + 1) * nk]) != h[3]:
                    bad.append(j)
                i += 1
            out.append(bad)
        return out

    def _release(self, batches, failed, bad=None):
        """Release of every batch: the hits its check failed, and every hit
        of a batch whose Release failed (unconfirmed), join failed.

        bad (a summing copy's _judge): per batch, the positions whose copy
        failed the client's check: they fail, and the Release lists them
        (serve drops them) and is waited for. A batch whose hits were all
        checked by the client and passed is released without waiting."""
        for n, (ctx, lease, pos, hits) in enumerate(batches):
            ctx.slab.release()
            mine = bad is not None
            bad_j = bad[n] if mine else []
            if bad_j:
                byj = dict(zip(pos, hits))
                for j in bad_j:
                    logger.error("kvtier: a page failed its check as it was loaded: block %d is recomputed", byj[j][0])
                    self.c._count(load_corrupt_blocks=1)
                    failed.add(byj[j][0])
            if not lease:
                continue
            theirs = [(j, h) for j, h in zip(pos, hits) if not (mine and h[3])]
            if not theirs and not bad_j:
                release_async(self.door.stub, pb.ReleaseRequest(session=ctx.session, boot_id=ctx.boot, lease=lease), self.c.timeout)
                continue
            try:
                rel = self.door.stub.Release(pb.ReleaseRequest(session=ctx.session, boot_id=ctx.boot, lease=lease,
                                                               corrupt=bad_j), timeout=self.c.timeout)
                corrupt = set(rel.corrupt)
            except (grpc.RpcError, ValueError) as e:
                # The pages checked here stay good; serve's checks are unconfirmed.
                logger.info("kvtier: release of lease %d: %s: its %d pages unchecked here count as failed",
                            lease, e, len(theirs))
                failed.update(h[0] for _, h in theirs)
                continue
            for j, h in theirs:
                if j in corrupt:
                    logger.error("kvtier: a page failed serve's check while it was loaded: block %d is recomputed",
                                 h[0])
                    self.c._count(load_corrupt_blocks=1)
                    failed.add(h[0])

    def _load(self, hashes, block_ids):
        """A whole load (every layer): the block ids that failed."""
        t0 = time.perf_counter()
        verify = self.blocks.summing()
        batches, failed = self._get(self._keys(hashes), list(block_ids), verify)
        hits = [h for b in batches for h in b[3]]
        bad = None
        try:
            t1 = time.perf_counter()
            if verify:
                sums = self.blocks.copy_summed(True, hits, range(len(self.blocks.layers)))
                bad = self._judge(batches, sums)
            else:
                self.blocks.copy(True, hits, range(len(self.blocks.layers)), role="load")
            self.c._count(load_copy_s=time.perf_counter() - t1)
        finally:
            self._release(batches, failed, bad)
        self._count_load(hits, failed, time.perf_counter() - t0)
        return failed

    def _count_load(self, hits, failed, dt):
        ok = sum(1 for h in hits if h[0] not in failed)
        self.c._count(load_blocks=ok, load_failed_blocks=len(failed),
                      load_bytes=len(hits) * sum(self.c.kind_bytes), load_s=dt)

    def _load_loop(self):
        _lower_thread(self.c.thread_nice)
        while True:
            with self._mu:
                while not self._stop and not self._load_q:
                    self._mu.wait()
                if self._stop and not self._load_q:
                    return
                rid, hashes, ids, _ = self._load_q.popleft()
            try:
                failed = self._load(hashes, ids)
            except Exception:  # every block fails; vLLM recomputes them
                logger.exception("kvtier: load of %s failed", rid)
                failed = set(ids)
            with self._mu:
                self._recv_errors[rid] = failed
                self._recv_done.add(rid)

    def _start_sync(self, loads):
        hashes = [h for ld in loads for h in ld[1]]
        ids = [b for ld in loads for b in ld[2]]
        t0 = time.perf_counter()
        verify = self.blocks.summing()
        batches, failed = self._get(self._keys(hashes), ids, verify)
        hits = [h for b in batches for h in b[3]]
        s = _SyncLoad(len(self.blocks.layers))
        s.failed = failed
        self._sync = s

        def run():
            bad = None
            try:
                t1 = time.perf_counter()
                if verify:
                    # Layer by layer, each a native call; a kind's span is
                    # its layers' chunks in layer order, so the layers'
                    # sums chain into the span's (_Shift).
                    acc = None
                    for li in range(len(self.blocks.layers)):
                        part = self.blocks.copy_summed(True, hits, (li,))
                        acc = part if acc is None else self.blocks.chain(acc, part)
                        s.events[li].set()
                    if acc is not None:
                        bad = self._judge(batches, acc)
                elif self.blocks.cuda:
                    # Every layer in one call: a run's pages are one
                    # range of the slab, staged whole (_copy_staged); the
                    # forward's stream orders them before its kernels.
                    self.blocks.copy(True, hits, range(len(self.blocks.layers)))
                else:
                    for li in range(len(self.blocks.layers)):
                        self.blocks.copy(True, hits, (li,))
                        s.events[li].set()
                self.c._count(load_copy_s=time.perf_counter() - t1)
            except Exception:
                logger.exception("kvtier: synchronous load failed")
                s.failed.update(h[0] for h in hits)
            finally:
                for ev in s.events:
                    ev.set()
                self._release(batches, s.failed, bad)
                self._count_load(hits, s.failed, time.perf_counter() - t0)

        if self.blocks.cuda:
            run()  # copies on the forward's stream, done before it starts
        else:
            s.thread = threading.Thread(target=run, name="kvtier-layers", daemon=True)
            s.thread.start()

    def _end_sync(self):
        s, self._sync = self._sync, None
        if s is None:
            return
        if s.thread is not None:
            s.thread.join()
        with self._mu:
            self._errors |= s.failed

    # ---- saves -----------------------------------------------------------

    def _save_loop(self):
        _lower_thread(self.c.thread_nice)
        while True:
            with self._mu:
                while not self._stop and not self._save_q:
                    self._mu.wait()
                if not self._save_q:
                    return
                job = self._save_q.popleft()
            try:
                if self.writes:
                    self._save(job)
            except Exception:
                logger.exception("kvtier: save of step %d failed", job.seq)
            finally:
                with self._mu:
                    self._copied = max(self._copied, job.seq)
                    for rid in job.rids:
                        s = self._jobs_of.get(rid)
                        if s is not None:
                            s.discard(job.seq)
                    self._mu.notify_all()

    def _save(self, job):
        """BatchSet, copy the reserved pages in, Commit."""
        if job.event is not None:
            job.event.synchronize()
        c = self.c
        t0 = time.perf_counter()
        keys, ids, seen, dups = [], [], set(), 0
        for _, hashes, bids in job.saves:
            for k, b in zip(self._keys(hashes), bids):
                # Requests that share a prefix and complete its blocks in
                # one step offer the same key twice: serve refuses a key
                # twice in a call (INVALID); the second is saved already.
                if k in seen:
                    dups += 1
                    continue
                seen.add(k)
                keys.append(k)
                ids.append(b)
        nb = self.blocks.num_blocks
        limits = self.door.limits
        step = max(1, limits.max_batch_pages if limits is not None and limits.max_batch_pages else 1024)
        stored = failed = copied = 0
        exists = dups
        copy_s = 0.0
        for lo in range(0, len(keys), step):
            ks, bs = keys[lo:lo + step], ids[lo:lo + step]
            try:
                rep, ctx = self.door.call("BatchSet", lambda s, b: pb.SetRequest(session=s, boot_id=b, keys=ks),
                                          hold=True)
            except (_Lost, KvtierError) as e:
                logger.debug("kvtier: save of %d pages: %s", len(ks), e)
                failed += len(ks)
                continue
            written = [False] * len(ks)
            pages, pj = [], []  # the pages copied in, and their positions in ks
            sums = None  # the Commit's: every written page's kinds, summed as copied
            try:
                for j, page in enumerate(rep.pages[:len(ks)]):
                    if page.status == pb.SET_STATUS_EXISTS:
                        exists += 1
                    elif page.status == pb.SET_STATUS_RESERVED and 0 <= bs[j] < nb and len(page.spans) == len(
                            c.kind_bytes):
                        try:
                            addrs = [ctx.slab.check(sp, n) for sp, n in zip(page.spans, c.kind_bytes)]
                            views = [(ctx.slab.tensors[sp.slab], sp.offset, sp.slab) for sp in page.spans]
                        except ValueError as e:
                            logger.error("kvtier: set of page %s: %s", ks[j], e)
                            failed += 1
                            continue
                        pages.append((bs[j], addrs, views))
                        pj.append(j)
                        written[j] = True
                    else:
                        failed += 1
                t1 = time.perf_counter()
                if self.blocks.summing():
                    got = self.blocks.copy_summed(False, pages, range(len(self.blocks.layers)))
                    nk = len(c.kind_bytes)
                    sums = [0] * (len(ks) * nk)
                    for i, j in enumerate(pj):
                        sums[j * nk:(j + 1) * nk] = got[i * nk:(i + 1) * nk].tolist()
                else:
                    self.blocks.copy(False, pages, range(len(self.blocks.layers)), role="save")
                copy_s += time.perf_counter() - t1
                copied += len(pages)
            except Exception:
                written = [False] * len(ks)
                sums = None
                raise
            finally:
                ctx.slab.release()
                if rep.lease:
                    try:
                        cr = self.door.stub.Commit(pb.CommitRequest(session=ctx.session, boot_id=ctx.boot,
                                                                    lease=rep.lease, written=written,
                                                                    sums=sums or []),
                                                   timeout=self.c.timeout)
                        stored += sum(1 for j, ok in enumerate(cr.stored[:len(ks)]) if ok and written[j])
                        failed += sum(1 for j, ok in enumerate(cr.stored[:len(ks)]) if not ok and written[j])
                    except (grpc.RpcError, ValueError) as e:
                        if isinstance(e, grpc.RpcError) and e.code() == grpc.StatusCode.NOT_FOUND:
                            self.door.lost(ctx, "Commit: NotFound")
                        logger.info("kvtier: commit of lease %d: %s", rep.lease, e)
                        failed += sum(written)
        c._count(save_stored_blocks=stored, save_exists_blocks=exists, save_failed_blocks=failed,
                 save_bytes=copied * sum(c.kind_bytes), save_s=time.perf_counter() - t0, save_copy_s=copy_s)


def __getattr__(name):
    """kvtier.vllm.KvtierTier and KvtierTieringSpec, the secondary tier of
    vLLM's CPU offloading (docs/vllm-offloading.md), live in
    kvtier.vllm_tier; they are imported on first use, so a vLLM without
    the tiering module (kv_offload.tiering) still loads the connector."""
    if name in ("KvtierTier", "KvtierTieringSpec"):
        from kvtier import vllm_tier
        return getattr(vllm_tier, name)
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
