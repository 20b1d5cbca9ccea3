"""Stand-in vllm.v1.outputs (tests only): KVConnectorOutput, what the
workers' connectors report each step."""

from dataclasses import dataclass, field


@dataclass
class KVConnectorOutput:
    finished_sending: set | None = None
    finished_recving: set | None = None
    kv_connector_stats: object = None
    kv_cache_events: object = None
    kv_connector_worker_meta: object = None
    invalid_block_ids: set = field(default_factory=set)
    expected_finished_count: int = 0

    def is_empty(self):
        return (not self.finished_sending and not self.finished_recving and not self.kv_connector_stats
                and not self.kv_cache_events and not self.invalid_block_ids and not self.kv_connector_worker_meta)
