"""Stand-in for vLLM's KV connector v1 base module (tests only).

Written from the interface facts in ../shared/engines/README.md and the
method list of vllm-project/vllm
vllm/distributed/kv_transfer/kv_connector/v1/base.py at
003df2961dd8830c317a61f9745ccd557da9fa06: the same names, parameters,
defaults, abstract methods and return conventions; none of vLLM's code.
tests/test_vllm_standin.py checks it against a table of those facts.

Like the real module it imports torch, vllm.logger,
vllm.v1.attention.backend, vllm.v1.core.sched.output and vllm.v1.outputs
at import time.
"""

import enum
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import torch

from vllm.logger import init_logger
from vllm.v1.attention.backend import AttentionBackend, AttentionMetadata  # noqa: F401
from vllm.v1.core.sched.output import SchedulerOutput  # noqa: F401
from vllm.v1.outputs import KVConnectorOutput  # noqa: F401

if TYPE_CHECKING:
    from vllm.config import VllmConfig  # noqa: F401

# (source tensors, destination tensors, source indices, destination
# indices, "h2d" or "d2h"): the host-buffer copy an engine hands a connector.
CopyBlocksOp = Callable[
    [dict[str, torch.Tensor], dict[str, torch.Tensor], list[int], list[int], Literal["h2d", "d2h"]], None]

logger = init_logger(__name__)


class SupportsHMA(ABC):
    """Marks a connector that works with the hybrid memory allocator."""

    @abstractmethod
    def request_finished_all_groups(self, request, block_ids):
        """request_finished with one block list per KV cache group."""
        raise NotImplementedError


def supports_hma(connector):
    if isinstance(connector, type):
        return issubclass(connector, SupportsHMA)
    return isinstance(connector, SupportsHMA)


class KVConnectorRole(enum.Enum):
    SCHEDULER = 0
    WORKER = 1


class KVConnectorHandshakeMetadata(ABC):  # noqa: B024
    """Out-of-band handshake data between P/D workers."""


class KVConnectorMetadata(ABC):  # noqa: B024
    """What the scheduler-side connector hands the workers each step."""


class KVConnectorWorkerMetadata(ABC):
    """What a worker hands back to the scheduler-side connector."""

    @abstractmethod
    def aggregate(self, other):
        """Merges another worker's metadata into this one."""


class KVConnectorBase_V1(ABC):
    """The connector interface: scheduler-side and worker-side methods."""

    @property
    def prefer_cross_layer_blocks(self):
        return False

    @property
    def supports_eagle_prefix_cache_hashing(self):
        return False

    @property
    def requires_kv_delivery(self):
        return self._kv_transfer_config.is_kv_producer

    def __init__(self, vllm_config, role, kv_cache_config):
        logger.warning("Initializing KVConnectorBase_V1 (stand-in).")
        self._connector_metadata = None
        self._vllm_config = vllm_config
        if vllm_config.kv_transfer_config is None:
            raise ValueError("kv_transfer_config must be set for KVConnectorBase_V1")
        self._kv_transfer_config = vllm_config.kv_transfer_config
        self._kv_cache_config = kv_cache_config
        self._role = role
        self.use_eagle_prefix_cache_hashing = False

    def set_eagle_prefix_cache_hashing(self, enabled):
        self.use_eagle_prefix_cache_hashing = enabled

    @property
    def role(self):
        return self._role

    # ---- worker side ------------------------------------------------------

    def bind_connector_metadata(self, connector_metadata):
        """Set before each forward pass by the model runner."""
        self._connector_metadata = connector_metadata

    def clear_connector_metadata(self):
        """Cleared after each forward pass."""
        self._connector_metadata = None

    def _get_connector_metadata(self):
        assert self._connector_metadata is not None
        return self._connector_metadata

    def has_connector_metadata(self):
        return self._connector_metadata is not None

    def register_kv_caches(self, kv_caches):
        """The paged KV tensors, by layer name."""
        return

    def register_cross_layers_kv_cache(self, kv_cache, attn_backend):
        return

    def set_host_xfer_buffer_ops(self, copy_operation):
        return

    def handle_preemptions(self, kv_connector_metadata):
        """Called before preempted requests' blocks can be overwritten."""
        return

    @abstractmethod
    def start_load_kv(self, forward_context, **kwargs):
        """Starts the step's loads into the paged KV (before the forward)."""

    @abstractmethod
    def wait_for_layer_load(self, layer_name):
        """Blocks until the layer's loads are in the paged KV."""

    @abstractmethod
    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        """Starts saving one layer's KV (called from inside the layer)."""

    @abstractmethod
    def wait_for_save(self):
        """Called as the forward context exits."""

    def get_finished(self, finished_req_ids):
        """(ids whose saves ended, ids whose async loads ended); a saved id
        must be one vLLM passed in finished_req_ids, now or before."""
        return None, None

    def get_block_ids_with_load_errors(self):
        """Block ids whose load failed; for an async load, no later than
        the pass whose get_finished reports the request."""
        return set()

    def shutdown(self):
        return None

    def get_kv_connector_stats(self):
        return None

    def get_kv_connector_kv_cache_events(self):
        return None

    def get_handshake_metadata(self):
        return None

    def build_connector_worker_meta(self):
        return None

    # ---- scheduler side ---------------------------------------------------

    def bind_gpu_block_pool(self, gpu_block_pool):
        return

    @abstractmethod
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        """(tokens loadable beyond num_computed_tokens or None: ask again,
        load is asynchronous); side-effect free; False when 0."""

    @abstractmethod
    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        """After allocation; twice for an async load; decide by
        num_external_tokens, not by blocks."""

    @abstractmethod
    def build_connector_meta(self, scheduler_output):
        """Once per step; resets the connector's step state."""

    def on_new_request(self, request):
        return

    def update_connector_output(self, connector_output):
        return

    def request_finished(self, request, block_ids):
        """Once per request, before its blocks are freed; True keeps them
        until get_finished reports the request."""
        return False, None

    def take_events(self):
        return ()

    def has_pending_push_work(self):
        return False

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config):
        if cls is KVConnectorBase_V1:
            raise TypeError("get_required_kvcache_layout should not be called on the abstract base class")
        return None

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config):
        return False

    def get_finished_count(self):
        return None

    @classmethod
    def build_kv_connector_stats(cls, data=None):
        return None

    def set_xfer_handshake_metadata(self, metadata):
        return None

    def set_xfer_handshake_metadata_pp_aware(self, metadata):
        if any(pp_rank != 0 for pp_rank, _ in metadata):
            raise ValueError("%s received pp_rank > 0 handshake metadata" % type(self).__name__)
        self.set_xfer_handshake_metadata({tp_rank: meta for (_, tp_rank), meta in metadata.items()})

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        return None

    def reset_cache(self):
        logger.debug("reset_cache: %s does not implement it", type(self).__name__)
        return None
