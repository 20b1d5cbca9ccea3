"""Stand-in vllm.v1.core.sched (tests only)."""
