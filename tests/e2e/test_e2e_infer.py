"""Inference through all four clients: binary and JSON tensors, BYTES, output selection,
classification, compression, async calls and explicit model versions."""

from __future__ import annotations

import asyncio
import json
import queue
import struct

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio

from tests.e2e.simple_requests import (
    check_simple,
    error_of,
    grpc_inputs,
    http_inputs,
    simple_arrays,
    string_arrays,
)
from tests.harness import Server

LINEAR_IN = np.array([[1.0, 2.0, 3.0, 4.0]], dtype=np.float32)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_http_infer(server: Server, binary: bool) -> None:
    a, b = simple_arrays(batch=2)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)]
    outputs.append(httpclient.InferRequestedOutput("OUTPUT1", binary_data=binary))
    with httpclient.InferenceServerClient(server.http) as client:
        result = client.infer("simple", http_inputs(a, b, binary), outputs=outputs, request_id="req-7")
    check_simple(result, a, b)
    response = result.get_response()
    assert response["model_name"] == "simple"
    assert response["model_version"] == "1"
    assert response["id"] == "req-7"
    first = response["outputs"][0]
    assert (first["name"], first["datatype"], first["shape"]) == ("OUTPUT0", "INT32", [2, 16])
    if binary:
        assert first["parameters"] == {"binary_data_size": 128}
        assert "data" not in first
    else:
        assert first["data"] == (a + b).flatten().tolist()


def test_http_infer_without_outputs_asks_binary(server: Server) -> None:
    a, b = simple_arrays()
    with httpclient.InferenceServerClient(server.http) as client:
        result = client.infer("simple", http_inputs(a, b))
    check_simple(result, a, b)
    # With no `outputs`, tritonclient sends binary_data_output=true: every output is binary.
    for output in result.get_response()["outputs"]:
        assert output["parameters"]["binary_data_size"] == 64


def test_http_output_selection(server: Server) -> None:
    a, b = simple_arrays()
    with httpclient.InferenceServerClient(server.http) as client:
        result = client.infer("simple", http_inputs(a, b), outputs=[httpclient.InferRequestedOutput("OUTPUT1")])
    assert [o["name"] for o in result.get_response()["outputs"]] == ["OUTPUT1"]
    assert result.as_numpy("OUTPUT0") is None
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_http_json_is_default_without_binary_data_output(server: Server) -> None:
    a, b = simple_arrays()
    body = {
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": a.flatten().tolist()},
            {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": b.tolist()},
        ]
    }
    response = httpx.post(f"http://{server.http}/v2/models/simple/infer", json=body, timeout=30)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    assert "inference-header-content-length" not in response.headers
    payload = response.json()
    assert payload["model_name"] == "simple"
    assert payload["model_version"] == "1"
    assert [o["name"] for o in payload["outputs"]] == ["OUTPUT0", "OUTPUT1"]
    assert payload["outputs"][0]["data"] == (a + b).flatten().tolist()
    assert payload["outputs"][1]["data"] == (a - b).flatten().tolist()


def test_http_binary_data_output_parameter(server: Server) -> None:
    a, b = simple_arrays()
    inputs = [
        {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": a.flatten().tolist()},
        {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": b.flatten().tolist()},
    ]
    # The request-wide binary_data_output is for the outputs the request does not list.
    body = {"inputs": inputs, "parameters": {"binary_data_output": True}}
    response = httpx.post(f"http://{server.http}/v2/models/simple/infer", json=body, timeout=30)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/octet-stream"
    header_length = int(response.headers["inference-header-content-length"])
    header = json.loads(response.content[:header_length])
    assert [output["parameters"] for output in header["outputs"]] == [{"binary_data_size": 64}] * 2
    tail = np.frombuffer(response.content[header_length:], dtype="<i4")
    np.testing.assert_array_equal(tail, np.concatenate([(a + b).flatten(), (a - b).flatten()]))
    # A listed output follows its own binary_data, JSON without it, as in Triton 2.51.
    outputs = [{"name": "OUTPUT0", "parameters": {"binary_data": True}}, {"name": "OUTPUT1"}]
    body = {"inputs": inputs, "outputs": outputs, "parameters": {"binary_data_output": True}}
    response = httpx.post(f"http://{server.http}/v2/models/simple/infer", json=body, timeout=30)
    header_length = int(response.headers["inference-header-content-length"])
    header = json.loads(response.content[:header_length])
    assert header["outputs"][0]["parameters"] == {"binary_data_size": 64}
    assert header["outputs"][1]["data"] == (a - b).flatten().tolist()
    np.testing.assert_array_equal(np.frombuffer(response.content[header_length:], dtype="<i4"), (a + b).flatten())
    outputs[0]["parameters"] = {"binary_data": False}
    response = httpx.post(f"http://{server.http}/v2/models/simple/infer", json=body, timeout=30)
    assert response.headers["content-type"] == "application/json"
    assert [output["data"] for output in response.json()["outputs"]] == [
        (a + b).flatten().tolist(),
        (a - b).flatten().tolist(),
    ]


def test_grpc_infer(server: Server) -> None:
    a, b = simple_arrays(batch=3)
    with grpcclient.InferenceServerClient(server.grpc) as client:
        result = client.infer("simple", grpc_inputs(a, b), request_id="r1")
        only = client.infer("simple", grpc_inputs(a, b), outputs=[grpcclient.InferRequestedOutput("OUTPUT1")])
    check_simple(result, a, b)
    response = result.get_response()
    assert (response.model_name, response.model_version, response.id) == ("simple", "1", "r1")
    assert [o.name for o in response.outputs] == ["OUTPUT0", "OUTPUT1"]
    assert list(response.outputs[0].shape) == [3, 16]
    assert len(response.raw_output_contents) == 2
    assert [o.name for o in only.get_response().outputs] == ["OUTPUT1"]
    np.testing.assert_array_equal(only.as_numpy("OUTPUT1"), a - b)


async def test_http_aio_infer(server: Server) -> None:
    a, b = simple_arrays()
    client = httpaio.InferenceServerClient(server.http)
    try:
        result = await client.infer("simple", http_inputs(a, b, module=httpaio))
        json_result = await client.infer(
            "simple",
            http_inputs(a, b, binary=False, module=httpaio),
            outputs=[httpaio.InferRequestedOutput("OUTPUT0", binary_data=False)],
        )
    finally:
        await client.close()
    check_simple(result, a, b)
    np.testing.assert_array_equal(json_result.as_numpy("OUTPUT0"), a + b)


async def test_grpc_aio_infer(server: Server) -> None:
    a, b = simple_arrays()
    client = grpcaio.InferenceServerClient(server.grpc)
    try:
        result = await client.infer("simple", grpc_inputs(a, b, module=grpcaio))
    finally:
        await client.close()
    check_simple(result, a, b)


def _bytes_input(module: object, name: str, array: np.ndarray, **kwargs: object) -> object:
    tensor = module.InferInput(name, list(array.shape), "BYTES")  # type: ignore[attr-defined]
    tensor.set_data_from_numpy(array, **kwargs)
    return tensor


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_http_bytes(server: Server, binary: bool) -> None:
    a, b = string_arrays()
    inputs = [_bytes_input(httpclient, "INPUT0", a, binary_data=binary)]
    inputs.append(_bytes_input(httpclient, "INPUT1", b, binary_data=binary))
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("OUTPUT0", "OUTPUT1")]
    with httpclient.InferenceServerClient(server.http) as client:
        result = client.infer("simple_string", inputs, outputs=outputs)
    sums = result.as_numpy("OUTPUT0")
    diffs = result.as_numpy("OUTPUT1")
    expected_sums = [str(i + 1) for i in range(16)]
    expected_diffs = [str(i - 1) for i in range(16)]
    if binary:
        assert [x.decode() for x in sums[0]] == expected_sums
        assert [x.decode() for x in diffs[0]] == expected_diffs
    else:
        assert [str(x) for x in sums[0]] == expected_sums
        assert [str(x) for x in diffs[0]] == expected_diffs


def test_http_bytes_identity_variable_length(server: Server) -> None:
    values = np.array([[b"", b"a", "na\u00efve".encode(), b"x" * 300]], dtype=np.object_)
    with httpclient.InferenceServerClient(server.http) as client:
        result = client.infer("simple_identity", [_bytes_input(httpclient, "INPUT0", values)])
    assert result.as_numpy("OUTPUT0").tolist() == values.tolist()
    size = sum(4 + len(v) for v in values[0])
    assert result.get_response()["outputs"][0]["parameters"] == {"binary_data_size": size}


def test_grpc_bytes(server: Server) -> None:
    a, b = string_arrays()
    identity = np.array([[b"\x00\x01\x02\x03", b"he\x00llo", b"turnout", b""]], dtype=np.object_)
    with grpcclient.InferenceServerClient(server.grpc) as client:
        result = client.infer(
            "simple_string", [_bytes_input(grpcclient, "INPUT0", a), _bytes_input(grpcclient, "INPUT1", b)]
        )
        echoed = client.infer("simple_identity", [_bytes_input(grpcclient, "INPUT0", identity)])
    assert [x.decode() for x in result.as_numpy("OUTPUT0")[0]] == [str(i + 1) for i in range(16)]
    assert echoed.as_numpy("OUTPUT0").tolist() == identity.tolist()


def _linear_input(module: object) -> object:
    tensor = module.InferInput("INPUT0", [1, 4], "FP32")  # type: ignore[attr-defined]
    tensor.set_data_from_numpy(LINEAR_IN)
    return tensor


@pytest.mark.parametrize(("version", "scale", "served"), [("1", 1.0, "1"), ("2", 2.0, "2"), ("", 2.0, "2")])
def test_versions(server: Server, version: str, scale: float, served: str) -> None:
    with httpclient.InferenceServerClient(server.http) as client:
        result = client.infer("linear", [_linear_input(httpclient)], model_version=version)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), LINEAR_IN * scale)
    assert result.get_response()["model_version"] == served
    with grpcclient.InferenceServerClient(server.grpc) as client:
        result = client.infer("linear", [_linear_input(grpcclient)], model_version=version)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), LINEAR_IN * scale)
    assert result.get_response().model_version == served


def test_unknown_version(server: Server) -> None:
    text = "Request for unknown model: 'linear' version 99 is not found"
    with httpclient.InferenceServerClient(server.http) as client:
        error = error_of(client.infer, "linear", [_linear_input(httpclient)], model_version="99")
    assert (error.status(), error.message()) == ("404", text)
    with grpcclient.InferenceServerClient(server.grpc) as client:
        error = error_of(client.infer, "linear", [_linear_input(grpcclient)], model_version="99")
    assert (error.status(), error.message()) == ("StatusCode.NOT_FOUND", text)


def _classes(values: np.ndarray) -> list[str]:
    return [v.decode() if isinstance(v, bytes) else v for v in values.flatten()]


def test_http_classification(server: Server) -> None:
    with httpclient.InferenceServerClient(server.http) as client:
        binary = client.infer(
            "linear", [_linear_input(httpclient)], outputs=[httpclient.InferRequestedOutput("OUTPUT0", class_count=2)]
        )
        as_json = client.infer(
            "linear",
            [_linear_input(httpclient)],
            model_version="1",
            outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=False, class_count=3)],
        )
    output = binary.get_response()["outputs"][0]
    assert (output["datatype"], output["shape"]) == ("BYTES", [1, 2])
    assert _classes(binary.as_numpy("OUTPUT0")) == ["8.000000:3", "6.000000:2"]
    assert _classes(as_json.as_numpy("OUTPUT0")) == ["4.000000:3", "3.000000:2", "2.000000:1"]


def test_grpc_classification(server: Server) -> None:
    with grpcclient.InferenceServerClient(server.grpc) as client:
        result = client.infer(
            "linear", [_linear_input(grpcclient)], outputs=[grpcclient.InferRequestedOutput("OUTPUT0", class_count=1)]
        )
    output = result.get_response().outputs[0]
    assert (output.datatype, list(output.shape)) == ("BYTES", [1, 1])
    assert _classes(result.as_numpy("OUTPUT0")) == ["8.000000:3"]


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_http_compression(server: Server, algorithm: str) -> None:
    a, b = simple_arrays()
    with httpclient.InferenceServerClient(server.http) as client:
        result = client.infer(
            "simple",
            http_inputs(a, b),
            request_compression_algorithm=algorithm,
            response_compression_algorithm=algorithm,
        )
        json_result = client.infer(
            "simple",
            http_inputs(a, b, binary=False),
            outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)],
            request_compression_algorithm=algorithm,
            response_compression_algorithm=algorithm,
        )
    check_simple(result, a, b)
    np.testing.assert_array_equal(json_result.as_numpy("OUTPUT0"), a + b)


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_http_response_content_encoding(server: Server, algorithm: str) -> None:
    a, b = simple_arrays()
    body = {
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": a.flatten().tolist()},
            {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": b.flatten().tolist()},
        ]
    }
    url = f"http://{server.http}/v2/models/simple/infer"
    response = httpx.post(url, json=body, headers={"Accept-Encoding": algorithm}, timeout=30)
    assert response.status_code == 200
    assert response.headers["content-encoding"] == algorithm
    assert response.json()["outputs"][0]["data"] == (a + b).flatten().tolist()


async def test_http_aio_compression(server: Server) -> None:
    a, b = simple_arrays()
    client = httpaio.InferenceServerClient(server.http)
    try:
        for algorithm in ("gzip", "deflate"):
            result = await client.infer(
                "simple",
                http_inputs(a, b, module=httpaio),
                request_compression_algorithm=algorithm,
                response_compression_algorithm=algorithm,
            )
            check_simple(result, a, b)
    finally:
        await client.close()


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_grpc_compression(server: Server, algorithm: str) -> None:
    a, b = simple_arrays()
    with grpcclient.InferenceServerClient(server.grpc) as client:
        result = client.infer("simple", grpc_inputs(a, b), compression_algorithm=algorithm)
    check_simple(result, a, b)


def test_http_async_infer(server: Server) -> None:
    pairs = [simple_arrays(seed=s) for s in range(8)]
    with httpclient.InferenceServerClient(server.http, concurrency=4) as client:
        pending = [client.async_infer("simple", http_inputs(a, b)) for a, b in pairs]
        for (a, b), request in zip(pairs, pending, strict=True):
            check_simple(request.get_result(timeout=60), a, b)


def test_grpc_async_infer(server: Server) -> None:
    pairs = [simple_arrays(seed=s) for s in range(8)]
    answers: queue.Queue[tuple[int, object, object]] = queue.Queue()
    with grpcclient.InferenceServerClient(server.grpc) as client:
        for index, (a, b) in enumerate(pairs):
            client.async_infer(
                "simple",
                grpc_inputs(a, b),
                callback=lambda result, error, index=index: answers.put((index, result, error)),
                request_id=str(index),
            )
        got = [answers.get(timeout=60) for _ in pairs]
    for index, result, error in got:
        assert error is None
        a, b = pairs[index]
        check_simple(result, a, b)
        assert result.get_response().id == str(index)


async def test_aio_concurrent_infers(server: Server) -> None:
    pairs = [simple_arrays(seed=s) for s in range(6)]
    http = httpaio.InferenceServerClient(server.http)
    rpc = grpcaio.InferenceServerClient(server.grpc)
    try:
        http_results = await asyncio.gather(
            *(http.infer("simple", http_inputs(a, b, module=httpaio)) for a, b in pairs)
        )
        grpc_results = await asyncio.gather(*(rpc.infer("simple", grpc_inputs(a, b, module=grpcaio)) for a, b in pairs))
    finally:
        await http.close()
        await rpc.close()
    for (a, b), h, g in zip(pairs, http_results, grpc_results, strict=True):
        check_simple(h, a, b)
        check_simple(g, a, b)


def test_http_zero_size_output_has_no_bytes(server: Server) -> None:
    empty = np.zeros((1, 0), dtype=np.float32)
    tensor = httpclient.InferInput("INPUT0", [1, 0], "FP32")
    tensor.set_data_from_numpy(empty)
    with httpclient.InferenceServerClient(server.http) as client:
        result = client.infer("identity_fp32", [tensor])
    output = result.get_response()["outputs"][0]
    assert output["shape"] == [1, 0]
    assert output["parameters"] == {"binary_data_size": 0}
    assert result.as_numpy("OUTPUT0").shape == (1, 0)


def test_grpc_fp16_binary(server: Server) -> None:
    values = np.array([[0.5, -1.25, 65504.0]], dtype=np.float16)
    tensor = grpcclient.InferInput("INPUT0", [1, 3], "FP16")
    tensor.set_data_from_numpy(values)
    with grpcclient.InferenceServerClient(server.grpc) as client:
        result = client.infer("identity_fp16", [tensor])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), values)


def test_grpc_query_headers_and_parameters(server: Server) -> None:
    """Custom headers and request parameters (simple_grpc_custom_args_client) do not disturb inference."""
    a, b = simple_arrays()
    with grpcclient.InferenceServerClient(server.grpc) as client:
        result = client.infer("simple", grpc_inputs(a, b), headers={"test": "1"}, parameters={"custom": "x", "n": 3})
    check_simple(result, a, b)


def test_http_query_string_is_ignored(server: Server) -> None:
    a, b = simple_arrays()
    with httpclient.InferenceServerClient(server.http) as client:
        result = client.infer("simple", http_inputs(a, b), query_params={"test_1": 1, "test_2": 2})
        assert client.is_server_live(query_params={"test_1": 1}) is True
    check_simple(result, a, b)


def test_http_raw_binary_header_framing(server: Server) -> None:
    """Hand-built binary request: JSON header, then tensors in `inputs` order."""
    a, b = simple_arrays()
    header = json.dumps(
        {
            "inputs": [
                {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "parameters": {"binary_data_size": 64}},
                {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "parameters": {"binary_data_size": 64}},
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }
    ).encode()
    body = header + a.tobytes() + b.tobytes()
    response = httpx.post(
        f"http://{server.http}/v2/models/simple/infer",
        content=body,
        headers={"Inference-Header-Content-Length": str(len(header))},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    length = int(response.headers["inference-header-content-length"])
    out = json.loads(response.content[:length])
    assert out["outputs"] == [
        {"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 16], "parameters": {"binary_data_size": 64}}
    ]
    np.testing.assert_array_equal(np.frombuffer(response.content[length:], "<i4"), (a + b).flatten())
    assert struct.calcsize("<16i") == len(response.content) - length
