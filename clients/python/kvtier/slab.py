"""The L2 slab of ``kvtier serve``, mapped into the engine: the copy plans
of a Step reply name spans of its files."""

import mmap
import os

import numpy as np


class Slab:
    """The slab files of a RegisterReply, mapped shared read-write."""

    def __init__(self, geometry):
        self._maps = []
        self._views = []
        try:
            for i, f in enumerate(geometry.files):
                if f.id != i:
                    raise ValueError("slab file %d has id %d" % (i, f.id))
                if f.size <= 0:
                    raise ValueError("slab file %s: size %d" % (f.path, f.size))
                fd = os.open(f.path, os.O_RDWR)
                try:
                    m = mmap.mmap(fd, f.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
                finally:
                    os.close(fd)
                self._maps.append(m)
                self._views.append(np.frombuffer(m, dtype=np.uint8))
        except Exception:
            self.close()
            raise

    def span(self, slab, offset, length):
        """A numpy view of the span; out of range raises ValueError naming it."""
        if not (0 <= slab < len(self._views)):
            raise ValueError("slab %d of %d" % (slab, len(self._views)))
        v = self._views[slab]
        if offset < 0 or length < 0 or offset > len(v) or length > len(v) - offset:
            raise ValueError("span [%d, +%d) outside slab %d of %d bytes" % (offset, length, slab, len(v)))
        return v[offset:offset + length]

    def close(self):
        self._views = []
        for m in self._maps:
            try:
                m.close()
            except BufferError:
                pass
        self._maps = []
