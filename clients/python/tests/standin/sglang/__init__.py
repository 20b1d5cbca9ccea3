"""A stand-in for SGLang, built from ../shared/engines/README.md and the
named SGLang sources (the interface, not its code): enough of
sglang.srt.mem_cache.hicache_storage and sglang.srt.metrics.collector for
kvtier.sglang and its tests to run without SGLang installed."""
