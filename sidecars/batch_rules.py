"""Triton's dynamic batch rules (core's DynamicBatchScheduler::GetDynamicBatch) as a pure
function of a queue in order: which requests at its head form the next batch, and when.
Both batchers use it: the dynamic batcher on its priority queue, the sequence batcher's
`oldest` strategy on its ready sequences."""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import NamedTuple


class Candidate(NamedTuple):
    """A queued request as the batch rules see it: its rows, what must match for two
    requests to share a batch, and when its wait for a batch began (monotonic ns)."""

    rows: int
    key: Hashable
    since_ns: int


class Plan(NamedTuple):
    """What to do with the head of a queue: move its first `take` requests into the batch
    now, or (`wait_ns` > 0) wait that long, or for a change in the queue, and look again.
    `full`: the batch takes no more requests after these (Triton's saturated payload);
    `sealed`: a request of another shape closed it, so no other batch may merge into it."""

    take: int
    wait_ns: int = 0
    full: bool = False
    sealed: bool = False


@dataclass(frozen=True)
class BatchRules:
    """Triton's dynamic batch rules (core's DynamicBatchScheduler::GetDynamicBatch), as a
    pure function of the queue in order, so each batcher keeps only its own queue.

    A batch is always a prefix of the queue: it grows request by request in queue order and
    closes at the first request that would pass `max_rows` or whose key differs; nothing is
    taken from behind it. Until its oldest request has waited `delay_ns`, the prefix is cut
    back and sent at once when it reaches a preferred size (the largest it reaches) or when
    its next request would pass the largest preferred size (what fits goes, the rest waits
    its own delay); else it goes whole at once when it holds the largest preferred size or more,
    or when a request it cannot take closes it; else it waits. Once the delay has
    passed it goes whole. Without preferred sizes, `max_rows` is the one (Triton's config
    normalisation).

    A batch already sent but not yet running (`formed_rows` of `formed_key`; Triton's
    payload waiting for a busy instance) keeps taking what the rules send until it is full."""

    max_rows: int
    preferred: frozenset[int]
    delay_ns: int

    @classmethod
    def of(cls, max_batch_size: int, preferred: Iterable[int], delay_us: int) -> BatchRules:
        max_rows = max(max_batch_size, 1)
        sizes = frozenset(size for size in preferred if 0 < size <= max_rows) or frozenset({max_rows})
        return cls(max_rows, sizes, delay_us * 1000)

    def plan(
        self,
        queue: Iterable[Candidate],
        now_ns: int,
        *,
        closing: bool = False,
        formed_rows: int = 0,
        formed_key: Hashable = None,
    ) -> Plan:
        """The requests to send from `queue` (in order; read only as far as the batch can
        reach) at `now_ns`. `closing` sends what is pending without waiting out the delay."""
        largest = max(self.preferred)
        rows = count = best = 0
        key = formed_key
        oldest_ns = now_ns
        closed = full = sealed = False
        for candidate in queue:
            size = max(candidate.rows, 1)
            total = formed_rows + rows + size
            if formed_rows + count == 0:
                key = candidate.key
            else:
                if total > largest and not best:
                    best = count  # what fits the largest preferred size, if nothing preferred came first
                    full = True
                if total > self.max_rows or candidate.key != key:
                    closed = True
                    sealed = candidate.key != key and total <= self.max_rows
                    break
            rows += size
            count += 1
            oldest_ns = min(oldest_ns, candidate.since_ns)
            if formed_rows + rows in self.preferred:
                best = count
        waited_ns = now_ns - oldest_ns
        delay_passed = self.delay_ns > 0 and waited_ns >= self.delay_ns
        if best and not delay_passed:
            return Plan(best, full=full or not self.delay_ns, sealed=sealed)
        if not count:
            return Plan(0, full=full, sealed=sealed)
        if closed or formed_rows + rows >= largest:
            return Plan(count, full=True, sealed=sealed)
        if delay_passed or not self.delay_ns or closing:
            return Plan(count, full=full)
        if not full and formed_rows and formed_rows not in self.preferred:
            return Plan(count)  # grow the waiting batch now
        return Plan(0, self.delay_ns - waited_ns, full=full)
