"""Experiments across models through gateways that discover their sidecars in Consul: a
called name whose weights name other models' arms ("tripled:1"), answered under the called
name with the arm as model_version over HTTP and gRPC; the split, sticky users, metrics
per arm, metadata, config, readiness and the repository index of the called name; live
KV changes and rejected ones (unknown model, zero weights, a cycle); shadows to another
model compared within a tolerance; sequences that keep their arm."""

from __future__ import annotations

import asyncio
import collections
import json
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.fleet.fleet_harness import Consul, Process, gateway, metric, running, sidecar, wait_until, wait_until_async
from tests.harness import make_models

SERVICE, PREFIX = "experiments", "experiments/policies/"
CONCURRENCY = 32
# What each arm multiplies its input by (the models are linear: OUTPUT0 = INPUT0 * scale).
SCALES = {"linear:1": 1.0, "linear:2": 2.0, "tripled:1": 3.0, "nearly:1": 1.0001}


@pytest.fixture(scope="module")
def experiment_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("experiment_repo")
    models = make_models()
    models.write_linear(repo)  # versions 1 (x1) and 2 (x2)
    models.write_linear(repo, name="tripled", versions={1: 3.0})
    models.write_linear(repo, name="nearly", versions={1: 1.0001})
    # Two models keeping a sequence's running sum: any request reaching the other one, or
    # another replica, mid-sequence is refused for want of a START.
    for name in ("sum_a", "sum_b"):
        model_dir = models.write_sequence(repo, name, ("READY",), state=True, instances=1)
        assert model_dir.name == name
    return repo


@pytest.fixture(scope="module")
def fleet(consul: Consul, experiment_repository: Path) -> Iterator[Process]:
    """Two replicas, then a gateway (so that KV policies' arms find their models known)."""
    replicas = [sidecar(consul.http, experiment_repository, f"--consul-service={SERVICE}") for _ in range(2)]
    with running(*replicas):
        wait_until(lambda: len(consul.passing(SERVICE)) == 2, 30, "two passing replicas")
        front = gateway(consul.http, f"--consul-service={SERVICE}", f"--routing-kv-prefix={PREFIX}", "--routing-seed=5")
        with running(front):
            yield front


def _set(consul: Consul, model: str, policy: object) -> None:
    assert consul.put(f"/v1/kv/{PREFIX}{model}", json.dumps(policy).encode()) is True


def _input(module: object = aioclient) -> list[object]:
    tensor = module.InferInput("INPUT0", [1, 4], "FP32")  # type: ignore[attr-defined]
    tensor.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
    return [tensor]


async def _arms(
    address: str, model: str, count: int, headers: list[dict[str, str]] | None = None, **options: str
) -> list[str]:
    """Send `count` requests for `model`; the arm each was answered by (its model_version),
    after checking the answer is the called name's and the output that arm computes."""
    client = aioclient.InferenceServerClient(address)
    inputs = _input()
    results = [""] * count
    indexes = iter(range(count))

    async def worker() -> None:
        for index in indexes:
            result = await client.infer(model, inputs, headers=headers[index] if headers else None, **options)
            response = result.get_response()
            assert response.model_name == model
            assert result.as_numpy("OUTPUT0")[0, 0] == np.float32(SCALES[response.model_version])
            results[index] = response.model_version

    try:
        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    finally:
        await client.close()
    return results


async def test_an_experiment_splits_sticks_and_answers_under_the_called_name(consul: Consul, fleet: Process) -> None:
    _set(consul, "scale", {"weights": {"linear:1": 80, "tripled:1": 20}, "sticky_header": "x-user"})
    address, metrics, http = fleet.fields["grpc"], fleet.fields["metrics"], fleet.fields["http"]

    async def applied() -> bool:
        try:
            return bool(await _arms(address, "scale", 4))
        except InferenceServerException:
            return False

    await wait_until_async(applied, 10, "the experiment's policy")
    before = {
        arm: metric(metrics, "turnout_gateway_route_decisions_total", model="scale", version=arm) for arm in SCALES
    }

    # The split: 4000 requests 80/20 within a 5-sigma binomial band.
    n = 4000
    counts = collections.Counter(await _arms(address, "scale", n))
    band = 5 * math.sqrt(n * 0.2 * 0.8)
    print(f"split of {n}: {dict(counts)}; expected 3200/800 +- {band:.0f}")
    assert set(counts) == {"linear:1", "tripled:1"}
    assert abs(counts["tripled:1"] - n * 0.2) <= band, counts
    # Metrics per arm, labelled by the called model and the arm.
    for arm in ("linear:1", "tripled:1"):
        routed = metric(metrics, "turnout_gateway_route_decisions_total", model="scale", version=arm)
        assert routed - before[arm] == counts[arm]
        timed = metric(metrics, "turnout_gateway_request_duration_seconds_count", model="scale", version=arm)
        assert timed >= counts[arm]

    # Sticky users: each key keeps its arm; the keys split near the weights.
    keys = [{"x-user": f"user-{i}"} for i in range(300)]
    arms = await _arms(address, "scale", 600, keys + keys)
    assert arms[:300] == arms[300:]
    assert 20 < arms[:300].count("tripled:1") < 100  # 60 expected
    assert metric(metrics, "turnout_gateway_sticky_hits_total", model="scale") >= 600

    # tritonclient over HTTP: the response, metadata, config, readiness and the index.
    with httpclient.InferenceServerClient(http) as client:
        response = client.infer("scale", _input(httpclient), headers={"x-user": "user-0"}).get_response()
        assert response["model_name"] == "scale" and response["model_version"] == arms[0]
        metadata = client.get_model_metadata("scale")
        assert metadata["name"] == "scale" and metadata["versions"] == ["linear:1", "tripled:1"]
        assert [tensor["name"] for tensor in metadata["inputs"]] == ["INPUT0"]
        assert client.get_model_config("scale")["name"] == "scale"
        assert client.is_model_ready("scale")
        assert not client.is_model_ready("scale", "1")  # no arm of it
        index = [entry for entry in client.get_model_repository_index() if entry["name"] == "scale"]
        assert [(e["version"], e["state"]) for e in index] == [("linear:1", "READY"), ("tripled:1", "READY")]

    # tritonclient over gRPC: an arm asked for by its spelling, and a version that is none.
    with grpcclient.InferenceServerClient(address) as client:
        result = client.infer("scale", _input(grpcclient), model_version="tripled:1")
        assert (result.get_response().model_name, result.get_response().model_version) == ("scale", "tripled:1")
        assert result.as_numpy("OUTPUT0")[0, 0] == 3.0
        assert client.get_model_metadata("scale", "tripled:1").versions == ["tripled:1"]
        assert client.is_model_ready("scale", "tripled:1")
        with pytest.raises(InferenceServerException) as info:
            client.infer("scale", _input(grpcclient), model_version="7")
        assert info.value.status() == "StatusCode.NOT_FOUND"
        assert info.value.message() == "Request for unknown model: 'scale' version 7 is not found"


async def test_experiments_change_live_and_bad_ones_change_nothing(consul: Consul, fleet: Process) -> None:
    address = fleet.fields["grpc"]
    _set(consul, "swap", {"weights": {"linear:2": 1}})

    async def serving(arm: str) -> bool:
        try:
            return await _arms(address, "swap", 20) == [arm] * 20
        except InferenceServerException:
            return False

    await wait_until_async(lambda: serving("linear:2"), 10, "the first policy")
    # A live change reaches new requests.
    _set(consul, "swap", {"weights": {"tripled:1": 1, "linear:2": 0}})
    await wait_until_async(lambda: serving("tripled:1"), 5, "the changed policy")

    # Each bad policy is refused with its reason in the log; the last good one stays.
    bad = [
        ({"weights": {"tripled:1": 1, "nope:1": 1}}, "arm 'nope:1' of model 'swap' names unknown model 'nope'"),
        ({"weights": {"tripled:1": 0, "linear:1": 0}}, "weights of model 'swap' must not all be zero"),
        ({"weights": {"swap": 1}}, "arm 'swap' of model 'swap' names the model itself; name one of its versions"),
    ]
    for policy, reason in bad:
        _set(consul, "swap", policy)
        wait_until(lambda: reason in fleet.output(), 10, f"the rejection: {reason}")  # noqa: B023
        assert await _arms(address, "swap", 40) == ["tripled:1"] * 40

    # A chain: while "chained" has an arm of linear, linear may not route to other models.
    _set(consul, "chained", {"weights": {"linear:1": 1}})
    await wait_until_async(lambda: _answers(address, "chained", "linear:1"), 10, "the chained policy")
    _set(consul, "linear", {"weights": {"1": 50, "tripled:1": 50}})
    chain = "arm 'linear:1' of model 'chained' names model 'linear', which routes to other models (a chain)"
    wait_until(lambda: chain in fleet.output(), 10, "the chain's rejection")
    assert set(await _arms(address, "chained", 20)) == {"linear:1"}

    # A cycle: linear routes half to tripled, then tripled would route back to linear.
    consul.delete(f"/v1/kv/{PREFIX}chained")
    consul.delete(f"/v1/kv/{PREFIX}scale")  # the first test's, which names linear:1 too
    _set(consul, "linear", {"weights": {"1": 50, "tripled:1": 50}})
    await wait_until_async(lambda: _both(address), 10, "linear's experiment")
    _set(consul, "tripled", {"weights": {"linear:1": 1}})
    cycle = "(a cycle: 'linear' -> 'tripled' -> 'linear')"
    wait_until(lambda: cycle in fleet.output(), 10, "the cycle's rejection")
    with grpcclient.InferenceServerClient(address) as client:  # tripled still answers as itself
        result = client.infer("tripled", _input(grpcclient))
        assert result.get_response().model_version == "1" and result.as_numpy("OUTPUT0")[0, 0] == 3.0
    consul.delete(f"/v1/kv/{PREFIX}tripled")
    consul.delete(f"/v1/kv/{PREFIX}linear")


async def _answers(address: str, model: str, arm: str) -> bool:
    try:
        return await _arms(address, model, 10) == [arm] * 10
    except InferenceServerException:
        return False


async def _both(address: str) -> bool:
    """linear's unversioned requests reach both its version 1 and tripled."""
    client = aioclient.InferenceServerClient(address)
    try:
        seen = set()
        for _ in range(40):
            result = await client.infer("linear", _input())
            seen.add(result.get_response().model_version)
        return seen == {"1", "tripled:1"}
    finally:
        await client.close()


async def test_a_shadow_to_another_model_is_compared_within_its_tolerance(consul: Consul, fleet: Process) -> None:
    """Two called names shadow to nearly:1 (x1.0001) from linear:1 (x1): one exactly, one
    within rtol 1e-3 given for its output, over a shadow tolerance of zero."""
    address, metrics = fleet.fields["grpc"], fleet.fields["metrics"]
    exact = {"version": "nearly:1", "rtol": 0, "atol": 0}
    loose = {"version": "nearly:1", "rtol": 0, "atol": 0, "outputs": {"OUTPUT0": {"rtol": 1e-3}}}
    _set(consul, "shadowed_exact", {"weights": {"linear:1": 1}, "shadow": exact})
    _set(consul, "shadowed_loose", {"weights": {"linear:1": 1}, "shadow": loose})

    def outcomes(model: str) -> dict[str, float]:
        shadows = "turnout_gateway_shadow_requests_total"
        return {
            o: metric(metrics, shadows, model=model, version="nearly:1", outcome=o)
            for o in ("same", "different", "error", "dropped")
        }

    for model in ("shadowed_exact", "shadowed_loose"):

        async def shadowing() -> bool:
            try:
                await _arms(address, model, 5)  # noqa: B023
            except InferenceServerException:  # the policy has not arrived yet
                return False
            await asyncio.sleep(0.2)
            return sum(outcomes(model).values()) > 0  # noqa: B023

        await wait_until_async(shadowing, 10, f"the shadow policy of {model}")
        start = sum(outcomes(model).values())
        assert await _arms(address, model, 300) == ["linear:1"] * 300  # the primary is untouched

        async def settled() -> bool:
            # Every copy is compared, failed or dropped (more than 16 running at once).
            return sum(outcomes(model).values()) >= start + 300  # noqa: B023

        await wait_until_async(settled, 20, f"the shadows of {model}")

    exact_outcomes, loose_outcomes = outcomes("shadowed_exact"), outcomes("shadowed_loose")
    print(f"exact: {exact_outcomes}; within rtol 1e-3: {loose_outcomes}")
    assert exact_outcomes["different"] > 0 and exact_outcomes["same"] == exact_outcomes["error"] == 0
    assert loose_outcomes["same"] > 0 and loose_outcomes["different"] == loose_outcomes["error"] == 0
    for model in ("shadowed_exact", "shadowed_loose"):
        largest = metric(metrics, "turnout_gateway_shadow_max_difference", model=model, version="nearly:1")
        assert 5e-5 < largest < 2e-4, largest  # |1.0001 - 1| in float32, whatever the tolerance


async def test_a_sequence_keeps_its_arm_across_gateways(consul: Consul, fleet: Process) -> None:
    """Each sequence alternates between two gateways step by step; the second never saw
    its START, and finds the arm and replica that hold it as it finds a version's."""
    _set(consul, "running", {"weights": {"sum_a:1": 50, "sum_b:1": 50}})
    flags = (f"--consul-service={SERVICE}", f"--routing-kv-prefix={PREFIX}", "--routing-seed=6")
    other = gateway(consul.http, *flags)
    clients = [aioclient.InferenceServerClient(g.fields["grpc"]) for g in (fleet, other)]

    def step_input(value: int) -> list[aioclient.InferInput]:
        tensor = aioclient.InferInput("INPUT", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.full([1, 1], value, dtype=np.int32))
        return [tensor]

    async def run(sequence_id: int | str) -> set[str]:
        arms = set()
        for step in range(6):
            result = await clients[step % 2].infer(
                "running", step_input(2), sequence_id=sequence_id, sequence_start=step == 0, sequence_end=step == 5
            )
            # The running sum proves every step reached the model and replica of the START.
            assert int(result.as_numpy("OUTPUT")[0, 0]) == 2 * (step + 1), (sequence_id, step)
            assert result.get_response().model_name == "running"
            arms.add(result.get_response().model_version)
        return arms

    async def applied() -> bool:
        try:
            return bool(await run(999))
        except InferenceServerException:
            return False

    with running(other):
        try:
            await wait_until_async(applied, 10, "the sequence experiment on both gateways")
            ids: list[int | str] = [*range(1, 11), *(f"user-{i}" for i in range(10))]
            per_sequence = await asyncio.gather(*(run(i) for i in ids))
            assert all(len(arms) == 1 for arms in per_sequence)  # one arm per sequence
            assert set().union(*per_sequence) == {"sum_a:1", "sum_b:1"}  # and the split still splits
        finally:
            for client in clients:
                await client.close()
