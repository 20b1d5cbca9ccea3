"""Python client of kvtier, the KV-cache tier framework.

Today it holds :mod:`kvtier.pagehash`, the page hashes that key every
content-addressed tier, computed exactly as kvtier's Go ``pagehash``
package does (definition and test vectors in ``docs/page-hashes.md``).
"""

from kvtier.pagehash import ROOT, SIZE, chain, next_hash, parse, short, to_hex

__all__ = ["ROOT", "SIZE", "chain", "next_hash", "parse", "short", "to_hex"]
