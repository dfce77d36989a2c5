"""Fixtures for the routing unit tests: metrics on a fresh Prometheus registry and a
balancer on the seeded generator, closed (its probes cancelled) after each test."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry

from gateway.metrics import GatewayMetrics
from gateway.routing.replicas import Balancer


@pytest.fixture
def metrics() -> GatewayMetrics:
    return GatewayMetrics(CollectorRegistry())


@pytest.fixture
async def balancer(rng: random.Random, metrics: GatewayMetrics) -> AsyncIterator[Balancer]:
    balancer = Balancer(rng, metrics)
    yield balancer
    await balancer.close()
