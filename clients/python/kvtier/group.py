"""The engine as kvtier's group transport (``kvtier serve --group engine``).

With that transport every Step reply of a rank carries its contribution to
the next tick, and the rank's next Step must carry the frontier: the
element-wise MIN of the counters of every rank's contribution, the AND of
their ok bits. An engine computes it with its own collective (for example
``torch.distributed.all_gather_object`` of the bytes, then
``reduce_contributions`` on every rank) or, in one process,
``reduce_contributions`` directly.

The wire format is kvtier's (host/consensus/codec.go), little endian::

    0  magic "KVC1"
    4  kind (1 contribution, 2 frontier), flags (bit 0: digest), 2 zero bytes
    8  group id u64, stack id u64, tick u64
    32 rank u32 (0xffffffff for a frontier), group size u32
    40 classes u16, structures u16, ok bits u32, reloads u32
    52 counts: classes x 4 x u64, ok bits in u64 words, reloads x u32,
       digest (32 bytes) and structures x 32 bytes when flag 0

``reduce_contributions`` checks what the Go ``consensus.ReduceEncoded``
checks (one group, stack, size, tick and shape, every rank once, equal
digests) and returns the same bytes.
"""

import struct

import numpy as np

HEADER = struct.Struct("<4sBBH QQQ II HHII")
MAGIC = b"KVC1"
KIND_CONTRIBUTION, KIND_FRONTIER = 1, 2
FLAG_DIGEST = 1
FRONTIER_RANK = 0xFFFFFFFF
MAX_GROUP = 1024


class GroupError(ValueError):
    """A contribution that cannot be reduced; the message names it."""


def _shape_len(classes, ok_bits, reloads, digest, structures):
    n = HEADER.size + classes * 4 * 8 + (ok_bits + 63) // 64 * 8 + reloads * 4
    if digest:
        n += 32 * (1 + structures)
    return n


def _parse(i, b):
    if len(b) < HEADER.size:
        raise GroupError("contribution %d: %d bytes, shorter than the %d-byte header" % (i, len(b), HEADER.size))
    (magic, kind, flags, zero, group, stack, tick, rank, size,
     classes, structures, ok_bits, reloads) = HEADER.unpack_from(b)
    if magic != MAGIC:
        raise GroupError("contribution %d: magic %r, want %r" % (i, magic, MAGIC))
    if kind != KIND_CONTRIBUTION:
        raise GroupError("contribution %d: kind %d, want %d (a contribution)" % (i, kind, KIND_CONTRIBUTION))
    if flags & ~FLAG_DIGEST or zero:
        raise GroupError("contribution %d: unknown flags %#x" % (i, flags))
    if not 1 <= size <= MAX_GROUP or rank >= size:
        raise GroupError("contribution %d: rank %d of a group of %d" % (i, rank, size))
    want = _shape_len(classes, ok_bits, reloads, flags & FLAG_DIGEST, structures)
    if len(b) != want:
        raise GroupError("contribution %d (rank %d, tick %d): %d bytes, its header says %d" % (i, rank, tick, len(b), want))
    return dict(group=group, stack=stack, tick=tick, rank=rank, size=size, flags=flags,
                shape=(classes, structures, ok_bits, reloads))


def reduce_contributions(msgs):
    """Reduces the contributions of every rank of one tick (bytes, one per
    rank, any order) to the encoded frontier to send to every rank."""
    msgs = [bytes(m) for m in msgs]
    if not msgs:
        raise GroupError("no contributions")
    hs = [_parse(i, m) for i, m in enumerate(msgs)]
    h0 = hs[0]
    if h0["size"] != len(msgs):
        raise GroupError("%d contributions for a group of %d" % (len(msgs), h0["size"]))
    seen = set()
    for i, h in enumerate(hs):
        for k in ("group", "stack", "size"):
            if h[k] != h0[k]:
                raise GroupError("contribution %d (rank %d): %s %d, contribution 0 has %d" % (i, h["rank"], k, h[k], h0[k]))
        if h["tick"] != h0["tick"]:
            raise GroupError("rank %d: tick %d, rank %d is at tick %d" % (h["rank"], h["tick"], h0["rank"], h0["tick"]))
        if h["shape"] != h0["shape"] or h["flags"] != h0["flags"]:
            raise GroupError("rank %d at tick %d: shape %s, rank %d has %s" % (h["rank"], h["tick"], h["shape"], h0["rank"], h0["shape"]))
        if h["rank"] in seen:
            raise GroupError("rank %d at tick %d: two contributions" % (h["rank"], h["tick"]))
        seen.add(h["rank"])
    order = sorted(range(len(msgs)), key=lambda i: hs[i]["rank"])
    classes, structures, ok_bits, reloads = h0["shape"]
    off = HEADER.size
    n_counts, n_words = classes * 4, (ok_bits + 63) // 64
    counts = np.stack([np.frombuffer(m, dtype="<u8", count=n_counts, offset=off) for m in msgs])
    off += n_counts * 8
    words = np.stack([np.frombuffer(m, dtype="<u8", count=n_words, offset=off) for m in msgs])
    off += n_words * 8
    prefixes = np.stack([np.frombuffer(m, dtype="<u4", count=reloads, offset=off) for m in msgs])
    off += reloads * 4
    tail = msgs[order[0]][off:]
    for i in order[1:]:
        if msgs[i][off:] != tail:
            raise GroupError("tick %d: rank %d's digests differ from rank %d's: the ranks' replicated state diverged"
                             % (h0["tick"], hs[i]["rank"], hs[order[0]]["rank"]))
    out = bytearray(HEADER.pack(MAGIC, KIND_FRONTIER, h0["flags"], 0, h0["group"], h0["stack"], h0["tick"],
                                FRONTIER_RANK, h0["size"], classes, structures, ok_bits, reloads))
    out += counts.min(axis=0).astype("<u8").tobytes()
    out += np.bitwise_and.reduce(words, axis=0).astype("<u8").tobytes()
    out += prefixes.min(axis=0).astype("<u4").tobytes()
    out += tail
    return bytes(out)
