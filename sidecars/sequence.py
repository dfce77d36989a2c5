"""Triton's sequence batcher for stateful models: each sequence (correlation id) holds a
slot of one model instance from its START request to its END or its idle timeout, the
model gets START/END/READY/CORRID controls and implicit state beside the client's
inputs, and batches form across slots (`direct`) or across sequences' next requests,
oldest first (`oldest`)."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from protos import model_config_pb2 as mc
from protos.sequence import SequenceFlags
from protos.statistics import BatchTimes, VersionStatistics
from protos.status import Status, TurnoutError, invalid_arg, unavailable
from sidecars.batcher import BackendFailure, Result
from sidecars.runtime import ModelInstance
from sidecars.sequence_config import FILLER, Row, SequenceTensors
from sidecars.validation import ValidRequest

log = logging.getLogger(__name__)

_NO_SEQUENCE = SequenceFlags(0, False, False)
# Triton cancels such requests with no text of its own.
_CANCELLED = "the sequence was cancelled while it waited for a free slot"


@dataclass(eq=False)
class _Pending:
    request: ValidRequest
    flags: SequenceFlags
    future: asyncio.Future[Result]
    enqueued_ns: int


@dataclass(eq=False)
class _Slot:
    """One sequence's place in an instance's batch (its row under `direct`)."""

    lane: _Lane
    index: int
    queue: deque[_Pending] = field(default_factory=deque)
    state: dict[str, np.ndarray] | None = None
    binding: int = 0  # changes on every release, so a late state write cannot reach the next sequence


@dataclass(eq=False)
class _Lane:
    """One model instance, its slots, and the event that wakes its worker."""

    instance: ModelInstance
    index: int
    slots: list[_Slot] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(eq=False)
class _Backlog:
    """A sequence that started while every slot was taken; it takes the next free one."""

    correlation_id: int | str
    queue: deque[_Pending] = field(default_factory=deque)
    expires_ns: int | None = None  # the earliest `timeout` of its requests
    timer: asyncio.TimerHandle | None = None


@dataclass(eq=False)
class _Row:
    slot: _Slot
    binding: int
    pending: _Pending | None  # None: a filler row
    state: dict[str, np.ndarray]


class SequenceBatcher:
    """The scheduler of a model with `sequence_batching`; the same contract as
    DynamicBatcher (submit, pending, instance_count, close), and the same `clock` seam:
    monotonic nanoseconds, with every wait (queue delay, timeouts, the reaper) on the
    running event loop."""

    def __init__(
        self,
        config: mc.ModelConfig,
        instances: Sequence[ModelInstance],
        stats: VersionStatistics,
        tensors: SequenceTensors,
        *,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self._clock = clock
        self._model = config.name
        self._stats = stats
        self._tensors = tensors
        batching = config.sequence_batching
        self._batched = config.max_batch_size > 0
        self._max_rows = max(config.max_batch_size, 1)
        self._idle_ns = batching.max_sequence_idle_microseconds * 1000
        self._oldest = batching.HasField("oldest")
        if self._oldest:
            slot_count = batching.oldest.max_candidate_sequences or self._max_rows
            self._delay_ns = batching.oldest.max_queue_delay_microseconds * 1000
            self._preferred = sorted(set(batching.oldest.preferred_batch_size))
            self._min_utilization = 0.0
        else:
            slot_count = self._max_rows
            self._delay_ns = batching.direct.max_queue_delay_microseconds * 1000
            self._preferred = []
            self._min_utilization = batching.direct.minimum_slot_utilization
        self._lanes = [_Lane(instance, i) for i, instance in enumerate(instances)]
        for lane in self._lanes:
            lane.slots = [_Slot(lane, s) for s in range(slot_count)]
        # Free slots, lowest slot number first and spread over instances: (slot, instance).
        self._free = [(s, lane.index) for lane in self._lanes for s in range(slot_count)]
        heapq.heapify(self._free)
        self._bound: dict[int | str, _Slot] = {}
        self._backlog: deque[_Backlog] = deque()
        self._backlogged: dict[int | str, _Backlog] = {}
        self._last_seen: dict[int | str, int] = {}
        self._queued = 0
        self._closing = False
        self._workers = [asyncio.create_task(self._work(lane)) for lane in self._lanes]
        self._reaper = asyncio.create_task(self._reap())

    @property
    def instance_count(self) -> int:
        return len(self._lanes)

    @property
    def pending(self) -> int:
        return self._queued

    async def submit(self, request: ValidRequest) -> Result:
        """Queue a request in its sequence and wait for its outputs. Raises TurnoutError
        with Triton's texts for requests that break the sequence rules."""
        flags = request.sequence or _NO_SEQUENCE
        self._check(request, flags)
        correlation_id = flags.id
        if self._closing:
            raise unavailable(
                "Server is stopping, scheduler for model has stopped accepting new inference requests"
                if flags.start
                else "Server exiting"
            )
        slot = self._bound.get(correlation_id)
        backlog = self._backlogged.get(correlation_id)
        if slot is None and backlog is None and not flags.start:
            raise invalid_arg(
                f"inference request for sequence {correlation_id} to model '{self._model}' must specify the "
                "START flag on the first request of the sequence"
            )
        now = self._clock()
        pending = _Pending(request, flags, asyncio.get_running_loop().create_future(), now)
        self._last_seen[correlation_id] = now
        if slot is not None:
            if flags.start:
                log.warning(
                    "sequence %s for model '%s' has a conflict. The previous sequence did not end before this "
                    "sequence start. Previous sequence will be terminated early.",
                    correlation_id,
                    self._model,
                )
            slot.queue.append(pending)
            slot.lane.changed.set()
        elif backlog is not None:
            backlog.queue.append(pending)
            self._time_out(backlog, request.timeout_us, now)
        elif self._free:
            slot_index, lane_index = heapq.heappop(self._free)
            slot = self._lanes[lane_index].slots[slot_index]
            self._bound[correlation_id] = slot
            slot.queue.append(pending)
            slot.lane.changed.set()
        else:
            backlog = _Backlog(correlation_id, deque([pending]))
            self._backlog.append(backlog)
            self._backlogged[correlation_id] = backlog
            self._time_out(backlog, request.timeout_us, now)
        if flags.end:
            # A later START with the same id is a new sequence, in a slot of its own.
            self._bound.pop(correlation_id, None)
            self._backlogged.pop(correlation_id, None)
            self._last_seen.pop(correlation_id, None)
        self._queued += 1
        return await pending.future

    def _check(self, request: ValidRequest, flags: SequenceFlags) -> None:
        """Triton's checks, in its order: CORRID type, batch size, correlation id."""
        corrid = self._tensors.corrid
        if corrid is not None:
            name, datatype = corrid
            given = "BYTES" if isinstance(flags.id, str) else "UINT64"
            if (given == "BYTES") != (datatype.name == "BYTES"):
                raise invalid_arg(
                    f"[request id: {request.id or '<id_unknown>'}] sequence batching control '{name}' data-type is "
                    f"'{given}', but model '{self._model}' expects '{datatype.name}'"
                )
        if request.batch_size > 1:
            raise invalid_arg(
                f"inference request to model '{self._model}' must specify batch-size 1 due to requirements of "
                "sequence batcher"
            )
        if flags.id in (0, ""):
            raise invalid_arg(
                f"inference request to model '{self._model}' must specify a non-zero or non-empty correlation ID"
            )

    # -- slots ----------------------------------------------------------------------------

    def _time_out(self, backlog: _Backlog, timeout_us: int | None, now: int) -> None:
        """A request's `timeout` bounds how long its whole backlogged sequence waits for a slot."""
        if not timeout_us:
            return
        expires = now + timeout_us * 1000
        if backlog.expires_ns is not None and backlog.expires_ns <= expires:
            return
        backlog.expires_ns = expires
        if backlog.timer is not None:
            backlog.timer.cancel()
        backlog.timer = asyncio.get_running_loop().call_later(timeout_us / 1e6, self._expire, backlog)

    def _expire(self, backlog: _Backlog) -> None:
        backlog.timer = None
        if backlog not in self._backlog:
            return  # it got a slot in time
        self._backlog.remove(backlog)
        if self._backlogged.get(backlog.correlation_id) is backlog:
            del self._backlogged[backlog.correlation_id]
        self._fail_backlog(backlog, unavailable("timeout of the corresponding sequence has been expired"))

    def _release(self, slot: _Slot) -> None:
        """Free a slot whose sequence ended or idled out: the oldest backlogged sequence
        takes it, else it waits for the next START."""
        slot.state = None
        slot.binding += 1
        while self._backlog:
            backlog = self._backlog.popleft()
            if backlog.timer is not None:
                backlog.timer.cancel()
            open_ended = self._backlogged.get(backlog.correlation_id) is backlog
            if open_ended:
                del self._backlogged[backlog.correlation_id]
            if any(pending.future.done() for pending in backlog.queue):
                # As Triton: a request cancelled while its sequence waited cancels the sequence.
                self._fail_backlog(backlog, TurnoutError(Status.CANCELLED, _CANCELLED))
                continue
            slot.queue.extend(backlog.queue)
            if open_ended:
                self._bound[backlog.correlation_id] = slot
            slot.lane.changed.set()
            return
        heapq.heappush(self._free, (slot.index, slot.lane.index))

    def _fail_backlog(self, backlog: _Backlog, error: TurnoutError) -> None:
        self._queued -= len(backlog.queue)
        for pending in backlog.queue:
            if not pending.future.done():
                pending.future.set_exception(error)

    async def _reap(self) -> None:
        """Release the slots of sequences idle for max_sequence_idle_microseconds."""
        while True:
            now = self._clock()
            wait_ns = self._idle_ns
            for correlation_id, seen in list(self._last_seen.items()):
                remaining = seen + self._idle_ns - now
                slot = self._bound.get(correlation_id)
                if remaining > 0 or (slot is not None and slot.queue):
                    wait_ns = min(wait_ns, max(remaining, 0) + 1_000_000)
                    continue
                if correlation_id in self._backlogged:
                    continue  # idle only once it holds a slot
                del self._last_seen[correlation_id]
                if slot is not None:
                    log.info(
                        "sequence %s of model '%s' idle for too long; its slot is released", correlation_id, self._model
                    )
                    del self._bound[correlation_id]
                    self._release(slot)
            await asyncio.sleep(max(wait_ns, 1_000_000) / 1e9)

    # -- batches --------------------------------------------------------------------------

    async def _work(self, lane: _Lane) -> None:
        while True:
            rows = await self._next_rows(lane)
            if rows is None:
                return
            await self._execute(lane, rows)

    async def _next_rows(self, lane: _Lane) -> list[_Row] | None:
        while True:
            heads = self._heads(lane)
            if not heads:
                if self._closing:
                    return None
                lane.changed.clear()
                await lane.changed.wait()
                continue
            wait_ns = self._wait_for_more(heads)
            if wait_ns > 0:
                lane.changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(lane.changed.wait(), wait_ns / 1e9)
                continue
            return self._take_oldest(heads) if self._oldest else self._take_direct(lane, heads)

    def _heads(self, lane: _Lane) -> list[_Slot]:
        """The slots with a request to run, once requests cancelled while queued are gone."""
        ready = []
        for slot in lane.slots:
            while slot.queue and slot.queue[0].future.done():
                dropped = slot.queue.popleft()
                self._queued -= 1
                if dropped.flags.end:
                    self._release(slot)
            if slot.queue:
                ready.append(slot)
        return ready

    def _wait_for_more(self, heads: list[_Slot]) -> int:
        """Nanoseconds to wait for a fuller batch under the strategy's queue delay."""
        if not self._delay_ns or self._closing:
            return 0
        count = len(heads)
        if count >= self._max_rows or count in self._preferred:
            return 0
        if not self._oldest and (not self._min_utilization or count / self._max_rows >= self._min_utilization):
            return 0
        oldest = min(slot.queue[0].enqueued_ns for slot in heads)
        return oldest + self._delay_ns - self._clock()

    def _take_direct(self, lane: _Lane, heads: list[_Slot]) -> list[_Row]:
        """Rows for every slot up to the highest busy one; idle slots get filler rows."""
        key = self._key(heads[0])
        top = heads[-1].index
        rows = []
        for slot in lane.slots[: top + 1]:
            if slot.queue and self._key(slot) == key:
                rows.append(self._take(slot))
            else:
                rows.append(_Row(slot, slot.binding, None, {}))
        return rows

    def _take_oldest(self, heads: list[_Slot]) -> list[_Row]:
        """The oldest sequences' next requests that can share a batch, cut back to the
        largest preferred size when one fits."""
        heads = sorted(heads, key=lambda slot: slot.queue[0].enqueued_ns)
        key = self._key(heads[0])
        chosen = [slot for slot in heads if self._key(slot) == key][: self._max_rows]
        if self._preferred and len(chosen) not in self._preferred and len(chosen) < self._max_rows:
            fitting = [size for size in self._preferred if size <= len(chosen)]
            if fitting:
                chosen = chosen[: fitting[-1]]
        return [self._take(slot) for slot in chosen]

    def _key(self, slot: _Slot) -> tuple[Any, ...]:
        """Requests batch together only when their inputs and states have equal shapes."""
        head = slot.queue[0]
        if slot.state is None or head.flags.start:
            return head.request.key
        return (head.request.key, tuple((name, array.shape) for name, array in sorted(slot.state.items())))

    def _take(self, slot: _Slot) -> _Row:
        pending = slot.queue.popleft()
        self._queued -= 1
        if pending.flags.start or slot.state is None:
            slot.state = self._tensors.initial()
        row = _Row(slot, slot.binding, pending, slot.state)
        if pending.flags.end:
            self._release(slot)
        return row

    async def _execute(self, lane: _Lane, rows: list[_Row]) -> None:
        start = self._clock()
        inputs = self._batch_inputs(rows)
        real = [row for row in rows if row.pending is not None]
        computed = self._clock()
        try:
            outputs = await lane.instance.execute(inputs)
        except Exception as exc:
            for row in real:
                assert row.pending is not None
                if not row.pending.future.done():
                    row.pending.future.set_exception(BackendFailure.of(exc))
            return
        inferred = self._clock()
        times = BatchTimes(len(real), computed - start, inferred - computed, self._clock() - inferred)
        self._stats.record_batch(times)
        finished = self._clock()
        for position, row in enumerate(rows):
            pending = row.pending
            if pending is None:
                continue
            mine = {name: self._row_of(outputs[name], position) for name in outputs}
            slot = row.slot
            if slot.binding == row.binding:
                slot.state = {s.input_name: mine[s.output_name].copy() for s in self._tensors.states}
                self._last_seen[pending.flags.id] = finished
            if not pending.future.done():
                pending.future.set_result(Result(mine, start - pending.enqueued_ns, times))

    def _row_of(self, array: np.ndarray, position: int) -> np.ndarray:
        return array[position : position + 1] if self._batched else array

    def _batch_inputs(self, rows: list[_Row]) -> dict[str, np.ndarray]:
        """The client's inputs, controls and states of every row, stacked on the batch dim."""
        sample = next(row for row in rows if row.pending is not None)
        assert sample.pending is not None
        controls = [
            Row(row.pending.flags.start, row.pending.flags.end, True, row.pending.flags.id) if row.pending else FILLER
            for row in rows
        ]
        inputs = self._tensors.controls(controls)
        if len(rows) == 1:
            inputs.update(sample.pending.request.inputs)
            inputs.update(sample.state)
            return inputs
        for name, array in sample.pending.request.inputs.items():
            filler = _filler(array)
            inputs[name] = np.concatenate([row.pending.request.inputs[name] if row.pending else filler for row in rows])
        for name, array in sample.state.items():
            filler = _filler(array)
            inputs[name] = np.concatenate([row.state[name] if row.pending else filler for row in rows])
        return inputs

    async def close(self) -> None:
        """Run what is queued, stop the workers, then release the instances. Sequences
        still open are cut off, and backlogged ones never start."""
        self._closing = True
        for lane in self._lanes:
            lane.changed.set()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._reaper.cancel()
        await asyncio.gather(self._reaper, return_exceptions=True)
        for backlog in self._backlog:
            if backlog.timer is not None:
                backlog.timer.cancel()
            self._fail_backlog(backlog, unavailable("Server exiting"))
        for lane in self._lanes:
            await asyncio.to_thread(lane.instance.close)


def _filler(array: np.ndarray) -> np.ndarray:
    """A row the model may read but whose values mean nothing (READY is false)."""
    if array.dtype == np.object_:
        return np.full(array.shape, b"", dtype=np.object_)
    return np.zeros_like(array)
