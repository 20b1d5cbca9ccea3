"""Stand-in for sglang.srt.metrics.collector: only StorageMetrics, the
value a backend's get_stats() returns (SGLang's StorageMetricsCollector
asserts its type and observes each list into a histogram)."""

from dataclasses import dataclass, field
from typing import List


@dataclass
class StorageMetrics:
    prefetch_pgs: List[int] = field(default_factory=list)
    backup_pgs: List[int] = field(default_factory=list)
    prefetch_bandwidth: List[float] = field(default_factory=list)
    backup_bandwidth: List[float] = field(default_factory=list)
