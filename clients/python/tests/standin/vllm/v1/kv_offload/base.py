"""Stand-in vllm.v1.kv_offload.base (tests only): the offload key and the
per-request context the secondary-tier interface names (snapshot
041410b9 imports OffloadKey, ReqContext and RequestOffloadingContext from
here). Shapes only, written from the interface; no vLLM code."""

import enum
from dataclasses import dataclass
from typing import Any, NewType

# A block's key: the block hash followed by its KV cache group index
# (4 bytes, big-endian), as raw bytes.
OffloadKey = NewType("OffloadKey", bytes)


def make_offload_key(block_hash: bytes, group_idx: int) -> OffloadKey:
    return OffloadKey(bytes(block_hash) + int(group_idx).to_bytes(4, "big", signed=False))


def get_offload_block_hash(key: OffloadKey) -> bytes:
    return key[:-4]


def get_offload_group_idx(key: OffloadKey) -> int:
    return int.from_bytes(key[-4:], "big", signed=False)


@dataclass
class ReqContext:
    """Per-request context handed to every tier call."""

    req_id: str
    kv_transfer_params: "dict[str, Any] | None" = None


class OffloadPolicy(enum.Enum):
    BLOCK_LEVEL = "block_level"
    REQUEST_LEVEL = "request_level"


@dataclass
class RequestOffloadingContext:
    policy: OffloadPolicy = OffloadPolicy.BLOCK_LEVEL


class OffloadingSpec:
    """The spec a secondary tier receives as offloading_spec: the engine's
    config (vllm_config, kv_cache_config), the connector's extra_config,
    and the block geometry. Tests build it with whatever they set."""

    def __init__(self, vllm_config=None, kv_cache_config=None, extra_config=None, **attrs):
        self.vllm_config = vllm_config
        self.kv_cache_config = kv_cache_config
        self.extra_config = dict(extra_config or {})
        for k, v in attrs.items():
            setattr(self, k, v)
