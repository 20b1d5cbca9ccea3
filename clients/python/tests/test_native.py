"""kvtier.native (libkvtiercopy.so, kvtier/_native/kvtiercopy.c): the one-pass
copy + CRC-32C against a reference CRC-32C, on every path the machine has
(AVX-512 folding, SSE 4.2, table: forced with native.set_accel and
KVTIER_NATIVE_ACCEL). The reference is Debian's python3-crc32c where it is
installed, else the pure-Python table below (itself checked against the
RFC 3720 vectors). Random data is seeded; every assertion names its seed.

KVTIER_BENCH=1 also runs test_bench_native (GB/s figures for docs/perf.md).
"""

import array
import ctypes
import importlib
import os
import random
import subprocess
import sys
import time

import pytest

from kvtier import native

try:
    import numpy as np
except ImportError:
    np = None

try:
    import crc32c as _ref_mod
except ImportError:
    _ref_mod = None
# KVTIER_TEST_PYREF=1: the pure-Python reference even with python3-crc32c
# (how the tests run where it is not installed; slower).
if os.environ.get("KVTIER_TEST_PYREF") == "1":
    _ref_mod = None

SEED = int(os.environ.get("KVTIER_TEST_SEED", "20261206"))


def _make_table():
    t = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t.append(c)
    return t


_TABLE = _make_table()


def py_crc32c(data, crc=0):
    """CRC-32C by the byte-wise table (slow; the reference without
    python3-crc32c)."""
    c = crc ^ 0xFFFFFFFF
    t = _TABLE
    for b in bytes(data):
        c = t[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def ref_crc32c(data, crc=0):
    if _ref_mod is not None:
        return _ref_mod.crc32c(bytes(data), crc) if crc else _ref_mod.crc32c(bytes(data))
    return py_crc32c(data, crc)


def _levels():
    """The paths this machine has: 0 .. the hardware's best."""
    return list(range(native.set_accel(2) + 1))


@pytest.fixture
def level(request, native_lib):
    """Runs a test on one path (0 table, 1 SSE 4.2, 2 AVX-512), skipping
    the ones the CPU lacks, and restores the best path after."""
    want = request.param
    hw = native.set_accel(2)
    if want > hw:
        pytest.skip("path %d needs a CPU feature this machine lacks (best path: %d)" % (want, hw))
    assert native.set_accel(want) == want
    yield want
    native.set_accel(2)


LEVELS = [0, 1, 2]
LENGTHS = [0, 1, 7, 63, 64, 255, 256, 1023, 1024, 1025, 4096 + 13, 12287, 12289,
           (1 << 20) + 5, 2883584]  # 2883584: 2.75 MiB

_data_cache = {}


def _data(n, seed):
    k = (n, seed)
    if k not in _data_cache:
        _data_cache[k] = random.Random(seed).randbytes(n)
    return _data_cache[k]


def _ref_cached(n, off, seed, crc=0):
    k = ("ref", n, off, seed, crc)
    if k not in _data_cache:
        _data_cache[k] = ref_crc32c(_data(n + off, seed)[off:], crc)
    return _data_cache[k]


def test_reference_vectors():
    # RFC 3720 B.4 and the check value of CRC-32C.
    vectors = [
        (b"", 0),
        (b"123456789", 0xE3069283),
        (bytes(32), 0x8A9136AA),
        (b"\xff" * 32, 0x62A8AB43),
        (bytes(range(32)), 0x46DD794E),
        (bytes(range(31, -1, -1)), 0x113FDB5C),
    ]
    for data, want in vectors:
        assert py_crc32c(data) == want, data
        if _ref_mod is not None:
            assert _ref_mod.crc32c(data) == want, data


@pytest.mark.parametrize("level", LEVELS, indirect=True)
def test_vectors(level):
    for data, want in [(b"123456789", 0xE3069283), (bytes(32), 0x8A9136AA),
                       (b"\xff" * 32, 0x62A8AB43), (bytes(4096), 0x98F94189)]:
        assert native.crc32c(data) == want, (level, len(data))


def test_library(native_lib):
    assert native.available(), native.why()
    assert native.why() == ""
    assert native.library_path() == native_lib
    # CDLL (not PyDLL): ctypes releases the GIL for every call.
    assert isinstance(native._lib, ctypes.CDLL) and not isinstance(native._lib, ctypes.PyDLL)
    assert native.accel() in (0, 1, 2)


@pytest.mark.parametrize("level", LEVELS, indirect=True)
def test_crc32c_lengths(level):
    for n in LENGTHS:
        for off in (0, 1, 5, 63):
            seed = SEED + n
            buf = _data(n + off, seed)
            want = _ref_cached(n, off, seed)
            what = "seed=%d level=%d n=%d off=%d" % (seed, level, n, off)
            # bytes, writable buffer, read-only view, numpy, address.
            assert native.crc32c(buf[off:]) == want, what
            ba = bytearray(buf)
            assert native.crc32c(memoryview(ba)[off:]) == want, what
            assert native.crc32c(memoryview(buf)[off:]) == want, what
            if np is not None:
                arr = np.frombuffer(buf, dtype=np.uint8)[off:]
                assert native.crc32c(arr) == want, what
                if n >= 8 and n % 8 == 0:
                    assert native.crc32c(arr.view(np.uint64).reshape(2, -1)) == want, what
            if n:
                addr = ctypes.addressof((ctypes.c_char * len(ba)).from_buffer(ba)) + off
                assert native.crc32c(addr, n) == want, what
            # n shorter than the buffer.
            assert native.crc32c(buf[off:], n=n // 2) == ref_crc32c(buf[off:off + n // 2]), what


@pytest.mark.parametrize("level", LEVELS, indirect=True)
def test_crc32c_continuation(level):
    rng = random.Random(SEED)
    for n in (0, 1, 100, 1024, 5000, 70000, (1 << 20) + 5):
        data = _data(n, SEED + 7)
        whole = _ref_cached(n, 0, SEED + 7)
        for _ in range(4):
            cut = rng.randint(0, n)
            a = native.crc32c(data[:cut])
            assert native.crc32c(data[cut:], crc=a) == whole, "seed=%d level=%d n=%d cut=%d" % (SEED, level, n, cut)


def _addr(ba, off=0):
    return ctypes.addressof((ctypes.c_char * len(ba)).from_buffer(ba)) + off


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("level", LEVELS, indirect=True)
def test_copy_crc32c(level, stream):
    for n in LENGTHS[1:]:
        for soff, doff in ((0, 0), (1, 0), (0, 3), (5, 63), (63, 17)):
            seed = SEED + n
            src = bytearray(_data(n + soff, seed))
            dst = bytearray(b"\xa5" * (n + doff + 64))
            what = "seed=%d level=%d stream=%s n=%d soff=%d doff=%d" % (seed, level, stream, n, soff, doff)
            got = native.copy_crc32c(_addr(dst, doff), _addr(src, soff), n, stream=stream)
            assert got == _ref_cached(n, soff, seed), what
            assert dst[doff:doff + n] == src[soff:], what
            assert dst[:doff] == b"\xa5" * doff and dst[doff + n:] == b"\xa5" * 64, what + ": wrote outside dst"
            # Continuing a running sum.
            got2 = native.copy_crc32c(_addr(dst, doff), _addr(src, soff), n, crc=0x12345678, stream=stream)
            assert got2 == _ref_cached(n, soff, seed, 0x12345678), what


@pytest.mark.parametrize("level", LEVELS, indirect=True)
def test_copy_crc32c_overlap(level):
    # Overlapping src and dst: the sum of src as it was, the bytes moved.
    for n in (1, 100, 1024, 4096 + 13, 70001):
        for shift in (-65, -1, 1, 64, 300):
            data = bytearray(_data(n + 800, SEED + n))
            want_bytes = bytearray(data)
            s = 200
            d = s + shift
            want_bytes[d:d + n] = data[s:s + n]
            want = ref_crc32c(data[s:s + n])
            what = "seed=%d level=%d n=%d shift=%d" % (SEED + n, level, n, shift)
            for stream in (False, True):
                buf = bytearray(data)
                assert native.copy_crc32c(_addr(buf, d), _addr(buf, s), n, stream=stream) == want, what
                assert buf == want_bytes, what


def _pages(rng, npages, page, nchunks_max):
    """Pieces of npages pages of page bytes each, every page split at
    random points, given layer_first style: the pieces of all pages
    interleaved, each page's own in the order of its bytes."""
    per_page = []
    for p in range(npages):
        k = rng.randint(1, nchunks_max)
        cuts = sorted(rng.sample(range(1, page), min(k - 1, page - 1)))
        bounds = [0] + cuts + [page]
        per_page.append([(p, bounds[i], bounds[i + 1] - bounds[i]) for i in range(len(bounds) - 1)])
    order = []
    while any(per_page):
        p = rng.choice([i for i, q in enumerate(per_page) if q])
        order.append(per_page[p].pop(0))
    return order


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("level", LEVELS, indirect=True)
def test_copy_pages(level, stream):
    for page, npages, nchunks in ((1, 3, 1), (100, 4, 7), (4096 + 13, 5, 16), (70001, 3, 64)):
        seed = SEED + page
        rng = random.Random(seed)
        src = bytearray(_data(page * npages + 7, seed))
        dst = bytearray(page * npages + 64)
        pieces = _pages(rng, npages, page, nchunks)
        # src pages at offset 7 (unaligned), dst pages at 3.
        dsts = [_addr(dst, 3 + p * page + o) for p, o, _ in pieces]
        srcs = [_addr(src, 7 + p * page + o) for p, o, _ in pieces]
        lens = [n for _, _, n in pieces]
        groups = [p for p, _, _ in pieces]
        what = "seed=%d level=%d stream=%s page=%d" % (seed, level, stream, page)
        sums = native.copy_pages(dsts, srcs, lens, groups, stream=stream)
        want = [ref_crc32c(src[7 + p * page:7 + (p + 1) * page]) for p in range(npages)]
        assert sums == want, what
        assert dst[3:3 + npages * page] == src[7:7 + npages * page], what
        # ngroups larger than used: the unused sums stay 0.
        sums = native.copy_pages(dsts, srcs, lens, array.array("I", groups), ngroups=npages + 2, stream=stream)
        assert sums == want + [0, 0], what
        # numpy arrays (int64 addresses, as torch's data_ptr() arithmetic gives).
        if np is not None:
            dst[:] = bytes(len(dst))
            sums = native.copy_pages(np.array(dsts, dtype=np.int64), np.array(srcs, dtype=np.uint64),
                                     np.array(lens, dtype=np.int32), np.array(groups, dtype=np.int64),
                                     stream=stream)
            assert sums == want, what
            assert dst[3:3 + npages * page] == src[7:7 + npages * page], what
        # No groups: a plain vectored copy.
        dst2 = bytearray(len(dst))
        dsts2 = [_addr(dst2, 3 + p * page + o) for p, o, _ in pieces]
        assert native.copy_pages(dsts2, srcs, lens, stream=stream) is None, what
        assert dst2 == dst, what


def test_copy_pages_empty(native_lib):
    assert native.copy_pages([], [], []) is None
    assert native.copy_pages([], [], [], [], ngroups=3) == [0, 0, 0]
    assert native.copy_pages([], [], [], []) == []


def test_bad_input(native_lib):
    buf = bytearray(64)
    a = _addr(buf)
    cases = [
        ("buf_or_addr", lambda: native.crc32c(0, 8)),
        ("buf_or_addr", lambda: native.crc32c(-5, 8)),
        ("n", lambda: native.crc32c(a)),
        ("n", lambda: native.crc32c(a, 0)),
        ("n", lambda: native.crc32c(a, -1)),
        ("n", lambda: native.crc32c(b"abc", 4)),
        ("n", lambda: native.crc32c(b"abc", -1)),
        ("buf", lambda: native.crc32c(object())),
        ("buf", lambda: native.crc32c(memoryview(bytearray(64))[::2])),
        ("crc", lambda: native.crc32c(b"abc", crc=-1)),
        ("crc", lambda: native.crc32c(b"abc", crc=1 << 32)),
        ("dst_addr", lambda: native.copy_crc32c(0, a, 8)),
        ("src_addr", lambda: native.copy_crc32c(a, 0, 8)),
        ("src_addr", lambda: native.copy_crc32c(a, 1.5, 8)),
        ("n", lambda: native.copy_crc32c(a, a + 8, 0)),
        ("n", lambda: native.copy_crc32c(a, a + 8, -8)),
        ("crc", lambda: native.copy_crc32c(a, a + 8, 8, crc=None)),
        ("srcs", lambda: native.copy_pages([a], [a, a], [8])),
        ("lens", lambda: native.copy_pages([a], [a], [8, 8])),
        ("groups", lambda: native.copy_pages([a], [a], [8], [0, 1])),
        ("dsts", lambda: native.copy_pages([0], [a], [8], [0])),
        ("srcs", lambda: native.copy_pages([a], [0], [8])),
        ("srcs", lambda: native.copy_pages([a], [-1], [8])),
        ("lens", lambda: native.copy_pages([a], [a], [0], [0])),
        ("lens", lambda: native.copy_pages([a], [a], [-8], [0])),
        ("lens", lambda: native.copy_pages([a], [a], [1 << 64])),
        ("groups", lambda: native.copy_pages([a], [a], [8], [-1])),
        ("groups", lambda: native.copy_pages([a, a], [a, a], [8, 8], [0, 2], ngroups=2)),
        ("ngroups", lambda: native.copy_pages([a], [a], [8], [0], ngroups=-1)),
        ("ngroups", lambda: native.copy_pages([a], [a], [8], ngroups=1)),
        ("level", lambda: native.set_accel(3)),
    ]
    if np is not None:
        cases += [
            ("dsts", lambda: native.copy_pages(np.array([a, 0]), [a, a], [8, 8])),
            ("srcs", lambda: native.copy_pages([a], np.array([-a]), [8])),
            ("srcs", lambda: native.copy_pages([a], np.array([float(a)]), [8])),
            ("srcs", lambda: native.copy_pages([a], np.array([[a]]), [8])),
            ("lens", lambda: native.copy_pages([a], [a], np.array([0], dtype=np.uint64))),
            ("groups", lambda: native.copy_pages([a], [a], [8], np.array([1 << 33]))),
            ("groups", lambda: native.copy_pages([a], [a], [8], np.array([3]), ngroups=3)),
        ]
    before = bytes(buf)
    for name, call in cases:
        with pytest.raises(ValueError) as e:
            call()
        assert str(e.value).startswith(name + ":"), (name, str(e.value))
    assert bytes(buf) == before


def test_search_order(monkeypatch):
    here = os.path.dirname(os.path.abspath(native.__file__))
    repo = os.path.dirname(os.path.dirname(os.path.dirname(here)))
    monkeypatch.delenv("KVTIER_NATIVE_LIB", raising=False)
    assert [p for _, p in native._candidates()] == [
        os.path.join(here, "_native", "libkvtiercopy.so"),
        os.path.join(repo, "bin", "libkvtiercopy.so"),
    ]
    assert os.path.isfile(os.path.join(repo, "Makefile")), repo
    monkeypatch.setenv("KVTIER_NATIVE_LIB", "/x/y.so")
    assert [p for _, p in native._candidates()] == ["/x/y.so"]


def test_threads(native_lib):
    """Four threads copying and summing at once (the GIL is released in
    the calls) each get their own right sums."""
    import threading

    results = {}

    def work(t):
        rng = random.Random(SEED + t)
        src = bytearray(rng.randbytes(300000))
        dst = bytearray(300000)
        pieces = _pages(rng, 3, 100000, 8)
        sums = None
        for _ in range(20):
            sums = native.copy_pages([_addr(dst, p * 100000 + o) for p, o, _ in pieces],
                                     [_addr(src, p * 100000 + o) for p, o, _ in pieces],
                                     [n for _, _, n in pieces], [p for p, _, _ in pieces])
        results[t] = (sums, [ref_crc32c(src[p * 100000:(p + 1) * 100000]) for p in range(3)], dst == src)

    ts = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for t in range(4):
        sums, want, same = results[t]
        assert sums == want and same, "seed=%d thread=%d" % (SEED + t, t)


def test_missing_library(native_lib, monkeypatch, tmp_path):
    missing = str(tmp_path / "nope.so")
    monkeypatch.setenv("KVTIER_NATIVE_LIB", missing)
    try:
        importlib.reload(native)
        assert not native.available()
        assert missing in native.why() and "$KVTIER_NATIVE_LIB" in native.why()
        with pytest.raises(RuntimeError, match="libkvtiercopy.so not loaded"):
            native.crc32c(b"abc")
    finally:
        monkeypatch.setenv("KVTIER_NATIVE_LIB", native_lib)
        importlib.reload(native)
    assert native.available(), native.why()


def test_env_accel(native_lib):
    hw = native.set_accel(2)
    code = ("import sys; sys.path.insert(0, %r); from kvtier import native; "
            "print(native.accel(), native.crc32c(bytes(range(256)) * 40))"
            % os.path.dirname(os.path.dirname(os.path.abspath(native.__file__))))
    want_sum = ref_crc32c(bytes(range(256)) * 40)
    for env, want in (("0", 0), ("1", min(1, hw)), ("2", hw), ("", hw), ("7", hw), ("x", hw)):
        e = dict(os.environ, KVTIER_NATIVE_LIB=native_lib, KVTIER_NATIVE_ACCEL=env)
        out = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, check=True).stdout.split()
        assert out == [str(want), str(want_sum)], (env, out)


_PORTABLE_SNIPPET = """
import ctypes, random, sys
sys.path.insert(0, %r)
from kvtier import native
rng = random.Random(%d)
out = [native.accel(), native.set_accel(2)]
for n in (1, 7, 64, 1023, 1025, 12289, 70001):
    src = bytearray(rng.randbytes(n))
    dst = bytearray(n + 3)
    a = ctypes.addressof((ctypes.c_char * len(src)).from_buffer(src))
    b = ctypes.addressof((ctypes.c_char * len(dst)).from_buffer(dst))
    c1 = native.crc32c(bytes(src))
    c2 = native.copy_crc32c(b + 3, a, n, stream=True)
    same = bytes(dst[3:]) == bytes(src)
    h = n // 2
    c3 = c1
    if h:
        dst[:] = bytes(len(dst))
        c3 = native.copy_pages([b + 3, b + 3 + h], [a, a + h], [h, n - h], [0, 0])[0]
        same = same and bytes(dst[3:]) == bytes(src)
    out.append([n, c1, c2, c3, same])
print(repr(out))
"""


def test_portable_build(native_lib, tmp_path):
    """The code for CPUs other than x86-64 (the table alone), built here
    with -DKVTIER_NO_X86, against the reference."""
    import ast
    import shutil

    cc = shutil.which("cc")
    lib = str(tmp_path / "libkvtiercopy-portable.so")
    src = os.path.join(os.path.dirname(os.path.abspath(native.__file__)), "_native", "kvtiercopy.c")
    subprocess.run([cc, "-DKVTIER_NO_X86", "-O2", "-shared", "-fPIC", "-Wall", "-o", lib, src], check=True)
    code = _PORTABLE_SNIPPET % (os.path.dirname(os.path.dirname(os.path.abspath(native.__file__))), SEED)
    e = dict(os.environ, KVTIER_NATIVE_LIB=lib)
    r = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = ast.literal_eval(r.stdout)
    assert out[:2] == [0, 0], out[:2]
    rng = random.Random(SEED)
    for n, c1, c2, c3, same in out[2:]:
        data = rng.randbytes(n)
        want = ref_crc32c(data)
        assert (c1, c2, c3, same) == (want, want, want, True), "seed=%d n=%d" % (SEED, n)


def test_fuzz(native_lib):
    """Random lengths, offsets and splits; every path against the
    reference and against each other."""
    seed = SEED
    rng = random.Random(seed)
    levels = _levels()
    pool = bytearray(random.Random(seed + 1).randbytes(300000))
    out = bytearray(300000 + 128)
    try:
        for case in range(200):
            n = rng.choice([rng.randint(1, 300), rng.randint(1, 5000), rng.randint(1000, 70000),
                            rng.randint(1, 290000)])
            soff = rng.randint(0, len(pool) - n)
            doff = rng.randint(0, 127)
            src = pool[soff:soff + n]
            want = ref_crc32c(src)
            crc0 = rng.getrandbits(32) if rng.random() < 0.3 else 0
            want0 = ref_crc32c(src, crc0) if crc0 else want
            k = rng.randint(1, 9)
            cuts = sorted(rng.randint(0, n) for _ in range(k - 1))
            bounds = [0] + cuts + [n]
            what = "seed=%d case=%d n=%d soff=%d doff=%d cuts=%s" % (seed, case, n, soff, doff, cuts)
            for lv in levels:
                native.set_accel(lv)
                w = "%s level=%d" % (what, lv)
                assert native.crc32c(_addr(pool, soff), n, crc0) == want0, w
                stream = rng.random() < 0.5
                out[:] = bytes(len(out))
                assert native.copy_crc32c(_addr(out, doff), _addr(pool, soff), n, crc0, stream) == want0, w
                assert out[doff:doff + n] == src, w
                pieces = [(b, e - b) for b, e in zip(bounds, bounds[1:]) if e > b]
                out[:] = bytes(len(out))
                sums = native.copy_pages([_addr(out, doff + b) for b, _ in pieces],
                                         [_addr(pool, soff + b) for b, _ in pieces],
                                         [m for _, m in pieces], [0] * len(pieces), stream=stream)
                assert sums == [want], w
                assert out[doff:doff + n] == src, w
    finally:
        native.set_accel(2)


@pytest.mark.skipif(os.environ.get("KVTIER_BENCH") != "1", reason="benchmark: KVTIER_BENCH=1 runs it")
def test_bench_native(native_lib):
    """GB/s of the page copies a client makes, 2.75 MiB pages x 32 a
    round into a rotating 1 GiB destination (out of cache), best of 3:
    torch copy_, ctypes.memmove, the one-pass copy + CRC-32C (plain and
    streaming stores), copy_pages with group sums (each page in 64
    pieces from a layer-major source, as SGLang's layer_first pool),
    memmove then a separate sum (two passes), and the sums alone
    (native on each path, python3-crc32c). Run:
    KVTIER_BENCH=1 /usr/bin/python3 -m pytest -q -s clients/python/tests/test_native.py -k bench"""
    import torch

    page, npages, chunks = 2883584, 32, 64
    chunk = page // chunks
    rounds = int(os.environ.get("KVTIER_BENCH_ROUNDS", "6"))
    src = torch.randint(0, 256, (npages * page,), dtype=torch.uint8)
    dst = torch.zeros(1 << 30, dtype=torch.uint8)
    slots = dst.numel() // page
    sbase, dbase = src.data_ptr(), dst.data_ptr()
    state = {"slot": 0}

    def slot_addrs():
        s = state["slot"]
        if s + npages > slots:
            s = 0
        state["slot"] = s + npages
        return s

    def run(body):
        best = None
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(rounds):
                body(slot_addrs())
            dt = time.perf_counter() - t0
            best = dt if best is None or dt < best else best
        return rounds * npages * page / best / 1e9

    def torch_copy(s):
        for p in range(npages):
            dst[(s + p) * page:(s + p + 1) * page].copy_(src[p * page:(p + 1) * page])

    def memmove(s):
        for p in range(npages):
            ctypes.memmove(dbase + (s + p) * page, sbase + p * page, page)

    def one_pass(stream):
        def body(s):
            for p in range(npages):
                native.copy_crc32c(dbase + (s + p) * page, sbase + p * page, page, stream=stream)
        return body

    def two_pass(s):
        for p in range(npages):
            ctypes.memmove(dbase + (s + p) * page, sbase + p * page, page)
            native.crc32c(dbase + (s + p) * page, page)

    # Layer-major source: chunk c of page p at (c * npages + p) * chunk;
    # the pieces in slab order (page by page), as numpy arrays (a client
    # computes them vectorized), built once per destination slot.
    import numpy as np
    pp, cc = np.meshgrid(np.arange(npages, dtype=np.uint64), np.arange(chunks, dtype=np.uint64), indexing="ij")
    pp, cc = pp.ravel(), cc.ravel()
    src_addrs = sbase + (cc * npages + pp) * chunk
    lens_arr = np.full(npages * chunks, chunk, dtype=np.uint64)
    groups_arr = pp.astype(np.uint32)
    dst_by_slot = {}

    def pieces(s):
        if s not in dst_by_slot:
            dst_by_slot[s] = dbase + (s + pp) * page + cc * chunk
        return dst_by_slot[s], src_addrs, lens_arr, groups_arr

    def copyv(stream, groups=True):
        def body(s):
            d, sr, ln, g = pieces(s)
            native.copy_pages(d, sr, ln, g if groups else None, stream=stream)
        return body

    def memmove_pieces(s):
        d, sr, _, _ = pieces(s)
        for i in range(len(sr)):
            ctypes.memmove(int(d[i]), int(sr[i]), chunk)

    def crc_native(s):
        for p in range(npages):
            native.crc32c(sbase + p * page, page)

    srcmv = memoryview(src.numpy())

    def crc_py(s):
        for p in range(npages):
            _ref_mod.crc32c(srcmv[p * page:(p + 1) * page])

    rows = [
        ("torch copy_", run(torch_copy)),
        ("ctypes.memmove (the limit)", run(memmove)),
        ("ctypes.memmove per piece (64 pieces/page, layer-major src)", run(memmove_pieces)),
        ("copy_pages, no sums (vectored memmove)", run(copyv(False, False))),
        ("copy_pages, no sums, stream=True", run(copyv(True, False))),
        ("kvtier_copy_crc32c", run(one_pass(False))),
        ("kvtier_copy_crc32c_nt (stream=True)", run(one_pass(True))),
        ("copy_pages + group sums", run(copyv(False))),
        ("copy_pages + group sums, stream=True", run(copyv(True))),
        ("memmove then kvtier_crc32c (two passes)", run(two_pass)),
    ]
    hw = native.set_accel(2)
    try:
        for lv in range(hw, -1, -1):
            native.set_accel(lv)
            rows.append(("kvtier_crc32c alone, path %d" % lv, run(crc_native)))
        for lv in range(hw - 1, -1, -1):
            native.set_accel(lv)
            rows.append(("kvtier_copy_crc32c, path %d" % lv, run(one_pass(False))))
    finally:
        native.set_accel(2)
    if _ref_mod is not None:
        rows.append(("python3-crc32c alone", run(crc_py)))
    # The Python cost of one batch of 128 pages x 64 pieces: building the
    # lists the client would, and copy_pages' validation + arrays (with
    # 1-byte pieces, so the copies cost nothing).
    n = 128 * 64
    t0 = time.perf_counter()
    for _ in range(20):
        d = [dbase + i * 64 for i in range(n)]
        sr = [sbase + i for i in range(n)]
        ln = [1] * n
        g = [i // 64 for i in range(n)]
    t_lists = (time.perf_counter() - t0) / 20
    t0 = time.perf_counter()
    for _ in range(20):
        native.copy_pages(d, sr, ln, g)
    t_call = (time.perf_counter() - t0) / 20
    da, sa = np.array(d, dtype=np.uint64), np.array(sr, dtype=np.uint64)
    la, ga = np.array(ln, dtype=np.uint64), np.array(g, dtype=np.uint32)
    t0 = time.perf_counter()
    for _ in range(20):
        native.copy_pages(da, sa, la, ga)
    t_np = (time.perf_counter() - t0) / 20
    t0 = time.perf_counter()
    for _ in range(20):
        native.copy_pages(d[:1], sr[:1], ln[:1], g[:1])
    t_one = (time.perf_counter() - t0) / 20
    lim = rows[1][1]
    print("\naccel path %d; %d rounds of %d x %d-byte pages into a %d-slot destination, best of 3"
          % (hw, rounds, npages, page, slots))
    for name, gbs in rows:
        print("%-58s %6.2f GB/s  %5.2fx memmove" % (name, gbs, gbs / lim))
    print("128 pages x 64 pieces: building the lists %.0f us; copy_pages (1-byte pieces) from lists "
          "%.0f us, from numpy arrays %.0f us; one piece %.1f us"
          % (t_lists * 1e6, t_call * 1e6, t_np * 1e6, t_one * 1e6))
