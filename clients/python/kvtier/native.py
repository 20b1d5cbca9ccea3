"""Copy + CRC-32C (Castagnoli) in one pass, through kvtier's small C
library ``libkvtiercopy.so`` (``kvtier/_native/kvtiercopy.c``) and ctypes.

The clients copy pages between the engine's host pool and kvtier's slab;
with this module they also get each page's CRC-32C for ``Completion.sums``
while copying, reading the source once (AVX-512 VPCLMULQDQ folding where
the CPU has it, else the SSE 4.2 CRC32 instruction, else a table).

Where the library is looked for, in order, and nowhere else (nothing is
compiled at import; ``make native`` builds ``bin/libkvtiercopy.so``):

1. ``$KVTIER_NATIVE_LIB``: when set it is the only candidate, so a wrong
   path is reported by :func:`why` instead of another copy being loaded;
2. ``_native/libkvtiercopy.so`` beside this file (an installed package);
3. ``<repo root>/bin/libkvtiercopy.so``, the repo root being three levels
   above this file (a checkout built with ``make build``).

The library is loaded at the first call of any function here (so a test
may set ``$KVTIER_NATIVE_LIB`` after importing this module) and kept.

Every C call goes through :class:`ctypes.CDLL`, which releases the GIL
for the call: other Python threads run while a batch copies.

Lengths: the buffer form of :func:`crc32c` takes an empty buffer (its sum
is ``crc``); an address with a length, in every function, needs the
length positive (a zero-length piece of a page is a caller's bug here).
Bad arguments raise ValueError naming the argument before any C call.
"""

import array
import ctypes
import os

__all__ = [
    "available", "why", "accel", "set_accel", "library_path",
    "crc32c", "copy_crc32c", "copy_pages",
]

_LIBNAME = "libkvtiercopy.so"
_U64_MAX = (1 << 64) - 1
_U32_MAX = (1 << 32) - 1

_lib = None        # the loaded CDLL
_path = None       # its path
_why = None        # why it is not loaded ("" when loaded; None: not tried)


def _candidates():
    env = os.environ.get("KVTIER_NATIVE_LIB")
    if env:
        return [("$KVTIER_NATIVE_LIB", env)]
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(os.path.dirname(here)))
    return [
        ("package", os.path.join(here, "_native", _LIBNAME)),
        ("repo bin", os.path.join(repo, "bin", _LIBNAME)),
    ]


def _bind(lib):
    c = ctypes
    lib.kvtier_crc32c.restype = c.c_uint32
    lib.kvtier_crc32c.argtypes = [c.c_uint32, c.c_void_p, c.c_size_t]
    for f in (lib.kvtier_copy_crc32c, lib.kvtier_copy_crc32c_nt):
        f.restype = c.c_uint32
        f.argtypes = [c.c_uint32, c.c_void_p, c.c_void_p, c.c_size_t]
    for f in (lib.kvtier_copyv_crc32c, lib.kvtier_copyv_crc32c_nt):
        f.restype = None
        # Arrays go as addresses (c_void_p): array.array's buffer_info().
        f.argtypes = [c.c_size_t, c.c_void_p, c.c_void_p, c.c_void_p, c.c_void_p, c.c_void_p]
    lib.kvtier_native_accel.restype = c.c_int
    lib.kvtier_native_accel.argtypes = []
    lib.kvtier_native_set_accel.restype = c.c_int
    lib.kvtier_native_set_accel.argtypes = [c.c_int]


def _load():
    global _lib, _path, _why
    if _why is not None:
        return _lib
    tried = []
    for what, p in _candidates():
        if not os.path.exists(p):
            tried.append("%s %s: no such file" % (what, p))
            continue
        try:
            lib = ctypes.CDLL(p)
            _bind(lib)
        except (OSError, AttributeError) as e:
            tried.append("%s %s: %s" % (what, p, e))
            continue
        _lib, _path, _why = lib, p, ""
        return _lib
    _why = "libkvtiercopy.so not loaded (make native builds bin/%s): %s" % (_LIBNAME, "; ".join(tried))
    return None


def _need():
    lib = _load()
    if lib is None:
        raise RuntimeError(_why)
    return lib


def available():
    """Whether the library is loaded (loading it at the first call)."""
    return _load() is not None


def why():
    """Why the library is not available ("" when it is): every place
    looked at and what went wrong there."""
    _load()
    return _why


def library_path():
    """The path of the loaded library, or None."""
    _load()
    return _path


def accel():
    """The path in use: 2 AVX-512 VPCLMULQDQ folding, 1 SSE 4.2 CRC32
    instruction, 0 portable table. RuntimeError without the library."""
    return _need().kvtier_native_accel()


def set_accel(level):
    """Caps the path at ``level`` (0, 1 or 2) within what the CPU has and
    returns the path now in use; for tests and benchmarks (it changes the
    path of every thread: call it with no copy running)."""
    if not isinstance(level, int) or level < 0 or level > 2:
        raise ValueError("level: want 0, 1 or 2, got %r" % (level,))
    return _need().kvtier_native_set_accel(level)


def _check_addr(name, v):
    if not isinstance(v, int) or isinstance(v, bool):
        raise ValueError("%s: want an int address, got %s" % (name, type(v).__name__))
    if v <= 0 or v > _U64_MAX:
        raise ValueError("%s: address %#x is not a valid pointer" % (name, v))


def _check_len(name, n):
    if not isinstance(n, int) or isinstance(n, bool):
        raise ValueError("%s: want an int length, got %s" % (name, type(n).__name__))
    if n <= 0 or n > _U64_MAX:
        raise ValueError("%s: length %d is not positive" % (name, n))


def _check_crc(crc):
    if not isinstance(crc, int) or isinstance(crc, bool) or crc < 0 or crc > _U32_MAX:
        raise ValueError("crc: want a uint32, got %r" % (crc,))


def _buffer(buf, n):
    """(ctypes argument, usable length, keepalive) for a bytes-like buf."""
    if isinstance(buf, bytes):
        size = len(buf)
        arg, keep = buf, buf
    else:
        try:
            mv = memoryview(buf)
        except TypeError:
            raise ValueError("buf: want a bytes-like object or an int address, got %s"
                             % type(buf).__name__) from None
        if not mv.c_contiguous:
            raise ValueError("buf: not C-contiguous")
        mv = mv.cast("B") if mv.ndim != 1 or mv.format != "B" else mv
        size = mv.nbytes
        if size == 0:
            arg, keep = None, mv
        elif not mv.readonly:
            keep = (ctypes.c_char * size).from_buffer(mv)
            arg = ctypes.addressof(keep)
        else:
            # A read-only view other than bytes (a slice of bytes, an
            # mmap opened read-only): numpy gives its address.
            try:
                import numpy as np
            except ImportError:
                raise ValueError("buf: read-only %s needs numpy for its address: pass bytes, "
                                 "a writable buffer or an int address" % type(buf).__name__) from None
            keep = np.frombuffer(mv, dtype=np.uint8)
            arg = keep.ctypes.data
    if n is None:
        n = size
    else:
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError("n: want a non-negative int, got %r" % (n,))
        if n > size:
            raise ValueError("n: %d is past the end of the %d-byte buf" % (n, size))
    return arg, n, keep


def crc32c(buf_or_addr, n=None, crc=0):
    """The CRC-32C of the bytes whose CRC-32C is ``crc`` followed by the
    first ``n`` bytes of ``buf_or_addr`` (all of it when n is None), like
    Go's crc32.Update with the Castagnoli table: ``crc32c(b)`` is the
    CRC-32C of b and ``crc32c(b2, crc=crc32c(b1)) == crc32c(b1 + b2)``.

    ``buf_or_addr`` is a bytes-like object (bytes, bytearray, memoryview,
    a contiguous numpy array) or an int address, with ``n`` > 0 then
    (a torch tensor: ``t.data_ptr()``, ``t.numel() * t.element_size()``)."""
    _check_crc(crc)
    if isinstance(buf_or_addr, int) and not isinstance(buf_or_addr, bool):
        _check_addr("buf_or_addr", buf_or_addr)
        if n is None:
            raise ValueError("n: an address needs a length")
        _check_len("n", n)
        return _need().kvtier_crc32c(crc, buf_or_addr, n)
    arg, n, keep = _buffer(buf_or_addr, n)
    if n == 0:
        return crc
    r = _need().kvtier_crc32c(crc, arg, n)
    del keep
    return r


def copy_crc32c(dst_addr, src_addr, n, crc=0, stream=False):
    """Copies ``n`` bytes from address ``src_addr`` to ``dst_addr`` (as
    memmove) and returns ``crc32c(src_addr, n, crc)`` of the bytes as
    they were in src: the copy and the sum in one pass over src.

    ``stream=True`` stores with non-temporal stores (dst is not pulled
    into the cache; fenced before return), meant for large copies into
    memory not read again soon. Off by default: on the VM it was measured
    on, the copy with the sum ran 0.75-0.9x of the ordinary stores
    (docs/perf.md, "Native copy+CRC-32C for the Python clients")."""
    _check_addr("dst_addr", dst_addr)
    _check_addr("src_addr", src_addr)
    _check_len("n", n)
    _check_crc(crc)
    lib = _need()
    f = lib.kvtier_copy_crc32c_nt if stream else lib.kvtier_copy_crc32c
    return f(crc, dst_addr, src_addr, n)


def _numpy_array(seq):
    """seq when it is a numpy array (numpy is imported only then)."""
    if type(seq).__name__ != "ndarray":
        return None
    import numpy as np
    return seq if isinstance(seq, np.ndarray) else None


def _ints(name, seq, code, positive):
    """(keepalive, address, max item) of seq as a C array of uint64
    (code "Q") or uint32 ("I"), every item checked: an int in range, not
    0 where positive. A numpy integer array is checked and converted
    vectorized (no copy when it is already contiguous of that type);
    anything else goes through array.array."""
    a = _numpy_array(seq)
    if a is not None:
        import numpy as np
        if a.ndim != 1 or a.dtype.kind not in "iu":
            raise ValueError("%s: want a 1-D integer array, got %s of %s" % (name, a.shape, a.dtype))
        if len(a) == 0:
            return a, 0, -1
        if a.dtype.kind == "i" and a.min() < 0:
            raise ValueError("%s: item %d is negative" % (name, int(np.argmin(a))))
        top = int(a.max())
        if code == "I" and top > _U32_MAX:
            raise ValueError("%s: item %d is past 2**32" % (name, int(np.argmax(a))))
        a = np.ascontiguousarray(a, dtype=np.uint64 if code == "Q" else np.uint32)
        if positive and not a.all():
            raise ValueError("%s: item %d is 0" % (name, int(np.argmin(a != 0))))
        return a, a.ctypes.data, top
    try:
        a = seq if isinstance(seq, array.array) and seq.typecode == code else array.array(code, seq)
    except (OverflowError, TypeError) as e:
        raise ValueError("%s: every item must be an int in [0, 2**%d): %s"
                         % (name, 64 if code == "Q" else 32, e)) from None
    if len(a) == 0:
        return a, 0, -1
    if positive and min(a) == 0:
        raise ValueError("%s: item %d is 0" % (name, a.index(0)))
    return a, a.buffer_info()[0], max(a) if code == "I" else None


def copy_pages(dsts, srcs, lens, groups=None, ngroups=None, stream=False):
    """Copies piece i, ``lens[i]`` bytes from address ``srcs[i]`` to
    ``dsts[i]``, for every i in order, in ONE C call (GIL released), and
    with ``groups`` sums each piece into its group's CRC-32C:
    ``sums[groups[i]] = crc32c(srcs[i], lens[i], sums[groups[i]])`` from
    sums all 0, so a page split in pieces (given in the order of its
    bytes) gets the CRC-32C of the whole page. Returns the ``ngroups``
    sums as a list of ints (ngroups defaults to max(groups) + 1), or None
    without ``groups`` (a plain vectored copy).

    The sequences are parallel, of equal length: lists of ints,
    array.array ('Q'; 'I' for groups: taken as they are), 1-D numpy
    integer arrays (checked and converted vectorized: the cheap way for
    thousands of pieces, no copy when already uint64 / uint32), or any
    iterable of ints. ``stream=True``: non-temporal stores as in
    :func:`copy_crc32c`; measured (docs/perf.md) to pay for a plain
    vectored copy into the slab (no groups: 1.00-1.13x memmove against
    0.78-0.87x) and to cost with the sums (0.79-0.84x against
    0.92-0.97x)."""
    n = len(dsts)
    if len(srcs) != n:
        raise ValueError("srcs: %d items, dsts has %d" % (len(srcs), n))
    if len(lens) != n:
        raise ValueError("lens: %d items, dsts has %d" % (len(lens), n))
    if groups is not None and len(groups) != n:
        raise ValueError("groups: %d items, dsts has %d" % (len(groups), n))
    d = _ints("dsts", dsts, "Q", True)
    s = _ints("srcs", srcs, "Q", True)
    ln = _ints("lens", lens, "Q", True)
    sums = g = None
    if groups is not None:
        g = _ints("groups", groups, "I", False)
        top = g[2] + 1
        if ngroups is None:
            ngroups = top
        elif not isinstance(ngroups, int) or isinstance(ngroups, bool) or ngroups < 0 or ngroups > _U32_MAX:
            raise ValueError("ngroups: want an int in [0, 2**32), got %r" % (ngroups,))
        elif top > ngroups:
            raise ValueError("groups: item %d is %d, not below ngroups %d"
                             % (list(g[0]).index(top - 1), top - 1, ngroups))
        sums = array.array("I", bytes(4 * ngroups))
    elif ngroups is not None:
        raise ValueError("ngroups: given without groups")
    if n == 0:
        return None if sums is None else list(sums)
    lib = _need()
    f = lib.kvtier_copyv_crc32c_nt if stream else lib.kvtier_copyv_crc32c
    f(n, d[1], s[1], ln[1], None if sums is None else g[1],
      None if sums is None else sums.buffer_info()[0])
    return None if sums is None else sums.tolist()
