"""Python client of kvtier, the KV-cache tier framework.

:mod:`kvtier.pagehash` computes the page hashes that key every
content-addressed tier, exactly as kvtier's Go ``pagehash`` package does
(definition and test vectors in ``docs/page-hashes.md``);
:mod:`kvtier.client`, :mod:`kvtier.slab` and :mod:`kvtier.connector` are
the engine's side of ``kvtier serve`` (see clients/python/README.md).
"""

from kvtier.pagehash import ROOT, SIZE, chain, next_hash, parse, short, to_hex

__all__ = ["ROOT", "SIZE", "chain", "next_hash", "parse", "short", "to_hex"]
