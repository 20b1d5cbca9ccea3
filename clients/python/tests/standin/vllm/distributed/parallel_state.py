"""Stand-in vllm.distributed.parallel_state (tests only): the rank of the
process. A test's worker process sets it with set_ranks before it builds
its connector, as vLLM's worker initialises its groups first."""

from dataclasses import dataclass


@dataclass
class GroupCoordinator:
    rank_in_group: int = 0
    world_size: int = 1


_TP = GroupCoordinator()
_PP = GroupCoordinator()


def set_ranks(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1):
    """Test hook (not vLLM's): this process's TP and PP coordinates."""
    global _TP, _PP
    _TP = GroupCoordinator(tp_rank, tp_size)
    _PP = GroupCoordinator(pp_rank, pp_size)


def get_tensor_model_parallel_rank():
    return _TP.rank_in_group


def get_tensor_model_parallel_world_size():
    return _TP.world_size


def get_pp_group():
    return _PP
