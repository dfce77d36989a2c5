"""Request edges where turnout answered 200 or 500 and Triton answers 400: repeated
names, JSON nested past Triton's limit, element counts past the byte size, CUDA shared
memory registration with empty arguments (Triton's texts from its current sources; the
report beside the change compares each with Triton 2.51)."""

from __future__ import annotations

import base64
import json
import socket
from collections.abc import Callable
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc

from gateway.shm import DISABLED
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
GRPC_CODE = {"400": "StatusCode.INVALID_ARGUMENT", "500": "StatusCode.INTERNAL"}
PROTOCOLS = pytest.mark.parametrize("protocol", ["http", "grpc"])
INT64_MAX = 2**63 - 1


def _expect(server: Server, protocol: str, status: str, text: str, call: Callable[[Any], Any]) -> None:
    module = httpclient if protocol == "http" else grpcclient
    with module.InferenceServerClient(server.http if protocol == "http" else server.grpc) as client:
        error = error_of(call, client)
    assert (error.status(), error.message()) == (status if protocol == "http" else GRPC_CODE[status], text)
    if protocol == "http":
        assert_http_serves(server.http)
    else:
        assert_grpc_serves(server.grpc)


def _post(server: Server, path: str, body: bytes) -> httpx.Response:
    return httpx.post(f"http://{server.http}{path}", content=body, timeout=60)


@PROTOCOLS
def test_repeated_output_name(server: Server, protocol: str) -> None:
    module = httpclient if protocol == "http" else grpcclient
    a, b = simple_arrays()
    inputs = http_inputs(a, b) if protocol == "http" else grpc_inputs(a, b)
    outputs = [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT0")]
    text = "[request id: r9] output 'OUTPUT0' already exists in request"
    _expect(server, protocol, "400", text, lambda c: c.infer("simple", inputs, outputs=outputs, request_id="r9"))


@PROTOCOLS
def test_repeated_input_name(server: Server, protocol: str) -> None:
    a, b = simple_arrays()
    inputs = http_inputs(a, b) if protocol == "http" else grpc_inputs(a, b)
    text = UNKNOWN_ID + "input 'INPUT0' already exists in request"
    _expect(server, protocol, "400", text, lambda c: c.infer("simple", [inputs[0], inputs[0]]))


def _nested_body(depth: int) -> bytes:
    data = "[" * depth + "1.5" + "]" * depth
    return ('{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,1],"data":' + data + "}]}").encode()


def test_data_nested_past_the_limit(server: Server) -> None:
    """`data` may hold a value 99 arrays below it; 100 is refused, however deep it goes."""
    response = _post(server, "/v2/models/identity_fp32/infer", _nested_body(99))
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == [1.5]
    for depth in (100, 50000):
        response = _post(server, "/v2/models/identity_fp32/infer", _nested_body(depth))
        assert (response.status_code, response.json()) == (
            400,
            {"error": "JSON nesting depth exceeds maximum allowed limit (100)"},
        )
    assert_http_serves(server.http)


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b"[" * 50000 + b"]" * 50000, 200),  # an index request that is no object: Triton lists the models
        (b'{"x":' + b"[" * 50000 + b"]" * 50000 + b"}", 200),  # a key Triton does not read
    ],
)
def test_deeply_nested_repository_index(server: Server, body: bytes, status: int) -> None:
    response = _post(server, "/v2/repository/index", body)
    assert response.status_code == status, response.text
    assert {"name": "simple", "version": "1", "state": "READY"} in response.json()


_TOO_BIG = "failed to parse the request JSON buffer: Number too big to be stored in double. at {}"


@pytest.mark.parametrize(
    ("path", "body", "offset"),
    [
        # an integer past a double's range in FP32 data: an internal error here before
        (
            "/v2/models/identity_fp32/infer",
            b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,1],"data":[' + b"9" * 400 + b"]}]}",
            68,
        ),
        # a number Python reads as infinity, in a request that would otherwise run (Triton
        # 2.51: 500 with this text, where turnout answered 200 with NaN outputs before)
        (
            "/v2/models/identity_fp32/infer",
            b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,1],"data":[1e400]}]}',
            68,
        ),
        (
            "/v2/models/identity_fp32/infer",
            b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,2],"data":[0,-1e400]}]}',
            70,
        ),
        # more digits than Python converts: its own text as an internal error before
        (
            "/v2/models/identity_fp32/infer",
            b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,1],"data":[' + b"1" * 5000 + b"]}]}",
            68,
        ),
        # past the document's first 64 KiB, where it was not looked for before
        (
            "/v2/models/identity_fp32/infer",
            b'{"id":"' + b"x" * 70_000 + b'","inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,1],'
            b'"data":[1e400]}]}',
            70_076,
        ),
        ("/v2/models/simple/infer", b'{"id":1e999,"inputs":[]}', 6),  # before the id's type
        ("/v2/logging", b'{"log_verbose_level":0,"x":1e999}', 27),  # in a field no one reads
        ("/v2/trace/setting", b'{"trace_rate":1e999}', 14),
        ("/v2/repository/index", b'{"ready":-1e999}', 9),
    ],
)
def test_a_number_too_big_for_a_double_is_refused_as_rapidjson_refuses_it(
    server: Server, path: str, body: bytes, offset: int
) -> None:
    # Each Triton 2.51's answer to the same body (Python reads such a number as infinity).
    response = _post(server, path, body)
    assert (response.status_code, response.json()) == (500, {"error": _TOO_BIG.format(offset)})
    assert _post(server, "/v2/logging", b"{}").json()["log_verbose_level"] == 0  # nothing was changed
    assert_http_serves(server.http)


_ONES = b'"datatype":"INT32","shape":[1,16],"data":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]}'
_INPUTS = b'{"name":"INPUT0",' + _ONES + b',{"name":"INPUT1",' + _ONES


@pytest.mark.parametrize(
    ("body", "status", "answer"),
    [
        (
            b'{"inputs":[{"name":"S\xfe","datatype":"INT32","shape":[1],"data":[1]}]}',
            400,
            {
                "error": UNKNOWN_ID + "expected 2 inputs but got 1 inputs for model 'simple'. Got input(s) "
                "['S\ufffd'], but missing required input(s) ['INPUT0','INPUT1']. Please provide all required input(s)."
            },
        ),
        (
            b'{"inputs":[' + _INPUTS + b'],"outputs":[{"name":"O\xfe"}]}',
            400,
            {"error": "unexpected inference output 'O\ufffd' for model 'simple'"},
        ),
        (
            b'{"inputs":[{"name":"INPUT0","datatype":"INT\xfe32","shape":[1,16],"data":[1]},{"name":"INPUT1",'
            + _ONES
            + b"]}",
            400,
            {"error": "invalid datatype for input INPUT0"},
        ),
        (b'{"id":"a\xfeb","inputs":[' + _INPUTS + b"]}", 200, "a\ufffdb"),
        (b'{"parameters":{"k\xfe":1},"inputs":[' + _INPUTS + b"]}", 200, None),
        (b'{"parameters":{"k":"v\xfe"},"inputs":[' + _INPUTS + b"]}", 200, None),
    ],
)
def test_bytes_that_are_not_utf8_in_ids_names_and_parameters(
    server: Server, body: bytes, status: int, answer: Any
) -> None:
    # Triton 2.51 takes them as they are: each of these answers with its status (and, but
    # for the byte, its text). A protobuf string cannot carry them, so here they become
    # U+FFFD (Triton echoes the raw byte, which makes its answer JSON that is not UTF-8).
    response = _post(server, "/v2/models/simple/infer", body)
    assert response.status_code == status, response.text
    if status == 200:
        assert response.json().get("id") == answer
        assert response.json()["outputs"][0]["data"] == [2] * 16
    else:
        assert response.json() == answer
    assert_http_serves(server.http)


@pytest.mark.parametrize(
    ("path", "body", "status", "text"),
    [
        ("/v2/logging", b'{"x\xfe":1}', 200, None),
        ("/v2/logging", b'{"log_file":"\xfe"}', 501, "log file location can not be updated through network protocol"),
        (
            "/v2/trace/setting",
            b'{"trace_file":"\xfe"}',
            501,
            "trace file location can not be updated through network protocol",
        ),
        ("/v2/repository/index", b'{"x":"\xfe"}', 200, None),
        (
            "/v2/repository/models/simple/load",
            b'{"parameters":{"x":"\xfe"}}',
            500,
            "unexpected error on creating Triton parameter",
        ),
    ],
)
def test_bytes_that_are_not_utf8_in_other_bodies(
    server: Server, path: str, body: bytes, status: int, text: str | None
) -> None:
    # Each Triton 2.51's answer (an 'Invalid encoding in string' 500 here before).
    response = _post(server, path, body)
    assert response.status_code == status, response.text
    if text is not None:
        assert response.json() == {"error": text}
    assert_http_serves(server.http)


@pytest.mark.parametrize(
    ("shape", "datatype", "text"),
    [
        (
            [2**62, 4],
            "INT32",
            "invalid shape for input 'INPUT0': shape [4611686018427387904,4] causes total element count to exceed "
            f"maximum size of {INT64_MAX}",
        ),
        (
            [2**61],
            "INT64",
            "byte size overflow for input 'INPUT0': element count (2305843009213693952) * data type size (8) exceeds "
            f"maximum allowed size ({INT64_MAX})",
        ),
        (
            [10**9],
            "FP32",
            "JSON input 'INPUT0' has a byte_size (4000000000 bytes) that exceeds the maximum allowed value of "
            "67108864 bytes. Use --http-max-input-size to increase the limit.",
        ),
    ],
)
def test_json_element_count_past_the_byte_size(server: Server, shape: list[int], datatype: str, text: str) -> None:
    document = {"inputs": [{"name": "INPUT0", "datatype": datatype, "shape": shape, "data": [1]}]}
    response = _post(server, "/v2/models/identity_fp32/infer", json.dumps(document).encode())
    assert (response.status_code, response.json()) == (400, {"error": text})
    assert_http_serves(server.http)


@PROTOCOLS
def test_tensor_element_count_past_the_byte_size(server: Server, protocol: str) -> None:
    """Binary (HTTP) and raw (gRPC) tensors meet Triton core's overflow check."""
    module = httpclient if protocol == "http" else grpcclient
    tensor = module.InferInput("INPUT0", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 1), dtype=np.float32))
    tensor.set_shape([1, 2**62])
    text = f"byte size for tensor 'INPUT0' exceeds maximum size of {INT64_MAX}"
    _expect(server, protocol, "400", text, lambda c: c.infer("identity_fp32", [tensor]))


def test_register_cuda_shared_memory_checks_arguments_first(shm_server: Server) -> None:
    with grpc.insecure_channel(shm_server.grpc) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.CudaSharedMemoryRegister(service_pb2.CudaSharedMemoryRegisterRequest())
    assert (caught.value.code(), caught.value.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "failed to register shared memory region: invalid args",
    )
    empty = b'{"raw_handle":{"b64":""},"device_id":0,"byte_size":0}'
    response = _post(shm_server, "/v2/cudasharedmemory/region/r/register", empty)
    assert (response.status_code, response.json()) == (
        400,
        {"error": "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t"},
    )
    # A well-formed handle gets the answer of a Triton built without GPUs, with its status.
    with grpcclient.InferenceServerClient(shm_server.grpc) as client:
        error = error_of(client.register_cuda_shared_memory, "r", base64.b64encode(bytes(64)), 0, 16)
    assert (error.status(), error.message()) == (
        "StatusCode.INVALID_ARGUMENT",
        "failed to register CUDA shared memory region: 'r', GPUs not supported",
    )
    with httpclient.InferenceServerClient(shm_server.http) as client:
        error = error_of(client.register_cuda_shared_memory, "r", base64.b64encode(bytes(64)), 0, 16)
    assert (error.status(), error.message()) == (
        "400",
        "failed to register CUDA shared memory region: 'r', GPUs not supported",
    )


def test_content_length_with_chunked_body(server: Server) -> None:
    host, port = server.http.rsplit(":", 1)
    request = (
        b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
        b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n2\r\n{}\r\n0\r\n\r\n"
    )
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]


def test_a_request_with_both_lengths_closes_its_connection_after_the_answer(server: Server) -> None:
    # The chunks decide the body (as Triton); the connection ends there, so no second
    # request can be read with the other framing.
    host, port = server.http.rsplit(":", 1)
    request = (
        b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"
    )
    follow_up = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(request + follow_up)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert answer.count(b"HTTP/1.1 ") == 1, answer


@pytest.mark.parametrize(
    ("body", "status", "text"),
    [
        (b"", 500, "failed to parse the request JSON buffer: The document is empty. at 0"),
        (b"[1]", 400, "Shared memory register request has no 'key' field"),
        (b'{"key": 5}', 500, "attempt to access JSON non-string as string"),
        (b'{"key": "/k", "offset": -1}', 500, "attempt to access JSON non-unsigned-integer as unsigned-integer"),
        (b'{"key": "/k"}', 400, "Shared memory register request has no 'byte_size' field"),
        (b'{"key": "//", "byte_size": 8}', 400, "cannot register shared memory region 'r' - invalid shm key '//'"),
    ],
)
def test_system_shared_memory_registration_is_read_as_triton_reads_it(
    shm_server: Server, body: bytes, status: int, text: str
) -> None:
    response = _post(shm_server, "/v2/systemsharedmemory/region/r/register", body)
    assert (response.status_code, response.json()) == (status, {"error": text})


def test_disabled_shared_memory_is_refused_before_the_body_is_read(server: Server) -> None:
    for path in ("/v2/systemsharedmemory/region/r/register", "/v2/cudasharedmemory/region/r/register"):
        response = _post(server, path, b"{not json")
        assert (response.status_code, response.json()) == (501, {"error": DISABLED})
    assert _post(server, "/v2/systemsharedmemory/region/r/unregister", b"").status_code == 501
