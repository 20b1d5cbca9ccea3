"""Stand-in vllm.v1.attention (tests only)."""
