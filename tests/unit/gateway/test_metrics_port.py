"""gateway.metrics_port.FleetMetrics in process: replicas' /metrics served by stand-in
endpoints whose text each step sets; the fleet sum of a counter never goes down when a
replica leaves, restarts (its counters back to zero) or drops a model, is not counted
twice when a replica that left comes back with its counters, and gauges are the present
fleet's only."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.metrics_port import FleetMetrics
from gateway.upstream import SidecarClient
from protos.triton_metrics import MetricsEndpoint


class StandIn:
    """A replica's /metrics: `success` requests of model m, `pending` queued."""

    def __init__(self) -> None:
        self.success: dict[str, int] = {"m": 0}
        self.pending = 0
        self.endpoint = MetricsEndpoint("127.0.0.1", 0, self.render)
        self.address = f"127.0.0.1:{self.endpoint.port}"

    def render(self) -> bytes:
        lines = ["# TYPE nv_inference_request_success counter"]
        lines += [f'nv_inference_request_success{{model="{m}",version="1"}} {n}' for m, n in self.success.items()]
        lines += ["# TYPE nv_inference_pending_request_count gauge"]
        lines += [f'nv_inference_pending_request_count{{model="m",version="1"}} {self.pending}']
        return ("\n".join(lines) + "\n").encode()


@pytest.fixture
def stand_ins() -> Iterator[list[StandIn]]:
    replicas = [StandIn(), StandIn()]
    yield replicas
    for replica in replicas:
        replica.endpoint.close()


@pytest.fixture
async def fleet(stand_ins: list[StandIn]) -> AsyncIterator[tuple[FleetMetrics, list[SidecarClient]]]:
    clients = [SidecarClient("onnxruntime", f"127.0.0.1:{9 + i}", metrics=s.address) for i, s in enumerate(stand_ins)]
    present = list(clients)
    metrics = FleetMetrics(lambda: present)
    yield metrics, present
    await metrics.close()
    for client in clients:
        await client.close()


async def sample(metrics: FleetMetrics, name: str, model: str = "m") -> float:
    text = await metrics.render()
    for family in text_string_to_metric_families(text):
        for found in family.samples:
            if found.name in (name, f"{name}_total") and found.labels.get("model") == model:
                return float(found.value)
    return 0.0


async def test_a_replica_that_leaves_keeps_its_counts_in_the_sum(fleet, stand_ins) -> None:
    metrics, present = fleet
    stand_ins[0].success["m"], stand_ins[1].success["m"] = 3, 4
    stand_ins[1].pending = 2
    assert await sample(metrics, "nv_inference_request_success") == 7
    assert await sample(metrics, "nv_inference_pending_request_count") == 2

    gone = present.pop()
    assert await sample(metrics, "nv_inference_request_success") == 7
    assert await sample(metrics, "nv_inference_pending_request_count") == 0  # gauges: the present fleet only

    # Back with the counters it had (it was only away): counted once.
    stand_ins[1].success["m"] = 5
    present.append(gone)
    assert await sample(metrics, "nv_inference_request_success") == 8


async def test_a_restarted_replica_or_an_unloaded_model_takes_nothing_away(fleet, stand_ins) -> None:
    metrics, _ = fleet
    stand_ins[0].success.update(m=3, other=2)
    stand_ins[1].success["m"] = 4
    assert await sample(metrics, "nv_inference_request_success") == 7

    stand_ins[1].success["m"] = 1  # restarted: counting from zero again
    del stand_ins[0].success["other"]  # unloaded
    assert await sample(metrics, "nv_inference_request_success") == 3 + 4 + 1
    assert await sample(metrics, "nv_inference_request_success", "other") == 2
    stand_ins[1].success["m"] = 2
    assert await sample(metrics, "nv_inference_request_success") == 3 + 4 + 2
