"""The scheduler between server and runtime: a bounded priority queue per model version
that forms batches (Triton's dynamic batcher) and hands them to free model instances.

Without `dynamic_batching` the same queue runs every request alone."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from protos import model_config_pb2 as mc
from protos.statistics import BatchTimes, VersionStatistics
from protos.status import TurnoutError, internal, unavailable
from sidecars.runtime import ModelInstance
from sidecars.validation import ValidRequest


class BackendFailure(TurnoutError):
    """The framework failed to execute a batch (Triton's failure reason BACKEND)."""

    @classmethod
    def of(cls, exc: Exception) -> BackendFailure:
        """`exc` from a framework call: a TurnoutError keeps its status and text, anything else is INTERNAL."""
        failed = exc if isinstance(exc, TurnoutError) else internal(str(exc))
        return cls(failed.status, failed.message)


@dataclass(frozen=True)
class Result:
    """One request's slice of a batch's outputs and what it cost."""

    outputs: dict[str, np.ndarray]
    queue_ns: int
    times: BatchTimes


@dataclass(eq=False)
class _Pending:
    request: ValidRequest
    future: asyncio.Future[Result]
    enqueued_ns: int
    level: int
    timer: asyncio.TimerHandle | None = None
    delayed: bool = False


@dataclass(frozen=True)
class _Policy:
    reject: bool
    timeout_us: int
    allow_override: bool
    max_queue_size: int

    @classmethod
    def of(cls, policy: mc.ModelQueuePolicy) -> _Policy:
        return cls(
            reject=policy.timeout_action == mc.ModelQueuePolicy.REJECT,
            timeout_us=policy.default_timeout_microseconds,
            allow_override=policy.allow_timeout_override,
            max_queue_size=policy.max_queue_size,
        )


@dataclass
class _Level:
    policy: _Policy
    queue: deque[_Pending] = field(default_factory=deque)
    delayed: deque[_Pending] = field(default_factory=deque)  # timed out under DELAY: served last


class DynamicBatcher:
    """Queues validated requests and runs them on `instances`, one batch per instance at a time.

    `clock` gives monotonic nanoseconds; every wait goes through the running event loop,
    so a test loop on virtual time, with a clock that reads it, drives the whole batcher."""

    def __init__(
        self,
        config: mc.ModelConfig,
        instances: Sequence[ModelInstance],
        stats: VersionStatistics,
        *,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self._clock = clock
        self._instances = list(instances)
        self._stats = stats
        self._batched = config.max_batch_size > 0
        self._gathers = self._batched and config.HasField("dynamic_batching")
        batching = config.dynamic_batching
        self._max_rows = max(config.max_batch_size, 1)
        self._preferred = sorted(set(batching.preferred_batch_size))
        self._delay_ns = batching.max_queue_delay_microseconds * 1000 if self._gathers else 0
        self._preserve_ordering = self._gathers and batching.preserve_ordering
        levels = max(batching.priority_levels, 1)
        default = _Policy.of(batching.default_queue_policy)
        self._levels = [
            _Level(_Policy.of(batching.priority_queue_policy[n]) if n in batching.priority_queue_policy else default)
            for n in range(1, levels + 1)
        ]
        self._default_level = batching.default_priority_level or 1
        self._changed = asyncio.Event()
        self._closing = False
        self._queued = 0
        # preserve_ordering: batches deliver their results in the order they were formed.
        self._formed = 0
        self._delivered = 0
        self._deliveries: dict[int, Callable[[], None]] = {}
        self._workers = [asyncio.create_task(self._work(instance)) for instance in self._instances]

    @property
    def instance_count(self) -> int:
        return len(self._instances)

    @property
    def pending(self) -> int:
        """Requests queued and not yet executing (Triton's pending request count)."""
        return self._queued

    async def submit(self, request: ValidRequest) -> Result:
        """Queue a request and wait for its outputs. Raises TurnoutError on a full
        queue, an expired timeout, or a framework failure."""
        if self._closing:
            raise unavailable("Server exiting")
        level_number = request.priority if 0 < request.priority <= len(self._levels) else self._default_level
        level = self._levels[level_number - 1]
        policy = level.policy
        if policy.max_queue_size and len(level.queue) + len(level.delayed) >= policy.max_queue_size:
            raise unavailable(f"[request id: {request.id or '<id_unknown>'}] Exceeds maximum queue size")
        loop = asyncio.get_running_loop()
        pending = _Pending(request, loop.create_future(), self._clock(), level_number)
        timeout_us = policy.timeout_us
        override = request.timeout_us
        if policy.allow_override and override and override < timeout_us:
            timeout_us = override
        if timeout_us:
            pending.timer = loop.call_later(timeout_us / 1e6, self._expire, pending)
        level.queue.append(pending)
        self._queued += 1
        self._changed.set()
        return await pending.future

    def _expire(self, pending: _Pending) -> None:
        level = self._levels[pending.level - 1]
        pending.timer = None
        if pending.future.done() or pending not in level.queue:
            return
        level.queue.remove(pending)
        if level.policy.reject:
            self._queued -= 1
            pending.future.set_exception(unavailable("Request timeout expired"))
        else:
            pending.delayed = True
            level.delayed.append(pending)

    async def _work(self, instance: ModelInstance) -> None:
        while True:
            batch = await self._next_batch()
            if batch is None:
                return
            await self._execute(instance, batch)

    async def _next_batch(self) -> list[_Pending] | None:
        while True:
            if not self._queued:
                if self._closing:
                    return None
                self._changed.clear()
                await self._changed.wait()
                continue
            if self._delay_ns:
                wait_ns = self._wait_for_more()
                if wait_ns > 0:
                    self._changed.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._changed.wait(), wait_ns / 1e9)
                    continue
            batch = self._take()
            if batch:
                return batch

    def _queues(self) -> list[deque[_Pending]]:
        return [level.queue for level in self._levels] + [level.delayed for level in self._levels]

    def _wait_for_more(self) -> int:
        """Nanoseconds to keep waiting for a larger batch; 0 to run what is queued now."""
        head = next(q[0] for q in self._queues() if q)
        rows = 0
        for queue in self._queues():
            for pending in queue:
                if pending.request.key == head.request.key:
                    rows += pending.request.batch_size
        if self._closing or rows >= self._max_rows or rows in self._preferred:
            return 0
        return head.enqueued_ns + self._delay_ns - self._clock()

    def _take(self) -> list[_Pending]:
        """Remove the next batch: compatible requests in priority order, up to the limit."""
        batch: list[_Pending] = []
        rows = 0
        key = None
        for queue in self._queues():
            kept: list[_Pending] = []
            while queue:
                pending = queue[0]
                if pending.future.done():  # cancelled by its client while queued
                    queue.popleft()
                    self._queued -= 1
                    continue
                if key is None:
                    key = pending.request.key
                fits = rows + pending.request.batch_size <= self._max_rows
                if pending.request.key != key or not fits:
                    if self._preserve_ordering or not fits:
                        break
                    kept.append(queue.popleft())
                    continue
                queue.popleft()
                self._queued -= 1
                batch.append(pending)
                rows += pending.request.batch_size
                if not self._gathers:
                    break
            queue.extendleft(reversed(kept))
            if batch and (not self._gathers or rows >= self._max_rows):
                break
        batch = self._prefer(batch, rows)
        for pending in batch:
            if pending.timer is not None:
                pending.timer.cancel()
        return batch

    def _prefer(self, batch: list[_Pending], rows: int) -> list[_Pending]:
        """Cut a batch back to the largest preferred size it can form, requeueing the rest."""
        if not self._preferred or rows in self._preferred or rows >= self._max_rows:
            return batch
        cumulative, sizes = 0, []
        for pending in batch:
            cumulative += pending.request.batch_size
            sizes.append(cumulative)
        best = max((i for i, size in enumerate(sizes) if size in self._preferred), default=None)
        if best is None:
            return batch
        for pending in reversed(batch[best + 1 :]):
            level = self._levels[pending.level - 1]
            queue = level.delayed if pending.delayed else level.queue
            queue.appendleft(pending)
            self._queued += 1
        return batch[: best + 1]

    async def _execute(self, instance: ModelInstance, batch: list[_Pending]) -> None:
        sequence = self._formed
        self._formed += 1
        start = self._clock()
        first = batch[0].request
        if len(batch) == 1:
            inputs = first.inputs
        else:
            inputs = {name: np.concatenate([p.request.inputs[name] for p in batch]) for name in first.inputs}
        rows = sum(p.request.batch_size for p in batch)
        computed = self._clock()
        try:
            outputs = await instance.execute(inputs)
        except Exception as exc:
            error = BackendFailure.of(exc)
            self._deliver(sequence, lambda: _fail(batch, error))
            return
        inferred = self._clock()
        slices = _split(batch, outputs) if self._batched and len(batch) > 1 else [outputs]
        done = self._clock()
        times = BatchTimes(rows, computed - start, inferred - computed, done - inferred)
        self._stats.record_batch(times)

        def deliver() -> None:
            for pending, outputs_of_one in zip(batch, slices, strict=True):
                if not pending.future.done():
                    pending.future.set_result(Result(outputs_of_one, start - pending.enqueued_ns, times))

        self._deliver(sequence, deliver)

    def _deliver(self, sequence: int, deliver: Callable[[], None]) -> None:
        if not self._preserve_ordering:
            deliver()
            return
        self._deliveries[sequence] = deliver
        while self._delivered in self._deliveries:
            self._deliveries.pop(self._delivered)()
            self._delivered += 1

    async def close(self) -> None:
        """Run what is queued, stop the workers, then release the instances."""
        self._closing = True
        self._changed.set()
        await asyncio.gather(*self._workers, return_exceptions=True)
        for instance in self._instances:
            await asyncio.to_thread(instance.close)


def _fail(batch: list[_Pending], error: TurnoutError) -> None:
    for pending in batch:
        if not pending.future.done():
            pending.future.set_exception(error)


def _split(batch: list[_Pending], outputs: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """Cut each output back into the rows of each request (views, no copies)."""
    slices = []
    offset = 0
    for pending in batch:
        end = offset + pending.request.batch_size
        slices.append({name: array[offset:end] for name, array in outputs.items()})
        offset = end
    return slices
