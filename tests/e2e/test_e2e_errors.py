"""Triton's error table (reference §4): exact HTTP status, gRPC code and text for each
situation, through the real clients or raw HTTP where the client validates first.
After each error the server must still answer a good request."""

from __future__ import annotations

import gzip
import json
import time
import zlib
from collections.abc import Callable
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.e2e.simple_requests import (
    assert_grpc_serves,
    assert_http_serves,
    error_of,
    grpc_inputs,
    http_inputs,
    simple_arrays,
)
from tests.harness import Server

UNKNOWN_ID = "[request id: <id_unknown>] "
SHAPE_NOTE = (
    " NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be prepended "
    "to each input shape. If you want to specify the full shape including the batch dim in your input dims "
    "config, try setting max_batch_size to zero. See the model configuration docs for more info on max_batch_size."
)
GRPC_CODE = {
    "400": "StatusCode.INVALID_ARGUMENT",
    "404": "StatusCode.NOT_FOUND",
    "500": "StatusCode.INTERNAL",
    "503": "StatusCode.UNAVAILABLE",
}


def _module(protocol: str) -> Any:
    return httpclient if protocol == "http" else grpcclient


def _client(server: Server, protocol: str) -> Any:
    if protocol == "http":
        return httpclient.InferenceServerClient(server.http)
    return grpcclient.InferenceServerClient(server.grpc)


def _tensor(module: Any, name: str, array: np.ndarray, datatype: str = "INT32") -> Any:
    tensor = module.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def _expect(server: Server, protocol: str, http_status: str, text: str, call: Callable[[Any], Any]) -> None:
    with _client(server, protocol) as client:
        error = error_of(call, client)
    expected_status = http_status if protocol == "http" else GRPC_CODE[http_status]
    assert (error.status(), error.message()) == (expected_status, text)
    if protocol == "http":
        assert_http_serves(server.http)
    else:
        assert_grpc_serves(server.grpc)


PROTOCOLS = pytest.mark.parametrize("protocol", ["http", "grpc"])


@PROTOCOLS
def test_unknown_model(server: Server, protocol: str) -> None:
    text = "Request for unknown model: 'foo' is not found"
    module = _module(protocol)
    a, b = simple_arrays()
    inputs = [_tensor(module, "INPUT0", a), _tensor(module, "INPUT1", b)]
    _expect(server, protocol, "404", text, lambda c: c.infer("foo", inputs))
    _expect(server, protocol, "404", text, lambda c: c.get_model_metadata("foo"))
    _expect(server, protocol, "404", text, lambda c: c.get_model_config("foo"))


@PROTOCOLS
def test_unknown_version_metadata(server: Server, protocol: str) -> None:
    text = "Request for unknown model: 'simple' version 3 is not found"
    _expect(server, protocol, "404", text, lambda c: c.get_model_metadata("simple", "3"))


@PROTOCOLS
def test_wrong_input_name(server: Server, protocol: str) -> None:
    module = _module(protocol)
    a, b = simple_arrays()
    inputs = [_tensor(module, "INPUT0", a), _tensor(module, "INPUTX", b)]
    text = "unexpected inference input 'INPUTX' for model 'simple'"
    _expect(server, protocol, "400", text, lambda c: c.infer("simple", inputs))


@PROTOCOLS
def test_wrong_output_name(server: Server, protocol: str) -> None:
    module = _module(protocol)
    a, b = simple_arrays()
    inputs = [_tensor(module, "INPUT0", a), _tensor(module, "INPUT1", b)]
    outputs = [module.InferRequestedOutput("OUTPUTX")]
    text = "unexpected inference output 'OUTPUTX' for model 'simple'"
    _expect(server, protocol, "400", text, lambda c: c.infer("simple", inputs, outputs=outputs))


@PROTOCOLS
def test_missing_input(server: Server, protocol: str) -> None:
    module = _module(protocol)
    a, _ = simple_arrays()
    text = (
        UNKNOWN_ID + "expected 2 inputs but got 1 inputs for model 'simple'. Got input(s) ['INPUT0'], "
        "but missing required input(s) ['INPUT1']. Please provide all required input(s)."
    )
    _expect(server, protocol, "400", text, lambda c: c.infer("simple", [_tensor(module, "INPUT0", a)]))


@PROTOCOLS
def test_wrong_shape(server: Server, protocol: str) -> None:
    module = _module(protocol)
    short = np.zeros((1, 15), dtype=np.int32)
    inputs = [_tensor(module, "INPUT0", short), _tensor(module, "INPUT1", short)]
    text = (
        UNKNOWN_ID
        # both are wrong: Triton names the one its core walks first
        + "unexpected shape for input 'INPUT1' for model 'simple'. Expected [-1,16], got [1,15]."
        + SHAPE_NOTE
    )
    _expect(server, protocol, "400", text, lambda c: c.infer("simple", inputs))


@pytest.mark.parametrize(
    ("shapes", "text"),
    [
        ([[-1, 16], [1, 16]], "input 'INPUT0' batch size does not match other inputs for 'simple'"),
        (
            [[1, -1], [1, 16]],
            "All input dimensions should be specified for input 'INPUT0' for model 'simple', got [1,-1]",
        ),
        # Core keeps the batch size in a uint32: -2 sets 4294967294, which the other -2 is not.
        ([[-2, 16], [-2, 16]], "input 'INPUT0' batch size does not match other inputs for 'simple'"),
        ([[-3, 16], [0, 16]], "inference request batch-size must be <= 8 for 'simple'"),
        ([[2**32 + 1, 16], [2**32 + 1, 16]], "input 'INPUT0' batch size does not match other inputs for 'simple'"),
        # Triton lets this one through to the model, which finds a batch of 16 rows in it
        ([[0, 16], [0, 16]], "input 'INPUT1' holds data but a batch size of 0 for 'simple'"),
    ],
)
def test_negative_and_zero_dims_grpc(server: Server, shapes: list[list[int]], text: str) -> None:
    """As Triton's core (checked on 2.51, and current core's batch-size check): the batch
    dim is only compared, a -1 past it is refused; a batch size of 0 leaves the shape
    without its batch dim."""
    a, b = simple_arrays()
    inputs = grpc_inputs(a, b)
    for tensor, shape in zip(inputs, shapes, strict=True):
        tensor.set_shape(shape)
    prefix = "" if text.startswith("tensor ") else UNKNOWN_ID
    _expect(server, "grpc", "400", prefix + text, lambda c: c.infer("simple", inputs))


@PROTOCOLS
def test_wrong_datatype(server: Server, protocol: str) -> None:
    module = _module(protocol)
    floats = np.zeros((1, 16), dtype=np.float32)
    _, b = simple_arrays()
    inputs = [_tensor(module, "INPUT0", floats, "FP32"), _tensor(module, "INPUT1", b)]
    text = UNKNOWN_ID + "inference input 'INPUT0' data-type is 'FP32', but model 'simple' expects 'INT32'"
    _expect(server, protocol, "400", text, lambda c: c.infer("simple", inputs))


@PROTOCOLS
def test_batch_too_large(server: Server, protocol: str) -> None:
    a, b = simple_arrays(batch=9)
    module = _module(protocol)
    inputs = [_tensor(module, "INPUT0", a), _tensor(module, "INPUT1", b)]
    text = UNKNOWN_ID + "inference request batch-size must be <= 8 for 'simple'"
    _expect(server, protocol, "400", text, lambda c: c.infer("simple", inputs))


@PROTOCOLS
def test_batch_dims_disagree(server: Server, protocol: str) -> None:
    a, _ = simple_arrays(batch=1)
    _, b = simple_arrays(batch=2)
    module = _module(protocol)
    inputs = [_tensor(module, "INPUT0", a), _tensor(module, "INPUT1", b)]
    text = UNKNOWN_ID + "input 'INPUT0' batch size does not match other inputs for 'simple'"  # INPUT1 walked first
    _expect(server, protocol, "400", text, lambda c: c.infer("simple", inputs))


@PROTOCOLS
def test_full_queue(server: Server, protocol: str) -> None:
    # simple_queue holds a request a second and queues at most one: of three sent at
    # once, one is answered and two are refused at once.
    module = _module(protocol)
    a, b = simple_arrays()
    inputs = [_tensor(module, "INPUT0", a), _tensor(module, "INPUT1", b)]
    if protocol == "http":
        with httpclient.InferenceServerClient(server.http, concurrency=3) as client:
            pending = [client.async_infer("simple_queue", inputs) for _ in range(3)]
            outcomes = [_outcome(p.get_result) for p in pending]
    else:
        with grpcclient.InferenceServerClient(server.grpc) as client:
            results: list[Any] = []
            for _ in range(3):
                client.async_infer("simple_queue", inputs, callback=lambda result, error: results.append(error))
            _wait_for(lambda: len(results) == 3)
            outcomes = results
    refused = [o for o in outcomes if o is not None]
    assert len(refused) == 2
    status = "503" if protocol == "http" else "StatusCode.UNAVAILABLE"
    assert {(e.status(), e.message()) for e in refused} == {(status, UNKNOWN_ID + "Exceeds maximum queue size")}
    if protocol == "http":
        assert_http_serves(server.http)
    else:
        assert_grpc_serves(server.grpc)


@PROTOCOLS
def test_queue_timeout(server: Server, protocol: str) -> None:
    module = _module(protocol)
    a, b = simple_arrays()
    inputs = [_tensor(module, "INPUT0", a), _tensor(module, "INPUT1", b)]
    _expect(server, protocol, "503", "Request timeout expired", lambda c: c.infer("simple_timeout", inputs))


def _outcome(call: Callable[[], Any]) -> InferenceServerException | None:
    try:
        call()
    except InferenceServerException as exc:
        return exc
    return None


def _wait_for(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for the callbacks"
        time.sleep(0.01)


@PROTOCOLS
def test_byte_size_mismatch(server: Server, protocol: str) -> None:
    module = _module(protocol)
    tensor = _tensor(module, "INPUT0", np.ones((1, 4), dtype=np.float32), "FP32")
    tensor.set_shape([1, 3])
    text = UNKNOWN_ID + "input byte size mismatch for input 'INPUT0' for model 'identity_fp32'. Expected 12, got 16"
    _expect(server, protocol, "400", text, lambda c: c.infer("identity_fp32", [tensor]))


@PROTOCOLS
def test_bytes_element_count_mismatch(server: Server, protocol: str) -> None:
    module = _module(protocol)
    tensor = module.InferInput("INPUT0", [1, 3], "BYTES")
    tensor.set_data_from_numpy(np.array([[b"a", b"b", b"c"]], dtype=np.object_))
    tensor.set_shape([1, 4])
    text = UNKNOWN_ID + "expected 4 string elements for inference input 'INPUT0' for model 'simple_identity', got 3"
    _expect(server, protocol, "400", text, lambda c: c.infer("simple_identity", [tensor]))


# ---- HTTP-only rows: the client would refuse these, so the body is built by hand ----


def _post(server: Server, body: bytes, headers: dict[str, str] | None = None, model: str = "simple") -> httpx.Response:
    return httpx.post(f"http://{server.http}/v2/models/{model}/infer", content=body, headers=headers or {}, timeout=30)


def _expect_http(response: httpx.Response, status: int, text: str, server: Server) -> None:
    assert (response.status_code, response.json()) == (status, {"error": text})
    assert_http_serves(server.http)


def _json_inputs(a: list[int], b: list[int], shape: list[int] | None = None) -> dict[str, Any]:
    shape = shape or [1, 16]
    return {
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": shape, "data": a},
            {"name": "INPUT1", "datatype": "INT32", "shape": shape, "data": b},
        ]
    }


def test_malformed_json(server: Server) -> None:
    text = "failed to parse the request JSON buffer: Invalid value. at 0"
    _expect_http(_post(server, b"x"), 500, text, server)


def test_json_missing_inputs(server: Server) -> None:
    text = "Unable to parse 'inputs': attempt to access non-existing object member 'inputs'"
    _expect_http(_post(server, b"{}"), 500, text, server)


def test_json_negative_dim(server: Server) -> None:
    body = json.dumps(_json_inputs(list(range(16)), list(range(16)), shape=[-1, 16])).encode()
    text = "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer"
    _expect_http(_post(server, body), 500, text, server)


def test_json_data_too_long(server: Server) -> None:
    body = json.dumps(_json_inputs(list(range(17)), list(range(16)))).encode()
    text = "Unable to parse 'data': Shape does not match true shape of 'data' field"
    _expect_http(_post(server, body), 500, text, server)


def test_json_data_too_short(server: Server) -> None:
    body = json.dumps(_json_inputs(list(range(15)), list(range(16)))).encode()
    # Current Triton's text (its QA, qa/L0_http, expects it); 2.51 gave the text of too many.
    text = "Failed to parse 'data' field: shape does not match true shape"
    _expect_http(_post(server, body), 500, text, server)


def test_input_without_data(server: Server) -> None:
    body = _json_inputs(list(range(16)), list(range(16)))
    del body["inputs"][1]["data"]
    text = (
        "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
        "'shared_memory_region' in 'parameters'. But no field is set"
    )
    _expect_http(_post(server, json.dumps(body).encode()), 400, text, server)


def test_binary_input_without_header_length(server: Server) -> None:
    body = _json_inputs(list(range(16)), list(range(16)))
    del body["inputs"][1]["data"]
    body["inputs"][1]["parameters"] = {"binary_data_size": 64}
    # As Triton 2.51 answers it: the whole body is JSON, so the input's bytes are missing.
    text = "unexpected size for input 'INPUT1', expecting 64 additional bytes for model 'simple'"
    _expect_http(_post(server, json.dumps(body).encode()), 400, text, server)


def _binary_body(a: np.ndarray, b: np.ndarray) -> tuple[bytes, bytes]:
    header = {
        "inputs": [
            {"name": n, "datatype": "INT32", "shape": [1, 16], "parameters": {"binary_data_size": 64}}
            for n in ("INPUT0", "INPUT1")
        ]
    }
    return json.dumps(header).encode(), a.tobytes() + b.tobytes()


def test_header_length_out_of_range(server: Server) -> None:
    header, tensors = _binary_body(*simple_arrays())
    body = header + tensors
    response = _post(server, body, {"Inference-Header-Content-Length": str(len(body) + 10)})
    text = f"inference header size should be in range (0, {len(body)}), got: {len(body) + 10}"
    _expect_http(response, 400, text, server)


def test_leftover_binary_bytes(server: Server) -> None:
    header, tensors = _binary_body(*simple_arrays())
    response = _post(server, header + tensors + b"\0" * 8, {"Inference-Header-Content-Length": str(len(header))})
    _expect_http(response, 400, "unexpected additional input data for model 'simple'", server)


def test_short_binary_body(server: Server) -> None:
    header, tensors = _binary_body(*simple_arrays())
    response = _post(server, header + tensors[:-8], {"Inference-Header-Content-Length": str(len(header))})
    assert response.status_code == 400
    assert response.json()["error"].startswith("unexpected size for input 'INPUT1', expecting ")
    assert response.json()["error"].endswith(" additional bytes for model 'simple'")
    assert_http_serves(server.http)


def test_reserved_parameter(server: Server) -> None:
    body = _json_inputs(list(range(16)), list(range(16)))
    body["parameters"] = {"triton_anything": 1}
    text = "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified."
    _expect_http(_post(server, json.dumps(body).encode()), 400, text, server)


def test_fp16_json_input(server: Server) -> None:
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP16", "shape": [1, 2], "data": [1.0, 2.0]}]}
    text = "receiving FP16 data via JSON is not supported. Please use the binary data format for input INPUT0"
    _expect_http(_post(server, json.dumps(body).encode(), model="identity_fp16"), 400, text, server)


def test_fp16_json_output(server: Server) -> None:
    tensor = httpclient.InferInput("INPUT0", [1, 2], "FP16")
    tensor.set_data_from_numpy(np.array([[1.0, 2.0]], dtype=np.float16))
    output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)
    # Triton's http_server.cc words it without the output name.
    text = "sending FP16 data via JSON is not supported. Please use the binary data format for output"
    _expect(server, "http", "400", text, lambda c: c.infer("identity_fp16", [tensor], outputs=[output]))


def test_unsupported_content_encoding(server: Server) -> None:
    body = json.dumps(_json_inputs(list(range(16)), list(range(16)))).encode()
    response = _post(server, gzip.compress(body), {"Content-Encoding": "br"})
    assert response.status_code == 501
    assert response.json() == {"error": "Unsupported compression type"}
    assert response.headers["accept-encoding"] == "gzip, deflate"
    assert_http_serves(server.http)


def _compressed_cases() -> list[tuple[str, bytes, int, str | None]]:
    """(Content-Encoding, body, status, error text or None for an answer) as Triton 2.51
    answered each: its zlib detects either header and treats a fault in the data as the
    end of the body, so what inflated before it is the request."""
    body = json.dumps(_json_inputs(list(range(16)), list(range(16)))).encode()
    packed = gzip.compress(body, mtime=0)
    stored = gzip.compress(body, compresslevel=0, mtime=0)  # the body's bytes as they are
    assert body[:25] == b'{"inputs": [{"name": "INP'
    raw_request = (
        "[request id: <id_unknown>] Raw request must only have 1 input (found 1) to be deduced but got 2 inputs "
        "in 'simple' model configuration"
    )
    return [
        ("deflate", packed, 200, None),  # a gzip body labelled deflate
        ("gzip", zlib.compress(body), 200, None),  # a zlib body labelled gzip
        ("gzip", packed[:-8] + bytes([packed[-8] ^ 1]) + packed[-7:], 200, None),  # a bad checksum
        ("gzip", packed + b"trailing garbage", 200, None),
        ("gzip", b"not gzip", 400, raw_request),  # inflates to nothing: an empty body, read as raw
        (
            "gzip",
            stored[: 10 + 5 + 25],
            500,
            "failed to parse the request JSON buffer: Missing a closing quotation mark in string. at 25",
        ),  # cut short: what it holds
    ]


@pytest.mark.parametrize(
    ("encoding", "body", "status", "text"),
    _compressed_cases(),
    ids=["gzip-as-deflate", "zlib-as-gzip", "bad-checksum", "trailing", "not-compressed", "truncated"],
)
def test_compressed_bodies_inflate_as_tritons_zlib_reads_them(
    server: Server, encoding: str, body: bytes, status: int, text: str | None
) -> None:
    response = _post(server, body, {"Content-Encoding": encoding})
    if text is not None:
        _expect_http(response, status, text, server)
        return
    assert response.status_code == status
    assert response.json()["outputs"][0]["data"] == [2 * n for n in range(16)]


@pytest.mark.parametrize(
    ("body", "headers"),
    [
        (b"{not json", {}),
        (b'{"inputs": []}', {"Inference-Header-Content-Length": "999"}),
        (b'{"inputs": []}', {"Content-Encoding": "br"}),
        (b"not gzip", {"Content-Encoding": "gzip"}),
    ],
    ids=["malformed", "header-length", "encoding", "bad-gzip"],
)
@pytest.mark.parametrize(
    ("path", "text"),
    [
        ("foo", "Request for unknown model: 'foo' is not found"),
        ("simple/versions/7", "Request for unknown model: 'simple' version 7 is not found"),
    ],
    ids=["model", "version"],
)
def test_an_unknown_model_is_refused_before_its_body_is_read(
    server: Server, body: bytes, headers: dict[str, str], path: str, text: str
) -> None:
    # Triton looks the model up before it reads an infer body: a bad body to a model it
    # does not serve answers that the model is unknown.
    response = httpx.post(f"http://{server.http}/v2/models/{path}/infer", content=body, headers=headers, timeout=30)
    assert (response.status_code, response.json()) == (404, {"error": text})
    assert_http_serves(server.http)


def test_unknown_path_and_wrong_method(server: Server) -> None:
    missing = httpx.get(f"http://{server.http}/v2/nowhere/at/all", timeout=30)
    assert (missing.status_code, missing.json()) == (404, {"error": "Not Found"})
    non_numeric = httpx.get(f"http://{server.http}/v2/models/simple/versions/abc", timeout=30)
    assert (non_numeric.status_code, non_numeric.json()) == (404, {"error": "Not Found"})
    wrong = httpx.get(f"http://{server.http}/v2/models/simple/infer", timeout=30)
    assert (wrong.status_code, wrong.json()) == (405, {"error": "Method Not Allowed"})
    assert wrong.headers["allow"] == "POST"  # the body is Triton's; the header says what to use
    index = httpx.get(f"http://{server.http}/v2/repository/index", timeout=30)
    assert (index.status_code, index.headers["allow"]) == (405, "POST")
    assert_http_serves(server.http)


def test_http_ready_false_is_empty_400(server: Server) -> None:
    response = httpx.get(f"http://{server.http}/v2/models/simple/versions/5/ready", timeout=30)
    assert response.status_code == 400
    assert_http_serves(server.http)


def test_http_unknown_model_url_quoting(server: Server) -> None:
    """tritonclient quotes model names; Triton matches the raw path and reports the name as sent."""
    with httpclient.InferenceServerClient(server.http) as client:
        error = error_of(client.get_model_metadata, "no model")
    assert (error.status(), error.message()) == ("404", "Request for unknown model: 'no%20model' is not found")


# ---- gRPC-only rows: hand-built protobuf requests through tritonclient's own stubs ----


def _stub(server: Server) -> tuple[grpc.Channel, Any]:
    channel = grpc.insecure_channel(server.grpc)
    return channel, service_pb2_grpc.GRPCInferenceServiceStub(channel)


def _grpc_error(server: Server, request: Any) -> grpc.RpcError:
    channel, stub = _stub(server)
    with channel:
        try:
            stub.ModelInfer(request, timeout=30)
        except grpc.RpcError as exc:
            return exc
    raise AssertionError("ModelInfer succeeded; expected an error")


def _simple_request() -> Any:
    request = service_pb2.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        tensor = request.inputs.add(name=name, datatype="INT32")
        tensor.shape.extend([1, 16])
    return request


def test_grpc_contents_and_raw(server: Server) -> None:
    request = _simple_request()
    request.inputs[0].contents.int_contents.extend(range(16))
    request.inputs[1].contents.int_contents.extend(range(16))
    request.raw_input_contents.append(np.zeros(16, np.int32).tobytes())
    error = _grpc_error(server, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == (
        "contents field must not be specified when using raw_input_contents for 'INPUT0' for model 'simple'"
    )
    assert_grpc_serves(server.grpc)


def test_grpc_input_without_data(server: Server) -> None:
    request = _simple_request()
    request.raw_input_contents.append(np.zeros(16, np.int32).tobytes())
    error = _grpc_error(server, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == "unable to find data for input tensor 'INPUT1' for model 'simple' in request."
    assert_grpc_serves(server.grpc)


def test_grpc_explicit_contents(server: Server) -> None:
    """Typed contents instead of raw bytes (grpc_explicit_int_content_client)."""
    request = _simple_request()
    request.inputs[0].contents.int_contents.extend(range(16))
    request.inputs[1].contents.int_contents.extend([1] * 16)
    channel, stub = _stub(server)
    with channel:
        response = stub.ModelInfer(request, timeout=30)
    assert [o.name for o in response.outputs] == ["OUTPUT0", "OUTPUT1"]
    assert len(response.raw_output_contents) == 2
    sums = np.frombuffer(response.raw_output_contents[0], dtype="<i4")
    np.testing.assert_array_equal(sums, np.arange(16) + 1)


def test_grpc_non_numeric_version(server: Server) -> None:
    text = (
        "failed to get model version from specified version string 'x' (details: stol), "
        "version should be an integral value > 0"
    )
    a, b = simple_arrays()
    _expect(server, "grpc", "400", text, lambda c: c.infer("simple", grpc_inputs(a, b), model_version="x"))


def test_http_infer_errors_do_not_leak_between_requests(server: Server) -> None:
    """An error response, then a good one on the same keep-alive connection."""
    a, b = simple_arrays()
    with httpclient.InferenceServerClient(server.http) as client:
        error_of(client.infer, "foo", http_inputs(a, b))
        result = client.infer("simple", http_inputs(a, b))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)


def test_a_batch_of_zero_rows_is_refused_as_triton_refuses_it(server: Server) -> None:
    """Core checks a batch-0 request against the shape without its batch dim: over JSON,
    whose data for no rows is no bytes, that is a byte size mismatch."""
    empty = {"datatype": "INT32", "shape": [0, 16], "data": []}
    body = {"inputs": [{"name": "INPUT0", **empty}, {"name": "INPUT1", **empty}]}
    response = httpx.post(f"http://{server.http}/v2/models/simple/infer", json=body, timeout=10)
    text = UNKNOWN_ID + "input byte size mismatch for input 'INPUT1' for model 'simple'. Expected 64, got 0"
    assert (response.status_code, response.json()) == (400, {"error": text})


SIMPLE_BODY = {
    "inputs": [
        {"name": name, "shape": [1, 16], "datatype": "INT32", "data": list(range(16))} for name in ("INPUT0", "INPUT1")
    ]
}

# What Triton 2.51 answered each request with (status, Content-Type), on loopback beside
# turnout: its handlers type their answers application/json as they start, except health,
# readiness and infer, whose answers keep libevhtp's text/plain until an infer body is
# parsed; a path no handler takes is text/plain too.
CONTENT_TYPES = [
    ("GET", "/v2/health/live", b"", {}, 200, "text/plain"),
    ("GET", "/v2/health/ready", b"", {}, 200, "text/plain"),
    ("DELETE", "/v2/health/ready", b"", {}, 405, "text/plain"),
    ("GET", "/v2/models/simple/ready", b"", {}, 200, "text/plain"),
    ("GET", "/v2/models/nope/ready", b"", {}, 400, "text/plain"),
    ("GET", "/v2/models/simple/versions/7/ready", b"", {}, 400, "text/plain"),
    ("GET", "/nope", b"", {}, 404, "text/plain"),
    ("GET", "/v2/models/simple/versions/abc", b"", {}, 404, "text/plain"),
    ("GET", "/v2/models/simple/infer", b"", {}, 405, "text/plain"),
    ("POST", "/v2/models/nope/infer", b"{}", {}, 404, "text/plain"),
    ("POST", "/v2/models/nope/infer", json.dumps(SIMPLE_BODY).encode(), {}, 404, "text/plain"),
    ("POST", "/v2/models/simple/versions/9/infer", json.dumps(SIMPLE_BODY).encode(), {}, 404, "text/plain"),
    ("POST", "/v2/models/simple/infer", b"{}", {"Inference-Header-Content-Length": "-1"}, 400, "text/plain"),
    ("POST", "/v2/models/simple/infer", b"{}", {"Content-Encoding": "br"}, 501, "text/plain"),
    ("POST", "/v2/models/simple/infer", b"{", {}, 500, "application/json"),
    ("POST", "/v2/models/simple/infer", b'{"inputs": [{"name": "X"}]}', {}, 400, "application/json"),
    ("GET", "/v2", b"", {}, 200, "application/json"),
    ("POST", "/v2", b"{}", {}, 405, "application/json"),
    ("POST", "/v2/models/simple/config", b"", {}, 405, "application/json"),
    ("GET", "/v2/models/nope/config", b"", {}, 404, "application/json"),
    ("GET", "/v2/models/nope/stats", b"", {}, 400, "application/json"),
    ("POST", "/v2/repository/index", b"{}", {}, 200, "application/json"),
    ("GET", "/v2/trace/setting", b"", {}, 200, "application/json"),
    ("GET", "/v2/logging", b"", {}, 200, "application/json"),
]


@pytest.mark.parametrize(("method", "path", "body", "headers", "status", "content_type"), CONTENT_TYPES)
def test_answers_are_typed_where_tritons_are(
    server: Server, method: str, path: str, body: bytes, headers: dict[str, str], status: int, content_type: str
) -> None:
    response = httpx.request(method, f"http://{server.http}{path}", content=body, headers=headers)
    assert (response.status_code, response.headers.get("content-type")) == (status, content_type)
    assert "server" not in response.headers and "date" not in response.headers  # nor do Triton's
