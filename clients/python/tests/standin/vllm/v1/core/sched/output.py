"""Stand-in vllm.v1.core.sched.output (tests only): SchedulerOutput and
the per-request data it carries, with the real field names (read from
vllm-project/vllm vllm/v1/core/sched/output.py)."""

from dataclasses import dataclass, field


@dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: list | None
    mm_features: list
    sampling_params: object
    pooling_params: object
    block_ids: tuple
    num_computed_tokens: int
    lora_request: object
    prompt_embeds: object = None
    prefill_token_ids: list | None = None


@dataclass
class CachedRequestData:
    req_ids: list
    # For ids in resumed_req_ids new_block_ids replaces the request's
    # blocks; for the others it is appended.
    resumed_req_ids: set
    new_token_ids: list
    all_token_ids: dict
    new_block_ids: list
    num_computed_tokens: list
    num_output_tokens: list

    @property
    def num_reqs(self):
        return len(self.req_ids)

    @classmethod
    def make_empty(cls):
        return cls(req_ids=[], resumed_req_ids=set(), new_token_ids=[], all_token_ids={}, new_block_ids=[],
                   num_computed_tokens=[], num_output_tokens=[])


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict
    total_num_scheduled_tokens: int
    scheduled_spec_decode_tokens: dict
    scheduled_encoder_inputs: dict
    num_common_prefix_blocks: list
    finished_req_ids: set
    free_encoder_mm_hashes: list
    preempted_req_ids: set | None = None
    pending_structured_output_tokens: bool = False
    kv_connector_metadata: object = None
    ec_connector_metadata: object = None

    @classmethod
    def make_empty(cls):
        return cls(scheduled_new_reqs=[], scheduled_cached_reqs=CachedRequestData.make_empty(),
                   num_scheduled_tokens={}, total_num_scheduled_tokens=0, scheduled_spec_decode_tokens={},
                   scheduled_encoder_inputs={}, num_common_prefix_blocks=[], finished_req_ids=set(),
                   free_encoder_mm_hashes=[])
