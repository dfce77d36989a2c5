"""Which sidecar owns which model.

The static registry learns ownership from each sidecar's RepositoryIndex: at start,
after every load/unload, and, at most once per `min_refresh_interval`, when a request
names a model it does not know. Its `watch` asks each sidecar whether it is ready every
READY_POLL_SECS, for the gateway's readiness (gateway.readiness). A Consul-backed
registry can replace it behind the `ModelRegistry` protocol (gateway.discovery does).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from gateway.metrics import GatewayMetrics
from gateway.readiness import FleetHealth, SidecarHealth, report
from gateway.upstream import SidecarClient
from protos import layout
from protos.status import TurnoutError

logger = logging.getLogger(__name__)

READY_POLL_SECS = 1.0  # how often the static registry asks its sidecars whether they are ready


class ModelRegistry(Protocol):
    """Maps model names to the sidecar that serves them."""

    @property
    def sidecars(self) -> Sequence[SidecarClient]:
        """Every known sidecar, in configuration order."""
        ...

    def owner(self, model: str) -> SidecarClient | None:
        """The sidecar that owns `model` as last learned; never does I/O."""
        ...

    async def find(self, model: str) -> SidecarClient | None:
        """Like `owner`, but on a miss refreshes (rate limited) and looks again."""
        ...

    async def refresh(self) -> None:
        """Relearn ownership from the sidecars now."""
        ...

    def placement(self, model: str, parameters: Mapping[str, str | bytes]) -> SidecarClient | None:
        """Where a load goes: the owner, else the sidecar of the framework that the
        config override or uploaded file names, else the first sidecar."""
        ...

    def replicas(self, model: str, version: str) -> Sequence[SidecarClient]:
        """The sidecars an inference for `model` may go to: those with `version` READY,
        else those serving the model at all (they answer Triton's error); never does I/O."""
        ...

    def ready_versions(self, model: str) -> frozenset[str] | None:
        """The versions of `model` some sidecar has READY; None when not known."""
        ...

    def peers(self, client: SidecarClient) -> Sequence[SidecarClient]:
        """Every replica of `client`'s framework, `client` included: where loads and unloads go."""
        ...

    @property
    def health(self) -> FleetHealth:
        """What the registry last learned of the fleet's health; never does I/O."""
        ...

    async def watch(self) -> None:
        """Keep the registry (and `health`) current until cancelled."""
        ...

    async def wait_first(self, timeout: float) -> bool:
        """Wait up to `timeout` for the first complete view of the fleet; False if none came."""
        ...


class StaticRegistry:
    """A fixed set of sidecars; ownership refreshed from their repository indexes."""

    def __init__(
        self,
        sidecars: Sequence[SidecarClient],
        *,
        min_refresh_interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        metrics: GatewayMetrics | None = None,
    ) -> None:
        """`metrics`: where `watch` reports; `clock` rate-limits refreshes (injected in tests)."""
        self._sidecars = tuple(sidecars)
        self._metrics = metrics
        # No sidecar to ask (`turnout up` on an empty repository): nothing to wait for.
        self._health = FleetHealth(synced=not self._sidecars)
        self._first = asyncio.Event()
        self._owners: dict[str, SidecarClient] = {}
        self._ready: dict[str, frozenset[str]] = {}
        self._min_interval = min_refresh_interval
        self._clock = clock
        self._last_refresh: float | None = None
        self._refreshing: asyncio.Task[None] | None = None

    @property
    def sidecars(self) -> Sequence[SidecarClient]:
        return self._sidecars

    def owner(self, model: str) -> SidecarClient | None:
        return self._owners.get(model)

    async def find(self, model: str) -> SidecarClient | None:
        client = self._owners.get(model)
        if client is not None:
            return client
        recent = self._last_refresh is not None and self._clock() - self._last_refresh < self._min_interval
        if recent and self._refreshing is None:
            return None
        await self._join_round()
        return self._owners.get(model)

    async def refresh(self) -> None:
        """Read every sidecar's index in a round that starts after this call: a round
        already running may have read the indexes before the load or unload the caller
        just made, so it is waited for and not trusted."""
        running = self._refreshing
        if running is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(running)
        if self._refreshing is running:
            self._refreshing = None
        await self._join_round()

    async def _join_round(self) -> None:
        # Concurrent misses share one round instead of each asking every sidecar.
        if self._refreshing is None:
            round_ = asyncio.ensure_future(self._refresh())
            round_.add_done_callback(self._round_done)
            self._refreshing = round_
        await asyncio.shield(self._refreshing)

    def _round_done(self, round_: asyncio.Task[None]) -> None:
        # Cleared here, not by a waiter: the round ends even when every waiter was cancelled.
        if self._refreshing is round_:
            self._refreshing = None
        if not round_.cancelled():
            round_.exception()  # retrieved: the waiters, if any, raise it themselves

    async def _refresh(self) -> None:
        results = await asyncio.gather(*(c.repository_index() for c in self._sidecars), return_exceptions=True)
        owners: dict[str, SidecarClient] = {}
        ready: dict[str, set[str]] = {}
        # A sidecar that does not answer keeps the models it owned before.
        for client, result in zip(self._sidecars, results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, TurnoutError):
                    raise result
                logger.warning("sidecar %s did not list its models: %s", client.address, result.message)
                for name, previous in self._owners.items():
                    if previous is client:
                        owners.setdefault(name, client)
                continue
            for model in result.models:
                # The first sidecar (configuration order) wins a name both list.
                owners.setdefault(model.name, client)
                if model.state == "READY" and owners[model.name] is client:
                    ready.setdefault(model.name, set()).add(model.version)
        self._owners = owners
        self._ready = {name: frozenset(versions) for name, versions in ready.items()}
        self._last_refresh = self._clock()

    def placement(self, model: str, parameters: Mapping[str, str | bytes]) -> SidecarClient | None:
        client = self._owners.get(model)
        if client is not None:
            return client
        framework = framework_of_load(parameters)
        if framework is not None:
            for candidate in self._sidecars:
                if candidate.framework == framework:
                    return candidate
        return self._sidecars[0] if self._sidecars else None

    def replicas(self, model: str, version: str) -> Sequence[SidecarClient]:
        client = self._owners.get(model)
        return (client,) if client is not None else ()

    def ready_versions(self, model: str) -> frozenset[str] | None:
        # Versions loaded since the last refresh (poll mode) are not known here.
        return self._ready.get(model)

    def peers(self, client: SidecarClient) -> Sequence[SidecarClient]:
        return (client,)

    @property
    def health(self) -> FleetHealth:
        return self._health

    async def watch(self) -> None:
        """Ask every sidecar whether it is ready (its own --strict-readiness rule) every
        READY_POLL_SECS; a sidecar that comes back after failing gets its index read again."""
        while True:
            answers = await asyncio.gather(*(c.readiness() for c in self._sidecars))
            sidecars = tuple(
                SidecarHealth(c.framework, c.address, answer is not None, bool(answer))
                for c, answer in zip(self._sidecars, answers, strict=True)
            )
            health = FleetHealth(True, sum(1 for s in sidecars if s.reachable), sidecars=sidecars)
            back = self._health.synced and any(
                now.ready and not before.ready for now, before in zip(sidecars, self._health.sidecars, strict=False)
            )
            if self._metrics is not None:
                report(self._health, health, self._metrics)
            self._health = health
            self._first.set()
            if back:
                try:
                    await self.refresh()
                except Exception:  # the next round tries again; the watch must outlive it
                    logger.warning("could not read the sidecars' indexes again", exc_info=True)
            await asyncio.sleep(READY_POLL_SECS)

    async def wait_first(self, timeout: float) -> bool:
        if self._health.synced:
            return True
        try:
            await asyncio.wait_for(self._first.wait(), timeout)
        except TimeoutError:
            return False
        return True


def framework_of_load(parameters: Mapping[str, str | bytes]) -> str | None:
    """The framework a load request names: the config override's platform/backend,
    then the suffix of an uploaded file ("file:1/model.onnx")."""
    config = parameters.get("config")
    if isinstance(config, str):
        try:
            parsed = json.loads(config)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            for key in ("platform", "backend"):
                value = parsed.get(key)
                if isinstance(value, str) and (framework := layout.framework_of_name(value)):
                    return framework
    for key in parameters:
        if key.startswith("file:") and (framework := layout.framework_of_file(key[len("file:") :])):
            return framework
    return None
