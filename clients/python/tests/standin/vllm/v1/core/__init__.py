"""Stand-in vllm.v1.core (tests only)."""
