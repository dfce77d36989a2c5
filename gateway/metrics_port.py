"""The metrics port: what one scrape answers. The gateway's own registry
(gateway.metrics), then Triton's families for the whole fleet, summed from every
sidecar's /metrics at scrape time, as one Triton would show them."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterable, Sequence
from functools import partial
from typing import Any

import httpx
from prometheus_client import CollectorRegistry, generate_latest

from gateway.upstream import SidecarClient
from protos import grpc_service_pb2 as pb
from protos.triton_metrics import HOST_FAMILIES, Exposition, HostGauges, MetricsEndpoint, add_statistics, on_loop

log = logging.getLogger(__name__)


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
    Triton families (`fleet`, a coroutine run on `loop` for each scrape).

    A worker of a gateway with --gateway-workers (gateway.workers) also serves its parts
    apart: `/metrics/own`, what it counted itself (its registry and `own_models`, the
    Triton families of the ensembles it ran), and `/metrics/fleet`, the fleet's."""

    def __init__(
        self,
        registry: CollectorRegistry,
        host: str,
        port: int,
        fleet: Callable[[], Coroutine[Any, Any, str]] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
        timeout: float = 5.0,
        own_models: Callable[[], Iterable[pb.ModelStatistics]] | None = None,
    ) -> None:
        self._registry = registry
        loop = loop or asyncio.get_running_loop()
        self._fleet = on_loop(fleet, loop, timeout) if fleet is not None else None
        parts = None
        if own_models is not None:
            own = on_loop(partial(_own, registry, own_models), loop, timeout)
            parts = {OWN_PATH: own, FLEET_PATH: self._render_fleet}
        self._endpoint = MetricsEndpoint(host, port, self._render, parts)

    @property
    def port(self) -> int:
        return self._endpoint.port

    def _render_fleet(self) -> bytes:
        return self._fleet().encode() if self._fleet is not None else b""

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


OWN_PATH = "/metrics/own"
FLEET_PATH = "/metrics/fleet"


async def _own(registry: CollectorRegistry, models: Callable[[], Iterable[pb.ModelStatistics]]) -> bytes:
    exposition = Exposition()
    for stats in models():
        add_statistics(exposition, stats)
    return generate_latest(registry) + exposition.render().encode()
