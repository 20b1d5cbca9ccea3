"""Stand-in vllm.distributed.kv_transfer (tests only)."""
