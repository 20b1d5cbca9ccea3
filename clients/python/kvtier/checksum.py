"""CRC-32C (Castagnoli) of the pages an engine writes into the slab, for
``Completion.sums`` of the engine API (docs/engine-api.md, "Page
checksums").

The sums are optional. They come from kvtier's native library
(:mod:`kvtier.native`: the AVX-512 fold, several times a copy's speed)
when it is built and found, else from Debian's ``python3-crc32c`` module
(``import crc32c``; about 2 GB/s here, its software path). Without
either :func:`available` is False and :func:`plan_sums` returns None:
the client then sends no sums and serve's tiers compute their own, as
before the field existed.
"""

from kvtier import native as _native

try:
    import crc32c as _crc32c
except ImportError:  # python3-crc32c not installed
    _crc32c = None


def source():
    """Which implementation sums: "native", "python3-crc32c" or None."""
    if _native.available():
        return "native"
    if _crc32c is not None:
        return "python3-crc32c"
    return None


def available():
    """Whether sums can be computed (the native library or python3-crc32c)."""
    return source() is not None


def crc32c(buf):
    """The CRC-32C of a bytes-like object (bytes, memoryview, a contiguous
    numpy array); RuntimeError when neither implementation is there."""
    s = source()
    if s == "native":
        return _native.crc32c(buf)
    if s is None:
        raise RuntimeError("CRC-32C needs kvtier's native library (make native; %s) or Debian's python3-crc32c"
                           % _native.why())
    return _crc32c.crc32c(buf)


def plan_sums(spans):
    """The sums of a TO_SLAB plan: the CRC-32C of each item's slab span
    after the copy, in the plan's item order, or None when no
    implementation is there."""
    if not available():
        return None
    return [crc32c(sp) for sp in spans]
