"""Stand-in vllm.v1.request (tests only): Request with the attributes a
KV connector reads (request_id, prompt_token_ids, all_token_ids,
num_tokens, num_computed_tokens, block_hashes, num_publishable_block_hashes,
status, ...) and RequestStatus. Block hashes are computed as tokens are
appended, by the block hasher given at construction."""

import enum


class RequestStatus(enum.IntEnum):
    WAITING = enum.auto()
    WAITING_FOR_FSM = enum.auto()
    WAITING_FOR_REMOTE_KVS = enum.auto()
    WAITING_FOR_STREAMING_REQ = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    # Anything after PREEMPTED is finished.
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_IGNORED = enum.auto()
    FINISHED_ERROR = enum.auto()

    @staticmethod
    def is_finished(status):
        return status > RequestStatus.PREEMPTED


class Request:
    def __init__(self, request_id, prompt_token_ids, sampling_params=None, pooling_params=None,
                 block_hasher=None, max_tokens=16, cache_salt=None, kv_transfer_params=None):
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.sampling_params = sampling_params
        self.pooling_params = pooling_params
        self.max_tokens = max_tokens
        self.cache_salt = cache_salt
        self.kv_transfer_params = kv_transfer_params
        self.status = RequestStatus.WAITING
        self.num_prompt_tokens = len(self.prompt_token_ids)
        self._output_token_ids = []
        self._all_token_ids = list(self.prompt_token_ids)
        self.num_computed_tokens = 0
        self.num_cached_tokens = -1
        self.num_external_computed_tokens = 0
        self.num_preemptions = 0
        self.block_hashes = []
        self._block_hasher = block_hasher
        if block_hasher is not None:
            self.block_hashes.extend(block_hasher(self))

    @property
    def all_token_ids(self):
        return self._all_token_ids

    @property
    def output_token_ids(self):
        return self._output_token_ids

    @property
    def num_tokens(self):
        return len(self._all_token_ids)

    @property
    def num_output_tokens(self):
        return len(self._output_token_ids)

    @property
    def num_publishable_block_hashes(self):
        # Without EAGLE's successor-aware hashing every hash is publishable.
        return len(self.block_hashes)

    def append_output_token_ids(self, token_ids):
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        self._output_token_ids.extend(token_ids)
        self._all_token_ids.extend(token_ids)
        if self._block_hasher is not None:
            self.block_hashes.extend(self._block_hasher(self))

    def is_finished(self):
        return RequestStatus.is_finished(self.status)
