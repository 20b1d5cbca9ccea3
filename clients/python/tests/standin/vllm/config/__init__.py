"""Stand-in vllm.config (tests only): the fields of VllmConfig that
kvtier.vllm reads, as plain dataclasses. The real classes have many more
fields; these keep the real names."""

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ModelConfig:
    model: str = "test/model"
    revision: str | None = None
    dtype: Any = None
    served_model_name: str | None = None
    max_model_len: int = 4096
    use_mla: bool = False


@dataclass
class CacheConfig:
    block_size: int = 16
    cache_dtype: str = "auto"
    enable_prefix_caching: bool = True
    prefix_caching_hash_algo: str = "sha256"
    num_gpu_blocks: int | None = None


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    data_parallel_rank: int = 0
    decode_context_parallel_size: int = 1
    prefill_context_parallel_size: int = 1
    rank: int = 0


@dataclass
class KVTransferConfig:
    kv_connector: str | None = None
    engine_id: str | None = None
    kv_role: str | None = None
    kv_rank: int | None = None
    kv_parallel_size: int = 1
    kv_connector_extra_config: dict = field(default_factory=dict)
    kv_connector_module_path: str | None = None
    kv_load_failure_policy: str = "recompute"

    @property
    def is_kv_transfer_instance(self):
        return self.kv_connector is not None and self.kv_role in ("kv_producer", "kv_consumer", "kv_both")

    @property
    def is_kv_producer(self):
        return self.kv_connector is not None and self.kv_role in ("kv_producer", "kv_both")

    @property
    def is_kv_consumer(self):
        return self.kv_connector is not None and self.kv_role in ("kv_consumer", "kv_both")

    def get_from_extra_config(self, key, default):
        return self.kv_connector_extra_config.get(key, default)


@dataclass
class VllmConfig:
    model_config: ModelConfig = field(default_factory=ModelConfig)
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    kv_transfer_config: KVTransferConfig | None = None
