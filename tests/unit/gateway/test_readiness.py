"""gateway.readiness in process, fed by ConsulRegistry from Consul `health/service` answers
as tests/unit/gateway/test_discovery.py builds them: Triton's strict readiness per model
version across replicas (one ready replica is enough; a model every replica failed, or
whose every replica fails its check, is not), a discovery that never synced, an empty
fleet, the non-strict rule, and what gets logged and counted."""

from __future__ import annotations

import logging
import random
from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry

from gateway.discovery import ConsulRegistry
from gateway.metrics import GatewayMetrics
from gateway.readiness import NO_REPLICA, NOT_SYNCED, FleetHealth, SidecarHealth, unready_reasons
from gateway.routing.replicas import Balancer
from tests.unit.gateway.test_discovery import SERVICE, ConsulStandIn, entry


@pytest.fixture
def metrics() -> GatewayMetrics:
    return GatewayMetrics(CollectorRegistry())


@pytest.fixture
async def registry(metrics: GatewayMetrics, rng: random.Random) -> AsyncIterator[ConsulRegistry]:
    registry = ConsulRegistry(ConsulStandIn(), SERVICE, Balancer(rng, metrics), metrics)
    yield registry
    await registry.close()


def reasons(registry: ConsulRegistry, strict: bool = True) -> list[str]:
    return unready_reasons(registry.health, strict=strict, need_replica=True)


def ready_replicas(metrics: GatewayMetrics, model: str, version: str) -> float | None:
    labels = {"model": model, "version": version}
    return metrics.registry.get_sample_value("turnout_gateway_model_ready_replicas", labels)


async def test_not_ready_before_consul_ever_answered(registry) -> None:
    assert reasons(registry) == [NOT_SYNCED]
    assert reasons(registry, strict=False) == [NOT_SYNCED]


async def test_an_empty_fleet_cannot_serve(registry) -> None:
    registry._apply([])
    assert reasons(registry) == [NO_REPLICA]
    assert reasons(registry, strict=False) == [NO_REPLICA]


async def test_one_replica_of_two_failing_a_model_keeps_the_gateway_ready(registry, metrics) -> None:
    registry._apply(
        [
            entry("a", address="10.0.0.1", meta={"models": "simple:1;linear:1"}),
            entry("b", address="10.0.0.2", meta={"models": "simple:1", "failed": "linear:1"}),
        ]
    )
    assert reasons(registry) == []
    assert [c.address for c in registry.replicas("linear", "1")] == ["10.0.0.1:8001"]
    assert ready_replicas(metrics, "linear", "1") == 1
    assert ready_replicas(metrics, "simple", "1") == 2


async def test_a_model_every_replica_failed_makes_it_unready_only_under_strict_readiness(
    registry, metrics, caplog
) -> None:
    caplog.set_level(logging.WARNING, "gateway.readiness")
    registry._apply(
        [
            entry("a", address="10.0.0.1", meta={"models": "simple:1", "failed": "linear:1"}),
            entry("b", address="10.0.0.2", meta={"models": "simple:1", "failed": "linear:1"}),
        ]
    )
    assert reasons(registry) == ["model 'linear' version 1: no ready replica: failed to load on 2 replicas"]
    assert reasons(registry, strict=False) == []
    assert ready_replicas(metrics, "linear", "1") == 0
    assert [r.getMessage() for r in caplog.records] == [
        "model 'linear' version 1 cannot be served: no ready replica: failed to load on 2 replicas"
    ]


async def test_a_model_whose_replicas_all_fail_their_check_is_unavailable_until_they_deregister(
    registry, metrics
) -> None:
    good = entry("a", address="10.0.0.1", meta={"models": "simple:1"})
    registry._apply([good, entry("b", address="10.0.0.2", meta={"models": "linear:1"})])
    assert reasons(registry) == []

    registry._apply([good, entry("b", address="10.0.0.2", meta={"models": "linear:1"}, check="critical")])
    assert reasons(registry) == [
        "model 'linear' version 1: no ready replica: listed by 1 replica failing the health check"
    ]
    assert registry.replicas("linear", "1") == ()

    # Consul dropped the critical entry (DeregisterCriticalServiceAfter): the fleet no longer lists it.
    registry._apply([good])
    assert reasons(registry) == []
    assert ready_replicas(metrics, "linear", "1") is None


async def test_a_model_that_failed_before_any_version_counts_only_where_no_replica_lists_versions(registry) -> None:
    registry._apply(
        [
            entry("a", address="10.0.0.1", meta={"models": "simple:1"}),
            entry("b", address="10.0.0.2", meta={"models": "", "failed": "simple:;broken:"}),
        ]
    )
    assert reasons(registry) == ["model 'broken': no ready replica: failed to load on 1 replica"]


async def test_the_fleet_routes_on_while_a_model_is_unavailable(registry) -> None:
    registry._apply([entry("a", meta={"models": "simple:1", "failed": "linear:2"})])
    assert [c.address for c in registry.replicas("simple", "1")] == ["10.0.0.1:8001"]
    assert len(reasons(registry)) == 1


def test_polled_sidecars_answer_for_themselves() -> None:
    up = SidecarHealth("onnxruntime", "127.0.0.1:1", reachable=True, ready=True)
    failed = SidecarHealth("pytorch", "127.0.0.1:2", reachable=True, ready=False)
    gone = SidecarHealth("pytorch", "127.0.0.1:2", reachable=False, ready=False)

    def check(*sidecars: SidecarHealth, strict: bool = True) -> list[str]:
        health = FleetHealth(True, sum(s.reachable for s in sidecars), sidecars=sidecars)
        return unready_reasons(health, strict=strict, need_replica=False)

    assert check(up) == []
    assert check() == []  # `turnout up` on an empty repository, as Triton with no models
    assert check(up, failed) == ["the pytorch sidecar at 127.0.0.1:2 is not ready"]
    assert check(up, failed, strict=False) == []
    assert check(up, gone) == ["the pytorch sidecar at 127.0.0.1:2 does not answer"]
    assert check(up, gone, strict=False) == []
    assert check(gone, strict=False) == ["the pytorch sidecar at 127.0.0.1:2 does not answer"]
