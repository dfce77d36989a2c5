"""Weighted version routing through gateways that discover their sidecars in Consul:
the split of unversioned requests, sticky keys (the same on two gateways), explicit
versions, live policy changes from Consul KV, invalid policies, unready versions, the
routing file of `turnout up`, and shadow traffic."""

from __future__ import annotations

import asyncio
import collections
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
import tritonclient.http as httpclient

from tests.fleet.fleet_harness import Consul, Process, gateway, metric, running, sidecar, wait_until, wait_until_async
from tests.harness import turnout_up

CONCURRENCY = 64


def _linear_input(module: object = aioclient) -> list[object]:
    tensor = module.InferInput("INPUT0", [1, 4], "FP32")  # type: ignore[attr-defined]
    tensor.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
    return [tensor]


async def _versions(address: str, count: int, headers: list[dict[str, str] | None] | None = None) -> list[str]:
    """Send `count` unversioned linear requests, CONCURRENCY at a time; the serving versions in order.
    Each answer's output must agree with its version (linear multiplies by it)."""
    client = aioclient.InferenceServerClient(address)
    inputs = _linear_input()
    results: list[str] = [""] * count
    next_index = iter(range(count))

    async def worker() -> None:
        for index in next_index:
            result = await client.infer("linear", inputs, headers=headers[index] if headers else None)
            version = result.get_response().model_version
            assert result.as_numpy("OUTPUT0")[0, 0] == float(version)
            results[index] = version

    try:
        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    finally:
        await client.close()
    return results


def _five_sigma(n: int, p: float) -> float:
    """Half-width of a 5-sigma band on a Binomial(n, p) count: a correct split falls
    outside it about once in 1.7 million runs."""
    return 5 * math.sqrt(n * p * (1 - p))


def _set_policy(consul: Consul, key: str, policy: object) -> None:
    assert consul.put(f"/v1/kv/{key}", json.dumps(policy).encode()) is True


def _fleet(consul: Consul, repository: Path, service: str, replicas: int = 2) -> list[Process]:
    return [sidecar(consul.http, repository, f"--consul-service={service}") for _ in range(replicas)]


async def test_weighted_split_sticky_explicit_and_live_kv(consul: Consul, fleet_repository: Path) -> None:
    service, prefix = "route-split", "route-split/policies/"
    _set_policy(consul, f"{prefix}linear", {"weights": {"1": 90, "2": 10}, "sticky_header": "x-user"})
    flags = (f"--consul-service={service}", f"--routing-kv-prefix={prefix}", "--routing-seed=7")
    replicas = _fleet(consul, fleet_repository, service)
    gateways = [gateway(consul.http, *flags) for _ in range(2)]
    with running(*gateways, *replicas):
        wait_until(lambda: len(consul.passing(service)) == 2, 15, "two passing replicas")
        first, second = (g.fields["grpc"] for g in gateways)

        # 10 000 unversioned requests split 90/10 within a 5-sigma binomial band.
        n = 10_000
        started = time.monotonic()
        counts = collections.Counter(await _versions(first, n))
        elapsed = time.monotonic() - started
        band = _five_sigma(n, 0.1)
        print(f"split of {n}: {dict(counts)} in {elapsed:.1f}s; expected 9000/1000 +- {band:.0f}")
        assert set(counts) == {"1", "2"}
        assert abs(counts["2"] - n * 0.1) <= band, counts
        routed = metric(gateways[0].fields["metrics"], "turnout_gateway_route_decisions_total", model="linear")
        assert routed == n

        # Sticky: each key always lands on one version, the same on both gateways,
        # and the keys split close to the weights.
        keys = [{"x-user": f"user-{i}"} for i in range(400)]
        on_first = await _versions(first, 800, keys + keys)
        on_second = await _versions(second, 400, keys)
        assert on_first[:400] == on_first[400:] == on_second
        assert 0 < on_first[:400].count("2") < 120  # 40 expected
        assert metric(gateways[1].fields["metrics"], "turnout_gateway_sticky_hits_total", model="linear") == 400

        # An explicit version is honoured, over the policy, on both protocols.
        with grpcclient.InferenceServerClient(first) as client:
            for _ in range(20):
                result = client.infer("linear", _linear_input(grpcclient), model_version="2")
                assert result.get_response().model_version == "2"
        with httpclient.InferenceServerClient(gateways[0].fields["http"]) as client:
            result = client.infer("linear", _linear_input(httpclient), model_version="1", headers={"x-user": "user-0"})
            assert result.get_response()["model_version"] == "1"

        # A live KV change reaches new requests within a second; sticky keys move only
        # as far as the new weights need (each moved key goes to the version that grew).
        _set_policy(consul, f"{prefix}linear", {"weights": {"1": 50, "2": 50}, "sticky_header": "x-user"})
        changed_at = time.monotonic()

        async def applied() -> list[str]:
            while True:
                moved = await _versions(first, 400, keys)
                if moved.count("2") > 120 or time.monotonic() - changed_at > 5:
                    return moved

        moved = await applied()
        assert time.monotonic() - changed_at < 1.0 + 0.5  # the new weights applied within a second (+ one round)
        assert all(after == "2" for before, after in zip(on_first[:400], moved, strict=True) if before != after)
        assert 140 < moved.count("2") < 260  # 200 expected
        assert await _versions(second, 400, keys) == moved  # both gateways moved the same keys

        # An invalid policy is rejected with a reason in the log; the last good one stays.
        _set_policy(consul, f"{prefix}linear", {"weights": {"1": -5}})
        wait_until(lambda: "rejected" in gateways[0].output(), 5, "the rejection to be logged")
        assert "must be a number >= 0" in gateways[0].output()
        assert await _versions(first, 400, keys) == moved

        # Weight on a version no replica has READY is skipped and its share redistributed.
        _set_policy(consul, f"{prefix}linear", {"weights": {"2": 50, "7": 50}})

        async def only_version_2() -> bool:
            return await _versions(first, 40) == ["2"] * 40

        await wait_until_async(only_version_2, 5, "version 7 to be skipped")
        assert await _versions(first, 200) == ["2"] * 200
        skipped = metric(gateways[0].fields["metrics"], "turnout_gateway_route_skipped_versions_total", version="7")
        assert skipped >= 20


async def test_shadow_is_counted_and_leaves_the_primary_alone(consul: Consul, fleet_repository: Path) -> None:
    service, prefix = "route-shadow", "route-shadow/policies/"
    flags = (f"--consul-service={service}", f"--routing-kv-prefix={prefix}", "--routing-seed=11")
    replicas = _fleet(consul, fleet_repository, service, replicas=1)
    gw = gateway(consul.http, *flags)
    with running(gw, *replicas):
        wait_until(lambda: consul.passing(service), 15, "a passing replica")
        address, metrics = gw.fields["grpc"], gw.fields["metrics"]

        async def timed_run(count: int) -> tuple[list[str], float]:
            started = time.monotonic()
            versions = await _versions(address, count)
            return versions, time.monotonic() - started

        _set_policy(consul, f"{prefix}linear", {"weights": {"1": 1}})

        async def plain_policy() -> bool:
            return await _versions(address, 10) == ["1"] * 10

        await wait_until_async(plain_policy, 5, "the plain policy")
        await timed_run(300)  # warm up
        _, plain = await timed_run(2000)

        _set_policy(consul, f"{prefix}linear", {"weights": {"1": 1}, "shadow": {"version": "2", "fraction": 1.0}})

        async def shadowing() -> bool:
            await _versions(address, 5)
            return metric(metrics, "turnout_gateway_shadow_requests_total") > 0

        await wait_until_async(shadowing, 5, "the shadow policy")
        before = metric(metrics, "turnout_gateway_shadow_requests_total")
        versions, shadowed = await timed_run(2000)
        # Every primary answer is still version 1's (its output checked in _versions).
        assert versions == ["1"] * 2000
        await asyncio.sleep(0.5)  # let the last shadows finish: they run after their primaries
        outcomes = {
            o: metric(metrics, "turnout_gateway_shadow_requests_total", version="2", outcome=o)
            for o in ("same", "different", "error", "dropped")
        }
        print(f"2000 requests: {plain:.2f}s plain, {shadowed:.2f}s with shadows; shadow outcomes {outcomes}")
        # Version 2 doubles: every answered shadow differs from its primary.
        assert outcomes["different"] > 0 and outcomes["same"] == 0 and outcomes["error"] == 0
        assert sum(outcomes.values()) - before >= 2000
        # The shadows share two cores with everything else; the primary may slow by at
        # most the cost of one extra inference per request (2x), never wait on them.
        assert shadowed < plain * 2.5 + 1.0


def test_turnout_up_routing_file(tmp_path: Path, fleet_repository: Path) -> None:
    routing = tmp_path / "routing.yaml"
    routing.write_text('models:\n  linear:\n    weights: {"1": 0, "2": 100}\n    sticky_header: x-user\n')
    with (
        turnout_up(fleet_repository, f"--routing={routing}") as server,
        httpclient.InferenceServerClient(server.http) as client,
    ):
        for _ in range(20):
            result = client.infer("linear", _linear_input(httpclient))
            assert result.get_response()["model_version"] == "2"
        assert (
            client.infer("linear", _linear_input(httpclient), model_version="1").get_response()["model_version"] == "1"
        )


def test_invalid_routing_file_stops_the_start(tmp_path: Path) -> None:
    routing = tmp_path / "routing.yaml"
    routing.write_text("models:\n  linear:\n    weights: {}\n")
    command = [sys.executable, "-m", "turnout", "gateway", "--sidecar=onnxruntime=127.0.0.1:1", f"--routing={routing}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "needs a non-empty 'weights' mapping" in done.stderr
