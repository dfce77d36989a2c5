"""The fleet as Consul sees it: a registry of sidecar replicas kept current by a
blocking-query watch on `health/service`, published as an immutable snapshot.

Requests read the snapshot in force and never wait on Consul; each watch round that
changes something swaps in a new one, with the FleetHealth readiness reads: every model
version a registered replica lists (READY, failed, or on a replica failing its check)
and how many healthy replicas have it READY. A replica whose meta says `tls` is reached over TLS;
a gateway told to use TLS to sidecars never falls back to a plain one.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gateway.consul import ConsulClient, ConsulWatch
from gateway.metrics import GatewayMetrics
from gateway.readiness import FleetHealth, ModelHealth, report
from gateway.registry import framework_of_load
from gateway.routing.replicas import Balancer
from gateway.upstream import SidecarClient, SidecarTls

logger = logging.getLogger(__name__)

CLOSE_GRACE_SECS = 5.0  # a replica that left may still finish requests sent to it
# A restarted Consul agent knows no sidecar until each re-registers (they do every 10 s):
# for this long after Consul answers again, a known replica missing from it is kept.
REJOIN_GRACE_SECS = 15.0


def parse_models(meta: Mapping[str, str], key: str = "models") -> dict[str, frozenset[str]]:
    """The models a sidecar advertises under `key`: meta `models` (READY) or `failed`
    (or `<key>_0`, `<key>_1`, ... when long), `name:1,2;other:1`."""
    text = meta.get(key)
    if text is None:
        text = "".join(meta[f"{key}_{i}"] for i in range(len(meta)) if f"{key}_{i}" in meta)
    models: dict[str, frozenset[str]] = {}
    for item in filter(None, text.split(";")):
        name, _, versions = item.rpartition(":")
        if name:
            models[name] = frozenset(filter(None, versions.split(",")))
    return models


@dataclass(frozen=True)
class Replica:
    """One sidecar instance as registered; only healthy ones are routed to."""

    service_id: str
    framework: str
    address: str
    lane: str
    metrics: str  # host:port of its /metrics, "" when it advertises none
    models: Mapping[str, frozenset[str]]
    tls: bool = False  # it serves gRPC and its lane over TLS only
    failed: Mapping[str, frozenset[str]] = field(default_factory=dict)  # versions whose load failed
    healthy: bool = True  # every check passing


@dataclass(frozen=True)
class Snapshot:
    """model -> version -> replicas, built once per Consul change and never mutated."""

    clients: tuple[SidecarClient, ...] = ()
    by_model: Mapping[str, tuple[SidecarClient, ...]] = field(default_factory=dict)
    by_version: Mapping[tuple[str, str], tuple[SidecarClient, ...]] = field(default_factory=dict)
    versions: Mapping[str, frozenset[str]] = field(default_factory=dict)


def _replica(entry: Mapping[str, Any]) -> Replica | None:
    service = entry.get("Service") or {}
    checks = entry.get("Checks") or []
    meta: Mapping[str, str] = service.get("Meta") or {}
    address = service.get("Address") or (entry.get("Node") or {}).get("Address", "")
    port = service.get("Port")
    if not address or not port or "framework" not in meta:
        return None
    host = f"[{address}]" if ":" in address else address
    return Replica(
        str(service["ID"]),
        meta["framework"],
        f"{host}:{port}",
        meta.get("lane", ""),
        meta.get("metrics", ""),
        parse_models(meta),
        meta.get("tls") == "true",
        parse_models(meta, "failed"),
        all(check.get("Status") == "passing" for check in checks),
    )


class ConsulRegistry:
    """ModelRegistry over the healthy instances of one Consul service."""

    def __init__(
        self,
        consul: ConsulClient,
        service: str,
        balancer: Balancer,
        metrics: GatewayMetrics,
        tls: SidecarTls | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`tls`: how to reach TLS replicas, and that plain ones are refused; None reaches
        TLS replicas trusting the system's CAs. `clock` times the rejoin grace (injected in tests)."""
        self._consul = consul
        self._clock = clock
        self._tls = tls
        self._refused: set[str] = set()  # plain replicas already logged as refused
        self._service = service
        self._balancer = balancer
        self._metrics = metrics
        self._snapshot = Snapshot()
        self._health = FleetHealth()
        self._replicas: dict[str, tuple[Replica, SidecarClient]] = {}
        self._first = asyncio.Event()
        self._closing: set[asyncio.Task[None]] = set()

    # --- ModelRegistry ---------------------------------------------------------------

    @property
    def sidecars(self) -> Sequence[SidecarClient]:
        return self._snapshot.clients

    def owner(self, model: str) -> SidecarClient | None:
        found = self._snapshot.by_model.get(model)
        return found[0] if found else None

    async def find(self, model: str) -> SidecarClient | None:
        return self.owner(model)

    async def refresh(self) -> None:
        """Loads and unloads show in Consul once the sidecars re-register; nothing to ask here."""

    def placement(self, model: str, parameters: Mapping[str, str | bytes]) -> SidecarClient | None:
        client = self.owner(model)
        if client is not None:
            return client
        framework = framework_of_load(parameters)
        clients = self._snapshot.clients
        for candidate in clients:
            if candidate.framework == framework:
                return candidate
        return clients[0] if clients else None

    def replicas(self, model: str, version: str) -> Sequence[SidecarClient]:
        if version:
            found = self._snapshot.by_version.get((model, version))
            if found:
                return found
        return self._snapshot.by_model.get(model, ())

    def ready_versions(self, model: str) -> frozenset[str] | None:
        return self._snapshot.versions.get(model, frozenset())

    def peers(self, client: SidecarClient) -> Sequence[SidecarClient]:
        return tuple(c for c in self._snapshot.clients if c.framework == client.framework)

    @property
    def health(self) -> FleetHealth:
        return self._health

    # --- the watch ----------------------------------------------------------------------

    async def wait_first(self, timeout: float) -> bool:
        """Wait up to `timeout` for the first answer from Consul; False if none came."""
        try:
            await asyncio.wait_for(self._first.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def watch(self) -> None:
        """Follow the service's health forever; Consul being away keeps the last snapshot."""
        rejoin_until = 0.0
        rounds = ConsulWatch(
            self._consul,
            f"/v1/health/service/{self._service}",
            what="discovery",
            away="routing on the last known fleet",
            log=logger,
        )
        while True:
            entries, back = await rounds.next()
            if back:
                rejoin_until = self._clock() + REJOIN_GRACE_SECS
            rejoining = self._clock() < rejoin_until
            self._apply(entries or [], keep_missing=rejoining)
            self._first.set()
            if rounds.index == 0 or rejoining:
                # Poll while rejoining: a kept replica that never re-registers must go
                # when the grace ends, even if nothing else changes.
                if rejoining:
                    rounds.index = 0
                await asyncio.sleep(0.5)

    def _apply(self, entries: list[Mapping[str, Any]], keep_missing: bool = False) -> None:
        registered = [r for e in entries if (r := _replica(e)) is not None and self._acceptable(r)]
        replicas = {r.service_id: r for r in registered if r.healthy}
        if keep_missing:
            listed = {str((e.get("Service") or {}).get("ID")) for e in entries}
            for service_id, (kept, _) in self._replicas.items():
                if service_id not in listed:
                    replicas[service_id] = kept
        current: dict[str, tuple[Replica, SidecarClient]] = {}
        for service_id, replica in sorted(replicas.items()):
            known = self._replicas.get(service_id)
            where = (replica.address, replica.lane, replica.metrics, replica.tls)
            if known is not None and (known[0].address, known[0].lane, known[0].metrics, known[0].tls) == where:
                current[service_id] = (replica, known[1])
            else:
                tls = (self._tls or _system_tls()) if replica.tls else None
                client = SidecarClient(replica.framework, replica.address, replica.lane, replica.metrics, tls)
                current[service_id] = (replica, client)
                logger.info("replica %s (%s) joined at %s", service_id, replica.framework, replica.address)
        for service_id, (_, client) in self._replicas.items():
            if current.get(service_id, (None, None))[1] is not client:
                logger.info("replica %s left", service_id)
                self._retire(client)
        self._replicas = current
        self._snapshot = _build(current.values())
        unhealthy = [r for r in registered if r.service_id not in current]
        health = _health([r for r, _ in current.values()], unhealthy)
        report(self._health, health, self._metrics)
        self._health = health
        self._metrics.set_replicas(len(current), self._balancer.ejected_count())

    def _acceptable(self, replica: Replica) -> bool:
        """A plain replica is refused when we were told to use TLS: no silent downgrade."""
        if replica.tls or self._tls is None:
            return True
        if replica.service_id not in self._refused:
            self._refused.add(replica.service_id)
            logger.warning(
                "replica %s at %s does not serve TLS and TLS to sidecars is on; not routing to it",
                replica.service_id,
                replica.address,
            )
        return False

    def _retire(self, client: SidecarClient) -> None:
        self._balancer.forget(client)
        task = asyncio.get_running_loop().create_task(client.close(CLOSE_GRACE_SECS))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for _, c in self._replicas.values()), *self._closing, return_exceptions=True)


@functools.cache
def _system_tls() -> SidecarTls:
    """TLS trusting the system's CAs, for TLS replicas of a gateway given no CA of its own."""
    return SidecarTls()


def _health(healthy: Sequence[Replica], unhealthy: Sequence[Replica]) -> FleetHealth:
    """Each model version the registered replicas list, with its ready, failed and
    unhealthy counts. A replica failing its check counts whatever it lists, READY or not."""
    counts: dict[tuple[str, str], list[int]] = {}

    def count(models: Mapping[str, frozenset[str]], which: int) -> None:
        for model, versions in models.items():
            for version in versions or ("",):
                counts.setdefault((model, version), [0, 0, 0])[which] += 1

    for replica in healthy:
        count(replica.models, 0)
        count(replica.failed, 1)
    for replica in unhealthy:
        count(replica.models, 2)
        count(replica.failed, 2)
    # A replica that failed a model before any version adds nothing where others list its versions.
    versioned = {model for model, version in counts if version}
    models = {
        key: ModelHealth(key[0], key[1], *numbers)
        for key, numbers in counts.items()
        if key[1] or key[0] not in versioned
    }
    return FleetHealth(True, len(healthy), MappingProxyType(models))


def _build(replicas: Any) -> Snapshot:
    by_model: dict[str, list[SidecarClient]] = {}
    by_version: dict[tuple[str, str], list[SidecarClient]] = {}
    versions: dict[str, set[str]] = {}
    clients: list[SidecarClient] = []
    for replica, client in replicas:
        clients.append(client)
        for model, model_versions in replica.models.items():
            by_model.setdefault(model, []).append(client)
            versions.setdefault(model, set()).update(model_versions)
            for version in model_versions:
                by_version.setdefault((model, version), []).append(client)
    return Snapshot(
        tuple(clients),
        MappingProxyType({k: tuple(v) for k, v in by_model.items()}),
        MappingProxyType({k: tuple(v) for k, v in by_version.items()}),
        MappingProxyType({k: frozenset(v) for k, v in versions.items()}),
    )
