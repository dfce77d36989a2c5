"""ModelStreamInfer: the sync client's stream with callbacks and the aio stream_infer;
errors arrive in-band and the stream keeps serving."""

from __future__ import annotations

import queue
from collections.abc import AsyncIterator
from typing import Any

import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio

from tests.e2e.simple_requests import check_simple, grpc_inputs, simple_arrays
from tests.harness import Server


def test_stream_with_in_band_error(server: Server) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    pairs = [simple_arrays(seed=s) for s in range(3)]
    with grpcclient.InferenceServerClient(server.grpc) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        try:
            client.async_stream_infer("simple", grpc_inputs(*pairs[0]), request_id="0")
            client.async_stream_infer("no_such_model", grpc_inputs(*pairs[1]), request_id="bad")
            client.async_stream_infer("simple", grpc_inputs(*pairs[2]), request_id="2")
            got = [answers.get(timeout=60) for _ in range(3)]
        finally:
            client.stop_stream()
    results = [r for r, e in got if e is None]
    errors = [e for r, e in got if e is not None]
    assert len(results) == 2 and len(errors) == 1
    assert errors[0].message() == "Request for unknown model: 'no_such_model' is not found"
    by_id = {r.get_response().id: r for r in results}
    assert set(by_id) == {"0", "2"}
    check_simple(by_id["0"], *pairs[0])
    check_simple(by_id["2"], *pairs[2])
    for result in results:
        parameters = result.get_response().parameters
        assert parameters["triton_final_response"].bool_param is True


def test_stream_many_requests_in_order_of_ids(server: Server) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    pairs = [simple_arrays(seed=100 + s) for s in range(10)]
    with grpcclient.InferenceServerClient(server.grpc) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        try:
            for index, (a, b) in enumerate(pairs):
                client.async_stream_infer("simple", grpc_inputs(a, b), request_id=str(index))
            got = [answers.get(timeout=60) for _ in pairs]
        finally:
            client.stop_stream()
    for result, error in got:
        assert error is None
        check_simple(result, *pairs[int(result.get_response().id)])


async def test_aio_stream_infer(server: Server) -> None:
    pairs = [simple_arrays(seed=200 + s) for s in range(4)]

    async def requests() -> AsyncIterator[dict[str, Any]]:
        for index, (a, b) in enumerate(pairs):
            yield {"model_name": "simple", "inputs": grpc_inputs(a, b, module=grpcaio), "request_id": str(index)}
        yield {"model_name": "simple", "inputs": grpc_inputs(*pairs[0], module=grpcaio), "model_version": "7"}

    client = grpcaio.InferenceServerClient(server.grpc)
    got = []
    try:
        async for result, error in client.stream_infer(inputs_iterator=requests()):
            got.append((result, error))
            if len(got) == len(pairs) + 1:
                break
    finally:
        await client.close()
    errors = [e for _, e in got if e is not None]
    assert [e.message() for e in errors] == ["Request for unknown model: 'simple' version 7 is not found"]
    results = [r for r, e in got if e is None]
    assert len(results) == len(pairs)
    for result in results:
        check_simple(result, *pairs[int(result.get_response().id)])
        assert result.get_response().parameters["triton_final_response"].bool_param is True
