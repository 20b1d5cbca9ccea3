"""The deterministic test payload of a page, exactly as kvtier's Go
``host.Payload``: a splitmix64 stream seeded by the page hash and the
payload kind. kvtier's synthetic engines (``kvtier loadgen``, the Python
connector's tests) write it into every page they compute and compare every
page they load against it, so a wrong byte anywhere is caught.
"""

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_MASK = (1 << 64) - 1


def _seed(h, kind):
    if len(h) != 32:
        raise ValueError("page hash of %d bytes, want 32" % len(h))
    w = [int.from_bytes(h[i:i + 8], "little") for i in range(0, 32, 8)]
    s = w[0] ^ ((w[1] * 0x9E3779B97F4A7C15) & _MASK) ^ ((w[2] << 1) & _MASK) ^ ((w[3] << 2) & _MASK) ^ ((kind << 56) & _MASK)
    return s & _MASK


def payload(h, kind, n):
    """Returns the n payload bytes of page hash h (32 bytes), kind."""
    if n < 0:
        raise ValueError("negative length %d" % n)
    s0 = _seed(h, kind)
    words = n // 8
    with np.errstate(over="ignore"):
        i = np.arange(1, words + 1, dtype=np.uint64)
        z = np.uint64(s0) + i * _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        z = z ^ (z >> np.uint64(31))
    out = bytearray(z.astype("<u8").tobytes())
    s = (s0 + words * 0x9E3779B97F4A7C15) & _MASK
    for i in range(words * 8, n):
        out.append((s >> (8 * (i % 8))) & 0xFF)
    return bytes(out)
