"""Stand-in vllm.v1.core.kv_cache_utils (tests only): KVCacheBlock and
BlockHash (bytes; recent vLLM's block hashes are bytes)."""

from dataclasses import dataclass
from typing import NewType

BlockHash = NewType("BlockHash", bytes)


@dataclass
class KVCacheBlock:
    block_id: int
    ref_cnt: int = 0


NONE_HASH = BlockHash(b"\x00" * 32)


def sha256(obj):
    """A stand-in of vLLM's sha256 hash function over (parent, tokens,
    extra keys): SHA-256 of a fixed encoding."""
    import hashlib
    import struct

    parent, tokens, extra = obj
    h = hashlib.sha256(parent)
    h.update(struct.pack("<%dq" % len(tokens), *tokens))
    if extra:
        h.update(repr(extra).encode())
    return h.digest()


def get_request_block_hasher(block_size, caching_hash_fn=sha256):
    """A function of a request returning the hashes of its newly full
    blocks, chained from the previous block's hash (as vLLM's is)."""

    def hasher(request):
        out = []
        n = len(request.block_hashes)
        parent = request.block_hashes[-1] if n else NONE_HASH
        toks = request.all_token_ids
        extra = (request.cache_salt,) if request.cache_salt and n == 0 else None
        while (n + 1) * block_size <= len(toks):
            parent = BlockHash(caching_hash_fn((parent, tuple(toks[n * block_size:(n + 1) * block_size]), extra)))
            out.append(parent)
            n += 1
            extra = None
        return out

    return hasher
