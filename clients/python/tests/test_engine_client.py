"""The engine API's Python client (kvtier.client, kvtier.slab,
kvtier.payload) against a real ``kvtier serve --doors engine`` process,
driven by a CPU engine's scheduler loop (tests/enginestep.py): hits
verified byte for byte, a SIGKILL of serve in the middle (misses while it
is away), a restart on the same data dir (registered again on the new
boot_id, L3 hits again)."""

import os
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

from enginestep import Engine, EngineRank
from kvtier._serveproc import wait_listening
from kvtier.client import make_namespace, pack_hashes, unpack_hashes
from kvtier.payload import payload
from kvtier.slab import Slab


class Serve:
    def __init__(self, binary, data):
        self.binary, self.data = binary, data
        self.sockdir = tempfile.mkdtemp(prefix="kvs-")
        self.sock = os.path.join(self.sockdir, "s.sock")
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen([self.binary, "serve", "--data-dir", self.data, "--socket", self.sock,
                                      "--log-level", "error", "--doors", "engine"],
                                     stdout=subprocess.DEVNULL)
        wait_listening(self.proc, self.sock, 60)

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=30)
        shutil.rmtree(self.sockdir, ignore_errors=True)


@pytest.fixture
def serve(kvtier_bin, tmp_path):
    s = Serve(kvtier_bin, str(tmp_path / "data"))
    s.start()
    yield s
    s.stop()


def test_engine_hits_verified(serve):
    conn = EngineRank(serve.sock, "test-model")
    eng = Engine(conn, seed=1)
    eng.run(120)
    conn.close()
    assert conn.errors == []
    assert eng.wrong == 0
    assert eng.verified > 100, eng.verified
    assert eng.hit_tokens > 0.2 * eng.input_tokens, (eng.hit_tokens, eng.input_tokens)


def test_engine_survives_serve_kill(serve):
    conn = EngineRank(serve.sock, "test-model")
    eng = Engine(conn, seed=2)
    eng.run(60)
    assert eng.wrong == 0 and eng.verified > 0
    # Let the spills land, then kill serve mid-run.
    for _ in range(20):
        conn.step()
        conn.run_loads()
        conn.run_saves()
    serve.kill()
    before = eng.verified

    def restart_at(step):
        if step == 5:
            serve.start()

    eng.run(60, start=60, on_step=restart_at)
    assert conn.unavailable_steps > 0
    # The engine steps on; the rank registers again once gRPC reconnects.
    deadline = time.time() + 15
    while conn.restarts == 0 and time.time() < deadline:
        conn.step()
        time.sleep(0.02)
    assert conn.restarts == 1
    # After the restart the cache is found again (L3) and every byte is right.
    after = Engine(conn, seed=2)
    after.run(60)
    assert after.wrong == 0 and eng.wrong == 0
    assert after.verified > 0, "no hits after serve came back"
    assert conn.errors == [], conn.errors[:3]
    conn.close()
    assert before > 0


def test_engine_sends_sums(serve, monkeypatch):
    """TO_SLAB completions carry each item's CRC-32C (python3-crc32c) and
    serve takes them; sums that do not fit the plan are refused by name and
    the plan waits for a good report; without python3-crc32c the client
    sends none, as before."""
    pytest.importorskip("crc32c")
    conn = EngineRank(serve.sock, "test-model")
    assert conn.sums, "python3-crc32c is installed: the rank reports sums by default"
    eng = Engine(conn, seed=3)
    eng.run(30)
    assert conn.errors == [], conn.errors[:3]
    assert eng.wrong == 0 and eng.verified > 0
    assert conn.sums_sent > 0

    # One more stored request: its backup's completion, tampered with.
    req = eng.request(1000)
    while conn.lookup(req)[1]:
        conn.step()
    conn.step([req])
    conn.write_placed(eng.kv_of)
    conn.run_saves()
    owed = [c for c in conn._owed if c[2]]
    assert len(owed) == 1, conn._owed
    plan, ok, sums = owed[0]
    assert ok and len(sums) > 0
    conn._owed = [(plan, True, sums[:-1] + [sums[-1], 7])]
    conn.step()
    assert len(conn.errors) == 1 and conn.errors[0].startswith("completions[0].sums") and "sums for its" in conn.errors[0], conn.errors
    conn.errors.clear()
    conn._owed = [(plan, True, sums)]
    conn.step()
    assert conn.errors == [], conn.errors
    conn.finish(req)
    conn.step()

    # Without the native library and python3-crc32c: no sums, and serve
    # is fine with that.
    from kvtier import checksum
    monkeypatch.setattr(checksum, "_crc32c", None)
    monkeypatch.setattr(checksum._native, "available", lambda: False)
    assert not checksum.available() and checksum.plan_sums([b"x"]) is None
    sent = conn.sums_sent
    eng2 = Engine(conn, seed=4)
    eng2.run(20)
    assert conn.sums_sent == sent
    assert conn.errors == [] and eng2.wrong == 0
    conn.close()


@pytest.mark.parametrize("source", ["native", "python3-crc32c"])
def test_checksum_vector(monkeypatch, source):
    """Each implementation kvtier.checksum takes gives the CRC-32C check
    value and the same plan sums; the native one is preferred."""
    from kvtier import checksum
    if source == "native":
        assert checksum._native.available(), checksum._native.why()
        assert checksum.source() == "native"
    else:
        pytest.importorskip("crc32c")
        monkeypatch.setattr(checksum._native, "available", lambda: False)
        assert checksum.source() == "python3-crc32c"
    assert checksum.crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    import numpy as np
    a = np.arange(4096, dtype=np.uint32).view(np.uint8)
    assert checksum.plan_sums([a[:8192], memoryview(a)[8192:]]) == [checksum.crc32c(a[:8192].tobytes()), checksum.crc32c(a[8192:].tobytes())]


def test_pack_and_namespace():
    hs = [bytes([i]) * 32 for i in range(3)]
    assert unpack_hashes(pack_hashes(hs)) == hs
    with pytest.raises(ValueError, match="hash 1 has 31 bytes"):
        pack_hashes([b"a" * 32, b"b" * 31])
    with pytest.raises(ValueError, match="multiple of 32"):
        unpack_hashes(b"x" * 33)
    good = {"model": "m", "page_tokens": 512, "page_bytes": [16384]}
    assert make_namespace(good).page_tokens == 512
    for bad, msg in [({"page_tokens": 512, "page_bytes": [1]}, "namespace.model"),
                     (dict(good, page_tokens=0), "namespace.page_tokens"),
                     (dict(good, page_bytes=[]), "namespace.page_bytes"),
                     (dict(good, colour="red"), "unknown field")]:
        with pytest.raises(ValueError, match=msg):
            make_namespace(bad)


def test_slab_bounds(tmp_path):
    p = tmp_path / "s0"
    p.write_bytes(bytes(8192))

    class F:
        def __init__(self, i, path, size):
            self.id, self.path, self.size = i, path, size

    class G:
        files = [F(0, str(p), 8192)]

    s = Slab(G())
    v = s.span(0, 4096, 4096)
    v[0] = 9
    assert p.read_bytes()[4096] == 9
    for args, msg in [((1, 0, 1), "slab 1 of 1"), ((0, 8192, 1), "outside"), ((0, 4096, 4097), "outside"), ((0, -1, 1), "outside")]:
        with pytest.raises(ValueError, match=msg):
            s.span(*args)
    s.close()


def test_payload_matches_go():
    # Printed by host.Payload in Go for pagehash.Next(Root, [tok]).
    for h, k, n, want in [
        ("71c99cc3bc21757feed5b712744ebb0f770d5c41d99189f9457495747bf11050", 0, 16, "fe1fdd4f25ca3b3cc35d8321b3b6de1a"),
        ("a82e8c1943a8293993f3074e550affd613e389826ed78519458b3c9cc6dac5eb", 1, 13, "ee9793c5ed637e1baa66987966"),
        ("977d660f26807198d6e78c6639eb0c6f76b3d9c2dcb53f74ad674c7d8d941554", 3, 40,
         "4330d3a75264be814e6a96a6493a846506464c499bc19e6e4ad08d5c218e0e4097e171a9502acba0"),
    ]:
        assert payload(bytes.fromhex(h), k, n).hex() == want
