"""Helpers of the kvtier.vllm tests: a small engine that calls
KvtierConnector exactly as vLLM's scheduler and workers do, on CPU.

- MiniScheduler follows vLLM's v1 scheduler (vllm/v1/core/sched/scheduler.py)
  where the connector is concerned: running requests first (a prefill chunk
  or one decode token each, the last running request preempted when blocks
  run out), then waiting ones (get_num_new_matched_tokens for a request
  with nothing computed, None skips it this step, an async load parks it in
  WAITING_FOR_REMOTE_KVS until a finished_recving; update_state_after_alloc
  after every allocation, with 0 for the second one of an async load),
  build_connector_meta once a step, request_finished at finish and abort
  (True delays the free until finished_sending), invalid block ids handled
  as vLLM does (the request's computed tokens cut at the first failed
  block, its output of that step dropped).
- Worker holds paged KV tensors (torch, CPU; vLLM's FlashAttention shape
  (2, blocks, block_size, heads, head_dim), several layers) and runs a
  "model" whose KV of a token is a function of its prefix, layer, kind and
  global head: a forward writes the scheduled tokens' KV layer by layer
  (wait_for_layer_load before, save_kv_layer after) and reads back the
  context it was given (loaded or computed before), counting every wrong
  element. A request's next token depends on whether any rank read a wrong
  element, so wrong bytes that vLLM would use show in the output.
- Engine ties them: one scheduler-side connector in this process, one
  worker per TP rank in its own process (spawn), outputs aggregated as
  vLLM's KVOutputAggregator does (a request is finished sending or
  receiving once every worker said so; invalid block ids are the union).
"""

import multiprocessing as mp
import os
import time
import traceback
from collections import deque
from dataclasses import dataclass

import torch

from vllm.config import CacheConfig, KVTransferConfig, ModelConfig, ParallelConfig, VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.forward_context import ForwardContext
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_utils import KVCacheBlock, get_request_block_hasher
from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MLAAttentionSpec
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import Request, RequestStatus

from kvtier.store.v1 import store_pb2 as _storepb

BLOCK = 16
LAYERS = 4
HEADS = 4         # KV heads of the model; a TP rank holds HEADS / tp
HEAD_DIM = 32
MLA_DIM = 64
DTYPE = torch.bfloat16


@dataclass(frozen=True)
class Geometry:
    """The model's KV geometry (the tests' default is small; the benchmark
    uses a real model's)."""
    layers: int = LAYERS
    heads: int = HEADS
    head_dim: int = HEAD_DIM


GEOM = Geometry()


def kind_bytes(tp=1, geom=GEOM, block=BLOCK, esize=2):
    """Bytes of one payload kind of a page (one block, every layer)."""
    return geom.layers * block * (geom.heads // tp) * geom.head_dim * esize


def store_yaml(kinds, slab_pages, l3_mib=64, block=BLOCK):
    """A store stack for serve --doors store: kinds [(name, bytes)], an shm
    slab of slab_pages pages, an l3disk with LMDB."""
    payloads = "\n".join("    - {name: %s, page_bytes: %d}" % (n, b) for n, b in kinds)
    slab = slab_pages * sum(b for _, b in kinds)
    return """version: 1
model:
  page_tokens: %d
  payloads:
%s
tiers:
  - name: l2
    role: slab
    use: l2hugetlb
    config: {size: %d, fallback: shm, name: "kvtier-vllmt-{{DIRHASH}}", stale: remove, populate: true}
  - name: l3
    role: store
    use: l3disk
    index: {use: lmdb, config: {dir: "{{DIR}}/store/index"}}
    config:
      disks: [{dir: "{{DIR}}/store/l3", budget: %dMiB}]
policy:
  evictor: lru
write_policy: write_through
ranks: {world_size: 1, rank: 0}
""" % (block, payloads, slab, l3_mib)


def vllm_config(sock, tp=1, extra=None, role="kv_both", model="test/model", block=BLOCK):
    e = {"socket": sock, "timeout_s": 2, "register_retry_s": 0.2}
    e.update(extra or {})
    return VllmConfig(model_config=ModelConfig(model=model), cache_config=CacheConfig(block_size=block),
                      parallel_config=ParallelConfig(tensor_parallel_size=tp),
                      kv_transfer_config=KVTransferConfig(kv_connector="KvtierConnector",
                                                          kv_connector_module_path="kvtier.vllm", kv_role=role,
                                                          kv_connector_extra_config=e))


def layer_names(layers=LAYERS):
    return ["model.layers.%d.self_attn.attn" % i for i in range(layers)]


def kv_cache_config(num_blocks, tp=1, geom=GEOM, mla=False, block=BLOCK):
    if mla:
        spec = MLAAttentionSpec(block_size=block, num_kv_heads=1, head_size=MLA_DIM, dtype=DTYPE)
    else:
        spec = FullAttentionSpec(block_size=block, num_kv_heads=geom.heads // tp, head_size=geom.head_dim,
                                 dtype=DTYPE)
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                         kv_cache_groups=[KVCacheGroupSpec(layer_names(geom.layers), spec)])


def next_token(tokens, wrong=False):
    """The model's next token: a function of the sequence; 0 when the
    forward read a wrong KV element."""
    if wrong:
        return 0
    return (tokens[-1] * 7 + len(tokens) * 13 + sum(tokens[-4:])) % 30011 + 1


def expected_output(prompt, max_tokens):
    toks = list(prompt)
    for _ in range(max_tokens):
        toks.append(next_token(toks))
    return toks[len(prompt):]


def seeds(tokens):
    """A prefix-dependent seed per position (int64)."""
    t = torch.tensor(tokens, dtype=torch.int64)
    w = (torch.arange(len(tokens), dtype=torch.int64) * 2654435761 + 97) % 1000003 + 1
    return torch.cumsum(t * w, 0) % 1000000007


def kv_values(sd, layer, kind, head0, heads, head_dim):
    """The KV of positions with seeds sd at a layer, kind and the global
    heads [head0, head0 + heads): small integers, exact in bfloat16."""
    h = torch.arange(head0, head0 + heads, dtype=torch.int64)
    d = torch.arange(head_dim, dtype=torch.int64)
    v = (sd[:, None, None] * (layer * 7 + kind * 3 + 1) + h[None, :, None] * 131 + d[None, None, :] * 17) % 251
    return v.to(DTYPE)


class Worker:
    """One vLLM worker (a TP rank): paged KV tensors, the connector with
    role WORKER, a forward as described above."""

    def __init__(self, sock, rank, tp, num_blocks, extra=None, geom=GEOM, kv_shape="flash", compute_s=0.0,
                 device="cpu"):
        from vllm.distributed.parallel_state import set_ranks

        from kvtier.vllm import KvtierConnector

        set_ranks(rank, tp)
        self.rank, self.tp, self.nb, self.geom = rank, tp, num_blocks, geom
        self.hr, self.hd = geom.heads // tp, geom.head_dim
        self.compute_s = compute_s
        self.device = torch.device(device)
        self.names = layer_names(geom.layers)
        if kv_shape == "flash":
            shape = (2, num_blocks, BLOCK, self.hr, self.hd)
        else:  # flashinfer: (blocks, 2, ...)
            shape = (num_blocks, 2, BLOCK, self.hr, self.hd)
        self.kv = {n: torch.zeros(*shape, dtype=DTYPE, device=self.device) for n in self.names}
        self._cycles = gpu_cycles_per_s(self.device) if self.device.type == "cuda" and compute_s else 0
        self.kv_shape = kv_shape
        cfg = vllm_config(sock, tp, extra)
        self.conn = KvtierConnector(cfg, KVConnectorRole.WORKER, kv_cache_config(num_blocks, tp, geom))
        self.conn.register_kv_caches(self.kv)
        self.blocks = {}

    def kind_view(self, name, k):
        t = self.kv[name]
        return (t[k] if self.kv_shape == "flash" else t[:, k]).reshape(self.nb * BLOCK, self.hr, self.hd)

    def slots(self, rid, lo, hi):
        b = self.blocks[rid]
        pos = torch.arange(lo, hi)
        return (torch.tensor(b, dtype=torch.int64)[pos // BLOCK] * BLOCK + pos % BLOCK).to(self.device)

    def execute(self, so, tokens):
        """One step. tokens: request id -> its tokens up to the end of what
        this step computes. Returns what the model runner reports."""
        for nr in so.scheduled_new_reqs:
            self.blocks[nr.req_id] = list(nr.block_ids[0])
        cr = so.scheduled_cached_reqs
        start = {nr.req_id: nr.num_computed_tokens for nr in so.scheduled_new_reqs}
        check = set(start)
        for i, rid in enumerate(cr.req_ids):
            nb = cr.new_block_ids[i]
            if rid in cr.resumed_req_ids:
                self.blocks[rid] = list(nb[0]) if nb else []
                check.add(rid)
            elif nb:
                self.blocks[rid].extend(nb[0])
            start[rid] = cr.num_computed_tokens[i]
        for rid in so.finished_req_ids:
            self.blocks.pop(rid, None)
        meta = so.kv_connector_metadata
        launch = _ThreadTimes()
        self.conn.bind_connector_metadata(meta)
        self.conn.handle_preemptions(meta)
        self.conn.start_load_kv(ForwardContext())
        wrong, checked = {}, {}
        work = []
        for rid, n in so.num_scheduled_tokens.items():
            c0 = start[rid]
            sd = seeds(tokens[rid][:c0 + n])
            work.append((rid, c0, n, sd, self.slots(rid, c0, c0 + n), self.slots(rid, 0, c0) if rid in check else None))
        for li, name in enumerate(self.names):
            self.conn.wait_for_layer_load(name)
            for rid, c0, n, sd, new_slots, ctx_slots in work:
                for k in range(2):
                    view = self.kind_view(name, k)
                    if ctx_slots is not None and c0:
                        want = kv_values(sd[:c0], li, k, self.rank * self.hr, self.hr, self.hd).to(self.device)
                        bad = int((view[ctx_slots] != want).sum())
                        wrong[rid] = wrong.get(rid, 0) + bad
                        checked[rid] = checked.get(rid, 0) + want.numel()
                    view[new_slots] = kv_values(sd[c0:c0 + n], li, k, self.rank * self.hr, self.hr, self.hd).to(
                        self.device)
            self.conn.save_kv_layer(name, self.kv[name], None)
        # The launch: what the engine's thread did before the forward's
        # idle wait (bench_vllm's overlap reports it).
        self.launch = launch.since()
        if work and self.compute_s:
            # The accelerator's share of a forward: the host waits, idle
            # (on CUDA: a kernel that spins that long, the host waiting
            # for the device).
            if self._cycles:
                torch.cuda._sleep(int(self._cycles * self.compute_s))
                torch.cuda.synchronize(self.device)
            else:
                time.sleep(self.compute_s)
        self.conn.wait_for_save()
        sending, recving = self.conn.get_finished(set(so.finished_req_ids))
        out = KVConnectorOutput(finished_sending=sending, finished_recving=recving,
                                invalid_block_ids=self.conn.get_block_ids_with_load_errors(),
                                kv_connector_stats=self.conn.get_kv_connector_stats())
        self.conn.clear_connector_metadata()
        return {"kv": out, "wrong": wrong, "checked": checked}

    def read_block(self, name, k, block):
        return (self.kv[name][k] if self.kv_shape == "flash" else self.kv[name][:, k])[block].cpu().clone()

    def shutdown(self):
        self.conn.shutdown()


def gpu_cycles_per_s(device):
    """The clock of torch.cuda._sleep's spin on device (cycles a second),
    from one spin of 50 ms timed with events."""
    n = 10 ** 7
    torch.cuda._sleep(n)  # warm up
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(n)
    end.record()
    end.synchronize()
    first = n / (start.elapsed_time(end) / 1e3)
    n = int(first * 0.05)
    start.record()
    torch.cuda._sleep(n)
    end.record()
    end.synchronize()
    return n / (start.elapsed_time(end) / 1e3)


class _ThreadTimes:
    """The calling thread's wall time, time on a CPU and time runnable
    but waiting for one (/proc/thread-self/schedstat; the last two 0
    where it cannot be read), from its creation."""

    def __init__(self):
        self.wall, self.cpu, self.runq = time.perf_counter(), *self._sched()

    @staticmethod
    def _sched():
        try:
            with open("/proc/thread-self/schedstat") as f:
                on, wait = f.read().split()[:2]
            return int(on) / 1e9, int(wait) / 1e9
        except (OSError, ValueError):
            return 0.0, 0.0

    def since(self):
        """(wall, on a CPU, waiting for a CPU) in seconds since creation."""
        cpu, runq = self._sched()
        return time.perf_counter() - self.wall, cpu - self.cpu, runq - self.runq


def _worker_main(pipe, sock, rank, tp, num_blocks, extra, geom):
    try:
        torch.set_num_threads(1)
        w = Worker(sock, rank, tp, num_blocks, extra, geom)
        pipe.send(("ok", None))
    except BaseException:
        pipe.send(("err", traceback.format_exc()))
        return
    while True:
        cmd, arg = pipe.recv()
        try:
            if cmd == "step":
                out = w.execute(*arg)
            elif cmd == "rebuild":
                w.shutdown()
                w = Worker(sock, rank, tp, num_blocks, arg, geom)
                out = None
            elif cmd == "stats":
                out = w.conn.get_kv_connector_stats()
            elif cmd == "shutdown":
                w.shutdown()
                pipe.send(("ok", None))
                return
            else:
                raise ValueError(cmd)
            pipe.send(("ok", out))
        except BaseException:
            pipe.send(("err", traceback.format_exc()))


class RemoteWorker:
    """A Worker in its own process (spawn)."""

    def __init__(self, sock, rank, tp, num_blocks, extra=None, geom=GEOM):
        ctx = mp.get_context("spawn")
        self.pipe, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, sock, rank, tp, num_blocks, extra, geom),
                                daemon=True)
        self.proc.start()

    def wait_ready(self):
        self._recv()

    def send(self, cmd, arg=None):
        self.pipe.send((cmd, arg))

    def _recv(self, timeout=120):
        if not self.pipe.poll(timeout):
            raise TimeoutError("worker did not answer in %d s" % timeout)
        st, v = self.pipe.recv()
        if st != "ok":
            raise RuntimeError("worker failed:\n" + v)
        return v

    def call(self, cmd, arg=None):
        self.send(cmd, arg)
        return self._recv()

    def close(self):
        try:
            if self.proc.is_alive():
                self.call("shutdown")
        finally:
            self.proc.join(10)
            if self.proc.is_alive():
                self.proc.kill()


class MiniScheduler:
    """vLLM's scheduler, reduced to what concerns a KV connector (see the
    module's comment). No local prefix cache: every hit is kvtier's."""

    def __init__(self, conn, num_blocks, token_budget=256, max_running=8):
        self.conn = conn
        self.free = deque(range(num_blocks))
        self.token_budget, self.max_running = token_budget, max_running
        self.requests, self.blocks = {}, {}
        self.waiting, self.running = deque(), []
        self.finished_recving, self.failed_recving = set(), set()
        self.finished_req_ids = set()
        self.prev_scheduled = set()
        self.preemptions = 0
        self.delayed = set()  # finished, blocks held for the connector
        self.hasher = get_request_block_hasher(BLOCK)

    def add(self, rid, prompt, max_tokens):
        r = Request(rid, prompt, block_hasher=self.hasher, max_tokens=max_tokens)
        self.requests[rid] = r
        self.waiting.append(r)
        self.conn.on_new_request(r)
        return r

    def _alloc(self, r, ntokens):
        have = self.blocks.setdefault(r.request_id, [])
        need = -(-ntokens // BLOCK) - len(have)
        if need > len(self.free):
            return None
        got = [self.free.popleft() for _ in range(max(0, need))]
        have.extend(got)
        return got

    def _free_blocks(self, r):
        self.free.extend(self.blocks.pop(r.request_id, []))
        del self.requests[r.request_id]
        self.delayed.discard(r.request_id)

    def _preempt(self, r):
        self.free.extend(self.blocks.pop(r.request_id, []))
        r.status = RequestStatus.PREEMPTED
        r.num_computed_tokens = 0
        r.num_preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(r)

    def _free_request(self, r):
        delay, _ = self.conn.request_finished(r, list(self.blocks.get(r.request_id, [])))
        self.finished_req_ids.add(r.request_id)
        if delay:
            self.delayed.add(r.request_id)
        else:
            self._free_blocks(r)

    def abort(self, rid):
        r = self.requests.get(rid)
        if r is None or r.is_finished():
            return
        if r in self.running:
            self.running.remove(r)
        elif r in self.waiting:
            self.waiting.remove(r)
        delay = False
        if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
            delay = rid not in self.finished_recving
            self.finished_recving.discard(rid)
            self.failed_recving.discard(rid)
        r.status = RequestStatus.FINISHED_ABORTED
        d, _ = self.conn.request_finished(r, list(self.blocks.get(rid, [])))
        self.finished_req_ids.add(rid)
        if delay or d:
            self.delayed.add(rid)
        else:
            self._free_blocks(r)

    def schedule(self):
        budget = self.token_budget
        num_sched, new_blocks = {}, {}
        sched_running, new_reqs, resumed, preempted = [], [], [], []
        i = 0
        while i < len(self.running) and budget > 0:
            r = self.running[i]
            n = min(r.num_tokens - r.num_computed_tokens, budget)
            if n <= 0:
                i += 1
                continue
            got = None
            while True:
                got = self._alloc(r, r.num_computed_tokens + n)
                if got is not None:
                    break
                victim = self.running.pop()
                if victim in sched_running:
                    sched_running.remove(victim)
                    budget += num_sched.pop(victim.request_id)
                    new_blocks.pop(victim.request_id, None)
                    i -= 1
                self._preempt(victim)
                preempted.append(victim)
                if victim is r:
                    break
            if got is None:
                break
            sched_running.append(r)
            new_blocks[r.request_id] = got
            num_sched[r.request_id] = n
            budget -= n
            i += 1
        if not preempted:
            skipped = []
            while self.waiting and budget > 0 and len(self.running) < self.max_running:
                r = self.waiting[0]
                rid = r.request_id
                if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                    if rid not in self.finished_recving:
                        skipped.append(self.waiting.popleft())
                        continue
                    if rid in self.failed_recving:
                        self.failed_recving.discard(rid)
                        if not r.num_computed_tokens:
                            self.free.extend(self.blocks.pop(rid, []))
                    else:
                        c = min(len(self.blocks.get(rid, [])) * BLOCK, r.num_tokens)
                        if c == r.num_tokens:
                            c -= 1
                        r.num_computed_tokens = c
                    self.finished_recving.discard(rid)
                    r.status = RequestStatus.PREEMPTED if r.num_preemptions else RequestStatus.WAITING
                ext, load_async = 0, False
                if r.num_computed_tokens == 0:
                    ext, load_async = self.conn.get_num_new_matched_tokens(r, 0)
                    if ext is None:
                        skipped.append(self.waiting.popleft())
                        continue
                    assert ext >= 0 and (ext > 0 or not load_async), (ext, load_async)
                    r.num_external_computed_tokens = ext
                    computed = ext
                else:
                    computed = r.num_computed_tokens
                n = 0 if load_async else min(r.num_tokens - computed, budget)
                got = self._alloc(r, computed + n)
                if got is None:
                    break
                self.conn.update_state_after_alloc(
                    r, KVCacheBlocks(([KVCacheBlock(b) for b in self.blocks[rid]],)), ext)
                self.waiting.popleft()
                if load_async:
                    r.status = RequestStatus.WAITING_FOR_REMOTE_KVS
                    skipped.append(r)
                    continue
                self.running.append(r)
                (new_reqs if r.status == RequestStatus.WAITING else resumed).append(r)
                num_sched[rid] = n
                budget -= n
                r.status = RequestStatus.RUNNING
                r.num_computed_tokens = computed
                if r.num_cached_tokens < 0:
                    r.num_cached_tokens = computed
            for r in reversed(skipped):
                self.waiting.appendleft(r)
        cached = CachedRequestData.make_empty()
        for r in sched_running + resumed:
            rid = r.request_id
            cached.req_ids.append(rid)
            if r in resumed:
                cached.resumed_req_ids.add(rid)
                cached.new_block_ids.append((list(self.blocks[rid]),))
            else:
                cached.new_block_ids.append((new_blocks[rid],) if new_blocks.get(rid) else None)
            cached.num_computed_tokens.append(r.num_computed_tokens)
            cached.num_output_tokens.append(r.num_output_tokens)
        so = SchedulerOutput.make_empty()
        so.scheduled_new_reqs = [NewRequestData(r.request_id, r.prompt_token_ids, [], None, None,
                                                (list(self.blocks[r.request_id]),), r.num_computed_tokens, None)
                                 for r in new_reqs]
        so.scheduled_cached_reqs = cached
        so.num_scheduled_tokens = num_sched
        so.total_num_scheduled_tokens = sum(num_sched.values())
        so.preempted_req_ids = {r.request_id for r in preempted}
        so.finished_req_ids, self.finished_req_ids = self.finished_req_ids, set()
        so.kv_connector_metadata = self.conn.build_connector_meta(so)
        tokens = {rid: list(self.requests[rid].all_token_ids[:self.requests[rid].num_computed_tokens + n])
                  for rid, n in num_sched.items()}
        for rid, n in num_sched.items():
            self.requests[rid].num_computed_tokens += n
        self.prev_scheduled = set(num_sched)
        return so, tokens

    def _invalid(self, invalid):
        """vLLM's handling of failed loads (recompute policy)."""
        failed = set()
        for r in list(self.waiting):
            if r.status != RequestStatus.WAITING_FOR_REMOTE_KVS:
                continue
            ids = self.blocks.get(r.request_id, [])
            c = r.num_computed_tokens if r.request_id in self.failed_recving else len(ids) * BLOCK
            for idx, b in enumerate(ids[:-(-c // BLOCK)]):
                if b in invalid:
                    r.num_computed_tokens = idx * BLOCK
                    r.num_external_computed_tokens = idx * BLOCK
                    self.failed_recving.add(r.request_id)
                    failed.add(r.request_id)
                    break
        skip = set()
        for r in self.running:
            ids = self.blocks.get(r.request_id, [])
            c = r.num_cached_tokens
            for idx, b in enumerate(ids[:-(-c // BLOCK)] if c > 0 else []):
                if b in invalid:
                    r.num_computed_tokens = idx * BLOCK
                    r.num_external_computed_tokens = idx * BLOCK
                    r.num_cached_tokens = idx * BLOCK
                    skip.add(r.request_id)
                    break
        return failed, skip

    def update(self, so, sampled, kv):
        """After the step: outputs of rank 0 (sampled), the aggregated
        connector output. Returns the requests that finished."""
        failed_async, skip = self._invalid(kv.invalid_block_ids) if kv.invalid_block_ids else (set(), set())
        done = []
        for rid in so.num_scheduled_tokens:
            if rid in skip:
                continue
            r = self.requests.get(rid)
            if r is None or r.is_finished():
                continue
            tok = sampled.get(rid)
            if tok is None:
                continue
            r.append_output_token_ids(tok)
            if r.num_output_tokens >= r.max_tokens:
                r.status = RequestStatus.FINISHED_LENGTH_CAPPED
                self.running.remove(r)
                self._free_request(r)
                done.append(r)
        for rid in kv.finished_recving or ():
            assert rid in self.requests, "finished_recving of unknown %s" % rid
            r = self.requests[rid]
            if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                self.finished_recving.add(rid)
            else:
                assert r.is_finished(), (rid, r.status)
                self._free_blocks(r)
        for rid in kv.finished_sending or ():
            assert rid in self.delayed, "finished_sending of %s, not held" % rid
            self._free_blocks(self.requests[rid])
        return done, failed_async | skip

    def idle(self):
        return not self.waiting and not self.running and not self.delayed


class Engine:
    """The scheduler-side connector and MiniScheduler here, one Worker per
    TP rank (in processes, or in this process when inproc)."""

    def __init__(self, sock, tp=2, num_blocks=48, extra=None, token_budget=256, max_running=8, inproc=False,
                 geom=GEOM, compute_s=0.0, device="cpu"):
        from kvtier.vllm import KvtierConnector

        self.sock, self.tp, self.num_blocks, self.geom, self.compute_s = sock, tp, num_blocks, geom, compute_s
        self.device = device
        assert device == "cpu" or inproc, "a CUDA KV cache needs the worker in this process (inproc)"
        self.workers = []
        if inproc:
            assert tp == 1
            self.workers = [Worker(sock, 0, 1, num_blocks, extra, geom, compute_s=compute_s, device=device)]
        else:
            self.workers = [RemoteWorker(sock, r, tp, num_blocks, extra, geom) for r in range(tp)]
            for w in self.workers:
                w.wait_ready()
        self.inproc = inproc
        self.conn = KvtierConnector(vllm_config(sock, tp, extra), KVConnectorRole.SCHEDULER,
                                    kv_cache_config(num_blocks, tp, geom))
        self.sched = MiniScheduler(self.conn, num_blocks, token_budget, max_running)
        self.pending = {}  # rid -> (kind, count of workers that said so)
        self.outputs = {}
        self.wrong_used = 0      # wrong elements read in a step whose output was kept
        self.wrong_dropped = 0   # wrong elements read in a step vLLM dropped (failed load)
        self.checked = 0
        self.invalid = set()
        self.steps = 0
        self.stats = None

    def add(self, rid, prompt, max_tokens):
        return self.sched.add(rid, prompt, max_tokens)

    def _run_workers(self, so, tokens):
        if self.inproc:
            return [self.workers[0].execute(so, tokens)]
        for w in self.workers:
            w.send("step", (so, tokens))
        return [w._recv() for w in self.workers]

    def step(self):
        so, tokens = self.sched.schedule()
        outs = self._run_workers(so, tokens)
        self.steps += 1
        kv = KVConnectorOutput(invalid_block_ids=set())
        for key in ("finished_sending", "finished_recving"):
            got = set()
            for o in outs:
                for rid in getattr(o["kv"], key) or ():
                    c = self.pending.get((key, rid), 0) + 1
                    if c == len(outs):
                        self.pending.pop((key, rid), None)
                        got.add(rid)
                    else:
                        self.pending[(key, rid)] = c
            setattr(kv, key, got or None)
        for o in outs:
            kv.invalid_block_ids |= o["kv"].invalid_block_ids
            st = o["kv"].kv_connector_stats
            if st is not None:
                self.stats = st if self.stats is None else self.stats.aggregate(st)
        st = self.conn.get_kv_connector_stats()
        if st is not None:
            self.stats = st if self.stats is None else self.stats.aggregate(st)
        self.invalid |= kv.invalid_block_ids
        wrong = {}
        for o in outs:
            for rid, n in o["wrong"].items():
                wrong[rid] = wrong.get(rid, 0) + n
            self.checked += sum(o["checked"].values())
        sampled = {}
        for rid, n in so.num_scheduled_tokens.items():
            toks = tokens[rid]
            r = self.sched.requests[rid]
            if len(toks) == r.num_tokens:  # the prefill is complete: a token comes out
                sampled[rid] = next_token(toks, wrong.get(rid, 0) > 0)
        done, dropped = self.sched.update(so, sampled, kv)
        for rid, n in wrong.items():
            if rid in dropped:
                self.wrong_dropped += n
            else:
                self.wrong_used += n
        for r in done:
            self.outputs[r.request_id] = list(r.output_token_ids)
        return so

    def run(self, timeout=60, on_step=None):
        """Steps until every request is done and every block free. A step
        that scheduled nothing (requests waiting on lookups or loads) is
        followed by a short sleep, where vLLM's loop would spin."""
        n = 0
        deadline = time.monotonic() + timeout
        while not self.sched.idle():
            so = self.step()
            n += 1
            if on_step is not None:
                on_step(n)
            if not so.total_num_scheduled_tokens:
                time.sleep(0.0005)
            assert time.monotonic() < deadline, "the engine loop did not finish in %d s (%d steps): %s" % (
                timeout, n, self.describe())

    def describe(self):
        sc = self.sched
        lk = getattr(self.conn, "_scheduler", None)
        return "waiting %s, running %s, held %s, pending %s, lookups %s" % (
            [(r.request_id, r.status.name, r.num_computed_tokens) for r in sc.waiting],
            [(r.request_id, r.num_computed_tokens, r.num_tokens) for r in sc.running], sorted(sc.delayed),
            self.pending, {k: (v.done, v.loadable, v.present, v.l2) for k, v in lk._lookups.items()} if lk else None)

    def rebuild(self, extra):
        """A new vLLM on the same node: new scheduler side and workers'
        connectors (and empty KV caches), another configuration."""
        self.conn.shutdown()
        for w in self.workers:
            if self.inproc:
                w.shutdown()
            else:
                w.call("rebuild", extra)
        if self.inproc:
            self.workers = [Worker(self.sock, 0, 1, self.num_blocks, extra, self.geom, compute_s=self.compute_s,
                                   device=self.device)]
        from kvtier.vllm import KvtierConnector

        self.conn = KvtierConnector(vllm_config(self.sock, self.tp, extra), KVConnectorRole.SCHEDULER,
                                    kv_cache_config(self.num_blocks, self.tp, self.geom))
        self.sched = MiniScheduler(self.conn, self.num_blocks, self.sched.token_budget, self.sched.max_running)
        self.pending = {}

    def close(self):
        try:
            self.conn.shutdown()
        finally:
            for w in self.workers:
                if self.inproc:
                    w.shutdown()
                else:
                    w.close()


def prompts(n, systems=4, seed=0, system_blocks=3, max_extra=60):
    """n prompts: each a shared system prompt (one of `systems`, whole
    blocks) and its own suffix (a partial tail block most of the time)."""
    import random

    rng = random.Random(seed)
    out = []
    for i in range(n):
        s = i % systems
        sys_toks = [1000 * (s + 1) + j for j in range(system_blocks * BLOCK)]
        extra = rng.randrange(5, max_extra)
        out.append(sys_toks + [(i * 7919 + j * 31) % 20000 + 1 for j in range(extra)])
    return out


class OldServe:
    """Fault injection: a serve older than client_verifies. The flag is
    dropped from every GetRequest on the way out, so serve sends no sums
    and checks at release (check_at_release), as such a serve would.
    Wraps a Store stub; every other call passes through."""

    def __init__(self, stub):
        self._stub = stub

    def __getattr__(self, name):
        return getattr(self._stub, name)

    def BatchGet(self, req, **kw):
        r = _storepb.GetRequest()
        r.CopyFrom(req)
        r.client_verifies = False
        return self._stub.BatchGet(r, **kw)
