"""Stand-in vllm.distributed.kv_transfer.kv_connector (tests only)."""
