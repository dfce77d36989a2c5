"""The custom metrics python models declare (`pb_utils.MetricFamily`): one store per
sidecar, so instances naming the same family and labels share one metric, as in Triton.
Instance processes change it from their reader threads and scrapes read it on the event
loop, hence the lock."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from protos.triton_metrics import Exposition
from sidecars.python.channel import MetricOp

log = logging.getLogger(__name__)

Labels = tuple[tuple[str, str], ...]


@dataclass
class _Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0


class CustomMetrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._families: dict[str, tuple[str, str]] = {}  # name -> (kind, description)
        self._values: dict[tuple[str, Labels], float] = {}
        self._histograms: dict[tuple[str, Labels], _Histogram] = {}

    def apply(self, op: MetricOp) -> float:
        """Run one operation; returns the metric's value (0 for a histogram). "delete": a
        model's family object is gone, and with it the family and its metrics, as in Triton."""
        with self._lock:
            if op.op == "delete":
                if self._families.get(op.family, (op.kind,))[0] == op.kind:
                    self._forget(op.family)
                return 0.0
            known = self._families.setdefault(op.family, (op.kind, op.description))
            if known[0] != op.kind:
                log.warning(
                    "metric family '%s' is a %s; a model asked for it as a %s: ignored", op.family, known[0], op.kind
                )
                return 0.0
            key = (op.family, op.labels)
            if op.kind == "histogram":
                histogram = self._histograms.setdefault(key, _Histogram(op.buckets, [0] * len(op.buckets)))
                if op.op == "observe":
                    for index, bound in enumerate(histogram.buckets):  # cumulative, as Prometheus's
                        if op.value <= bound:
                            histogram.counts[index] += 1
                    histogram.total += op.value
                    histogram.count += 1
                return 0.0
            value = self._values.setdefault(key, 0.0)
            if op.op == "increment":
                value += op.value
            elif op.op == "set":
                value = op.value
            self._values[key] = value
            return value

    def _forget(self, family: str) -> None:
        self._families.pop(family, None)
        for samples in (self._values, self._histograms):
            for key in [key for key in samples if key[0] == family]:
                del samples[key]

    def add_to(self, exposition: Exposition) -> None:
        with self._lock:
            for name, (kind, description) in self._families.items():
                exposition.declare(name, kind, description)
            for (name, labels), value in self._values.items():
                exposition.add(name, labels, value)
            for (name, labels), histogram in self._histograms.items():
                for bound, count in zip(histogram.buckets, histogram.counts, strict=True):
                    exposition.add(name, (*labels, ("le", repr(float(bound)))), count, f"{name}_bucket")
                exposition.add(name, (*labels, ("le", "+Inf")), histogram.count, f"{name}_bucket")
                exposition.add(name, labels, histogram.total, f"{name}_sum")
                exposition.add(name, labels, histogram.count, f"{name}_count")
