"""Which replica serves a request: power of two choices on outstanding requests, and
ejection of a replica that failed, until a probe finds it ready again.

The outstanding counts and the ejected set are the only mutable routing state; they
change on the event loop thread only, so they need no lock.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Sequence

from gateway.metrics import GatewayMetrics
from gateway.upstream import SidecarClient
from protos.status import unavailable

logger = logging.getLogger(__name__)

PROBE_INTERVAL_SECS = 0.5
# Triton's queue-full text: the gateway sheds load with it before a sidecar queues it.
QUEUE_FULL = "[request id: <id_unknown>] Exceeds maximum queue size"


class Balancer:
    """Picks replicas and keeps ejected ones out. `rng` is injected (seed it in tests)."""

    def __init__(self, rng: random.Random, metrics: GatewayMetrics, max_inflight: int = 0) -> None:
        self._rng = rng
        self._metrics = metrics
        self._max_inflight = max_inflight  # per replica; 0 = no limit
        self._outstanding: dict[SidecarClient, int] = {}
        self._ejected: dict[SidecarClient, asyncio.Task[None]] = {}

    def choose(self, candidates: Sequence[SidecarClient], tried: Sequence[SidecarClient] = ()) -> SidecarClient | None:
        """The less loaded of two random healthy candidates not yet tried; ejected ones
        only when nothing else is left. Raises UNAVAILABLE (Triton's queue-full text) when
        every candidate already has `max_inflight` requests: overload is refused at once."""
        healthy = self._eligible(candidates, tried)
        if len(healthy) <= 1:
            return healthy[0] if healthy else None
        first, second = self._rng.sample(healthy, 2)
        return first if self._load(first) <= self._load(second) else second

    def first(self, ordered: Sequence[SidecarClient], tried: Sequence[SidecarClient] = ()) -> SidecarClient | None:
        """The first of `ordered` (a sequence's rendezvous order) that `choose` would
        consider: not yet tried, healthy while any healthy one is left, under `max_inflight`."""
        healthy = self._eligible(ordered, tried)
        return healthy[0] if healthy else None

    def _eligible(self, candidates: Sequence[SidecarClient], tried: Sequence[SidecarClient]) -> Sequence[SidecarClient]:
        if not tried and not self._ejected and not self._max_inflight:
            return candidates  # a request's first try, every replica healthy, no limit: all of them
        fresh = [c for c in candidates if c not in tried]
        healthy = [c for c in fresh if c not in self._ejected] or fresh
        if self._max_inflight and healthy:
            healthy = [c for c in healthy if self._load(c) < self._max_inflight]
            if not healthy:
                raise unavailable(QUEUE_FULL)
        return healthy

    def _load(self, client: SidecarClient) -> int:
        return self._outstanding.get(client, 0)

    def track(self, client: SidecarClient) -> _InFlight:
        """A `with` block that counts one request outstanding at `client`."""
        return _InFlight(self._outstanding, client)

    def eject(self, client: SidecarClient, reason: str) -> None:
        """Keep `client` out of rotation until it answers a readiness probe."""
        if client in self._ejected:
            return
        logger.warning("replica %s ejected: %s", client.address, reason)
        self._ejected[client] = asyncio.get_running_loop().create_task(self._probe(client))
        self._metrics.count_ejection(client.framework)

    async def _probe(self, client: SidecarClient) -> None:
        while not await client.server_ready():
            await asyncio.sleep(PROBE_INTERVAL_SECS)
        logger.info("replica %s is ready again", client.address)
        self._ejected.pop(client, None)

    def forget(self, client: SidecarClient) -> None:
        """`client` left the fleet: stop probing it."""
        task = self._ejected.pop(client, None)
        if task is not None:
            task.cancel()
        self._outstanding.pop(client, None)

    def ejected_count(self) -> int:
        return len(self._ejected)

    async def close(self) -> None:
        tasks = list(self._ejected.values())
        self._ejected.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class _InFlight:
    """One request counted outstanding at a replica while its `with` block runs (made for
    every request: a plain object, not a generator's context manager)."""

    __slots__ = ("_client", "_outstanding")

    def __init__(self, outstanding: dict[SidecarClient, int], client: SidecarClient) -> None:
        self._outstanding = outstanding
        self._client = client

    def __enter__(self) -> None:
        self._outstanding[self._client] = self._outstanding.get(self._client, 0) + 1

    def __exit__(self, *_: object) -> None:
        # `forget` may have dropped the count while this request was in flight.
        left = self._outstanding.get(self._client, 0) - 1
        if left > 0:
            self._outstanding[self._client] = left
        else:
            self._outstanding.pop(self._client, None)
