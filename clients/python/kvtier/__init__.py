"""Python client of kvtier, the KV-cache tier framework.

:mod:`kvtier.pagehash` computes the page hashes that key every
content-addressed tier, exactly as kvtier's Go ``pagehash`` package does
(definition and test vectors in ``docs/page-hashes.md``);
:mod:`kvtier.client` and :mod:`kvtier.slab` are an engine's side of
``kvtier serve``'s engine API; :mod:`kvtier.sglang` (SGLang's storage
backend), :mod:`kvtier.vllm` (vLLM's KV connector) and
:mod:`kvtier.vllm_tier` (a secondary tier of vLLM's CPU offloading) go
over its page-store door (see clients/python/README.md).
"""

from kvtier.pagehash import ROOT, SIZE, chain, next_hash, parse, short, to_hex

__all__ = ["ROOT", "SIZE", "chain", "next_hash", "parse", "short", "to_hex"]
