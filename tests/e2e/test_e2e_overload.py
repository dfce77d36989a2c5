"""Overload: beyond --sidecar-max-inflight the gateway refuses at once with Triton's
queue-full text (UNAVAILABLE / 503 plus Retry-After); a model's max_queue_size does
the same inside its sidecar. Everything accepted is answered."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.simple_requests import check_simple, grpc_inputs, http_inputs, simple_arrays
from tests.harness import Server, turnout_up, write_repository

LIMIT = 2
QUEUE_FULL = "[request id: <id_unknown>] Exceeds maximum queue size"


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = write_repository(tmp_path_factory.mktemp("repo_overload"), ("simple_held", "simple_queue"))
    with turnout_up(repo, f"--sidecar-max-inflight={LIMIT}") as running:
        yield running


def test_beyond_the_limit_is_refused_fast(limited: Server) -> None:
    a, b = simple_arrays()

    async def burst() -> list[tuple[object, float]]:
        async with grpcaio.InferenceServerClient(limited.grpc) as client:

            async def one() -> tuple[object, float]:
                started = time.monotonic()
                try:
                    result: object = await client.infer("simple_held", grpc_inputs(a, b, module=grpcaio))
                except InferenceServerException as exc:
                    result = exc
                return result, time.monotonic() - started

            first = [asyncio.ensure_future(one()) for _ in range(LIMIT)]
            await asyncio.sleep(0.3)  # the first ones are queued in the sidecar now
            rest = await asyncio.gather(*(one() for _ in range(6)))
            # Over HTTP too, while the limit is reached: 503, Triton's text, Retry-After.
            async with httpx.AsyncClient() as http:
                response = await http.post(
                    f"http://{limited.http}/v2/models/simple_held/infer",
                    json={"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": [0] * 16}]},
                )
            assert response.status_code == 503
            assert response.json() == {"error": QUEUE_FULL}
            assert response.headers["retry-after"] == "1"
            return [*await asyncio.gather(*first), *rest]

    outcomes = asyncio.run(burst())
    answered = [r for r, _ in outcomes if not isinstance(r, InferenceServerException)]
    refused = [(r, s) for r, s in outcomes if isinstance(r, InferenceServerException)]
    assert len(answered) == LIMIT and len(refused) == 6
    for result in answered:
        check_simple(result, a, b)
    for error, seconds in refused:
        assert isinstance(error, InferenceServerException)
        assert error.status() == "StatusCode.UNAVAILABLE"
        assert error.message() == QUEUE_FULL
        assert seconds < 1.0  # refused, not queued behind the held ones


def test_model_queue_full_has_retry_after(limited: Server) -> None:
    # simple_queue holds a request a second and queues one: of two at once, one is refused by the sidecar.
    a, b = simple_arrays()

    async def pair() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=30) as http:
            body = {
                "inputs": [
                    {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": a.flatten().tolist()},
                    {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": b.flatten().tolist()},
                ]
            }
            url = f"http://{limited.http}/v2/models/simple_queue/infer"
            return list(await asyncio.gather(*(http.post(url, json=body) for _ in range(LIMIT))))

    responses = asyncio.run(pair())
    codes = sorted(r.status_code for r in responses)
    assert codes == [200, 503]
    refused = next(r for r in responses if r.status_code == 503)
    assert refused.json()["error"].endswith("Exceeds maximum queue size")
    assert refused.headers["retry-after"] == "1"
    # Once the burst is over, the gateway serves again.
    with httpclient.InferenceServerClient(limited.http) as client:
        check_simple(client.infer("simple_queue", http_inputs(a, b)), a, b)
