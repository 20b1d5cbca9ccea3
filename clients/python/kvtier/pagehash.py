"""Prefix-chained page hashes, identical to kvtier's Go ``pagehash`` package.

A sequence of tokens (unsigned 32-bit integers) is cut into pages of
``page_tokens`` tokens; only whole pages are hashed::

    h[-1] = 32 zero bytes
    h[i]  = SHA-256(h[i-1] || le32(t[i*P]) || ... || le32(t[i*P+P-1]))

so one hash names one position in one prefix. ``docs/page-hashes.md`` is
the specification and holds the test vectors; this module must never change
the bytes it hashes.

Tokens may be any sequence of Python ints or a NumPy integer array. A token
outside [0, 2**32) is refused with a ValueError naming its index, never
wrapped. Go's ``pagehash`` defines no namespace or key derivation beyond the
chain, so neither does this module.
"""

import hashlib
import operator
import struct

try:  # NumPy is optional: arrays are encoded without a Python loop.
    import numpy as _np
except ImportError:  # pragma: no cover - exercised only without numpy
    _np = None

__all__ = ["ROOT", "SIZE", "chain", "next_hash", "parse", "short", "to_hex"]

#: Length of a page hash in bytes.
SIZE = 32

#: h[-1], the hash before the first page of every sequence.
ROOT = bytes(SIZE)

_MAX_TOKEN = 0xFFFFFFFF


def _check_prev(prev):
    try:
        b = bytes(prev)
    except TypeError:
        raise TypeError(f"prev: want {SIZE} bytes, got {type(prev).__name__}") from None
    if len(b) != SIZE:
        raise ValueError(f"prev: want {SIZE} bytes, got {len(b)}")
    return b


def _encode(tokens):
    """Return tokens as little-endian uint32 bytes, refusing a token that is
    not an integer in [0, 2**32) with an error naming its index."""
    if _np is not None and isinstance(tokens, _np.ndarray):
        if tokens.ndim != 1:
            raise ValueError(f"tokens: want a 1-D array, got shape {tokens.shape}")
        if tokens.dtype.kind not in "iu":
            raise TypeError(f"tokens: want an integer array, got dtype {tokens.dtype}")
        if tokens.size:
            bad = _np.flatnonzero((tokens < 0) | (tokens > _MAX_TOKEN))
            if bad.size:
                i = int(bad[0])
                raise ValueError(f"tokens[{i}] = {int(tokens[i])}: outside [0, 2**32)")
        return tokens.astype("<u4", copy=False).tobytes()
    tokens = list(tokens)
    try:
        return struct.pack(f"<{len(tokens)}I", *tokens)
    except struct.error:
        pass
    # Find the offending token for the message (only on the error path).
    for i, t in enumerate(tokens):
        try:
            v = operator.index(t)
        except TypeError:
            raise TypeError(f"tokens[{i}]: want an int, got {type(t).__name__}") from None
        if not 0 <= v <= _MAX_TOKEN:
            raise ValueError(f"tokens[{i}] = {v}: outside [0, 2**32)")
    raise ValueError("tokens: cannot encode as uint32")  # pragma: no cover


def _check_page_tokens(page_tokens):
    try:
        p = operator.index(page_tokens)
    except TypeError:
        raise TypeError(f"page_tokens: want an int, got {type(page_tokens).__name__}") from None
    if isinstance(page_tokens, bool) or p <= 0:
        raise ValueError(f"page_tokens must be positive, got {page_tokens!r}")
    return p


def next_hash(prev, tokens):
    """Return the hash of the page holding ``tokens``, chained after ``prev``
    (32 bytes; ``ROOT`` for the first page). Go: ``pagehash.Next``."""
    d = hashlib.sha256(_check_prev(prev))
    d.update(_encode(tokens))
    return d.digest()


def chain(tokens, page_tokens, prev=ROOT):
    """Return the hashes (32-byte ``bytes``) of the whole pages of ``tokens``,
    chained after ``prev``. A trailing partial page is not hashed.
    Go: ``pagehash.Chain``."""
    p = _check_page_tokens(page_tokens)
    h = _check_prev(prev)
    # Every token is checked, the trailing partial page's too: a bad token
    # is an error wherever it is.
    data = memoryview(_encode(tokens))
    n = len(data) // (4 * p)
    step = 4 * p
    out = []
    for i in range(n):
        d = hashlib.sha256(h)
        d.update(data[i * step : (i + 1) * step])
        h = d.digest()
        out.append(h)
    return out


def to_hex(h):
    """Return the 64 lowercase hex characters of a hash. Go: ``Hash.String``."""
    return _check_prev(h).hex()


def short(h):
    """Return the first 8 bytes of a hash in hex, for logs. Go: ``Hash.Short``."""
    return _check_prev(h)[:8].hex()


def parse(s):
    """Decode 64 hex characters into a hash. Go: ``pagehash.Parse``."""
    if not isinstance(s, str):
        raise TypeError(f"page hash: want a str, got {type(s).__name__}")
    if len(s) != 2 * SIZE:
        raise ValueError(f"page hash {s[:80]!r}: want {2 * SIZE} hex characters, got {len(s)}")
    try:
        return bytes.fromhex(s)
    except ValueError as e:
        raise ValueError(f"page hash {s!r}: {e}") from None
