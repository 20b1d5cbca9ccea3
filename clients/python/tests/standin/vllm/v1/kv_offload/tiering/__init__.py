"""Stand-in vllm.v1.kv_offload.tiering (tests only)."""
