"""Triton's sequence batcher for stateful models: each sequence (correlation id) holds a
slot of one model instance from its START request to its END or its idle timeout, the
model gets START/END/READY/CORRID controls and implicit state beside the client's
inputs, and batches form across slots (`direct`) or, under `oldest`, from the sequences'
next requests in the order they became ready, by the dynamic batcher's rules
(`sidecars.batch_rules`)."""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from protos import model_config_pb2 as mc
from protos.sequence import SequenceFlags
from protos.statistics import BatchTimes, VersionStatistics
from protos.status import Cause, Status, TurnoutError, invalid_arg, unavailable
from protos.validation import ValidRequest
from sidecars.batch_rules import BatchRules, Candidate
from sidecars.batcher import BackendFailure, Result
from sidecars.runtime import ModelInstance, RequestInstance
from sidecars.sequence_config import FILLER, Row, SequenceTensors

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
    # When it could first join a batch: its arrival, or when the request before it in its
    # sequence finished (`oldest` counts the queue delay from here, as Triton's per-instance
    # dynamic batcher counts it from when the request reached it), and a tiebreak in that order.
    ready_ns: int = 0
    ready_order: int = 0


@dataclass(eq=False)
class _Slot:
    """One sequence's place in an instance's batch (its row under `direct`)."""

    lane: _Lane
    index: int
    queue: deque[_Pending] = field(default_factory=deque)
    state: dict[str, np.ndarray] | None = None
    binding: int = 0  # changes on every release, so a late state write cannot reach the next sequence
    issued: bool = False  # `oldest`: its head is in a formed batch or running (Triton's in-flight slot)


@dataclass(eq=False)
class _Formed:
    """`oldest`: a batch of sequences' next requests formed for the lane's instance (Triton's
    payload); it may keep taking requests until it is full or the instance starts it."""

    members: list[tuple[_Slot, _Pending]] = field(default_factory=list)
    key: Any = None
    since_ns: int = 0  # its oldest member's ready time
    full: bool = False
    sealed: bool = False  # closed by a request of another shape: never merged
    offered: bool = False
    started: bool = False

    def add(self, members: list[tuple[_Slot, _Pending]], key: Any) -> None:
        if not self.members:
            self.key, self.since_ns = key, members[0][1].ready_ns
        self.members += members
        self.since_ns = min(self.since_ns, *(pending.ready_ns for _, pending in members))


@dataclass(eq=False)
class _Lane:
    """One model instance, its slots, and the event that wakes its worker (and, under
    `oldest`, its batch former)."""

    instance: ModelInstance
    index: int
    slots: list[_Slot] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    formed: deque[_Formed] = field(default_factory=deque)  # `oldest`: waiting for the instance
    idle: asyncio.Future[_Formed | None] | None = None  # `oldest`: the worker waiting for a batch
    forming: bool = True  # `oldest`: its former runs
    # An instance-group update removed it: its slots take no new sequence, and once every
    # one is free (`released`) it stops and its instance is closed.
    leaving: bool = False
    released: set[int] = field(default_factory=set)
    stopped: bool = False
    workers: list[asyncio.Task[None]] = field(default_factory=list)


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
        oldest = batching.oldest
        self._rules = BatchRules.of(
            config.max_batch_size, oldest.preferred_batch_size, oldest.max_queue_delay_microseconds
        )
        slot_count = (oldest.max_candidate_sequences or self._max_rows) if self._oldest else self._max_rows
        self._slot_count = slot_count
        self._delay_ns = batching.direct.max_queue_delay_microseconds * 1000
        self._min_utilization = batching.direct.minimum_slot_utilization
        # A new sequence's state shapes: a START batches with continuing sequences whose
        # states have the same shapes.
        self._initial_shapes = _shapes(tensors.initial())
        self._readied = 0
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
        for lane in self._lanes:
            self._start_lane(lane)
        self._closing_lanes: set[asyncio.Task[None]] = set()  # leaving lanes closing their instance
        self._reaper = asyncio.create_task(self._reap())

    def _start_lane(self, lane: _Lane) -> None:
        lane.workers.append(asyncio.create_task(self._work(lane)))
        if self._oldest:
            lane.workers.append(asyncio.create_task(self._form(lane)))

    @property
    def instance_count(self) -> int:
        return sum(1 for lane in self._lanes if not lane.leaving)

    async def update_instances(self, added: Sequence[ModelInstance], removed: Sequence[ModelInstance]) -> None:
        """Triton's in-place instance-group update (SequenceBatchScheduler::Update): each
        added instance brings its slots, which backlogged sequences take first; a removed
        one takes no new sequence, keeps those it holds until they end or idle out, and
        is closed once its last slot is free (this does not wait for that)."""
        leaving = {id(instance) for instance in removed}
        for lane in self._lanes:
            if id(lane.instance) in leaving:
                lane.leaving = True
        kept = []
        for slot_index, lane_index in self._free:
            lane = self._lanes[lane_index]
            if lane.leaving:
                lane.released.add(slot_index)
            else:
                kept.append((slot_index, lane_index))
        self._free = kept
        heapq.heapify(self._free)
        for lane in self._lanes:
            if lane.leaving:
                self._stop_when_free(lane)
        for instance in added:
            lane = _Lane(instance, len(self._lanes))
            lane.slots = [_Slot(lane, s) for s in range(self._slot_count)]
            self._lanes.append(lane)
            self._start_lane(lane)
            for slot in lane.slots:
                self._release(slot)  # to the oldest backlogged sequence, else free

    def _stop_when_free(self, lane: _Lane) -> None:
        """A leaving lane whose every slot is free stops, then closes its instance."""
        if lane.stopped or len(lane.released) < len(lane.slots):
            return
        lane.stopped = True
        lane.changed.set()
        closing = asyncio.get_running_loop().create_task(self._close_lane(lane))
        self._closing_lanes.add(closing)
        closing.add_done_callback(self._closing_lanes.discard)

    async def _close_lane(self, lane: _Lane) -> None:
        await asyncio.gather(*lane.workers, return_exceptions=True)
        await asyncio.to_thread(lane.instance.close)

    @property
    def pending(self) -> int:
        return self._queued

    def run_now(self, request: ValidRequest) -> Result | None:
        """A sequence's requests always go through its slot's queue."""
        return None

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
            # The cause lets a gateway that did not see the START try the replica next in line.
            raise TurnoutError(
                Status.INVALID_ARG,
                f"inference request for sequence {correlation_id} to model '{self._model}' must specify the "
                "START flag on the first request of the sequence",
                Cause.UNKNOWN_SEQUENCE,
            )
        now = self._clock()
        pending = _Pending(request, flags, asyncio.get_running_loop().create_future(), now)
        self._ready(pending, now)
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
        request.queued = True
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
        takes it, else it waits for the next START (on a leaving lane, it goes)."""
        slot.state = None
        slot.binding += 1
        if slot.lane.leaving:
            slot.lane.released.add(slot.index)
            self._stop_when_free(slot.lane)
            return
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
            now = self._clock()
            for pending in backlog.queue:
                self._ready(pending, now)
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
            rows = await (self._next_formed(lane) if self._oldest else self._next_rows(lane))
            if rows is None:
                return
            if rows:
                await self._execute(lane, rows)

    # -- oldest: Triton's per-instance dynamic batcher over the sequences' next requests -----

    async def _form(self, lane: _Lane) -> None:
        """Form batches from the lane's ready heads, oldest ready first, by the dynamic
        batch rules, whether or not the instance is busy: a batch waiting for it keeps
        growing until full (Triton's batcher thread, which prefetches for sequences)."""
        formed = _Formed()
        try:
            while True:
                if formed.full or formed.started:
                    formed = _Formed()
                heads = self._heads(lane)
                if not heads and (self._closing or lane.stopped):
                    return
                ready = sorted(
                    (slot for slot in heads if not slot.issued),
                    key=lambda slot: (slot.queue[0].ready_ns, slot.queue[0].ready_order),
                )
                if not ready:
                    await _wait_for_change(lane)
                    continue
                keys = [self._key(slot) for slot in ready]
                candidates = (Candidate(1, key, slot.queue[0].ready_ns) for slot, key in zip(ready, keys, strict=True))
                plan = self._rules.plan(
                    candidates,
                    self._clock(),
                    closing=self._closing,
                    formed_rows=len(formed.members),
                    formed_key=formed.key,
                )
                if plan.take:
                    for slot in ready[: plan.take]:
                        slot.issued = True
                    formed.add([(slot, slot.queue[0]) for slot in ready[: plan.take]], keys[0])
                    if not formed.offered:
                        self._offer(lane, formed)
                formed.full |= plan.full
                formed.sealed |= plan.sealed
                if plan.wait_ns > 0:
                    await _wait_for_change(lane, plan.wait_ns)
                elif not plan.take and not plan.full:
                    await _wait_for_change(lane)  # the waiting batch cannot take the head: until it starts
        finally:
            lane.forming = False
            if lane.idle is not None and not lane.idle.done():
                lane.idle.set_result(None)

    def _offer(self, lane: _Lane, formed: _Formed) -> None:
        formed.offered = True
        if lane.idle is not None and not lane.idle.done():
            formed.started = True
            lane.idle.set_result(formed)
        else:
            lane.formed.append(formed)

    async def _next_formed(self, lane: _Lane) -> list[_Row] | None:
        """The rows of the next formed batch, merged with those behind it whose delay has
        passed (Triton's InstanceQueue::Dequeue); None once closed and drained."""
        if lane.formed:
            formed = lane.formed.popleft()
            formed.started = True
            now = self._clock()
            while self._rules.delay_ns and not formed.sealed and lane.formed:
                behind = lane.formed[0]
                due = now - behind.since_ns > self._rules.delay_ns
                fits = len(formed.members) + len(behind.members) <= self._max_rows
                if behind.sealed or not due or not fits or behind.key != formed.key:
                    break
                behind.started = True
                formed.members += lane.formed.popleft().members
        elif not lane.forming:
            return None
        else:
            lane.idle = asyncio.get_running_loop().create_future()
            lane.changed.set()
            waited = await lane.idle
            if waited is None:
                return None
            formed = waited
        lane.changed.set()
        rows = []
        for slot, pending in formed.members:
            if slot.queue and slot.queue[0] is pending:
                rows.append(self._take(slot))  # the slot stays issued until the row has run
                continue
            slot.issued = False  # its request was cancelled while the batch waited
            if slot.queue:
                self._ready(slot.queue[0], self._clock())
        return rows

    async def _next_rows(self, lane: _Lane) -> list[_Row] | None:
        while True:
            heads = self._heads(lane)
            if not heads:
                if self._closing or lane.stopped:
                    return None
                await _wait_for_change(lane)
                continue
            wait_ns = self._wait_for_utilization(heads)
            if wait_ns > 0:
                await _wait_for_change(lane, wait_ns)
                continue
            return self._take_direct(lane, heads)

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

    def _wait_for_utilization(self, heads: list[_Slot]) -> int:
        """`direct`: nanoseconds to wait, up to the queue delay, for the minimum slot utilization."""
        if not self._delay_ns or self._closing or not self._min_utilization:
            return 0
        if len(heads) / self._max_rows >= self._min_utilization:
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

    def _key(self, slot: _Slot) -> tuple[Any, ...]:
        """Requests batch together only when their inputs and the states they will get
        (a START's: the initial state) have equal shapes."""
        head = slot.queue[0]
        if slot.state is None or head.flags.start:
            return (head.request.key, self._initial_shapes)
        return (head.request.key, _shapes(slot.state))

    def _ready(self, pending: _Pending, now: int) -> None:
        """`pending` may join a batch from `now` on (if it could not already)."""
        if now > pending.ready_ns or not pending.ready_order:
            pending.ready_ns = max(pending.ready_ns, now)
            self._readied += 1
            pending.ready_order = self._readied

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
        try:
            await self._run(lane, rows)
        finally:
            # The sequences' next requests may run from now on.
            finished = self._clock()
            for row in rows:
                slot = row.slot
                if row.pending is not None and slot.issued:
                    slot.issued = False
                    if slot.queue:
                        self._ready(slot.queue[0], finished)
            lane.changed.set()

    async def _run(self, lane: _Lane, rows: list[_Row]) -> None:
        start = self._clock()
        if isinstance(lane.instance, RequestInstance):
            await self._run_requests(lane.instance, rows, start)
            return
        inputs = self._batch_inputs(rows)
        real = [row for row in rows if row.pending is not None]
        computed = self._clock()
        try:
            outputs = await lane.instance.execute(inputs)
        except Exception as exc:
            _fail_rows(real, exc)
            return
        inferred = self._clock()
        times = BatchTimes(len(real), computed - start, inferred - computed, self._clock() - inferred, start)
        self._stats.record_batch(times)
        for position, row in enumerate(rows):
            pending = row.pending
            if pending is None:
                continue
            mine = {name: self._row_of(outputs[name], position) for name in outputs}
            slot = row.slot
            if slot.binding == row.binding:
                slot.state = {s.input_name: mine[s.output_name].copy() for s in self._tensors.states}
            if not pending.future.done():
                pending.future.set_result(Result(mine, start - pending.enqueued_ns, times))

    async def _run_requests(self, instance: RequestInstance, rows: list[_Row], start: int) -> None:
        """The rows as requests of their own (a python model's execute takes a list of them),
        each with its controls and state, its sequence's id and flags; filler rows are left out."""
        real = [row for row in rows if row.pending is not None]
        requests = []
        for row in real:
            assert row.pending is not None
            flags = row.pending.flags
            inputs = self._tensors.controls([Row(flags.start, flags.end, True, flags.id)])
            inputs.update(row.pending.request.inputs)
            inputs.update(row.state)
            requests.append(replace(row.pending.request, inputs=inputs))
        try:
            results = await instance.execute_requests(requests)
        except Exception as exc:
            _fail_rows(real, exc)
            return
        inferred = self._clock()
        times = BatchTimes(len(real), 0, inferred - start, 0, start)
        self._stats.record_batch(times)
        for row, result in zip(real, results, strict=True):
            pending = row.pending
            assert pending is not None
            if isinstance(result, TurnoutError):
                if not pending.future.done():
                    pending.future.set_exception(BackendFailure(result.status, result.message))
                continue
            outputs = result.outputs if result is not None else {}
            slot = row.slot
            if slot.binding == row.binding and all(s.output_name in outputs for s in self._tensors.states):
                slot.state = {s.input_name: outputs[s.output_name].copy() for s in self._tensors.states}
            if not pending.future.done():
                parameters = result.parameters if result is not None else None
                pending.future.set_result(Result(outputs, start - pending.enqueued_ns, times, parameters))

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
        await asyncio.gather(*(task for lane in self._lanes for task in lane.workers), return_exceptions=True)
        await asyncio.gather(*self._closing_lanes, return_exceptions=True)
        self._reaper.cancel()
        await asyncio.gather(self._reaper, return_exceptions=True)
        for backlog in self._backlog:
            if backlog.timer is not None:
                backlog.timer.cancel()
            self._fail_backlog(backlog, unavailable("Server exiting"))
        for lane in self._lanes:
            if not lane.stopped:
                await asyncio.to_thread(lane.instance.close)


async def _wait_for_change(lane: _Lane, timeout_ns: int | None = None) -> None:
    """Until the lane changes (a request, a freed slot, a finished or started batch) or `timeout_ns` passes."""
    lane.changed.clear()
    timer = None if timeout_ns is None else asyncio.get_running_loop().call_later(timeout_ns / 1e9, lane.changed.set)
    try:
        await lane.changed.wait()
    finally:
        if timer is not None:
            timer.cancel()


def _fail_rows(rows: list[_Row], exc: Exception) -> None:
    """A batch the framework failed: each of its requests gets the error."""
    for row in rows:
        assert row.pending is not None
        if not row.pending.future.done():
            row.pending.future.set_exception(BackendFailure.of(exc))


def _shapes(state: dict[str, np.ndarray]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    return tuple((name, array.shape) for name, array in sorted(state.items()))


def _filler(array: np.ndarray) -> np.ndarray:
    """A row the model may read but whose values mean nothing (READY is false)."""
    if array.dtype == np.object_:
        return np.full(array.shape, b"", dtype=np.object_)
    return np.zeros_like(array)
