"""The gateway's own Prometheus metrics, kept in a registry the composition root owns.

The gateway counts the requests it routes, per model, protocol and outcome, times them
per model, version and protocol, and shows the fleet's Triton metrics summed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import httpx
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from gateway.upstream import SidecarClient
from protos import grpc_service_pb2 as pb
from protos.triton_metrics import HOST_FAMILIES, Exposition, HostGauges, MetricsEndpoint, add_statistics, on_loop

if TYPE_CHECKING:
    from gateway.routing.versions import Decision

log = logging.getLogger(__name__)

# Cheap native buckets (Triton's latency summaries cost a third of its throughput, #8561).
DURATION_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
MAX_DURATION_SERIES = 512


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._requests = Counter(
            "turnout_gateway_requests",
            "Inference requests the gateway routed, by model, protocol and outcome",
            ["model", "protocol", "outcome"],
            registry=registry,
        )
        # labels() costs a lock and a dict build; keep each child once per label set.
        self._children: dict[tuple[str, str, bool], Counter] = {}
        self._durations = Histogram(
            "turnout_gateway_request_duration_seconds",
            "Inference request duration through the gateway, by model, version and protocol",
            ["model", "version", "protocol"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self._duration_children: dict[tuple[str, str, str], Histogram] = {}
        # Fleet routing. Labels stay bounded: versions are the policy's or "other",
        # reasons and outcomes are fixed sets, replicas are counted, not named.
        self._routes = Counter(
            "turnout_gateway_route_decisions",
            "Version routing decisions, by model, chosen version (arm) and reason",
            ["model", "version", "reason"],
            registry=registry,
        )
        self._sticky = Counter(
            "turnout_gateway_sticky_hits", "Requests whose sticky key chose the version", ["model"], registry=registry
        )
        self._skipped = Counter(
            "turnout_gateway_route_skipped_versions",
            "Weighted versions skipped for want of a ready replica (their weight redistributed)",
            ["model", "version"],
            registry=registry,
        )
        self._shadows = Counter(
            "turnout_gateway_shadow_requests",
            "Shadow requests by model, candidate version and outcome (same, different, error, dropped)",
            ["model", "version", "outcome"],
            registry=registry,
        )
        self._shadow_latency = Histogram(
            "turnout_gateway_shadow_latency_seconds",
            "Latency of answered shadow requests",
            ["model", "version"],
            registry=registry,
        )
        self._failovers = Counter(
            "turnout_gateway_failovers",
            "Requests that could not reach a replica: retried on another, or out of replicas/time",
            ["model", "outcome"],
            registry=registry,
        )
        self._ejections = Counter(
            "turnout_gateway_replica_ejections",
            "Replicas ejected after a failed send",
            ["framework"],
            registry=registry,
        )
        self._replicas = Gauge(
            "turnout_gateway_replicas", "Replicas known from discovery, by state", ["state"], registry=registry
        )

    def count_request(self, model: str, protocol: str, success: bool) -> None:
        key = (model, protocol, success)
        child = self._children.get(key)
        if child is None:
            child = self._requests.labels(model, protocol, "success" if success else "failure")
            self._children[key] = child
        child.inc()

    def observe_request(self, model: str, version: str, protocol: str, seconds: float) -> None:
        key = (model, version, protocol)
        child = self._duration_children.get(key)
        if child is None:
            # Versions come from clients: past a bound, new ones share one label value.
            if len(self._duration_children) >= MAX_DURATION_SERIES:
                key = (model, "other", protocol)
                child = self._duration_children.get(key)
            if child is None:
                child = self._durations.labels(*key)
                self._duration_children[key] = child
        child.observe(seconds)

    def count_route(self, model: str, decision: Decision, version: str) -> None:
        """`version` is the arm's label: the chosen version, or "other" for one no policy names."""
        self._routes.labels(model, version or "default", decision.reason.value).inc()
        if decision.sticky_key:
            self._sticky.labels(model).inc()
        for version in decision.skipped:
            self._skipped.labels(model, version).inc()

    def count_shadow(self, model: str, version: str, outcome: str) -> None:
        self._shadows.labels(model, version, outcome).inc()

    def observe_shadow_latency(self, model: str, version: str, seconds: float) -> None:
        self._shadow_latency.labels(model, version).observe(seconds)

    def count_failover(self, model: str, outcome: str) -> None:
        self._failovers.labels(model, outcome).inc()

    def count_ejection(self, framework: str) -> None:
        self._ejections.labels(framework).inc()

    def set_replicas(self, healthy: int, ejected: int) -> None:
        self._replicas.labels("healthy").set(healthy)
        self._replicas.labels("ejected").set(ejected)


class FleetMetrics:
    """Triton's families for the whole fleet, as one Triton would show them: every
    sidecar's own /metrics, summed sample by sample (replicas add up), or, for a sidecar
    whose metrics port is unknown, its ModelStatistics. Host gauges are this machine's.
    Ensembles run in the gateway: `ensembles` gives their counters, added to the zeros
    the ensemble sidecar reports for them."""

    def __init__(
        self,
        sidecars: Callable[[], Sequence[SidecarClient]],
        timeout: float = 2.0,
        ensembles: Callable[[], Iterable[pb.ModelStatistics]] = tuple,
    ) -> None:
        self._sidecars = sidecars
        self._ensembles = ensembles
        self._timeout = timeout
        self._host = HostGauges()
        self._http: httpx.AsyncClient | None = None

    async def render(self) -> str:
        sidecars = list(self._sidecars())
        answers = await asyncio.gather(*(self._scrape(c) for c in sidecars), return_exceptions=True)
        exposition = Exposition()
        for client, answer in zip(sidecars, answers, strict=True):
            if isinstance(answer, BaseException):  # a scrape must not fail because one sidecar is away
                log.warning("metrics of sidecar %s left out of this scrape: %s", client.address, answer)
            elif isinstance(answer, str):
                exposition.merge_text(answer, skip=HOST_FAMILIES)
            else:
                for stats in answer.model_stats:
                    add_statistics(exposition, stats)
        for stats in self._ensembles():
            add_statistics(exposition, stats)
        self._host.add_to(exposition)
        return exposition.render()

    async def _scrape(self, client: SidecarClient) -> str | pb.ModelStatisticsResponse:
        if not client.metrics:
            return await client.call("ModelStatistics", pb.ModelStatisticsRequest(), pb.ModelStatisticsResponse)
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=self._timeout)
        response = await self._http.get(f"http://{client.metrics}/metrics")
        response.raise_for_status()
        return response.text

    async def close(self) -> None:
        if self._http is not None:
            await self._http.aclose()


class MetricsServer:
    """Serves `/metrics` (and `/metrics/`): the gateway's registry, then the fleet's
    Triton families (`fleet`, a coroutine run on `loop` for each scrape)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        host: str,
        port: int,
        fleet: Callable[[], Coroutine[Any, Any, str]] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
        timeout: float = 5.0,
    ) -> None:
        self._registry = registry
        loop = loop or asyncio.get_running_loop()
        self._fleet = on_loop(fleet, loop, timeout) if fleet is not None else None
        self._endpoint = MetricsEndpoint(host, port, self._render)

    @property
    def port(self) -> int:
        return self._endpoint.port

    def _render(self) -> bytes:
        models = Exposition().render()
        if self._fleet is not None:
            try:
                models = self._fleet()
            except Exception:  # the gateway's own metrics are still worth a scrape
                log.warning("fleet metrics unavailable for this scrape", exc_info=True)
        return generate_latest(self._registry) + models.encode()

    def close(self) -> None:
        self._endpoint.close()
