"""Stand-in vllm.distributed (tests only)."""

from vllm.distributed.parallel_state import (  # noqa: F401
    get_pp_group,
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
)
