"""Stand-in vllm.v1.core.kv_cache_manager (tests only): KVCacheBlocks,
the blocks update_state_after_alloc receives."""

from dataclasses import dataclass


@dataclass
class KVCacheBlocks:
    # One sequence of KVCacheBlock per KV cache group.
    blocks: tuple

    def get_block_ids(self, allow_none=False):
        if allow_none and all(len(g) == 0 for g in self.blocks):
            return None
        return tuple([b.block_id for b in g] for g in self.blocks)

    def get_unhashed_block_ids(self):
        return [b.block_id for b in self.blocks[0]]
