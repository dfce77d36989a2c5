"""gateway.discovery in process: a Consul `health/service` answer becomes the snapshot
ConsulRegistry publishes (model -> version -> replicas): meta `models` (whole or split over
models_0, models_1, ...), `lane`, `tls`, `framework`; replicas failing a check drop out;
and after Consul comes back, known replicas it does not list yet are kept for
REJOIN_GRACE_SECS, timed by an injected clock."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gateway.consul import ConsulUnavailable
from gateway.discovery import REJOIN_GRACE_SECS, ConsulRegistry, parse_models
from gateway.metrics import GatewayMetrics
from gateway.routing.replicas import Balancer
from gateway.upstream import SidecarTls
from tests.unit.virtual_loop import virtual_time

SERVICE = "turnout-sidecar"

# What a Consul 1.8 agent answers to GET /v1/health/service/turnout-sidecar for two sidecars
# registered as sidecars/registration.py registers them (one on IPv6, one without a lane).
HEALTH_ANSWER = """
[
  {
    "Node": {
      "ID": "40e4a748-2192-161a-0510-9bf59fe950b5", "Node": "gpu-node-1", "Address": "10.1.10.12",
      "Datacenter": "dc1", "TaggedAddresses": {"lan": "10.1.10.12", "wan": "10.1.10.12"},
      "Meta": {"consul-network-segment": ""}, "CreateIndex": 13, "ModifyIndex": 14
    },
    "Service": {
      "ID": "turnout-onnxruntime-10.1.10.12-8001", "Service": "turnout-sidecar", "Tags": ["onnxruntime"],
      "Address": "10.1.10.12", "TaggedAddresses": {"lan_ipv4": {"Address": "10.1.10.12", "Port": 8001}},
      "Meta": {
        "framework": "onnxruntime", "device": "cuda:0", "lane": "10.1.10.12:8101",
        "metrics": "10.1.10.12:8201", "metrics_port": "8201", "models": "simple:1,2;identity:1"
      },
      "Port": 8001, "Weights": {"Passing": 1, "Warning": 1}, "EnableTagOverride": false,
      "Proxy": {"MeshGateway": {}, "Expose": {}}, "Connect": {}, "CreateIndex": 40, "ModifyIndex": 52
    },
    "Checks": [
      {
        "Node": "gpu-node-1", "CheckID": "serfHealth", "Name": "Serf Health Status", "Status": "passing",
        "Notes": "", "Output": "Agent alive and reachable", "ServiceID": "", "ServiceName": "",
        "ServiceTags": [], "Type": "", "Definition": {}, "CreateIndex": 13, "ModifyIndex": 13
      },
      {
        "Node": "gpu-node-1", "CheckID": "turnout-onnxruntime-10.1.10.12-8001-health",
        "Name": "sidecar gRPC health", "Status": "passing", "Notes": "",
        "Output": "gRPC check 10.1.10.12:8001/turnout.fleet: success", "ServiceID":
        "turnout-onnxruntime-10.1.10.12-8001", "ServiceName": "turnout-sidecar", "ServiceTags": ["onnxruntime"],
        "Type": "grpc", "Definition": {}, "CreateIndex": 40, "ModifyIndex": 41
      }
    ]
  },
  {
    "Node": {
      "ID": "c4e8f1a2-7b1d-4e0a-9f55-2d1c2b3a4f60", "Node": "cpu-node-2", "Address": "fd00::7",
      "Datacenter": "dc1", "TaggedAddresses": {"lan": "fd00::7", "wan": "fd00::7"},
      "Meta": {"consul-network-segment": ""}, "CreateIndex": 15, "ModifyIndex": 15
    },
    "Service": {
      "ID": "turnout-onnxruntime-fd00::7-8001", "Service": "turnout-sidecar", "Tags": ["onnxruntime"],
      "Address": "fd00::7", "TaggedAddresses": {},
      "Meta": {"framework": "onnxruntime", "device": "cpu", "tls": "true", "models": "simple:2"},
      "Port": 8001, "Weights": {"Passing": 1, "Warning": 1}, "EnableTagOverride": false,
      "Proxy": {"MeshGateway": {}, "Expose": {}}, "Connect": {}, "CreateIndex": 44, "ModifyIndex": 44
    },
    "Checks": [
      {
        "Node": "cpu-node-2", "CheckID": "serfHealth", "Name": "Serf Health Status", "Status": "passing",
        "Notes": "", "Output": "Agent alive and reachable", "ServiceID": "", "ServiceName": "",
        "ServiceTags": [], "Type": "", "Definition": {}, "CreateIndex": 15, "ModifyIndex": 15
      },
      {
        "Node": "cpu-node-2", "CheckID": "turnout-onnxruntime-fd00::7-8001-health",
        "Name": "sidecar gRPC health", "Status": "passing", "Notes": "",
        "Output": "gRPC check [fd00::7]:8001/turnout.fleet: success", "ServiceID":
        "turnout-onnxruntime-fd00::7-8001", "ServiceName": "turnout-sidecar", "ServiceTags": ["onnxruntime"],
        "Type": "grpc", "Definition": {}, "CreateIndex": 44, "ModifyIndex": 45
      }
    ]
  }
]
"""


def entry(
    service_id: str,
    framework: str = "onnxruntime",
    address: str = "10.0.0.1",
    port: int = 8001,
    *,
    meta: dict[str, str] | None = None,
    check: str = "passing",
    node_check: str = "passing",
    node_address: str = "10.0.0.1",
) -> dict[str, Any]:
    """One element of a `health/service` answer, shaped as Consul 1.8 shapes it."""
    service_meta = {"framework": framework, "device": "cpu", **(meta or {})}
    return {
        "Node": {
            "ID": "9d6a2a5e-0000-4000-8000-000000000001",
            "Node": "node-1",
            "Address": node_address,
            "Datacenter": "dc1",
            "TaggedAddresses": {"lan": node_address, "wan": node_address},
            "Meta": {"consul-network-segment": ""},
            "CreateIndex": 5,
            "ModifyIndex": 5,
        },
        "Service": {
            "ID": service_id,
            "Service": SERVICE,
            "Tags": [framework],
            "Address": address,
            "TaggedAddresses": {},
            "Meta": service_meta,
            "Port": port,
            "Weights": {"Passing": 1, "Warning": 1},
            "EnableTagOverride": False,
            "Proxy": {"MeshGateway": {}, "Expose": {}},
            "Connect": {},
            "CreateIndex": 10,
            "ModifyIndex": 10,
        },
        "Checks": [
            {"Node": "node-1", "CheckID": "serfHealth", "Name": "Serf Health Status", "Status": node_check,
             "Notes": "", "Output": "", "ServiceID": "", "ServiceName": "", "ServiceTags": [], "Type": "",
             "Definition": {}, "CreateIndex": 5, "ModifyIndex": 5},
            {"Node": "node-1", "CheckID": f"{service_id}-health", "Name": "sidecar gRPC health", "Status": check,
             "Notes": "", "Output": "", "ServiceID": service_id, "ServiceName": SERVICE, "ServiceTags": [framework],
             "Type": "grpc", "Definition": {}, "CreateIndex": 10, "ModifyIndex": 10},
        ],
    }  # fmt: skip


class ConsulStandIn:
    """Stands in for a Consul agent across the network. Each blocking query notes its
    index, the time and the fleet the registry publishes then (what the previous round
    left); it is then held for the next step's seconds and answered with the step: an
    (entries, index) pair, or a ConsulUnavailable to raise. An empty script ends the
    watch with ScriptDone."""

    def __init__(self, script: list[tuple[float, Any]] | None = None) -> None:
        self.script = list(script or [])
        self.indexes: list[int] = []
        self.times: list[float] = []
        self.fleets: list[tuple[Any, ...]] = []
        self.fleet: Callable[[], tuple[Any, ...]] = tuple

    async def blocking_get(self, path: str, index: int, params: dict[str, str] | None = None) -> tuple[Any, int]:
        assert path == f"/v1/health/service/{SERVICE}"
        self.indexes.append(index)
        self.times.append(asyncio.get_running_loop().time())
        self.fleets.append(self.fleet())
        if not self.script:
            raise ScriptDone
        seconds, answer = self.script.pop(0)
        await asyncio.sleep(seconds)
        if isinstance(answer, ConsulUnavailable):
            raise answer
        return answer


class ScriptDone(Exception):
    """The stand-in Consul has nothing more to say; ends the watch."""


@pytest.fixture
def consul() -> ConsulStandIn:
    return ConsulStandIn()


@pytest.fixture
def metrics() -> GatewayMetrics:
    return GatewayMetrics(CollectorRegistry())


@pytest.fixture
async def registry(consul, metrics, rng: random.Random) -> AsyncIterator[ConsulRegistry]:
    registry = ConsulRegistry(consul, SERVICE, Balancer(rng, metrics), metrics)
    yield registry
    await registry.close()  # the SidecarClients it made hold grpc.aio channels


def addresses(clients: Any) -> list[str]:
    return [c.address for c in clients]


def fleets_seen(consul: ConsulStandIn) -> list[list[str]]:
    """The addresses of the fleet published at each blocking query, in order."""
    return [addresses(fleet) for fleet in consul.fleets]


# --- one answer becomes the snapshot -----------------------------------------------


async def test_a_health_answer_becomes_model_version_replicas(registry, metrics) -> None:
    registry._apply(json.loads(HEALTH_ANSWER))

    first, second = registry.sidecars  # in service-id order
    assert (first.framework, first.address, first.metrics, first.tls) == (
        "onnxruntime",
        "10.1.10.12:8001",
        "10.1.10.12:8201",
        False,
    )
    assert (second.framework, second.address, second.metrics, second.tls) == (
        "onnxruntime",
        "[fd00::7]:8001",
        "",
        True,
    )
    assert registry.replicas("simple", "1") == (first,)
    assert registry.replicas("simple", "2") == (first, second)
    assert registry.replicas("identity", "1") == (first,)
    assert registry.ready_versions("simple") == frozenset({"1", "2"})
    assert registry.ready_versions("identity") == frozenset({"1"})
    assert registry.owner("simple") is first
    assert await registry.find("identity") is first
    assert registry.peers(second) == (first, second)
    assert metrics.registry.get_sample_value("turnout_gateway_replicas", {"state": "healthy"}) == 2


async def test_a_version_no_replica_serves_falls_back_to_every_replica_of_the_model(registry) -> None:
    registry._apply(
        [
            entry("a", address="10.0.0.1", meta={"models": "simple:1"}),
            entry("b", address="10.0.0.2", meta={"models": "simple:2"}),
        ]
    )
    every = registry.replicas("simple", "")
    assert addresses(every) == ["10.0.0.1:8001", "10.0.0.2:8001"]
    assert registry.replicas("simple", "3") == every  # they answer Triton's own error
    assert registry.replicas("nope", "1") == ()
    assert registry.owner("nope") is None
    assert registry.ready_versions("nope") == frozenset()


async def test_replicas_of_different_frameworks_are_not_peers(registry) -> None:
    registry._apply(
        [
            entry("a", "onnxruntime", "10.0.0.1", meta={"models": "simple:1"}),
            entry("b", "pytorch", "10.0.0.2", meta={"models": "torchy:1"}),
            entry("c", "onnxruntime", "10.0.0.3", meta={"models": "simple:1"}),
        ]
    )
    onnx_a, torch, onnx_c = registry.sidecars
    assert registry.peers(onnx_c) == (onnx_a, onnx_c)
    assert registry.peers(torch) == (torch,)
    assert registry.owner("torchy") is torch


async def test_a_load_goes_to_the_owner_else_the_framework_it_names_else_the_first_replica(registry) -> None:
    registry._apply(
        [
            entry("a", "pytorch", "10.0.0.1", meta={"models": "torchy:1"}),
            entry("b", "onnxruntime", "10.0.0.2", meta={"models": ""}),
        ]
    )
    torch, onnx = registry.sidecars
    assert registry.placement("torchy", {"file:1/model.onnx": b"..."}) is torch
    assert registry.placement("fresh", {"config": '{"platform": "onnxruntime_onnx"}'}) is onnx
    assert registry.placement("fresh", {}) is torch


async def test_a_replica_without_a_service_address_is_reached_at_its_nodes_address(registry) -> None:
    registry._apply([entry("a", address="", node_address="10.9.8.7", port=8011)])
    assert addresses(registry.sidecars) == ["10.9.8.7:8011"]


@pytest.mark.parametrize(
    ("check", "node_check"),
    [("critical", "passing"), ("warning", "passing"), ("passing", "critical"), ("maintenance", "passing")],
)
async def test_a_replica_failing_any_of_its_checks_drops_out(registry, check, node_check) -> None:
    registry._apply(
        [
            entry("a", address="10.0.0.1", meta={"models": "simple:1"}),
            entry("b", address="10.0.0.2", meta={"models": "simple:1,2"}, check=check, node_check=node_check),
        ]
    )
    assert addresses(registry.sidecars) == ["10.0.0.1:8001"]
    assert addresses(registry.replicas("simple", "2")) == ["10.0.0.1:8001"]
    assert registry.ready_versions("simple") == frozenset({"1"})


async def test_a_replica_whose_check_starts_failing_leaves_the_next_snapshot(registry, metrics) -> None:
    registry._apply([entry("a", address="10.0.0.1"), entry("b", address="10.0.0.2")])
    registry._apply([entry("a", address="10.0.0.1"), entry("b", address="10.0.0.2", check="critical")])
    assert addresses(registry.sidecars) == ["10.0.0.1:8001"]
    assert metrics.registry.get_sample_value("turnout_gateway_replicas", {"state": "healthy"}) == 1


async def test_an_entry_without_framework_meta_or_a_port_is_not_a_replica(registry) -> None:
    no_framework = entry("a", address="10.0.0.1")
    del no_framework["Service"]["Meta"]["framework"]
    registry._apply([no_framework, entry("b", address="10.0.0.2", port=0), entry("c", address="10.0.0.3")])
    assert addresses(registry.sidecars) == ["10.0.0.3:8001"]


async def test_an_empty_answer_leaves_no_replicas(registry) -> None:
    registry._apply([entry("a")])
    registry._apply([])
    assert registry.sidecars == ()
    assert registry.owner("simple") is None


async def test_the_published_snapshot_never_changes_under_a_reader(registry) -> None:
    registry._apply([entry("a", address="10.0.0.1", meta={"models": "simple:1"})])
    before = registry._snapshot
    held = registry.replicas("simple", "1")

    registry._apply([entry("b", address="10.0.0.2", meta={"models": "simple:1"})])

    assert addresses(held) == ["10.0.0.1:8001"]
    assert addresses(before.clients) == ["10.0.0.1:8001"]
    assert addresses(registry.replicas("simple", "1")) == ["10.0.0.2:8001"]
    with pytest.raises(TypeError):
        before.by_model["simple"] = ()  # type: ignore[index]
    with pytest.raises(TypeError):
        before.versions["other"] = frozenset()  # type: ignore[index]


# --- meta ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("meta", "models"),
    [
        ({"models": "simple:1,2;other:1"}, {"simple": {"1", "2"}, "other": {"1"}}),
        ({"models": ""}, {}),
        ({}, {}),
        ({"models": "simple:1;"}, {"simple": {"1"}}),
        ({"models": "simple:"}, {"simple": set()}),
        ({"models": "noversions;simple:3"}, {"simple": {"3"}}),
        ({"models_0": "simple:1,", "models_1": "2;other:7"}, {"simple": {"1", "2"}, "other": {"7"}}),
        ({"models_1": "ple:4", "framework": "onnxruntime", "models_0": "sim"}, {"simple": {"4"}}),
        ({"models": "whole:1", "models_0": "split:1"}, {"whole": {"1"}}),
    ],
)
def test_models_meta_lists_the_ready_versions(meta, models) -> None:
    assert parse_models(meta) == {name: frozenset(versions) for name, versions in models.items()}


def test_models_meta_split_over_many_values_joins_back_in_numeric_order() -> None:
    # As sidecars/registration.py splits it: 512-character chunks, models_0 .. models_N.
    names = [f"model_with_a_long_name_{i:03d}" for i in range(200)]
    text = ";".join(f"{name}:1,{i + 2}" for i, name in enumerate(names))
    chunks = [text[i : i + 512] for i in range(0, len(text), 512)]
    assert len(chunks) > 10  # so models_10 must come after models_9, not after models_1
    meta = {"framework": "onnxruntime", "device": "cpu"} | {f"models_{i}": c for i, c in enumerate(chunks)}

    models = parse_models(meta)

    assert list(models) == names
    assert models["model_with_a_long_name_123"] == frozenset({"1", "125"})


async def test_split_models_meta_reaches_the_snapshot(registry) -> None:
    registry._apply([entry("a", meta={"models_0": "simple:1;tor", "models_1": "chy:2,3"})])
    assert registry.ready_versions("simple") == frozenset({"1"})
    assert registry.ready_versions("torchy") == frozenset({"2", "3"})


async def test_tls_meta_makes_a_tls_client_and_anything_else_a_plain_one(registry) -> None:
    registry._apply(
        [
            entry("a", address="10.0.0.1", meta={"tls": "true"}),
            entry("b", address="10.0.0.2", meta={"tls": "false"}),
            entry("c", address="10.0.0.3"),
        ]
    )
    assert [c.tls for c in registry.sidecars] == [True, False, False]


async def test_a_gateway_with_sidecar_tls_refuses_plain_replicas(consul, metrics, rng) -> None:
    registry = ConsulRegistry(consul, SERVICE, Balancer(rng, metrics), metrics, tls=SidecarTls())
    try:
        registry._apply(
            [
                entry("a", address="10.0.0.1", meta={"models": "simple:1"}),
                entry("b", address="10.0.0.2", meta={"tls": "true", "models": "simple:1"}),
            ]
        )
        assert addresses(registry.sidecars) == ["10.0.0.2:8001"]
        assert [c.tls for c in registry.sidecars] == [True]
    finally:
        await registry.close()


async def test_a_replica_that_stays_put_keeps_its_client_as_its_models_change(registry) -> None:
    meta = {"lane": "10.0.0.1:8101", "metrics": "10.0.0.1:8201"}
    registry._apply([entry("a", meta={**meta, "models": "simple:1"})])
    (client,) = registry.sidecars

    registry._apply([entry("a", meta={**meta, "models": "simple:1,2;fresh:1"})])

    assert registry.sidecars == (client,)
    assert registry.replicas("fresh", "1") == (client,)
    assert registry.ready_versions("simple") == frozenset({"1", "2"})


@pytest.mark.parametrize(
    "moved",
    [
        {"address": "10.0.0.9"},
        {"port": 8009},
        {"meta": {"lane": "10.0.0.1:8109", "metrics": "10.0.0.1:8201"}},
        {"meta": {"lane": "10.0.0.1:8101", "metrics": "10.0.0.1:8209"}},
        {"meta": {"lane": "10.0.0.1:8101", "metrics": "10.0.0.1:8201", "tls": "true"}},
    ],
)
async def test_a_replica_that_changes_where_it_is_reached_gets_a_new_client(registry, moved) -> None:
    registry._apply([entry("a", meta={"lane": "10.0.0.1:8101", "metrics": "10.0.0.1:8201"})])
    (old,) = registry.sidecars

    registry._apply([entry("a", **moved)])

    (new,) = registry.sidecars
    assert new is not old
    assert registry.peers(new) == (new,)


# --- rejoin grace ----------------------------------------------------------------------


async def test_while_rejoining_a_known_replica_consul_does_not_list_is_kept_with_its_client(registry) -> None:
    registry._apply(
        [
            entry("a", address="10.0.0.1", meta={"models": "simple:1"}),
            entry("b", address="10.0.0.2", meta={"models": "simple:1"}),
        ]
    )
    kept = registry.sidecars[1]

    registry._apply([entry("a", address="10.0.0.1", meta={"models": "simple:1"})], keep_missing=True)

    assert registry.sidecars[1] is kept
    assert addresses(registry.replicas("simple", "1")) == ["10.0.0.1:8001", "10.0.0.2:8001"]


async def test_while_rejoining_a_listed_replica_failing_its_check_still_drops_out(registry) -> None:
    registry._apply([entry("a", address="10.0.0.1"), entry("b", address="10.0.0.2")])
    registry._apply(
        [entry("a", address="10.0.0.1"), entry("b", address="10.0.0.2", check="critical")], keep_missing=True
    )
    assert addresses(registry.sidecars) == ["10.0.0.1:8001"]


async def test_while_rejoining_a_replica_that_registers_anew_replaces_what_was_kept(registry) -> None:
    registry._apply([entry("a", address="10.0.0.1", meta={"models": "simple:1"})])
    (old,) = registry.sidecars
    registry._apply([entry("a", address="10.0.0.5", meta={"models": "simple:2"})], keep_missing=True)
    assert addresses(registry.sidecars) == ["10.0.0.5:8001"]
    assert registry.sidecars[0] is not old
    assert registry.ready_versions("simple") == frozenset({"2"})


def fleet_of(*ids: str) -> list[dict[str, Any]]:
    return [entry(i, address=f"10.0.0.{n}", meta={"models": "simple:1"}) for n, i in enumerate(ids, start=1)]


A, B = "10.0.0.1:8001", "10.0.0.2:8001"
DOWN = ConsulUnavailable("consul at 127.0.0.1:8500: ConnectError('connection refused')")


async def watch(script: list[tuple[float, Any]], rng: random.Random) -> ConsulStandIn:
    """Run a registry's watch through `script` on virtual time, the registry's clock being
    the loop's; the stand-in Consul comes back with what it saw."""
    consul = ConsulStandIn(script)
    metrics = GatewayMetrics(CollectorRegistry())
    registry = ConsulRegistry(consul, SERVICE, Balancer(rng, metrics), metrics, clock=asyncio.get_running_loop().time)
    consul.fleet = lambda: tuple(registry.sidecars)
    try:
        with pytest.raises(ScriptDone):
            await registry.watch()
        assert await registry.wait_first(1.0)  # answered already: returns at once
    finally:
        await registry.close()
    return consul


@virtual_time
async def test_without_an_outage_a_replica_consul_stops_listing_leaves_at_once(rng) -> None:
    consul = await watch([(0.0, (fleet_of("a", "b"), 7)), (10.0, (fleet_of("a"), 8))], rng)

    assert fleets_seen(consul) == [[], [A, B], [A]]
    assert consul.indexes == [0, 7, 8]  # blocking queries all along
    assert consul.times == [0.0, 0.0, 10.0]  # and no pause of the watch's own between them


@virtual_time
async def test_after_an_outage_a_replica_consul_does_not_list_yet_stays_for_the_grace_then_goes(rng) -> None:
    consul = await watch(
        [
            (0.0, (fleet_of("a", "b"), 7)),
            (0.0, DOWN),
            (0.0, (fleet_of("a"), 3)),  # a restarted agent: only `a` has re-registered so far
            (REJOIN_GRACE_SECS - 3, (fleet_of("a"), 3)),
            (5.0, (fleet_of("a"), 3)),
        ],
        rng,
    )

    assert fleets_seen(consul) == [[], [A, B], [A, B], [A, B], [A, B], [A]]
    # While rejoining it polls (index 0), so a kept replica goes even if nothing changes.
    assert consul.indexes == [0, 7, 0, 0, 0, 3]


@virtual_time
async def test_a_kept_replica_that_re_registers_in_the_grace_stays_after_it(rng) -> None:
    consul = await watch(
        [
            (0.0, (fleet_of("a", "b"), 7)),
            (0.0, DOWN),
            (0.0, (fleet_of("a"), 3)),
            (2.0, (fleet_of("a", "b"), 4)),
            (REJOIN_GRACE_SECS, (fleet_of("a", "b"), 5)),
        ],
        rng,
    )
    assert fleets_seen(consul)[-1] == [A, B]
    # `b` kept its client through the outage, the grace and after it.
    assert len({fleet[1] for fleet in consul.fleets[1:]}) == 1


@virtual_time
async def test_the_grace_runs_from_when_consul_answers_again_not_from_the_outage(rng) -> None:
    consul = await watch(
        [
            (0.0, (fleet_of("a", "b"), 7)),
            *[(0.0, DOWN)] * 12,  # the watch's backoff pauses alone outlast the grace
            (0.0, (fleet_of("a"), 3)),
            (REJOIN_GRACE_SECS / 2, (fleet_of("a"), 3)),
        ],
        rng,
    )

    answered_again = consul.times[14]
    assert answered_again - consul.times[1] > REJOIN_GRACE_SECS
    assert fleets_seen(consul)[-2:] == [[A, B], [A, B]]


@virtual_time
async def test_an_outage_keeps_routing_on_the_last_known_fleet(rng) -> None:
    consul = await watch([(0.0, (fleet_of("a", "b"), 7)), (0.0, DOWN), (0.0, DOWN)], rng)
    assert fleets_seen(consul) == [[], [A, B], [A, B], [A, B]]
    assert consul.indexes == [0, 7, 0, 0]


def test_failed_meta_is_read_like_models_and_apart_from_them() -> None:
    meta = {"models": "simple:1", "failed_0": "linear:1,", "failed_1": "2;broken:"}
    assert parse_models(meta, "failed") == {"linear": frozenset({"1", "2"}), "broken": frozenset()}
    assert parse_models(meta) == {"simple": frozenset({"1"})}
