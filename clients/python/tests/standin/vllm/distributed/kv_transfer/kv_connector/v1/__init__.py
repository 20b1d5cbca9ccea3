"""Stand-in vllm.distributed.kv_transfer.kv_connector.v1 (tests only)."""

from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: F401
    KVConnectorBase_V1,
    KVConnectorRole,
    SupportsHMA,
    supports_hma,
)
