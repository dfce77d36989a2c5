"""The dynamic batcher through real requests: batching, shape grouping, queue limits,
timeouts (REJECT, DELAY, per-request override) and priorities."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import tritonclient.grpc.aio as aioclient
from tritonclient.utils import InferenceServerException

from tests.sidecars.sidecar_harness import Sidecar, simple_inputs


async def infer_many(url: str, model: str, count: int, **kwargs: object) -> list[object]:
    client = aioclient.InferenceServerClient(url)
    try:
        inputs, _ = simple_inputs(aioclient)
        calls = [client.infer(model, inputs, request_id=str(i), **kwargs) for i in range(count)]
        return await asyncio.gather(*calls, return_exceptions=True)
    finally:
        await client.close()


async def stats_of(url: str, model: str) -> object:
    client = aioclient.InferenceServerClient(url)
    try:
        return (await client.get_inference_statistics(model)).model_stats[0]
    finally:
        await client.close()


async def test_concurrent_rows_run_as_fewer_batches(main_sidecar: Sidecar) -> None:
    results = await infer_many(main_sidecar.url, "simple_dyn", 32)
    for index, result in enumerate(results):
        assert not isinstance(result, BaseException), result
        assert result.get_response().id == str(index)  # type: ignore[attr-defined]
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0")[0], np.arange(16) + 1)  # type: ignore[attr-defined]
    stats = await stats_of(main_sidecar.url, "simple_dyn")
    assert stats.inference_count == 32  # type: ignore[attr-defined]
    assert stats.execution_count < stats.inference_count  # type: ignore[attr-defined]
    assert any(b.batch_size > 1 for b in stats.batch_stats)  # type: ignore[attr-defined]


async def test_without_dynamic_batching_each_request_runs_alone(main_sidecar: Sidecar) -> None:
    before = await stats_of(main_sidecar.url, "simple")
    await infer_many(main_sidecar.url, "simple", 8)
    after = await stats_of(main_sidecar.url, "simple")
    executions = after.execution_count - before.execution_count  # type: ignore[attr-defined]
    assert executions == after.inference_count - before.inference_count == 8  # type: ignore[attr-defined]


async def test_different_shapes_are_not_merged(main_sidecar: Sidecar) -> None:
    client = aioclient.InferenceServerClient(main_sidecar.url)
    try:
        calls = []
        for length in (1, 2, 3, 1, 2, 3, 4, 4):
            data = np.arange(length, dtype=np.float32).reshape(1, length)
            tensor = aioclient.InferInput("INPUT0", [1, length], "FP32")
            tensor.set_data_from_numpy(data)
            calls.append(client.infer("auto_identity", [tensor]))
        results = await asyncio.gather(*calls)
    finally:
        await client.close()
    for length, result in zip((1, 2, 3, 1, 2, 3, 4, 4), results, strict=True):
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.arange(length, dtype=np.float32)[None])


async def test_full_queue_is_unavailable(main_sidecar: Sidecar) -> None:
    results = await infer_many(main_sidecar.url, "simple_queue", 3)
    errors = [r for r in results if isinstance(r, InferenceServerException)]
    assert len(errors) == 2
    assert all(e.status() == "StatusCode.UNAVAILABLE" for e in errors)
    assert errors[0].message().endswith("] Exceeds maximum queue size")
    assert sum(not isinstance(r, BaseException) for r in results) == 1


async def test_queue_timeout_rejects(main_sidecar: Sidecar) -> None:
    (result,) = await infer_many(main_sidecar.url, "simple_timeout", 1)
    assert isinstance(result, InferenceServerException)
    assert result.status() == "StatusCode.UNAVAILABLE"
    assert result.message() == "Request timeout expired"


async def test_timeout_override_applies_when_allowed_and_shorter(main_sidecar: Sidecar) -> None:
    (result,) = await infer_many(main_sidecar.url, "simple_override", 1, timeout=100_000)
    assert isinstance(result, InferenceServerException)
    assert result.message() == "Request timeout expired"


async def test_delay_action_still_answers(main_sidecar: Sidecar) -> None:
    results = await infer_many(main_sidecar.url, "simple_delay", 2)
    assert all(not isinstance(r, BaseException) for r in results), results


@pytest.mark.parametrize("priority", [0, 1, 2, 9])
async def test_priorities_are_served(main_sidecar: Sidecar, priority: int) -> None:
    results = await infer_many(main_sidecar.url, "simple_priority", 4, priority=priority)
    assert [r.get_response().id for r in results] == ["0", "1", "2", "3"]  # type: ignore[attr-defined]
