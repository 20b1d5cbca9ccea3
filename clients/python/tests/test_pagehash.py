"""Tests of kvtier.pagehash: every vector of docs/page-hashes.md (parsed from
the document, so a new vector is tested automatically), a cross-check with
kvtier's Go pagehash package on seeded random sequences, and the refusal of
bad input.

Run from the repository root: /usr/bin/python3 -m pytest -q clients/python/tests
"""

import hashlib
import os
import random
import shutil
import struct
import subprocess

import pytest

from kvtier import pagehash

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
DOC = os.path.join(REPO, "docs", "page-hashes.md")


class DocVector:
    """One test vector of the document."""

    def __init__(self, line):
        self.line = line
        self.name = ""
        self.page_tokens = None
        self.tokens = None
        self.hashes = []
        self.none = False

    def __repr__(self):
        return f"{os.path.relpath(DOC, REPO)}:{self.line} ({self.name})"


def parse_tokens(s):
    """Space-separated tokens and inclusive ranges a..b (the grammar of
    pagehash/vectors_test.go's parseTokens)."""
    out = []
    for f in s.split():
        lo, sep, hi = f.partition("..")
        a = int(lo)
        b = int(hi) if sep else a
        if not (0 <= a <= b <= 0xFFFFFFFF) or b - a > 1 << 20:
            raise ValueError(f"bad token or range {f!r}")
        out.extend(range(a, b + 1))
    return out


def parse_vectors(path):
    """Read the ```vectors block of the page-hash document, with the grammar
    of pagehash/vectors_test.go's parseVectors. Errors name the line."""
    out, cur, inside = [], None, False
    with open(path, encoding="utf-8") as f:
        for n, raw in enumerate(f, 1):
            line = raw.strip()
            if line == "```vectors":
                inside = True
                continue
            if not inside:
                continue
            if line == "```":
                return out
            if line == "":
                cur = None
                continue
            if cur is None:
                cur = DocVector(n)
                out.append(cur)
            if line.startswith("#"):
                cur.name = (cur.name + " " + line[1:].strip()).strip()
                continue
            key, sep, val = line.partition(":")
            if not sep:
                raise ValueError(f'{path}:{n}: want "key: value", got {line!r}')
            val = val.strip()
            try:
                if key == "page_tokens":
                    cur.page_tokens = int(val)
                elif key == "tokens":
                    cur.tokens = parse_tokens(val)
                elif key == "hashes" and val == "none":
                    cur.none = True
                elif key == f"h[{len(cur.hashes)}]":
                    cur.hashes.append(val)
                else:
                    raise ValueError(f"unexpected key {key!r} (next hash is h[{len(cur.hashes)}])")
            except ValueError as e:
                raise ValueError(f"{path}:{n}: {e}") from None
    raise ValueError(f"{path}: no closed ```vectors block")


VECTORS = parse_vectors(DOC)


def test_document_has_vectors():
    assert len(VECTORS) >= 5, f"{DOC} has {len(VECTORS)} vectors, want at least 5"
    sizes = {v.page_tokens for v in VECTORS}
    assert 512 in sizes and len(sizes) >= 3, f"vectors cover page sizes {sorted(sizes)}"


@pytest.mark.parametrize("v", VECTORS, ids=repr)
def test_document_vector(v):
    assert v.page_tokens and v.page_tokens > 0 and v.tokens is not None, f"{v!r}: incomplete vector"
    assert v.hashes or v.none, f'{v!r}: no hashes and no "hashes: none"'
    got = [pagehash.to_hex(h) for h in pagehash.chain(v.tokens, v.page_tokens)]
    assert got == v.hashes, f"{v!r}"
    if _np is not None:
        arr = _np.array(v.tokens, dtype=_np.uint32)
        assert [pagehash.to_hex(h) for h in pagehash.chain(arr, v.page_tokens)] == v.hashes, f"{v!r} (numpy)"


try:
    import numpy as _np
except ImportError:  # pragma: no cover
    _np = None


def test_next_matches_definition():
    # h[0] of the worked example: SHA-256 of 32 zero bytes, le32(1), le32(2).
    want = hashlib.sha256(bytes(32) + struct.pack("<2I", 1, 2)).digest()
    assert pagehash.next_hash(pagehash.ROOT, [1, 2]) == want
    assert pagehash.chain([1, 2, 3], 2) == [want]
    # Chaining after a given prev equals continuing the chain.
    full = pagehash.chain(list(range(12)), 3)
    assert pagehash.chain(list(range(6, 12)), 3, prev=full[1]) == full[2:]


def test_hex_round_trip():
    h = pagehash.chain([7] * 4, 4)[0]
    s = pagehash.to_hex(h)
    assert len(s) == 64 and s == s.lower()
    assert pagehash.parse(s) == h
    assert pagehash.parse(s.upper()) == h
    assert pagehash.short(h) == s[:16]


# Cross-check with Go on seeded random sequences.
SEED = int(os.environ.get("KVTIER_PAGEHASH_SEED", "20261203"))
CASES = 300
PAGE_SIZES = [1, 2, 3, 4, 7, 16, 64, 512]
EDGES = [0, 1, 255, 256, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFE, 0xFFFFFFFF]


def random_cases(seed, n):
    """Seeded (page_tokens, prev, tokens) cases: every page size, lengths
    with and without a partial page, edge tokens mixed with random ones,
    prev either ROOT or random."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        p = rng.choice(PAGE_SIZES)
        length = rng.randrange(0, 4 * p + p)
        tokens = [rng.choice(EDGES) if rng.random() < 0.2 else rng.getrandbits(32) for _ in range(length)]
        prev = pagehash.ROOT if rng.random() < 0.5 else rng.getrandbits(256).to_bytes(32, "little")
        out.append((p, prev, tokens))
    return out


def go_hashes(cases):
    """Run the Go pagehash through clients/python/tests/gohashes."""
    go = shutil.which("go")
    if go is None:
        pytest.skip("go is not on PATH: the cross-check with Go's pagehash needs it (the document vectors still ran)")
    stdin = "".join(f"{p} {prev.hex()} {' '.join(map(str, toks))}\n" for p, prev, toks in cases)
    proc = subprocess.run(
        [go, "run", "./clients/python/tests/gohashes"],
        cwd=REPO, input=stdin, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, f"go run gohashes failed ({proc.returncode}): {proc.stderr}"
    lines = proc.stdout.splitlines()
    assert len(lines) == len(cases), f"gohashes printed {len(lines)} lines for {len(cases)} cases"
    return [[] if line == "-" else line.split() for line in lines]


def test_cross_check_with_go():
    cases = random_cases(SEED, CASES)
    want = go_hashes(cases)
    for i, ((p, prev, tokens), w) in enumerate(zip(cases, want)):
        got = [pagehash.to_hex(h) for h in pagehash.chain(tokens, p, prev=prev)]
        assert got == w, (
            f"seed {SEED} (KVTIER_PAGEHASH_SEED), case {i}: page_tokens {p}, {len(tokens)} tokens, "
            f"prev {prev.hex()}: Python {got}, Go {w}"
        )
        if _np is not None:
            arr = _np.array(tokens, dtype=_np.int64)
            assert [pagehash.to_hex(h) for h in pagehash.chain(arr, p, prev=prev)] == w, (
                f"seed {SEED}, case {i}: numpy int64 array differs from Go"
            )


@pytest.mark.parametrize(
    "call, exc, msg",
    [
        (lambda: pagehash.chain([1, -1], 1), ValueError, "tokens[1] = -1: outside [0, 2**32)"),
        (lambda: pagehash.chain([1, 2, 2**32], 2), ValueError, "tokens[2] = 4294967296"),
        (lambda: pagehash.chain([1, 2.5], 1), TypeError, "tokens[1]: want an int, got float"),
        (lambda: pagehash.chain([1, "2"], 1), TypeError, "tokens[1]: want an int, got str"),
        (lambda: pagehash.chain([1], 0), ValueError, "page_tokens must be positive, got 0"),
        (lambda: pagehash.chain([1], -3), ValueError, "page_tokens must be positive"),
        (lambda: pagehash.chain([1], "1"), TypeError, "page_tokens: want an int"),
        (lambda: pagehash.chain([1], True), ValueError, "page_tokens must be positive"),
        (lambda: pagehash.chain([1], 1, prev=b"short"), ValueError, "prev: want 32 bytes, got 5"),
        (lambda: pagehash.next_hash(None, [1]), TypeError, "prev: want 32 bytes"),
        (lambda: pagehash.parse("ab"), ValueError, "want 64 hex characters, got 2"),
        (lambda: pagehash.parse("zz" * 32), ValueError, "page hash"),
        (lambda: pagehash.parse(b"00" * 32), TypeError, "want a str"),
    ],
)
def test_bad_input(call, exc, msg):
    with pytest.raises(exc) as e:
        call()
    assert msg in str(e.value)


@pytest.mark.skipif(_np is None, reason="numpy is not installed")
@pytest.mark.parametrize(
    "arr, exc, msg",
    [
        (lambda np: np.array([1, -1], dtype=np.int64), ValueError, "tokens[1] = -1"),
        (lambda np: np.array([2**32], dtype=np.int64), ValueError, "tokens[0] = 4294967296"),
        (lambda np: np.array([1.0, 2.0]), TypeError, "want an integer array, got dtype float64"),
        (lambda np: np.zeros((2, 2), dtype=np.uint32), ValueError, "want a 1-D array"),
    ],
)
def test_bad_numpy_input(arr, exc, msg):
    with pytest.raises(exc) as e:
        pagehash.chain(arr(_np), 1)
    assert msg in str(e.value)


def test_partial_page_token_is_checked():
    # A bad token in the trailing partial page is refused too, though that
    # page is never hashed.
    with pytest.raises(ValueError, match=r"tokens\[2\]"):
        pagehash.chain([1, 2, -5], 2)
    assert pagehash.chain([1, 2, 3], 4) == []
    assert pagehash.chain([], 4) == []
