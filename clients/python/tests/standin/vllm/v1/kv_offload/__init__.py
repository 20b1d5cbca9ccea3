"""Stand-in vllm.v1.kv_offload (tests only): the names kvtier.vllm_tier
imports, written from ../shared/engines/README.md's facts and the public
interface of vllm/v1/kv_offload/tiering/base.py at vLLM 041410b9. No vLLM
code."""
