"""Stand-in vllm.v1.kv_cache_interface (tests only): the KV cache specs
and KVCacheConfig, with the real field names."""

from dataclasses import dataclass

import torch


def _dtype_size(dtype):
    return torch.tensor([], dtype=dtype).element_size()


@dataclass(frozen=True)
class KVCacheSpec:
    block_size: int


@dataclass(frozen=True, kw_only=True)
class AttentionSpec(KVCacheSpec):
    num_kv_heads: int
    head_size: int
    dtype: torch.dtype
    page_size_padded: int | None = None

    @property
    def real_page_size_bytes(self):
        return 2 * self.block_size * self.num_kv_heads * self.head_size * _dtype_size(self.dtype)

    @property
    def page_size_bytes(self):
        return self.page_size_padded or self.real_page_size_bytes


@dataclass(frozen=True, kw_only=True)
class FullAttentionSpec(AttentionSpec):
    head_size_v: int | None = None
    sliding_window: int | None = None
    attention_chunk_size: int | None = None

    def __post_init__(self):
        if self.head_size_v is None:
            object.__setattr__(self, "head_size_v", self.head_size)

    @property
    def real_page_size_bytes(self):
        return self.block_size * self.num_kv_heads * (self.head_size + self.head_size_v) * _dtype_size(self.dtype)


@dataclass(frozen=True, kw_only=True)
class MLAAttentionSpec(FullAttentionSpec):
    cache_dtype_str: str | None = None

    @property
    def real_page_size_bytes(self):
        return self.block_size * self.num_kv_heads * self.head_size * _dtype_size(self.dtype)


@dataclass(frozen=True)
class KVCacheTensor:
    size: int
    shared_by: list


@dataclass(frozen=True)
class KVCacheGroupSpec:
    layer_names: list
    kv_cache_spec: KVCacheSpec


@dataclass
class KVCacheConfig:
    num_blocks: int
    kv_cache_tensors: list
    kv_cache_groups: list
