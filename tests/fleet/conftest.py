"""The fleet tests share one Consul agent (Debian bullseye's consul, fetched by
scripts/install-consul); each test starts the sidecars and gateways it needs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fleet.fleet_harness import Consul, consul_agent
from tests.harness import write_repository


@pytest.fixture(scope="session")
def consul() -> Iterator[Consul]:
    with consul_agent() as agent:
        yield agent


@pytest.fixture(scope="session")
def fleet_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_repository(tmp_path_factory.mktemp("fleet_repo"), ("simple", "linear"))
