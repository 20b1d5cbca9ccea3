"""Stand-in vllm.distributed.kv_transfer.kv_connector.v1.metrics (tests
only): KVConnectorStats (a dataclass holding a data dict; reset,
aggregate, reduce, is_empty for a subclass to implement) and
KVConnectorPromMetrics (built by a connector's build_prom_metrics with
vLLM's metric classes, keyed by prometheus_client's Gauge, Counter and
Histogram; observe(transfer_stats_data, engine_idx)). prometheus_client is
not installed here: Gauge, Counter and Histogram are small recording
stand-ins with its constructor and labels().inc()/set()/observe()."""

from dataclasses import dataclass, field
from typing import Any


class _Metric:
    def __init__(self, name, documentation="", labelnames=(), **kw):
        self.name, self.documentation, self.labelnames = name, documentation, tuple(labelnames)
        self.values = {}

    def labels(self, *values, **kv):
        key = tuple(values) if values else tuple(kv[n] for n in self.labelnames)
        if len(key) != len(self.labelnames):
            raise ValueError("%s: %d label values for %s" % (self.name, len(key), self.labelnames))
        return _Child(self, key)


class _Child:
    def __init__(self, metric, key):
        self.metric, self.key = metric, key

    def inc(self, amount=1):
        self.metric.values[self.key] = self.metric.values.get(self.key, 0) + amount

    def set(self, value):
        self.metric.values[self.key] = value

    def observe(self, value):
        self.metric.values.setdefault(self.key, []).append(value)


class Gauge(_Metric):
    pass


class Counter(_Metric):
    pass


class Histogram(_Metric):
    pass


PromMetric = Gauge | Counter | Histogram
PromMetricT = PromMetric


@dataclass
class KVConnectorStats:
    data: dict[str, Any] = field(default_factory=dict)

    def reset(self):
        raise NotImplementedError

    def aggregate(self, other):
        raise NotImplementedError

    def reduce(self):
        raise NotImplementedError

    def is_empty(self):
        raise NotImplementedError


class KVConnectorPromMetrics:
    def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        self._kv_transfer_config = vllm_config.kv_transfer_config
        self._gauge_cls = metric_types[Gauge]
        self._counter_cls = metric_types[Counter]
        self._histogram_cls = metric_types[Histogram]
        self._labelnames = labelnames
        self.per_engine_labelvalues = per_engine_labelvalues

    def observe(self, transfer_stats_data, engine_idx=0):
        raise NotImplementedError
