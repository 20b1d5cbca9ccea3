"""CRC-32C (Castagnoli) of the pages an engine writes into the slab, for
``Completion.sums`` of the engine API (docs/engine-api.md, "Page
checksums").

The sums are optional: they come from Debian's ``python3-crc32c`` module
(``import crc32c``, hardware CRC instructions where the CPU has them).
Without it :func:`available` is False and :func:`plan_sums` returns None:
the client then sends no sums and serve's tiers compute their own, as
before the field existed.
"""

try:
    import crc32c as _crc32c
except ImportError:  # python3-crc32c not installed: no sums
    _crc32c = None


def available():
    """Whether sums can be computed (python3-crc32c is installed)."""
    return _crc32c is not None


def crc32c(buf):
    """The CRC-32C of a bytes-like object (bytes, memoryview, a contiguous
    numpy array); raises RuntimeError without python3-crc32c."""
    if _crc32c is None:
        raise RuntimeError("CRC-32C needs Debian's python3-crc32c (import crc32c)")
    return _crc32c.crc32c(buf)


def plan_sums(spans):
    """The sums of a TO_SLAB plan: the CRC-32C of each item's slab span
    after the copy, in the plan's item order, or None without
    python3-crc32c."""
    if _crc32c is None:
        return None
    return [_crc32c.crc32c(sp) for sp in spans]
