"""Stand-in vllm.v1.kv_offload.tiering.base at vLLM 041410b9 (tests only):
the job types and the SecondaryTierManager interface, written from its
public signatures and documented semantics (../shared/engines/README.md,
"vLLM: native multi-tier offloading"). No vLLM code.

Every method runs in the scheduler process and must not block:
submit_store and submit_load start asynchronous jobs, get_finished polls
for their results. lookup answers True (present and ready), False (not
here) or None (being transferred: ask again)."""

from abc import ABC, abstractmethod
from collections.abc import Collection, Iterable
from dataclasses import dataclass

import numpy as np

from vllm.v1.kv_offload.base import OffloadKey, ReqContext, RequestOffloadingContext

JobId = int


@dataclass
class JobMetadata:
    """An asynchronous transfer job: keys[i] goes to or comes from the
    primary tier's block block_ids[i] (a row of the primary memoryview)."""

    job_id: JobId
    keys: Collection[OffloadKey]
    block_ids: np.ndarray
    is_promotion: bool
    req_context: ReqContext


@dataclass
class JobResult:
    job_id: JobId
    success: bool


class SecondaryTierManager(ABC):
    """One non-primary offloading tier. It reads and writes the CPU
    primary tier through primary_kv_view, shape (num_blocks, row bytes)."""

    def __init__(self, offloading_spec, primary_kv_view: memoryview, tier_type: str) -> None:
        self._offloading_spec = offloading_spec
        self._primary_kv_view = primary_kv_view
        self.tier_type = tier_type

    @abstractmethod
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> "bool | None":
        ...

    @abstractmethod
    def submit_store(self, job_metadata: JobMetadata) -> None:
        ...

    @abstractmethod
    def submit_load(self, job_metadata: JobMetadata) -> None:
        ...

    @abstractmethod
    def get_finished(self) -> Iterable[JobResult]:
        ...

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext):
        return

    def get_request_offloading_context(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def request_finished(self, req_context: ReqContext) -> None:
        return

    def shutdown(self) -> None:
        return
