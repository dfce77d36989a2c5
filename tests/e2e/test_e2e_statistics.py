"""Statistics rise with traffic, and the dynamic batcher merges concurrent requests."""

from __future__ import annotations

import asyncio

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio

from tests.e2e.simple_requests import (
    assert_grpc_serves,
    assert_http_serves,
    error_of,
    grpc_inputs,
    http_inputs,
    simple_arrays,
)
from tests.harness import Server


def _http_stats(url: str, model: str) -> dict:
    with httpclient.InferenceServerClient(url) as client:
        stats = client.get_inference_statistics(model)
    assert len(stats["model_stats"]) == 1
    return stats["model_stats"][0]


def test_statistics_count_requests(server: Server) -> None:
    before = _http_stats(server.http, "simple_stats")
    assert (before["name"], before["version"]) == ("simple_stats", "1")
    with httpclient.InferenceServerClient(server.http) as client:
        for seed in range(3):
            client.infer("simple_stats", http_inputs(*simple_arrays(seed=seed)))
    with grpcclient.InferenceServerClient(server.grpc) as client:
        client.infer("simple_stats", grpc_inputs(*simple_arrays(batch=2)))
    after = _http_stats(server.http, "simple_stats")
    assert after["inference_count"] - before["inference_count"] == 5
    assert after["execution_count"] - before["execution_count"] == 4
    success = after["inference_stats"]["success"]
    assert success["count"] - before["inference_stats"]["success"]["count"] == 4
    assert success["ns"] > before["inference_stats"]["success"]["ns"]
    assert after["last_inference"] >= before["last_inference"] and after["last_inference"] > 0
    for key in ("fail", "queue", "compute_input", "compute_infer", "compute_output"):
        assert set(after["inference_stats"][key]) == {"count", "ns"}
    sizes = {entry["batch_size"] for entry in after["batch_stats"]}
    assert {1, 2} <= sizes


def test_grpc_statistics(server: Server) -> None:
    with grpcclient.InferenceServerClient(server.grpc) as client:
        client.infer("simple_stats", grpc_inputs(*simple_arrays()))
        stats = client.get_inference_statistics("simple_stats")
        as_json = client.get_inference_statistics("simple_stats", as_json=True)
        everything = client.get_inference_statistics()
    assert len(stats.model_stats) == 1
    entry = stats.model_stats[0]
    assert (entry.name, entry.version) == ("simple_stats", "1")
    assert entry.inference_count >= 1
    assert entry.inference_stats.success.count >= 1
    # uint64 counters are strings in protobuf JSON.
    assert isinstance(as_json["model_stats"][0]["inference_count"], str)
    assert {"simple", "linear", "simple_stats"} <= {m.name for m in everything.model_stats}
    # linear serves two versions, one entry each.
    assert sorted(m.version for m in everything.model_stats if m.name == "linear") == ["1", "2"]


def test_http_statistics_of_every_model(server: Server) -> None:
    with httpclient.InferenceServerClient(server.http) as client:
        stats = client.get_inference_statistics()
    names = [(m["name"], m["version"]) for m in stats["model_stats"]]
    assert ("simple", "1") in names and ("linear", "2") in names


def test_statistics_unknown_model(server: Server) -> None:
    text = "requested model 'no_such_model' is not available"
    with httpclient.InferenceServerClient(server.http) as client:
        error = error_of(client.get_inference_statistics, "no_such_model")
    assert (error.status(), error.message()) == ("400", text)
    with grpcclient.InferenceServerClient(server.grpc) as client:
        error = error_of(client.get_inference_statistics, "no_such_model")
    assert (error.status(), error.message()) == ("StatusCode.INVALID_ARGUMENT", text)
    assert_http_serves(server.http)
    assert_grpc_serves(server.grpc)


async def test_aio_statistics(server: Server) -> None:
    http = httpaio.InferenceServerClient(server.http)
    rpc = grpcaio.InferenceServerClient(server.grpc)
    try:
        assert len((await http.get_inference_statistics("simple"))["model_stats"]) == 1
        assert len((await rpc.get_inference_statistics("simple")).model_stats) == 1
    finally:
        await http.close()
        await rpc.close()


async def test_dynamic_batching_merges_concurrent_requests(server: Server) -> None:
    before = _http_stats(server.http, "simple_batched")
    pairs = [simple_arrays(seed=300 + s) for s in range(32)]
    client = grpcaio.InferenceServerClient(server.grpc)
    try:
        results = await asyncio.gather(
            *(client.infer("simple_batched", grpc_inputs(a, b, module=grpcaio)) for a, b in pairs)
        )
    finally:
        await client.close()
    for (a, b), result in zip(pairs, results, strict=True):
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    after = _http_stats(server.http, "simple_batched")
    inferences = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert inferences == 32
    assert 1 <= executions < inferences
    assert any(entry["batch_size"] > 1 for entry in after["batch_stats"])
