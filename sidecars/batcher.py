"""The scheduler between server and runtime: a bounded priority queue per model version,
batches formed from its head by Triton's dynamic batch rules (`sidecars.batch_rules`, which
the `oldest` sequence strategy shares) and handed to the model instances when Triton's
batcher would hand them. Everything here changes on the event loop only, so it needs no lock.

Without `dynamic_batching` the same queue runs every request alone."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from protos import model_config_pb2 as mc
from protos.statistics import BatchTimes, VersionStatistics
from protos.status import Cause, Status, TurnoutError, internal, unavailable
from protos.validation import ValidRequest
from sidecars.batch_rules import BatchRules, Candidate, Plan
from sidecars.runtime import ModelInstance, RequestInstance, ThreadedInstance


class BackendFailure(TurnoutError):
    """The framework failed to execute a batch (Triton's failure reason BACKEND): the
    request's answer is an error response (Cause.RESPONSE)."""

    def __init__(self, status: Status, message: str) -> None:
        super().__init__(status, message, Cause.RESPONSE)

    @classmethod
    def of(cls, exc: Exception) -> BackendFailure:
        """`exc` from a framework call: a TurnoutError keeps its status and text, anything else is INTERNAL."""
        failed = exc if isinstance(exc, TurnoutError) else internal(str(exc))
        return cls(failed.status, failed.message)


@dataclass(slots=True)
class Result:
    """One request's slice of a batch's outputs and what it cost. Made for every request,
    so not frozen (a frozen dataclass's `__init__` costs several times a plain one's)."""

    outputs: dict[str, np.ndarray]
    queue_ns: int
    times: BatchTimes
    parameters: Mapping[str, bool | int | str] | None = None  # response parameters a model set


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


@dataclass(eq=False)
class _Batch:
    """A batch the scheduler formed (Triton's payload): it may keep taking requests until it
    is full or an instance starts it."""

    requests: list[_Pending] = field(default_factory=list)
    rows: int = 0
    key: Hashable = None
    since_ns: int = 0  # its oldest request's arrival
    full: bool = False  # takes no more requests
    sealed: bool = False  # closed by a request of another shape: never merged
    offered: bool = False
    started: int | None = None  # the order in which instances started batches

    def add(self, requests: list[_Pending]) -> None:
        if not self.requests:
            self.key = requests[0].request.key
            self.since_ns = requests[0].enqueued_ns
        self.requests += requests
        self.rows += sum(max(p.request.batch_size, 1) for p in requests)
        self.since_ns = min(self.since_ns, *(p.enqueued_ns for p in requests))


@dataclass
class _Level:
    """One priority level: requests in arrival order, then those that outlived their
    timeout under DELAY (Triton serves a level's delayed requests before the next level)."""

    policy: _Policy
    queue: deque[_Pending] = field(default_factory=deque)
    delayed: deque[_Pending] = field(default_factory=deque)

    def __iter__(self) -> Iterator[_Pending]:
        yield from self.queue
        yield from self.delayed

    def __len__(self) -> int:
        return len(self.queue) + len(self.delayed)


class DynamicBatcher:
    """Queues validated requests and runs them on `instances`, one batch per instance at a time.

    The queue is Triton's: priority levels in order, each its arrival-order queue then its
    DELAY-expired requests; requests are never reordered. One scheduler task forms batches
    from its head by `BatchRules` and offers them to the instances, as Triton's batcher
    thread does: when an instance waits for one or, where Triton prefetches (no priority
    levels and no queue policy), while up to two batches per instance wait for busy ones;
    a waiting batch keeps growing until it is full or an instance starts it, and an instance
    starting one merges the waiting batches behind it whose delay has passed, as far as
    max_batch_size allows. `clock` gives monotonic nanoseconds; every wait goes through
    the running event loop, so a test loop on virtual time, with a clock that reads it,
    drives the whole batcher."""

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
        self._takes_requests = bool(instances) and all(isinstance(i, RequestInstance) for i in instances)
        self._stats = stats
        self._batched = config.max_batch_size > 0
        self._gathers = self._batched and config.HasField("dynamic_batching")
        batching = config.dynamic_batching
        delay_us = batching.max_queue_delay_microseconds if self._gathers else 0
        self._rules = BatchRules.of(config.max_batch_size, batching.preferred_batch_size, delay_us)
        self._preserve_ordering = self._gathers and batching.preserve_ordering
        levels = max(batching.priority_levels, 1)
        default = _Policy.of(batching.default_queue_policy)
        self._levels = [
            _Level(_Policy.of(batching.priority_queue_policy[n]) if n in batching.priority_queue_policy else default)
            for n in range(1, levels + 1)
        ]
        self._default_level = batching.default_priority_level or 1
        policy = batching.default_queue_policy
        no_policy = not (policy.default_timeout_microseconds or policy.allow_timeout_override or policy.max_queue_size)
        # Batches wait for busy instances only where no queue rule could still apply to them.
        self._prefetch = batching.priority_levels == 0 and no_policy
        self._changed = asyncio.Event()
        self._closing = False
        self._queued = 0
        self._offered: deque[_Batch] = deque()  # formed, waiting for an instance
        self._idle: deque[asyncio.Future[_Batch | None]] = deque()  # instances waiting for a batch
        self._waiting: dict[asyncio.Future[_Batch | None], ModelInstance] = {}  # whose each wait is
        self._scheduling = True
        self._forming = _Batch()  # the batch the scheduler adds to until it is full or started
        # preserve_ordering: batches deliver their results in the order they were started.
        self._started = 0
        self._delivered = 0
        self._deliveries: dict[int, Callable[[], None]] = {}
        self._workers = {id(instance): asyncio.create_task(self._work(instance)) for instance in self._instances}
        self._leaving: set[int] = set()  # ids of instances an update removed, finishing their batch
        self._scheduler = asyncio.create_task(self._schedule())

    @property
    def instance_count(self) -> int:
        return len(self._instances)

    @property
    def pending(self) -> int:
        """Requests queued and not yet executing (Triton's pending request count)."""
        return self._queued + sum(len(batch.requests) for batch in self._offered)

    async def submit(self, request: ValidRequest) -> Result:
        """Queue a request and wait for its outputs. Raises TurnoutError on a full
        queue, an expired timeout, or a framework failure."""
        if self._closing:
            raise unavailable("Server exiting")
        level_number = request.priority if 0 < request.priority <= len(self._levels) else self._default_level
        level = self._levels[level_number - 1]
        policy = level.policy
        if policy.max_queue_size and len(level) >= policy.max_queue_size:
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
        request.queued = True
        self._queued += 1
        self._changed.set()
        try:
            return await pending.future
        except asyncio.CancelledError:
            # Its client gave up: the batch forming behind it may now be due.
            self._changed.set()
            raise

    def run_now(self, request: ValidRequest) -> Result | None:
        """Run `request` at once, on the event loop, where Triton's scheduler would hand it
        straight to an idle instance and that instance runs inline (ThreadedInstance): a
        model without dynamic batching, nothing queued before it. Saves the queue's task
        hand-offs; None when it cannot, and nothing has changed."""
        if self._gathers or self._takes_requests or self._closing or self._queued or self._offered:
            return None
        instance = next((self._waiting[w] for w in self._idle if not w.done()), None)
        if not isinstance(instance, ThreadedInstance) or not instance.inline:
            return None
        request.queued = True
        start = self._clock()
        try:
            outputs = instance.run_inline(request.inputs)
        except Exception as exc:
            raise BackendFailure.of(exc) from None
        inferred = self._clock()
        times = BatchTimes(request.batch_size, 0, inferred - start, 0, start)
        self._stats.record_batch(times)
        return Result(outputs, 0, times)

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
        self._changed.set()

    async def update_instances(self, added: Sequence[ModelInstance], removed: Sequence[ModelInstance]) -> None:
        """Triton's in-place instance-group update: the added instances take batches at
        once; each removed one runs the batch it holds, takes no other, and is closed."""
        for instance in added:
            self._instances.append(instance)
            self._workers[id(instance)] = asyncio.create_task(self._work(instance))
        leaving = {id(instance) for instance in removed}
        self._instances = [instance for instance in self._instances if id(instance) not in leaving]
        self._leaving |= leaving
        for waiting, instance in self._waiting.items():
            if id(instance) in leaving and not waiting.done():
                waiting.set_result(None)
        self._changed.set()
        workers = [self._workers.pop(id(instance)) for instance in removed]
        await asyncio.gather(
            *(self._retire(instance, worker) for instance, worker in zip(removed, workers, strict=True))
        )

    async def _retire(self, instance: ModelInstance, worker: asyncio.Task[None]) -> None:
        await asyncio.gather(worker, return_exceptions=True)
        self._leaving.discard(id(instance))
        await asyncio.to_thread(instance.close)

    async def _work(self, instance: ModelInstance) -> None:
        while not (self._leaving and id(instance) in self._leaving):
            batch = await self._next_batch(instance)
            if batch is None:
                return
            await self._execute(instance, batch)

    async def _next_batch(self, instance: ModelInstance) -> _Batch | None:
        """The first batch offered, merged with the ones behind it that are due (Triton's
        InstanceQueue::Dequeue), or the next one formed; None once closed and drained."""
        if not self._offered:
            if not self._scheduling:
                return None
            waiting: asyncio.Future[_Batch | None] = asyncio.get_running_loop().create_future()
            self._idle.append(waiting)
            self._waiting[waiting] = instance
            self._changed.set()
            if self._queued:
                self._form()  # may offer this instance its batch now
            try:
                return await waiting
            finally:
                del self._waiting[waiting]
        batch = self._offered.popleft()
        self._start(batch)
        now = self._clock()
        while self._rules.delay_ns and not batch.sealed and self._offered:
            behind = self._offered[0]
            due = now - behind.since_ns > self._rules.delay_ns
            if behind.sealed or not due or behind.key != batch.key or batch.rows + behind.rows > self._rules.max_rows:
                break
            behind.started = -1  # merged: its requests run in `batch`
            batch.add(self._offered.popleft().requests)
        self._changed.set()
        return batch

    def _offer(self, batch: _Batch) -> None:
        batch.offered = True
        while self._idle:
            waiting = self._idle.popleft()
            if not waiting.done():  # its instance's worker may have been cancelled
                self._start(batch)
                waiting.set_result(batch)
                return
        self._offered.append(batch)

    def _start(self, batch: _Batch) -> None:
        batch.started = self._started
        self._started += 1

    def _room(self) -> bool:
        """May the scheduler form a batch now (Triton's PayloadSlotAvailable)?"""
        if any(not waiting.done() for waiting in self._idle):
            return True
        return self._prefetch and len(self._offered) < 2 * len(self._instances)

    async def _schedule(self) -> None:
        """Form batches from the head of the queue (Triton's BatcherThread) until closed
        and drained; then the instances stop once they have run what was offered."""
        try:
            await self._form_batches()
        finally:
            self._scheduling = False
            for waiting in self._idle:
                if not waiting.done():
                    waiting.set_result(None)

    async def _form_batches(self) -> None:
        while True:
            wait_ns = self._form()
            if wait_ns is None:
                return
            await self._wait_for_change(wait_ns or None)

    def _form(self) -> int | None:
        """Form and offer batches from the head of the queue while the rules allow; then how
        long until they may allow more (0: until something changes), or None once closing
        and drained. The scheduler runs it whenever something changes; an instance asking
        for work runs it at once, rather than a turn of the loop later through the scheduler."""
        while True:
            batch = self._forming
            if batch.full or batch.started is not None:
                batch = self._forming = _Batch()
            self._drop_cancelled_heads()
            if not self._queued and self._closing:
                return None
            if not self._queued or not self._room():
                return 0
            if self._gathers:
                plan = self._rules.plan(
                    self._candidates(),
                    self._clock(),
                    closing=self._closing,
                    formed_rows=batch.rows,
                    formed_key=batch.key,
                )
            else:
                plan = Plan(1, full=True)
            if plan.take:
                batch.add(self._take(plan.take))
                if not batch.offered:
                    self._offer(batch)
            batch.full |= plan.full
            batch.sealed |= plan.sealed
            if plan.wait_ns > 0:
                return plan.wait_ns
            if not plan.take and not plan.full:
                return 0  # the waiting batch cannot take the head: until it starts

    async def _wait_for_change(self, timeout_ns: int | None = None) -> None:
        """Until the queue, the instances or the batches change, or `timeout_ns` passes."""
        self._changed.clear()
        timer = None
        if timeout_ns is not None:
            timer = asyncio.get_running_loop().call_later(timeout_ns / 1e9, self._changed.set)
        try:
            await self._changed.wait()
        finally:
            if timer is not None:
                timer.cancel()

    def _in_order(self) -> Iterator[_Pending]:
        """Every queued request in Triton's order, those cancelled by their clients skipped."""
        for level in self._levels:
            for pending in level:
                if not pending.future.done():
                    yield pending

    def _candidates(self) -> Iterator[Candidate]:
        for pending in self._in_order():
            yield Candidate(pending.request.batch_size, pending.request.key, pending.enqueued_ns)

    def _drop_cancelled_heads(self) -> None:
        """Forget requests cancelled by their clients at the front of each queue."""
        for level in self._levels:
            for queue in (level.queue, level.delayed):
                while queue and queue[0].future.done():
                    dropped = queue.popleft()
                    if dropped.timer is not None:
                        dropped.timer.cancel()
                    self._queued -= 1

    def _take(self, count: int) -> list[_Pending]:
        """Remove the first `count` live requests, in order, dropping cancelled ones on the way."""
        batch: list[_Pending] = []
        for level in self._levels:
            for queue in (level.queue, level.delayed):
                while queue and len(batch) < count:
                    pending = queue.popleft()
                    self._queued -= 1
                    if pending.timer is not None:
                        pending.timer.cancel()
                    if not pending.future.done():
                        batch.append(pending)
        return batch

    async def _execute(self, instance: ModelInstance, formed: _Batch) -> None:
        batch = formed.requests
        sequence = formed.started
        assert sequence is not None
        start = self._clock()
        if self._takes_requests:
            assert isinstance(instance, RequestInstance)
            await self._execute_requests(instance, batch, sequence, start)
            return
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
        times = BatchTimes(rows, computed - start, inferred - computed, done - inferred, start)
        self._stats.record_batch(times)

        def deliver() -> None:
            for pending, outputs_of_one in zip(batch, slices, strict=True):
                if not pending.future.done():
                    pending.future.set_result(Result(outputs_of_one, start - pending.enqueued_ns, times))

        self._deliver(sequence, deliver)

    async def _execute_requests(
        self, instance: RequestInstance, batch: list[_Pending], sequence: int, start: int
    ) -> None:
        """Hand the requests over whole (a python model's `execute` takes a list of them);
        each gets its own outputs or its own error."""
        rows = sum(p.request.batch_size for p in batch)
        try:
            results = await instance.execute_requests([p.request for p in batch])
        except Exception as exc:
            error = BackendFailure.of(exc)
            self._deliver(sequence, lambda: _fail(batch, error))
            return
        inferred = self._clock()
        times = BatchTimes(rows, 0, inferred - start, 0, start)
        self._stats.record_batch(times)

        def deliver() -> None:
            for pending, result in zip(batch, results, strict=True):
                if pending.future.done():
                    continue
                if isinstance(result, TurnoutError):
                    pending.future.set_exception(BackendFailure(result.status, result.message))
                elif result is None:  # its responses go to pending.request.responses
                    pending.future.set_result(Result({}, start - pending.enqueued_ns, times))
                else:
                    queued = start - pending.enqueued_ns
                    pending.future.set_result(Result(result.outputs, queued, times, result.parameters))

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
        await asyncio.gather(self._scheduler, return_exceptions=True)
        await asyncio.gather(*self._workers.values(), return_exceptions=True)
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
