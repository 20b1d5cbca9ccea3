"""A CPU engine over kvtier serve's engine API (docs/engine-api.md), for
the tests: :class:`EngineRank` is one rank (kvtier's L1 is its numpy
arrays; one ``Step`` call per scheduler step, batching every lookup,
store, finish and copy completion of that step) and :class:`Engine` a
scheduler loop over it, verifying every hit byte for byte against
kvtier.payload. test_group.py runs ranks against ``serve --group
engine``; test_engine_client.py against a serve killed and restarted.

While serve is away every lookup is a miss; a rank registers again on the
new ``boot_id`` by itself. With ``kvtier serve --group engine`` the engine
carries the ranks' group exchange: pass ``all_reduce``, a function from
this rank's contribution (bytes) to the frontier (bytes) that every rank
calls once per step (an all-gather over the engine's process group
followed by :func:`kvtier.group.reduce_contributions`). A single rank
needs none.
"""

import random
from dataclasses import dataclass, field

import numpy as np

from kvtier import checksum, pagehash
from kvtier.client import Client, health
from kvtier.engine.v1 import engine_pb2 as pb
from kvtier.group import reduce_contributions
from kvtier.payload import payload
from kvtier.slab import Slab


@dataclass
class Request:
    """What the rank reads of an engine request."""
    request_id: str
    prompt_token_ids: list


@dataclass
class StepPlan:
    """What the rank copies in this step."""
    loads: list = field(default_factory=list)       # FROM_SLAB plans
    saves: list = field(default_factory=list)       # TO_SLAB plans
    placements: list = field(default_factory=list)  # (req_id, key index, L1 page)


class EngineRank:
    """One rank of a CPU engine over the engine API: kvtier's L1 is
    ``l1``, numpy arrays of ``l1_pages`` pages per payload kind; one
    ``Step`` call per scheduler step (:meth:`step`)."""

    def __init__(self, socket_path, model, rank=0, world_size=1, engine_id="python-engine", salt="", all_reduce=None,
                 sums=None):
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
        # sums: report each TO_SLAB plan's CRC-32C per item
        # (Completion.sums) when python3-crc32c is installed (None: if it
        # is); sums_sent counts the items reported with one.
        self.sums = checksum.available() if sums is None else sums
        self.sums_sent = 0
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
        self._owed = []        # (plan, ok, sums or None)
        self._meta = StepPlan()

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

    def lookup(self, request, num_computed_tokens=0):
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

    def hit_pages(self, request):
        """The L1 pages (in key order) holding the request's hit prefix."""
        r = self._results.get(request.request_id)
        if r is None:
            return []
        return [p for rg in r.l1_pages for p in range(rg.start, rg.start + rg.count)]

    def step(self, computed=()):
        """The step's one Step call; returns the worker's metadata."""
        for req in computed:
            hs = self._keys.get(req.request_id)
            if hs and self._results.get(req.request_id) is not None:
                self._to_store[req.request_id] = hs
        res = self.client.step(completions=self._owed, lookups=list(self._to_lookup.items()),
                               stores=list(self._to_store.items()), finished=self._to_finish, aborted=self._to_abort,
                               frontier=self._frontier)
        self._meta = StepPlan()
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

    def finish(self, request):
        """The request is done: its pages stay cached, its lock goes."""
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
        
    # Worker side.

    def _run(self, plan):
        ok = True
        written = []
        for it in plan.items:
            try:
                span = self.slab.span(it.slab, it.offset, it.length)
                page = self.l1[it.kind][it.l1_page]
                if len(span) != len(page):
                    raise ValueError("span of %d bytes for a page of %d" % (len(span), len(page)))
                if plan.direction == pb.DIRECTION_TO_SLAB:
                    span[:] = page
                    written.append(span)
                else:
                    page[:] = span
            except (ValueError, IndexError) as e:
                self.errors.append("plan %d: %s" % (plan.plan, e))
                ok = False
        sums = None
        if ok and self.sums and plan.direction == pb.DIRECTION_TO_SLAB:
            # the bytes as written to the slab, after the copy
            sums = checksum.plan_sums(written)
            self.sums_sent += len(sums or ())
        self._owed.append((plan.plan, ok, sums))

    def run_loads(self):
        """Runs the step's loads (slab to L1), synchronously."""
        for pl in self._meta.loads:
            self._run(pl)

    def write_placed(self, kv_of):
        """Writes the computed KV of every placed page into L1:
        kv_of(req_id, key_index, kind) returns the page's bytes. With owner
        lanes only this rank's pages: the others' KV is not on this rank."""
        for rid, i, page in self._meta.placements:
            if not self.owns(i):
                continue
            hs = self._keys.get(rid)
            for k in range(len(self.kinds)):
                self.l1[k][page][:] = np.frombuffer(kv_of(rid, i, k, hs[i] if hs else None), dtype=np.uint8)

    def run_saves(self):
        """Runs the step's backups (L1 to slab) after the placed pages were
        written; their completions go in the next step."""
        for pl in self._meta.saves:
            self._run(pl)

    def close(self):
        self.slab.close()
        self.client.close()


class Engine:
    """A CPU engine's scheduler loop over one EngineRank, a few requests
    a step; every hit page verified against kvtier.payload."""

    def __init__(self, rank, seed):
        self.rank = rank
        self.rng = random.Random(seed)
        self.verified = self.wrong = self.hit_tokens = self.input_tokens = 0
        self.done = 0

    def request(self, i):
        pt = self.rank.page_tokens
        system = self.rng.randrange(4)
        pages = 3 + self.rng.randrange(4)
        toks = [system * 1000003 + j for j in range(4 * pt)]  # a shared 4-page system prompt
        toks += [i * 7919 + j for j in range(pages * pt)]
        if self.rng.random() < 0.3 and i > 0:
            toks = [system * 1000003 + j for j in range(4 * pt)] + [(i - 1) * 7919 + j for j in range(pages * pt)]
        return Request("r%d" % i, toks)

    def kv_of(self, rid, i, kind, h):
        return payload(h, kind, self.rank.kinds[kind][1])

    def verify(self, req):
        hs = self.rank._keys[req.request_id]
        for i, page in enumerate(self.rank.hit_pages(req)):
            if not self.rank.owns(i):
                continue  # another rank's page (owner lanes)
            for k, (_, size) in enumerate(self.rank.kinds):
                if bytes(self.rank.l1[k][page]) == payload(hs[i], k, size):
                    self.verified += 1
                else:
                    self.wrong += 1

    def run(self, n, start=0, per_step=4, on_step=None):
        waiting, queue = [], [self.request(i) for i in range(start, start + n)]
        computed = []
        steps = 0
        while queue or waiting or computed:
            steps += 1
            assert steps < 20 * n + 100, "the engine loop does not finish"
            while queue and len(waiting) < per_step:
                waiting.append(queue.pop(0))
            ready = []
            for req in waiting:
                tokens, pending = self.rank.lookup(req)
                if not pending:
                    ready.append((req, tokens))
            for req, tokens in ready:
                waiting.remove(req)
                self.verify(req)
                self.hit_tokens += tokens
                self.input_tokens += len(req.prompt_token_ids)
            stored = computed
            computed = [req for req, _ in ready]
            self.rank.step(computed)
            self.rank.run_loads()
            self.rank.write_placed(self.kv_of)
            self.rank.run_saves()
            for req in stored:
                self.rank.finish(req)
                self.done += 1
            if on_step:
                on_step(steps)
        # one more step sends the last finishes and completions
        self.rank.step()
        self.rank.run_loads()
        self.rank.run_saves()
