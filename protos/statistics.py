"""Triton's per-model-version inference counters, as ModelStatistics reports them.

Everything here is updated on the event loop thread, so no locks are needed."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from protos import grpc_service_pb2 as pb


@dataclass
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns

    def fill(self, target: pb.StatisticDuration) -> None:
        target.count = self.count
        target.ns = self.ns


@dataclass
class BatchDurations:
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


@dataclass(slots=True, unsafe_hash=True)
class BatchTimes:
    """What one execution of a batch cost, shared by every request in it, and when it
    started (the batcher's monotonic clock; what a traced request reports as COMPUTE_START).
    Made for every batch, so not frozen (a frozen dataclass's `__init__` costs several times
    a plain one's)."""

    size: int
    input_ns: int
    infer_ns: int
    output_ns: int
    start_ns: int = 0


class VersionStatistics:
    """The counters of one loaded model version."""

    def __init__(self) -> None:
        self.success = Duration()
        self.fail = Duration()
        self.queue = Duration()
        self.compute_input = Duration()
        self.compute_infer = Duration()
        self.compute_output = Duration()
        self.inference_count = 0
        self.execution_count = 0
        self.last_inference_ms = 0
        self.batches: dict[int, BatchDurations] = {}
        # Triton's failure reasons (REJECTED, CANCELED, BACKEND, OTHER) -> count.
        self.failures: dict[str, int] = {}
        self.load_secs = 0.0

    def record_batch(self, times: BatchTimes) -> None:
        self.execution_count += 1
        self.inference_count += times.size
        durations = self.batches.get(times.size)
        if durations is None:
            durations = self.batches[times.size] = BatchDurations()
        # Added in place rather than through Duration.add: this runs for every batch.
        durations.compute_input.count += 1
        durations.compute_input.ns += times.input_ns
        durations.compute_infer.count += 1
        durations.compute_infer.ns += times.infer_ns
        durations.compute_output.count += 1
        durations.compute_output.ns += times.output_ns

    def record_success(self, total_ns: int, queue_ns: int, times: BatchTimes) -> None:
        # Added in place rather than through Duration.add: this runs for every request.
        self.success.count += 1
        self.success.ns += total_ns
        self.queue.count += 1
        self.queue.ns += queue_ns
        self.compute_input.count += 1
        self.compute_input.ns += times.input_ns
        self.compute_infer.count += 1
        self.compute_infer.ns += times.infer_ns
        self.compute_output.count += 1
        self.compute_output.ns += times.output_ns
        self.last_inference_ms = time.time_ns() // 1_000_000

    def record_failure(self, total_ns: int, reason: str = "OTHER") -> None:
        self.fail.add(total_ns)
        self.failures[reason] = self.failures.get(reason, 0) + 1
        self.last_inference_ms = time.time_ns() // 1_000_000

    def fill(self, target: pb.ModelStatistics) -> None:
        target.last_inference = self.last_inference_ms
        target.inference_count = self.inference_count
        target.execution_count = self.execution_count
        stats = target.inference_stats
        self.success.fill(stats.success)
        self.fail.fill(stats.fail)
        self.queue.fill(stats.queue)
        self.compute_input.fill(stats.compute_input)
        self.compute_infer.fill(stats.compute_infer)
        self.compute_output.fill(stats.compute_output)
        # No response cache here; Triton still reports both, as zeros.
        stats.cache_hit.SetInParent()
        stats.cache_miss.SetInParent()
        for size in sorted(self.batches):
            durations = self.batches[size]
            entry = target.batch_stats.add(batch_size=size)
            durations.compute_input.fill(entry.compute_input)
            durations.compute_infer.fill(entry.compute_infer)
            durations.compute_output.fill(entry.compute_output)
