"""The engine as the group transport: two ranks of one engine against a
real ``kvtier serve --ranks 2 --group engine``, the engine all-reducing
the ranks' contributions with kvtier.group.reduce_contributions, as a
context-parallel engine would over its own process group."""

import os
import shutil
import signal
import struct
import subprocess
import tempfile

import pytest

from kvtier._serveproc import wait_listening
from kvtier.client import Client, health
from kvtier.group import GroupError, reduce_contributions
from kvtier.pagehash import chain


def start_serve(kvtier_bin, data, *args):
    """Starts ``kvtier serve`` with args and waits for its socket; returns
    the process, the socket and a function that stops it."""
    sockdir = tempfile.mkdtemp(prefix="kvg-")
    sock = os.path.join(sockdir, "s.sock")
    proc = subprocess.Popen([kvtier_bin, "serve", "--data-dir", data, "--socket", sock, "--log-level", "error",
                             "--doors", "engine", *args], stdout=subprocess.DEVNULL)

    def stop():
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        shutil.rmtree(sockdir, ignore_errors=True)

    try:
        wait_listening(proc, sock, 60)
    except RuntimeError:
        if proc.poll() is None:
            stop()
        shutil.rmtree(sockdir, ignore_errors=True)
        raise
    return sock, stop


@pytest.fixture
def group_serve(kvtier_bin, tmp_path):
    sock, stop = start_serve(kvtier_bin, str(tmp_path / "data"), "--ranks", "2", "--group", "engine")
    yield sock
    stop()


class Ranks:
    """Two ranks of one engine stepping in lockstep; the engine reduces
    their contributions between steps."""

    def __init__(self, sock):
        h = health(sock)
        ns = {"model": "group-test", "page_tokens": h.page_tokens, "page_bytes": [k.page_bytes for k in h.kinds]}
        self.page_tokens = h.page_tokens
        self.clients = [Client(sock, "group-test", r, 2, ns) for r in range(2)]
        for c in self.clients:
            assert c.info.group_transport == "engine"
        self.frontier = b""
        self.completions = [[], []]

    def step(self, **items):
        outs = []
        for r, c in enumerate(self.clients):
            res = c.step(completions=self.completions[r], frontier=self.frontier, **items)
            assert res.ok, res.error
            assert not res.reply.errors, res.reply.errors
            outs.append(res.reply)
        # The engine's all-reduce of the ranks' contributions.
        self.frontier = reduce_contributions([o.contribution for o in outs])
        # A CPU engine with no copies to make: every plan done at once.
        self.completions = [[(p.plan, True) for p in o.plans] for o in outs]
        return outs

    def close(self):
        for c in self.clients:
            c.close()


def test_engine_group_hits(group_serve):
    g = Ranks(group_serve)
    keys = []
    for i in range(12):
        toks = [1000 + j for j in range(4 * g.page_tokens)] + [i * 7919 + j for j in range(2 * g.page_tokens)]
        keys.append(chain(toks, g.page_tokens))
    # First pass: misses; store every key.
    for i, hs in enumerate(keys):
        rid = "a%d" % i
        outs = g.step(lookups=[(rid, hs)])
        for _ in range(20):
            if all(any(r.req_id == rid and r.status == 2 for r in o.lookups) for o in outs):
                break
            outs = g.step()
        g.step(stores=[(rid, hs)])
        g.step(finished=[rid])
    # Second pass: the shared prefix and the keys hit, equally on both ranks.
    hit = 0
    for i, hs in enumerate(keys):
        rid = "b%d" % i
        outs = g.step(lookups=[(rid, hs)])
        for _ in range(20):
            done = [[r for r in o.lookups if r.req_id == rid and r.status == 2] for o in outs]
            if all(done):
                break
            outs = g.step()
        assert done[0][0].hit_pages == done[1][0].hit_pages
        hit += done[0][0].hit_pages
        g.step(finished=[rid])
    assert hit >= 4 * len(keys), hit
    # A damaged frontier is refused, and the sessions end.
    bad = bytearray(g.frontier)
    bad[60] ^= 0xFF
    res = g.clients[0].step(frontier=bytes(bad))
    assert res.ok and res.reply.errors and res.reply.errors[0].item == "frontier", res.reply
    g.close()


def contribution(rank, size=2, tick=7, counts=(5, 4, 3, 2), ok=0b101, prefixes=(9,), digest=None, group=11, stack=22):
    flags = 1 if digest is not None else 0
    b = struct.pack("<4sBBH QQQ II HHII", b"KVC1", 1, flags, 0, group, stack, tick, rank, size,
                    len(counts) // 4, 4 if digest is not None else 0, 3, len(prefixes))
    b += struct.pack("<%dQ" % len(counts), *counts) + struct.pack("<Q", ok) + struct.pack("<%dI" % len(prefixes), *prefixes)
    if digest is not None:
        b += digest * 5
    return b


def test_reduce_rules():
    f = reduce_contributions([contribution(1, counts=(5, 1, 3, 9), ok=0b011, prefixes=(2,)), contribution(0)])
    assert f[4] == 2 and struct.unpack_from("<I", f, 32)[0] == 0xFFFFFFFF
    assert struct.unpack_from("<4Q", f, 52) == (5, 1, 3, 2)
    assert struct.unpack_from("<Q", f, 84)[0] == 0b001
    assert struct.unpack_from("<I", f, 92)[0] == 2
    d = reduce_contributions([contribution(0, digest=b"\x01" * 32), contribution(1, digest=b"\x01" * 32)])
    assert d.endswith(b"\x01" * 160)
    for msgs, msg in [
        ([], "no contributions"),
        ([contribution(0)], "1 contributions for a group of 2"),
        ([contribution(0), contribution(0)], "two contributions"),
        ([contribution(0), contribution(1, tick=8)], "tick 8"),
        ([contribution(0), contribution(1, group=12)], "group"),
        ([contribution(0), contribution(1, stack=23)], "stack"),
        ([contribution(0), contribution(1, prefixes=(1, 2))], "shape"),
        ([contribution(0), contribution(1)[:-1]], "header says"),
        ([contribution(0), b"KVC"], "shorter than"),
        ([contribution(0), b"XXXX" + contribution(1)[4:]], "magic"),
        ([contribution(0), contribution(2)], "rank 2 of a group of 2"),
        ([contribution(0, digest=b"\x01" * 32), contribution(1, digest=b"\x02" * 32)], "diverged"),
    ]:
        with pytest.raises(GroupError, match=msg):
            reduce_contributions(msgs)


def test_rank_engine_transport_single_rank(kvtier_bin, tmp_path):
    """A CPU engine's rank (tests/enginestep.py) against ``--ranks 1
    --group engine``: it reduces its own contribution each step; hits
    verified byte for byte."""
    from enginestep import Engine, EngineRank

    sock, stop = start_serve(kvtier_bin, str(tmp_path / "data"), "--group", "engine")
    try:
        conn = EngineRank(sock, "test-model")
        assert conn.client.info.group_transport == "engine"
        eng = Engine(conn, seed=3)
        eng.run(60)
        conn.close()
        assert conn.errors == [], conn.errors[:3]
        assert eng.wrong == 0 and eng.verified > 50, (eng.wrong, eng.verified)
    finally:
        stop()


def test_rank_needs_all_reduce_for_ranks(group_serve):
    from enginestep import EngineRank

    with pytest.raises(ValueError, match="pass all_reduce"):
        EngineRank(group_serve, "test-model", rank=0, world_size=2)


@pytest.fixture
def lanes_serve(kvtier_bin, tmp_path):
    sock, stop = start_serve(kvtier_bin, str(tmp_path / "data"), "--ranks", "2", "--group", "engine", "--owner-lanes")
    yield sock
    stop()


def test_two_ranks(group_serve):
    """Two ranks of one context-parallel engine, each with its own
    EngineRank in its own thread, their all_reduce an all-gather over a
    barrier (what torch.distributed.all_gather_object does across
    processes) and reduce_contributions: both ranks get the same answers,
    every loaded byte verified."""
    run_two_ranks(group_serve, lanes=1)


def test_two_ranks_owner_lanes(lanes_serve):
    """The same with serve --owner-lanes (one slab and one index for both
    ranks): each rank computes and keeps only its own pages (page i is
    rank i mod 2's) and verifies them; a page copied by the wrong rank
    would reach its owner as zeros."""
    run_two_ranks(lanes_serve, lanes=2)


def run_two_ranks(sock, lanes):
    import threading

    from enginestep import Engine, EngineRank

    gathered = [None, None]
    barrier = threading.Barrier(2, timeout=30)

    def all_reduce_for(rank):
        def all_reduce(contribution):
            gathered[rank] = contribution
            barrier.wait()
            frontier = reduce_contributions(list(gathered))
            barrier.wait()  # nobody overwrites gathered before both reduced
            return frontier
        return all_reduce

    conns, engines, errors = [], [], []
    # NB: a rank's registration must not end the other's session, so
    # both register before either steps.
    for r in range(2):
        conns.append(EngineRank(sock, "cp-model", rank=r, world_size=2, all_reduce=all_reduce_for(r)))
        assert conns[r].owner_lanes == lanes
    for r in range(2):
        engines.append(Engine(conns[r], seed=5))

    def run(r):
        try:
            engines[r].run(40)
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append((r, e))
            barrier.abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    for c in conns:
        assert c.errors == [], c.errors[:3]
        assert c.restarts == 0
    assert engines[0].hit_tokens == engines[1].hit_tokens > 0
    assert engines[0].wrong == engines[1].wrong == 0
    assert engines[0].verified > 0 and engines[1].verified > 0
    for c in conns:
        c.close()
