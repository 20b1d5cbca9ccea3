"""Stand-in for the vllm package (tests only): the names kvtier.vllm imports, built from ../shared/engines/README.md's facts. No vLLM code."""
