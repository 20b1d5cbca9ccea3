"""A connector shaped like vLLM's ``KVConnectorBase_V1``, over kvtier serve.

It needs no vLLM: small stand-ins (:class:`Request`, :class:`SchedulerOutput`)
carry what the methods read. One :class:`KvtierConnector` serves one engine
rank and makes exactly one ``Step`` call per scheduler step, in
:meth:`KvtierConnector.build_connector_meta`, batching every lookup, store,
finish and copy completion of that step.

Scheduler side: :meth:`get_num_new_matched_tokens` (a lookup, answered in a
later step while pages come back: ``(0, True)`` means "ask again"),
:meth:`update_state_after_alloc`, :meth:`build_connector_meta`,
:meth:`request_finished`. Worker side: :meth:`start_load_kv`,
:meth:`wait_for_layer_load`, :meth:`save_kv_layer`, :meth:`wait_for_save`,
:meth:`get_finished`.

kvtier's L1 here is the engine's KV pool for a CPU engine: ``l1_pages``
pages per payload kind in numpy arrays (:attr:`KvtierConnector.l1`);
copies between it and the slab are numpy copies. While serve is away (a
restart, a crash) every lookup is a miss and the engine recomputes; the
connector registers again on the new ``boot_id`` by itself.

With ``kvtier serve --group engine`` the engine carries the ranks' group
exchange: pass ``all_reduce``, a function from this rank's contribution
(bytes) to the frontier (bytes) that every rank of the engine calls once
per step, e.g. an ``all_gather_object`` over the engine's process group
followed by :func:`kvtier.group.reduce_contributions`. A single rank needs
none (its own contribution reduces to the frontier).
"""

from dataclasses import dataclass, field

import numpy as np

from kvtier import pagehash
from kvtier.client import Client, health
from kvtier.engine.v1 import engine_pb2 as pb
from kvtier.group import reduce_contributions
from kvtier.slab import Slab


@dataclass
class Request:
    """What the connector reads of an engine request."""
    request_id: str
    prompt_token_ids: list


@dataclass
class SchedulerOutput:
    """What the connector reads of a scheduler step: the requests whose
    prefill was computed in the step just run (their KV is stored)."""
    computed: list = field(default_factory=list)


@dataclass
class ConnectorMeta:
    """What the worker side does in this step."""
    loads: list = field(default_factory=list)       # FROM_SLAB plans
    saves: list = field(default_factory=list)       # TO_SLAB plans
    placements: list = field(default_factory=list)  # (req_id, key index, L1 page)


class KvtierConnector:
    def __init__(self, socket_path, model, rank=0, world_size=1, engine_id="python-engine", salt="", all_reduce=None):
        h = health(socket_path)
        self.page_tokens = h.page_tokens
        self.kinds = [(k.name, k.page_bytes) for k in h.kinds]
        ns = {"model": model, "kv_layout": "layer_first", "dtype": "uint8", "page_tokens": h.page_tokens,
              "page_bytes": [b for _, b in self.kinds], "shard": rank, "salt": salt}
        self.client = Client(socket_path, engine_id, rank, world_size, ns)
        # Only the engine transport takes a frontier (other transports'
        # replies carry the contribution too, in the same wire encoding,
        # for logs: serve exchanged it itself).
        engine = self.client.info.group_transport == "engine"
        if engine and all_reduce is None:
            if world_size > 1:
                self.client.close()
                raise ValueError("kvtier serve's group transport is the engine and world_size is %d: "
                                 "pass all_reduce (this rank's contribution -> the frontier)" % world_size)
            all_reduce = lambda c: reduce_contributions([c])  # noqa: E731
        self._all_reduce = all_reduce if engine else None
        self._frontier = b""
        self._attach()
        self.restarts = 0
        self.unavailable_steps = 0
        self.errors = []

    @property
    def owner_lanes(self):
        """serve's owner lanes (RegisterReply.owner_lanes): above 1, page i
        of a key belongs to rank i mod owner_lanes, and this rank computes,
        keeps and is sent copy plans for its own pages only. 1 without."""
        return max(1, self.client.info.owner_lanes)

    def owns(self, i):
        """Whether the page at position i of a key is this rank's."""
        lanes = self.owner_lanes
        return i % lanes == self.client.rank % lanes

    def _attach(self):
        info = self.client.info
        self.slab = Slab(info.slab)
        self.l1_pages = info.limits.l1_pages
        self.l1 = [np.zeros((self.l1_pages, b), dtype=np.uint8) for _, b in self.kinds]
        self._keys = {}        # req_id -> hashes
        self._to_lookup = {}   # req_id -> hashes, sent next step
        self._results = {}     # req_id -> LookupResult (DONE) or None (a miss)
        self._to_store = {}    # req_id -> hashes
        self._to_finish = []
        self._to_abort = []
        self._sent = set()     # req_ids the current session knows
        self._owed = []        # (plan, ok)
        self._meta = ConnectorMeta()

    def _reset(self, restarted):
        """serve went away: everything pending is a miss."""
        for rid in list(self._keys):
            if rid not in self._results:
                self._results[rid] = None
        self._to_lookup.clear()
        self._to_store.clear()
        self._to_finish.clear()
        self._to_abort.clear()
        self._sent.clear()
        self._owed.clear()
        self._frontier = b""
        if restarted:
            self.restarts += 1
            self.slab.close()
            keys, results = self._keys, self._results
            self._attach()
            self._keys, self._results = keys, results

    # Scheduler side.

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        """(tokens kvtier can load beyond num_computed_tokens, async). While
        the lookup is pending it returns (0, True): ask again next step."""
        rid = request.request_id
        if rid in self._results:
            r = self._results[rid]
            hit = 0 if r is None else r.hit_pages * self.page_tokens
            return max(0, hit - num_computed_tokens), False
        if rid not in self._keys:
            hs = pagehash.chain(request.prompt_token_ids, self.page_tokens)
            if not hs:
                self._results[rid] = None
                return 0, False
            self._keys[rid] = hs
            self._to_lookup[rid] = hs
        return 0, True

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        """kvtier names the L1 pages itself (the engine's pool here is
        kvtier's L1); nothing to record."""

    def hit_pages(self, request):
        """The L1 pages (in key order) holding the request's hit prefix."""
        r = self._results.get(request.request_id)
        if r is None:
            return []
        return [p for rg in r.l1_pages for p in range(rg.start, rg.start + rg.count)]

    def build_connector_meta(self, scheduler_output):
        """The step's one Step call; returns the worker's metadata."""
        for req in scheduler_output.computed:
            hs = self._keys.get(req.request_id)
            if hs and self._results.get(req.request_id) is not None:
                self._to_store[req.request_id] = hs
        res = self.client.step(completions=self._owed, lookups=list(self._to_lookup.items()),
                               stores=list(self._to_store.items()), finished=self._to_finish, aborted=self._to_abort,
                               frontier=self._frontier)
        self._meta = ConnectorMeta()
        if not res.ok:
            if res.unavailable:
                self.unavailable_steps += 1
            self._reset(res.restarted)
            return self._meta
        sent_store = dict(self._to_store)
        self._sent.update(self._to_lookup)
        self._owed, self._to_lookup, self._to_store, self._to_finish, self._to_abort = [], {}, {}, [], []
        rep = res.reply
        if self._all_reduce is not None and rep.contribution:
            self._frontier = self._all_reduce(rep.contribution)
        for e in rep.errors:
            self.errors.append("%s %s: %s" % (e.item, e.req_id, e.message))
        for lr in rep.lookups:
            if lr.status == pb.LOOKUP_STATUS_DONE:
                self._results[lr.req_id] = lr
        for p in rep.placements:
            hs = sent_store.get(p.req_id)
            if hs is None:
                self.errors.append("placement for %s, not stored" % p.req_id)
                continue
            i = p.first_page
            for rg in p.l1_pages:
                for page in range(rg.start, rg.start + rg.count):
                    self._meta.placements.append((p.req_id, i, page))
                    i += 1
        for pl in rep.plans:
            (self._meta.saves if pl.direction == pb.DIRECTION_TO_SLAB else self._meta.loads).append(pl)
        return self._meta

    def request_finished(self, request, block_ids=()):
        """The request is done: its pages stay cached, its lock goes.
        Returns (delay_free, params) as vLLM's does: nothing is delayed."""
        rid = request.request_id
        if rid in self._sent:
            self._sent.discard(rid)
            if self._results.get(rid) is not None:
                self._to_finish.append(rid)
            else:
                self._to_abort.append(rid)
        self._to_lookup.pop(rid, None)
        self._to_store.pop(rid, None)
        self._keys.pop(rid, None)
        self._results.pop(rid, None)
        return False, None

    # Worker side.

    def _run(self, plan):
        ok = True
        for it in plan.items:
            try:
                span = self.slab.span(it.slab, it.offset, it.length)
                page = self.l1[it.kind][it.l1_page]
                if len(span) != len(page):
                    raise ValueError("span of %d bytes for a page of %d" % (len(span), len(page)))
                if plan.direction == pb.DIRECTION_TO_SLAB:
                    span[:] = page
                else:
                    page[:] = span
            except (ValueError, IndexError) as e:
                self.errors.append("plan %d: %s" % (plan.plan, e))
                ok = False
        self._owed.append((plan.plan, ok))

    def start_load_kv(self, forward_context=None):
        """Runs the step's loads (slab to L1), synchronously."""
        for pl in self._meta.loads:
            self._run(pl)

    def wait_for_layer_load(self, layer_name=None):
        """Loads are synchronous here."""

    def save_kv_layer(self, layer_name, kv_of, attn_metadata=None):
        """Writes the computed KV of every placed page into L1:
        kv_of(req_id, key_index, kind) returns the page's bytes. With owner
        lanes only this rank's pages: the others' KV is not on this rank."""
        for rid, i, page in self._meta.placements:
            if not self.owns(i):
                continue
            hs = self._keys.get(rid)
            for k in range(len(self.kinds)):
                self.l1[k][page][:] = np.frombuffer(kv_of(rid, i, k, hs[i] if hs else None), dtype=np.uint8)

    def wait_for_save(self):
        """Runs the step's backups (L1 to slab) after the placed pages were
        written; their completions go in the next step."""
        for pl in self._meta.saves:
            self._run(pl)

    def get_finished(self, finished_req_ids=()):
        """(sending done, receiving done): copies are synchronous here."""
        return set(), set()

    def close(self):
        self.slab.close()
        self.client.close()
